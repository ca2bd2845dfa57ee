"""Correctness of the speed-ups (their speed is measured by fedul benchmark,
never by tests): the numpy IID split equals Flower Datasets' IidPartitioner, and the
ClientApp's per-process caches (model modules, parsed run configuration) carry nothing over
between clients or rounds; the benchmark's markdown shows the measured numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from torch import nn

import fedul_flwr.client_app as client_module
from fedul_flwr import wire
from fedul_flwr.config import RunConfig, config_from_json, resolve_config
from fedul_flwr.data.partition import _label_dataset, iid_partition
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.models import build_model
from fedul_flwr.experiments.tables import table_rows


@pytest.mark.parametrize(("n", "parts", "seed"), [(100, 7, 0), (60, 60, 3), (1001, 10, 42), (5, 1, 1)])
def test_iid_partition_matches_flower_datasets(n: int, parts: int, seed: int) -> None:
    from flwr_datasets.partitioner import IidPartitioner

    labels = np.arange(n) % 10
    partitioner = IidPartitioner(num_partitions=parts)
    partitioner.dataset = _label_dataset(labels).shuffle(seed=seed)
    expected = [np.asarray(partitioner.load_partition(i)["idx"], dtype=np.int64) for i in range(parts)]
    got = iid_partition(labels, parts, seed)
    assert len(got) == parts
    for e, g in zip(expected, got, strict=True):
        assert g.dtype == np.int64
        np.testing.assert_array_equal(g, e)


def _train(
    grid: InProcessGrid, cfg: RunConfig, node: int, state: dict[str, torch.Tensor], server_round: int
) -> dict[str, torch.Tensor]:
    """One train message to ``node`` as the ServerApp sends it; the reply's arrays."""
    config = ConfigRecord({wire.SERVER_ROUND: server_round, wire.RUN_CONFIG: cfg.to_json()})
    content = RecordDict({wire.ARRAYS: ArrayRecord(state), wire.CONFIG: config})
    (reply,) = grid.send_and_receive([grid.create_message(content, "train", node, "g")])
    assert not reply.has_error(), reply.error.reason
    return reply.content[wire.ARRAYS].to_torch_state_dict()


def _weights(seed: int) -> dict[str, torch.Tensor]:
    """FedUL's one exchanged model ``f`` (small-cnn on MNIST), keyed as on the wire."""
    return nn.ModuleDict({"f": build_model("small-cnn", 1, 10, 28, seed=seed)}).state_dict()


def test_cached_model_carries_nothing_between_messages() -> None:
    cfg = resolve_config({"samples-per-client": 40, "num-sets": 10, "batch-size": 16})
    grid = InProcessGrid(client_module.app, 2, cfg.as_dict())
    a, b = _weights(0), _weights(1)
    assert all(key.startswith(wire.model_prefix("f")) for key in a)
    client_module._module.cache_clear()
    first = _train(grid, cfg, 1, a, 1)
    _train(grid, cfg, 2, b, 2)  # another client, other weights, through the same cached module
    again = _train(grid, cfg, 1, a, 1)
    client_module._module.cache_clear()  # a freshly built module
    fresh = _train(grid, cfg, 1, a, 1)
    assert first.keys() == a.keys()
    for key in first:
        torch.testing.assert_close(again[key], first[key], rtol=0, atol=1e-6)
        torch.testing.assert_close(fresh[key], first[key], rtol=0, atol=1e-6)
    assert client_module._module.cache_info().currsize == 1


def test_run_config_is_parsed_once_per_text() -> None:
    base = resolve_config({})
    text = base.to_json()
    one = config_from_json(text)
    assert one == base  # the client runs with exactly the server's resolution
    assert config_from_json(base.to_json()) is one  # an equal text: the cached object
    other = config_from_json(resolve_config({"seed": 5}).to_json())
    assert other.seed == 5 and one.seed == 0


def test_augment_section_renders_its_ratios_and_one_row_per_method() -> None:
    """``--markdown`` of the ``augment`` section: the views-to-model ratio and each method's
    round cost relative to supervised FedAvg come from the results, not from the text."""
    from fedul_flwr.experiments.benchmark import render_markdown

    results = json.loads((Path(__file__).parent.parent / "docs" / "benchmarks" / "augment.json").read_text())
    augment = results["augment"]
    augment["augmentation-over-forward-backward"] = 0.123
    augment["round-cost-over-supervised"]["fixmatch"] = 9.87
    text = render_markdown(results)
    assert "**0.12**" in text
    rows = [row for row in table_rows(text) if row[0].startswith("fixmatch")]
    assert [r[0] for r in rows] == ["fixmatch", "fixmatch-dpl"]
    assert rows[0][-1] == "9.9x"
    assert {"strong views", "forward + backward"} <= {row[0] for row in table_rows(text)}
