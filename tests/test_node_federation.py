"""Deployment-style nodes (``node_config["data-dir"]``) in an in-process federation: a node
with bad data replies with an error naming the culprit, the server logs it and goes on with
the others; and a client's reply carries only f's arrays, scalar metrics and its node key."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedul_flwr import wire
from fedul_flwr.client_app import app as client_app
from fedul_flwr.preflight import resolve_config
from fedul_flwr.data.simulated import client_usets
from fedul_flwr.data.datasets import run_dataset_info
from fedul_flwr.data.sources import node_key
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.models import build_model
from fedul_flwr.node_data_cli import write_nodes
from fedul_flwr.server_app import run_federation
from fedul_flwr.strategies import NoSuccessfulReplyError

NODE_RECORD = wire.NODE_RECORD

ALLOWED_METRICS = {"train-loss", "num-examples", "uniform-weight", "num-steps"}


@pytest.fixture(scope="module")
def node_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three tiny node folders (10 sets x 12 images) written from the embedded sample."""
    cfg = resolve_config({"num-sets": 10, "seed": 5})
    return write_nodes(cfg, tmp_path_factory.mktemp("nodes"), 3, max_set_size=12)


def _run_config(tmp_path: Path, **extra: object) -> dict[str, object]:
    return {
        "num-sets": 10,
        "num-rounds": 2,
        "batch-size": 32,
        "min-available-nodes": 2,
        "min-train-nodes": 2,
        "device": "cpu",
        "output-dir": str(tmp_path / "runs"),
        **extra,
    }


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def flwr_log():
    handler = _Collect()
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


@pytest.mark.slow
def test_bad_node_is_logged_and_run_goes_on(node_dirs: list[Path], tmp_path: Path, flwr_log: list[str]) -> None:
    import shutil

    broken = tmp_path / "broken-node"
    shutil.copytree(node_dirs[2], broken)
    lines = (broken / "priors.csv").read_text().splitlines()
    lines[5] = lines[5].split(",", 1)[0] + "," + ",".join(["0.5"] * 10)  # set-04 sums to 5
    (broken / "priors.csv").write_text("\n".join(lines) + "\n")

    run_config = _run_config(tmp_path)
    node_configs = [{"data-dir": str(node_dirs[0])}, {"data-dir": str(node_dirs[1])}, {"data-dir": str(broken)}]
    grid = InProcessGrid(client_app, 3, run_config, node_configs=node_configs)
    outputs = run_federation(grid, resolve_config(run_config))

    rounds = [ln for ln in flwr_log if ln.startswith("aggregate_train:")]
    assert rounds == ["aggregate_train: Received 2 results and 1 failures"] * 2
    errors = [ln for ln in flwr_log if "Received error in reply from node 3" in ln]
    assert len(errors) == 2
    assert "NodeDataError" in errors[0] and str(broken / "priors.csv") in errors[0]
    assert "line 6" in errors[0] and "'set-04'" in errors[0]
    assert (outputs.path / "model.pt").is_file()
    assert sorted(r["round"] for r in outputs.rows.values() if "train-loss" in r) == [1, 2]


def test_all_nodes_bad_stops_with_the_reasons(node_dirs: list[Path], tmp_path: Path) -> None:
    run_config = _run_config(tmp_path, **{"num-rounds": 1})
    missing = [{"data-dir": str(tmp_path / f"gone-{i}")} for i in range(2)]
    grid = InProcessGrid(client_app, 2, run_config, node_configs=missing)
    with pytest.raises(NoSuccessfulReplyError) as err:
        run_federation(grid, resolve_config(run_config))
    assert str(tmp_path / "gone-0") in str(err.value) and str(tmp_path / "gone-1") in str(err.value)


def test_reply_holds_only_f_arrays_and_scalar_metrics(node_dirs: list[Path], tmp_path: Path) -> None:
    run_config = _run_config(tmp_path)
    cfg = resolve_config(run_config)
    info = run_dataset_info(cfg)
    model = build_model(cfg.model, info.channels, len(info.class_names), info.image_size)
    wire_state = {f"f.{k}": v for k, v in model.state_dict().items()}  # f's arrays, keyed as on the wire
    grid = InProcessGrid(client_app, 1, run_config, node_configs=[{"data-dir": str(node_dirs[0])}])
    config = ConfigRecord({wire.SERVER_ROUND: 1, wire.RUN_CONFIG: cfg.to_json(), wire.DATASET_FACTS: info.to_json()})
    content = RecordDict({"arrays": ArrayRecord(wire_state), "config": config})
    msg = grid.create_message(content, "train", dst_node_id=1, group_id="1")
    (reply,) = grid.send_and_receive([msg])
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""

    records = reply.content
    assert set(records.array_records) == {"arrays"} and set(records.metric_records) == {"metrics"}
    # plus the node's stable key, the server's aggregation order: a hash of the folder's path
    assert set(records.config_records) == {NODE_RECORD} and len(records) == 3
    assert dict(records.config_records[NODE_RECORD]) == {"node-key": node_key({"data-dir": str(node_dirs[0])}, 1)}
    arrays = records.array_records["arrays"]
    assert list(arrays.keys()) == list(wire_state.keys())
    for key, arr in arrays.to_torch_state_dict().items():
        assert arr.shape == wire_state[key].shape
    metrics = records.metric_records["metrics"]
    assert set(metrics) <= ALLOWED_METRICS
    for key, value in metrics.items():
        assert isinstance(value, (int, float)) and not isinstance(value, bool), (key, value)
    # the only count leaving the node is n_c, the FedAvg weight; no per-set size, no prior
    usets, _ = client_usets(resolve_config({"num-sets": 10, "seed": 5}), 0, 3)
    assert metrics["num-examples"] == 10 * 12
    secret = {float(v) for v in np.unique(usets.priors)} | {12.0}
    assert not secret & {float(v) for v in metrics.values()}
    # f's arrays only: no tensor shaped like the prior matrix, the images or the set labels
    shapes = {tuple(a.shape) for a in arrays.to_torch_state_dict().values()}
    assert (10, 10) not in shapes and (120,) not in shapes and not any(len(s) == 4 and s[0] == 120 for s in shapes)
