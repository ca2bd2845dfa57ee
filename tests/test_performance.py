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
from fedul_flwr.preflight import resolve_config
from fedul_flwr.config import RunConfig, config_from_json
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
    assert client_module._module.currsize == 1


def test_run_config_is_parsed_once_per_text() -> None:
    base = resolve_config({})
    text = base.to_json()
    one = config_from_json(text)
    assert one == base  # the client runs with exactly the server's resolution
    assert config_from_json(base.to_json()) is one  # an equal text: the cached object
    other = config_from_json(resolve_config({"seed": 5}).to_json())
    assert other.seed == 5 and one.seed == 0


def test_augment_section_renders_its_ratios_per_model_and_the_fedul_round() -> None:
    """``--markdown`` of the ``augment`` section: each model's row carries the step time and
    each augmentation's ratio to it, and the FedUL round ratio, from the results."""
    from fedul_flwr.experiments.benchmark import render_markdown

    results = json.loads((Path(__file__).parent.parent / "docs" / "benchmarks" / "augment.json").read_text())
    augment = results["augment"]
    assert set(augment["per-batch"]) == {"small-cnn", "wrn-28-2"}
    augment["per-batch"]["small-cnn"]["over-model-step"]["strong"] = 0.123
    augment["per-batch"]["wrn-28-2"]["median-s"]["model step"] = 1.5
    augment["fedul-round"]["rotate-over-none"] = 1.0456
    text = render_markdown(results)
    rows = {row[0]: row for row in table_rows(text) if row[0].startswith("`")}
    main = {cell.split(" ")[0]: row for cell, row in rows.items() if "views of" not in cell}
    assert set(main) == {"`small-cnn`", "`wrn-28-2`"}
    baseline = augment["setting"].get("baseline")
    assert not baseline or sum(f"views of `{baseline}`" in cell for cell in rows) == 2
    assert main["`small-cnn`"][3].endswith("(0.12x)")  # the strong column
    assert main["`wrn-28-2`"][1] == "1500.0 ms"
    assert "**1.046x**" in text
