"""Correctness of the speed-ups of issue #6 (their speed is measured by scripts/benchmark.py,
never by tests): the numpy IID split equals Flower Datasets' IidPartitioner, and the
ClientApp's per-process caches (model module, resolved config) carry nothing over between
clients or rounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

import fedul_flwr.client_app as client_module
from fedul_flwr.config import resolve_config
from fedul_flwr.data.partition import _label_dataset, iid_partition
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.models import build_model


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


def _train(grid: InProcessGrid, node: int, state: dict[str, torch.Tensor], server_round: int) -> dict[str, torch.Tensor]:
    content = RecordDict({"arrays": ArrayRecord(state), "config": ConfigRecord({"server-round": server_round})})
    (reply,) = grid.send_and_receive([grid.create_message(content, "train", node, "g")])
    assert not reply.has_error(), reply.error.reason
    return reply.content["arrays"].to_torch_state_dict()


def test_cached_model_carries_nothing_between_messages() -> None:
    run_config = resolve_config({"samples-per-client": 40, "num-sets": 10, "batch-size": 16}).as_dict()
    grid = InProcessGrid(client_module.app, 2, run_config)
    torch.manual_seed(0)
    a = build_model("small-cnn", 1, 10, 28).state_dict()
    torch.manual_seed(1)
    b = build_model("small-cnn", 1, 10, 28).state_dict()
    client_module._module.cache_clear()
    first = _train(grid, 1, a, 1)
    _train(grid, 2, b, 2)  # another client, other weights, through the same cached module
    again = _train(grid, 1, a, 1)
    client_module._module.cache_clear()  # a freshly built module
    fresh = _train(grid, 1, a, 1)
    for key in first:
        torch.testing.assert_close(again[key], first[key], rtol=0, atol=1e-6)
        torch.testing.assert_close(fresh[key], first[key], rtol=0, atol=1e-6)
    assert client_module._module.cache_info().currsize == 1


def test_resolved_config_is_cached_per_run_config() -> None:
    base = resolve_config({}).as_dict()
    one = client_module._resolve(base)
    assert client_module._resolve(dict(base)) is one
    other = client_module._resolve({**base, "seed": 5})
    assert other.seed == 5 and one.seed == 0
