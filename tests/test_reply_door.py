"""The one door every training reply goes through (fedul_flwr.strategies.admission), measured
on crafted replies through the project's real strategies (built by ``build_strategy`` from run
settings, the DP wrapper included): a hostile node's claimed weight moves server DP's noiseless
release by at most C/n, and a malformed reply (shape, dtype, missing or extra arrays, records or
metrics, a weight that is no positive number) is its node's named failed reply in every mode,
never a crash of the round."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedul_flwr import wire
from fedul_flwr.preflight import resolve_config
from fedul_flwr.client_app import app as client_app
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.strategies import STRATEGIES, build_strategy, inner_strategy

NODES = 4
CLIP = 0.5
# written out by hand (not read from the contract): the strategies server-side DP accepts
SERVER_DP_STRATEGIES = ("fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad")
GLOBAL = {"f.w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "f.b": np.zeros(4, np.float32),
          "f.n": np.array(3, dtype=np.int64)}  # fmt: skip


def _update(seed: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (scale * rng.standard_normal(v.shape)).astype(v.dtype) if v.dtype.kind == "f" else np.zeros_like(v)
            for k, v in GLOBAL.items()}  # fmt: skip


def _reply(instruction: Message, update: dict[str, np.ndarray], weight: object = 1.0, **changes: object) -> Message:
    arrays = {k: GLOBAL[k] + update[k] for k in GLOBAL}
    metrics = {wire.TRAIN_LOSS: 0.5, wire.NUM_EXAMPLES: 10, wire.UNIFORM_WEIGHT: 1, wire.NUM_STEPS: 2}
    metrics[wire.UNIFORM_WEIGHT] = metrics[wire.NUM_EXAMPLES] = weight  # type: ignore[assignment]
    content = RecordDict({wire.ARRAYS: ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()}),
                          wire.METRICS: MetricRecord(metrics),
                          wire.NODE_RECORD: ConfigRecord({wire.NODE_KEY: instruction.metadata.dst_node_id})})  # fmt: skip
    if "scaffold" in changes:  # the honest SCAFFOLD client: its control variate's change and round count
        changes.pop("scaffold")
        content[wire.METRICS] = MetricRecord({**metrics, wire.CV_ROUNDS: 1.0})
        content[wire.CV_DELTA] = ArrayRecord({k: Array(np.zeros_like(v)) for k, v in GLOBAL.items()})
    for name, change in changes.items():
        change(content)  # type: ignore[operator]
    return Message(content, reply_to=instruction)


def _round(strategy: str, mode: str, replies: dict[int, dict]) -> tuple:
    """One round of ``strategy`` under ``mode`` on 4 nodes whose replies are ``replies[node]``
    (keyword arguments of :func:`_reply`); the aggregate, the release and the strategy."""
    values = {"strategy": strategy, "differential-privacy": mode, "dp-clipping-norm": CLIP, "dp-noise-multiplier": 1e-9,
              "min-available-nodes": NODES, "min-train-nodes": 3, "num-malicious-nodes": 0}  # fmt: skip
    cfg = resolve_config(values)
    built = build_strategy(cfg, None, num_nodes=NODES)
    grid = InProcessGrid(client_app, NODES, values)
    initial = ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})
    instructions = list(built.configure_train(1, initial, ConfigRecord({wire.RUN_CONFIG: cfg.to_json()}), grid))
    for m in instructions:
        m.metadata.__dict__["_message_id"] = uuid.uuid4().hex
    sent = [_reply(m, **replies[m.metadata.dst_node_id]) for m in instructions]
    arrays, _ = built.aggregate_train(1, sent)
    return arrays, getattr(inner_strategy(built), "dp_release", None), inner_strategy(built)


def _norm(a: ArrayRecord, b: ArrayRecord) -> float:
    return float(np.sqrt(sum(np.sum((a[k].numpy().astype(np.float64) - b[k].numpy()) ** 2) for k in a.keys())))


@pytest.mark.parametrize("mode", ["server-fixed", "server-adaptive"])
@pytest.mark.parametrize("strategy", SERVER_DP_STRATEGIES)
@pytest.mark.parametrize("claimed", [-2.999, 1e6, 1e-9])
def test_a_hostile_weight_moves_the_noiseless_release_by_at_most_c_over_n(strategy: str, mode: str, claimed: float) -> None:
    """Node 1 claims ``claimed`` as its weight (the honest ClientApp sends 1); honest node 2
    sends a zero update, then one 100 times C: the release moves by exactly C/n, n the replies
    kept (4; 3 where the door refuses a weight that is no number > 0)."""
    base = {1: {"update": _update(1, 50.0), "weight": claimed}, 3: {"update": _update(3)}, 4: {"update": _update(4)}}
    _, quiet, _ = _round(strategy, mode, {**base, 2: {"update": _update(2, 0.0)}})
    _, loud, inner = _round(strategy, mode, {**base, 2: {"update": _update(2, 100.0)}})
    if claimed > 0:  # kept, weighing 1 like every other reply
        assert inner.last_replies.trained == [1, 2, 3, 4] and not inner.last_replies.failed
    else:  # refused at the door
        assert inner.last_replies.failed == [(1, "MalformedReplyError")] and inner.last_replies.trained == [2, 3, 4]
    moved = _norm(quiet, loud) / (CLIP / len(inner.last_replies.trained))
    assert 1 - 1e-4 <= moved <= 1 + 1e-4, moved


def _shape(c: RecordDict) -> None:
    c[wire.ARRAYS]["f.w"] = Array(np.zeros((4, 3), np.float32))


def _dtype(c: RecordDict) -> None:
    c[wire.ARRAYS]["f.w"] = Array(np.zeros((3, 4), np.int32))


def _missing_key(c: RecordDict) -> None:
    del c[wire.ARRAYS]["f.b"]


def _extra_key(c: RecordDict) -> None:
    c[wire.ARRAYS]["f.extra"] = Array(np.zeros(2, np.float32))


def _extra_record(c: RecordDict) -> None:
    c["other"] = ArrayRecord({"f.w": Array(np.zeros((3, 4), np.float32))})


def _no_metrics(c: RecordDict) -> None:
    del c[wire.METRICS]


def _extra_metric(c: RecordDict) -> None:
    c[wire.METRICS] = MetricRecord({**c[wire.METRICS], "secret": 1.0})


def _nan(c: RecordDict) -> None:
    c[wire.ARRAYS]["f.w"] = Array(np.full((3, 4), np.nan, np.float32))


def _inf(c: RecordDict) -> None:
    c[wire.ARRAYS]["f.b"] = Array(np.array([0, np.inf, 0, 0], np.float32))


def _list_metric(c: RecordDict) -> None:  # Flower's metric averaging raised on a list beside numbers
    c[wire.METRICS] = MetricRecord({**c[wire.METRICS], wire.TRAIN_LOSS: [0.5, 0.5]})


def _missing_metric(c: RecordDict) -> None:
    c[wire.METRICS] = MetricRecord({k: v for k, v in c[wire.METRICS].items() if k != wire.TRAIN_LOSS})


MALFORMED = {"shape": {"shape": _shape}, "dtype": {"dtype": _dtype}, "missing-key": {"missing": _missing_key},
             "extra-key": {"extra": _extra_key}, "extra-record": {"record": _extra_record},
             "no-metrics": {"metrics": _no_metrics}, "extra-metric": {"metric": _extra_metric},
             "missing-metric": {"metric": _missing_metric}, "list-metric": {"metric": _list_metric},
             "nan-array": {"nan": _nan}, "inf-array": {"inf": _inf}, "negative-weight": {"weight": -2.999},
             "zero-weight": {"weight": 0}, "nan-weight": {"weight": float("nan")}, "inf-weight": {"weight": float("inf")},
             "list-weight": {"weight": [1.0, 2.0]}}  # fmt: skip
MODES = [(s, "none") for s in STRATEGIES.names()] + [(s, m) for s in SERVER_DP_STRATEGIES
                                                      for m in ("server-fixed", "server-adaptive")]  # fmt: skip


@pytest.mark.parametrize("kind", MALFORMED)
@pytest.mark.parametrize(("strategy", "mode"), MODES)
def test_a_malformed_reply_is_its_nodes_named_failed_reply(strategy: str, mode: str, kind: str) -> None:
    side = {"scaffold": True} if strategy == "scaffold" else {}
    replies = {n: {"update": _update(n, 0.01), **side} for n in range(1, NODES + 1)}
    replies[1] = {**replies[1], **MALFORMED[kind]}
    arrays, _, inner = _round(strategy, mode, replies)
    assert inner.last_replies.failed == [(1, "MalformedReplyError")], inner.last_replies
    assert inner.last_replies.trained == [2, 3, 4]
    assert arrays is not None and sorted(arrays.keys()) == sorted(GLOBAL)
    assert all(arrays[k].numpy().shape == GLOBAL[k].shape and np.isfinite(arrays[k].numpy()).all() for k in GLOBAL)


class _OneHostileNode(InProcessGrid):
    """The in-process federation in which the node ``hostile`` adds the undeclared metric
    ``secret-label-count`` to its training replies, which arrive ``first`` or last."""

    def __init__(self, *args: object, hostile_first: bool, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.hostile = min(self.get_node_ids())
        self.hostile_first = hostile_first

    def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
        replies = list(super().pull_messages(message_ids))
        for reply in replies:
            if reply.metadata.src_node_id == self.hostile and not reply.has_error() and wire.ARRAYS in reply.content:
                reply.content[wire.METRICS] = MetricRecord({**reply.content[wire.METRICS], "secret-label-count": 7.0})
        replies.sort(key=lambda r: (r.metadata.src_node_id == self.hostile) != self.hostile_first)
        return replies


@pytest.mark.parametrize("hostile_first", [True, False])
@pytest.mark.parametrize("mode", ["none", "server-fixed"])
def test_an_undeclared_metric_key_refuses_that_reply_not_the_honest_one(
    hostile_first: bool, mode: str, tmp_path, small_test_set: None  # type: ignore[no-untyped-def]
) -> None:
    """Two nodes, one adding a metric key the contract does not declare: the door refuses that
    reply (whichever arrives first; two replies are no majority), keeps the honest one, and the
    run goes on."""
    import json

    from fedul_flwr.server_app import run_federation

    rc = {"samples-per-client": 60, "batch-size": 64, "num-rounds": 1, "min-train-nodes": 1, "min-available-nodes": 2,
          "differential-privacy": mode, "output-dir": str(tmp_path), "run-name": "door"}  # fmt: skip
    grid = _OneHostileNode(client_app, 2, rc, hostile_first=hostile_first)
    honest = max(grid.get_node_ids())
    outputs = run_federation(grid, resolve_config(rc))
    assert "status=ok" in outputs.summary()
    row = json.loads((tmp_path / "door" / "metrics.json").read_text())[-1]
    assert row["round"] == 1 and row["failed-replies"] == 1
    assert row["failed-nodes"] == [[grid.hostile, "MalformedReplyError"]] and row["trained-nodes"] == [honest]


class _ForgedMetric(InProcessGrid):
    """The in-process federation in which the lowest node id replaces its training replies'
    metric ``key`` by ``value``."""

    def __init__(self, *args: object, key: str, value: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.hostile, self.key, self.value = min(self.get_node_ids()), key, value

    def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
        replies = list(super().pull_messages(message_ids))
        for reply in replies:
            if reply.metadata.src_node_id == self.hostile and not reply.has_error() and len(reply.content[wire.ARRAYS]):
                reply.content[wire.METRICS] = MetricRecord({**reply.content[wire.METRICS], self.key: self.value})
        return replies


@pytest.mark.parametrize(("method", "key", "value"), [("rscfed", "num-labeled", [1.0, 2.0]),
                                                      ("semifl", "app-u", 0.1)])  # fmt: skip
def test_a_metric_of_the_wrong_kind_is_that_nodes_failed_reply(method: str, key: str, value: object, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """RSCFed's aggregation reads each reply's ``num-labeled`` (one number; a list made it raise
    in the middle of the round) and FedDB's plug-in uploads ``app-u`` (K floats): a reply whose
    declared metric is of the other kind is refused at the door, named, and the run goes on."""
    from fedul_flwr.server_app import run_federation

    rc = {"method": method, "client-setting": "labels-at-clients", "num-labeled": 60, "samples-per-client": 60,
          "batch-size": 16, "num-rounds": 1, "min-train-nodes": 1, "min-available-nodes": 3, "dpl": method == "semifl",
          "fixmatch-threshold": 0.0, "output-dir": str(tmp_path), "run-name": "kind"}  # fmt: skip
    grid = _ForgedMetric(client_app, 3, rc, key=key, value=value)
    outputs = run_federation(grid, resolve_config(rc))
    row = outputs.rows[1]
    assert row["failed-nodes"] == [[grid.hostile, "MalformedReplyError"]] and len(row["trained-nodes"]) == 2, row
    assert outputs.status == "ok"
