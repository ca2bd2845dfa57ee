"""Nothing to train is not a failure: a client whose method has nothing to train this round
replies with no model and zero examples; every aggregation path leaves it out, metrics.csv
counts it (``idle-replies``), and only real errors count toward ``max-failure-fraction``.

Each run is an in-process federation (the real ServerApp logic and ClientApp, no Ray) on the
embedded MNIST sample."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedul_flwr.preflight import resolve_config
from fedul_flwr.client_app import app as client_app
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods.supervised import Supervised
from fedul_flwr.server_app import run_federation
from fedul_flwr.strategies import STRATEGIES, strict

pytestmark = pytest.mark.usefixtures("small_test_set")  # central evaluation on 500 test images (tests/conftest.py)


class PlainSupervised(Supervised):
    """Supervised FedAvg without an aggregation mixin: the run's strategy alone (Flower's
    FedAvg, FedNova, SCAFFOLD, ...) sees the replies, the idle ones' included."""

    def aggregation(self) -> type | None:
        return None


def _run(tmp_path: Path, name: str, clients: int = 3, **settings: object):
    rc = {"output-dir": str(tmp_path), "run-name": name, "num-rounds": 2, "samples-per-client": 150,
          "batch-size": 32, "device": "cpu", "min-available-nodes": clients, "min-train-nodes": clients, **settings}  # fmt: skip
    outputs = run_federation(InProcessGrid(client_app, clients, rc), resolve_config(rc))
    with (outputs.path / "metrics.csv").open() as fh:
        return outputs, list(csv.DictReader(fh))


def test_hassle_clients_without_a_confident_pseudo_label_sit_out_and_the_run_goes_on(tmp_path: Path) -> None:
    """HASSLE with a threshold no pseudo-label reaches (1.0; the paper's 0.95 does the same to
    a client whose model is not yet confident): the two unlabeled clients of three have
    nothing to train. Before, each raised "nothing to train", counted as a failed reply, and
    2 of 3 failed replies stopped the run at the default max-failure-fraction=0.5."""
    outputs, rows = _run(tmp_path, "hassle", method="hassle", **{
        "client-setting": "annotation-heterogeneity", "label-layout": "L,U,U", "labeled-share": 0.5,
        "hassle-threshold": 1.0})  # fmt: skip
    assert [(r["round"], r["failed-replies"], r["idle-replies"]) for r in rows] == [("0", "", ""), ("1", "0", "2"),
                                                                                  ("2", "0", "2")]  # fmt: skip
    line = (outputs.path / "summary.txt").read_text()
    assert "failed-replies=0 " in line and "idle-replies=4 " in line and "clients=1 " in line and "status=ok" in line
    metrics = json.loads((outputs.path / "metrics.json").read_text())
    assert all(len(r["trained-nodes"]) == 1 for r in metrics[1:])


def test_fixmatch_clients_without_a_used_example_are_idle_not_failed(tmp_path: Path) -> None:
    """FixMatch weighted by the examples used (``fixmatch-weight='used'``) with a threshold no
    pseudo-label reaches: the two unlabeled clients used no example; each replies with no
    model and zero examples, counted as idle, and the run trains on the labeled client."""
    outputs, rows = _run(tmp_path, "fixmatch", method="fixmatch", **{
        "client-setting": "annotation-heterogeneity", "label-layout": "L,U,U", "labeled-share": 0.5,
        "fixmatch-threshold": 1.0, "fixmatch-weight": "used"})  # fmt: skip
    assert [(r["failed-replies"], r["idle-replies"]) for r in rows[1:]] == [("0", "2"), ("0", "2")]
    assert "clients=1 " in (outputs.path / "summary.txt").read_text()


@pytest.mark.parametrize("strategy", ["fedavg", "fedprox", "fednova", "scaffold", "fedadam", "fedmedian"])
def test_every_strategy_leaves_idle_replies_out(tmp_path: Path, strategy: str) -> None:
    """The unlabeled client of "L,P,U" has nothing to train under supervised FedAvg; with no
    method mixin the strategy itself would get its empty reply (before: Flower's strategies and
    FedNova stopped the run with InconsistentMessageReplies, "All ArrayRecords must have the
    same keys", SCAFFOLD likewise): the screening before every strategy leaves it out, and the
    run counts it as idle, not failed."""
    method = f"{__name__}:PlainSupervised"
    outputs, rows = _run(tmp_path, strategy, method=method, strategy=strategy, **{
        "client-setting": "annotation-heterogeneity", "label-layout": "L,P,U", "labeled-share": 0.5})  # fmt: skip
    assert [(r["failed-replies"], r["idle-replies"]) for r in rows[1:]] == [("0", "1"), ("0", "1")]
    assert math.isfinite(float(rows[-1]["test-loss"])) and rows[-1]["test-accuracy"] != rows[0]["test-accuracy"]
    assert "clients=2 " in (outputs.path / "summary.txt").read_text()


def test_feddb_dma_and_server_dp_leave_idle_replies_out(tmp_path: Path) -> None:
    """FedDB's DMA (weights from the APP-U of the replies that trained) and Flower's server-side
    DP wrapper (its noise divided by the clipped updates): the client that trains nothing
    (FixMatch-DPL needs labels and unlabeled images; "L" has no unlabeled image) is idle."""
    _, rows = _run(tmp_path, "feddb", method="feddb", **{
        "client-setting": "annotation-heterogeneity", "label-layout": "L,P,P", "labeled-share": 0.5})  # fmt: skip
    assert [(r["failed-replies"], r["idle-replies"]) for r in rows[1:]] == [("0", "1"), ("0", "1")]
    _, rows = _run(tmp_path, "dp", method="supervised", **{
        "client-setting": "annotation-heterogeneity", "label-layout": "L,P,U", "labeled-share": 0.5,
        "differential-privacy": "server-fixed", "dp-noise-multiplier": 0.1, "dp-clipping-norm": 10.0})  # fmt: skip
    assert [(r["failed-replies"], r["idle-replies"]) for r in rows[1:]] == [("0", "1"), ("0", "1")]


def _screen(strategy_name: str, replies: dict[int, RecordDict]) -> tuple:
    """One training round of ``strict(<strategy>)`` (no method mixin) over nodes answering
    ``replies``; returns (arrays, metrics, the strategy)."""
    app = ClientApp()

    @app.train()
    def _reply(msg: Message, context: Context) -> Message:
        return Message(replies[context.node_id], reply_to=msg)

    cls, specific = STRATEGIES.get(strategy_name)(resolve_config({"strategy": strategy_name}))
    strategy = strict(cls)(min_available_nodes=len(replies), min_train_nodes=1, **specific)
    grid = InProcessGrid(app, len(replies), {})
    current = ArrayRecord({"f.p": Array(np.full(2, 1.0, dtype=np.float32))})
    arrays, metrics = strategy.aggregate_train(1, list(grid.send_and_receive(strategy.configure_train(1, current, ConfigRecord(), grid))))
    return arrays, metrics, strategy


def _reply(value: float | None, n: int) -> RecordDict:
    arrays = ArrayRecord() if value is None else ArrayRecord({"f.p": Array(np.full(2, value, dtype=np.float32))})
    metrics = MetricRecord({"num-examples": n, "train-loss": 1.0, "num-steps": 5 if n else 0})
    return RecordDict({"arrays": arrays, "metrics": metrics})


@pytest.mark.parametrize("strategy", ["fedavg", "fednova"])
def test_a_round_where_every_client_is_idle_keeps_the_model(strategy: str) -> None:
    """Every reply idle (weights all 0): no division by zero, no failure; the strategy returns
    no arrays (Flower keeps the global model) and the idle nodes go on record. With one
    trained reply, the aggregate is that reply's model."""
    arrays, metrics, strict_strategy = _screen(strategy, {1: _reply(None, 0), 2: _reply(None, 0)})
    assert arrays is None and metrics is None
    assert strict_strategy.last_replies.idle == [1, 2] and strict_strategy.last_replies.failed == []
    arrays, _, strict_strategy = _screen(strategy, {1: _reply(None, 0), 2: _reply(3.0, 100)})
    assert float(arrays["f.p"].numpy()[0]) == pytest.approx(3.0)
    assert strict_strategy.last_replies.trained == [2] and strict_strategy.last_replies.idle == [1]
