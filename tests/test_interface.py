"""The method interface end to end, with the test-only multi-model method of
``tests/dual_method.py``: several exchanged models aggregated with their own weights, a model
kept on the node, an uploaded K-vector consumed by the aggregation, a client that sends only
one model, labeled + unlabeled batches -- and every strategy composing with it. Also: the
apps never branch on a method's name, and a missing data part is a clear error."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fedul_flwr import server_app, wire
from fedul_flwr.client_app import app as client_app
from fedul_flwr.preflight import resolve_config
from fedul_flwr.data.client_data import MissingPartError
from fedul_flwr.data.simulated import load_run_dataset
from fedul_flwr.data.sources import client_from_node_config
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import METHODS, LocalTask, Stream, get_method
from fedul_flwr.strategies import STRATEGIES
from fedul_flwr.training import iterate_batches

DUAL = "tests.dual_method:Dual"
SMALL = {"method": DUAL, "samples-per-client": 96, "batch-size": 16, "num-rounds": 1}


pytestmark = pytest.mark.usefixtures("small_test_set")  # tests/conftest.py


class RecordingGrid(InProcessGrid):
    """An in-process grid that keeps every train reply and every message it sent."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[Message] = []
        self.replies: list[Message] = []

    def push_messages(self, messages):
        messages = list(messages)
        self.sent.extend(messages)
        return super().push_messages(messages)

    def pull_messages(self, message_ids):
        replies = list(super().pull_messages(message_ids))
        self.replies.extend(r for r in replies if r.metadata.message_type == "train")
        return replies


def _prefixed(record: ArrayRecord, model: str) -> dict[str, np.ndarray]:
    return {k: record[k].numpy() for k in record if k.startswith(f"{model}.")}


def test_two_models_aggregated_with_their_own_weights(tmp_path: Path) -> None:
    # three nodes: keys 0 and 2 train a, b (and c) on labeled + unlabeled batches; key 1 has
    # no labels (odd key) and sends b only
    rc = {**SMALL, "output-dir": str(tmp_path), "run-name": "dual"}
    grid = RecordingGrid(client_app, 3, rc)
    outputs = server_app.run_federation(grid, resolve_config(rc))
    replies = {int(r.content[wire.NODE_RECORD][wire.NODE_KEY]): r.content for r in grid.replies}
    assert sorted(replies) == [0, 1, 2]
    keys = {n: {wire.model_of(k) for k in c[wire.ARRAYS]} for n, c in replies.items()}
    assert keys == {0: {"a", "b"}, 1: {"b"}, 2: {"a", "b"}}  # c never leaves a node
    metrics = {n: c[wire.METRICS] for n, c in replies.items()}
    assert metrics[1]["num-labeled"] == 0 and metrics[0]["num-labeled"] == metrics[0]["num-unlabeled"] == 96
    # labeled + unlabeled batches: one epoch = one pass over the labeled stream (B = 16)
    assert metrics[0]["num-steps"] == math.ceil(96 / 16) and metrics[1]["num-steps"] == math.ceil(96 / 32)

    final_a = torch.load(outputs.path / "model.pt")
    final_b = torch.load(outputs.path / "model-b.pt")
    # a: mean over the clients that sent it, weighted by their labeled counts
    w_a = {n: metrics[n]["num-labeled"] for n in (0, 2)}
    # b: weighted by num-unlabeled * K * min(probe), the uploaded K-vector
    w_b = {n: metrics[n]["num-unlabeled"] * 10 * min(metrics[n]["probe"]) for n in (0, 1, 2)}
    assert len(set(np.round(list(w_b.values()), 6))) == 3  # the probe makes the weights differ
    for model, weights, final in (("a", w_a, final_a), ("b", w_b, final_b)):
        total = sum(weights.values())
        for name, value in final.items():
            expected = sum(w * replies[n][wire.ARRAYS][f"{model}.{name}"].numpy() for n, w in weights.items()) / total
            np.testing.assert_allclose(value.numpy(), expected, rtol=1e-5, atol=1e-6, err_msg=f"{model}.{name}")
    # every predictor is evaluated centrally and recorded per round
    row = outputs.rows[1]
    for column in ("test-accuracy", "test-accuracy-b", "test-accuracy-ensemble", "train-loss"):
        assert column in row and math.isfinite(row[column])
    # the kept model lives in each node's context.state
    for context in grid.contexts.values():
        assert set(context.state.array_records) == {wire.KEPT_MODEL_STATE + "c"}


def _train_message(grid: InProcessGrid, cfg, server_round: int, arrays: ArrayRecord) -> Message:
    content = RecordDict(
        {
            wire.ARRAYS: arrays,
            wire.CONFIG: ConfigRecord({wire.SERVER_ROUND: server_round, wire.RUN_CONFIG: cfg.to_json()}),
        }
    )
    msg = grid.create_message(content, "train", 1, "g")
    msg.metadata.__dict__["_message_id"] = f"m{server_round}"
    return msg


def test_kept_model_continues_from_the_nodes_state(tmp_path: Path) -> None:
    rc = {**SMALL, "output-dir": str(tmp_path)}
    cfg = resolve_config(rc)
    grid = InProcessGrid(client_app, 1, rc)
    method = get_method(cfg.method)(cfg)
    arrays = ArrayRecord(server_app.global_models(cfg, method, 1, 10, 28).state_dict())
    node = grid.contexts[1]
    client_app(_train_message(grid, cfg, 1, arrays), node)
    after_1 = node.state[wire.KEPT_MODEL_STATE + "c"]
    client_app(_train_message(grid, cfg, 2, arrays), node)
    after_2 = node.state[wire.KEPT_MODEL_STATE + "c"].to_torch_state_dict()

    def round_2_from(state: RecordDict) -> dict[str, torch.Tensor]:
        context = Context(run_id=1, node_id=1, node_config=dict(node.node_config), state=state, run_config={})
        client_app(_train_message(grid, cfg, 2, arrays), context)
        return context.state[wire.KEPT_MODEL_STATE + "c"].to_torch_state_dict()

    resumed = round_2_from(RecordDict({wire.KEPT_MODEL_STATE + "c": after_1}))
    assert all(torch.equal(resumed[k], after_2[k]) for k in after_2)  # round 2 started from round 1's c
    fresh = round_2_from(RecordDict())
    assert any(not torch.equal(fresh[k], after_2[k]) for k in after_2)


@pytest.mark.parametrize("strategy", STRATEGIES.names())
def test_every_strategy_aggregates_each_model_of_a_multi_model_method(strategy: str, tmp_path: Path) -> None:
    rc = {**SMALL, "strategy": strategy, "output-dir": str(tmp_path), "run-name": strategy, "samples-per-client": 48}
    if strategy == "scaffold":
        rc["local-optimizer"] = "sgd"
    if strategy == "fedprox":
        rc["proximal-mu"] = 0.1
    nodes = 2  # key 0: a and b; key 1: b only
    if strategy in ("krum", "multikrum", "bulyan"):  # at least 3 senders of each model (Krum 2f + 3, Bulyan 4f + 3)
        nodes = 5  # keys 0, 2, 4 send a and b; keys 1, 3 only b
        rc.update({"min-available-nodes": nodes, "min-train-nodes": nodes})
    grid = RecordingGrid(client_app, nodes, rc)
    outputs = server_app.run_federation(grid, resolve_config(rc))
    initial = server_app.global_models(resolve_config(rc), get_method(DUAL)(resolve_config(rc)), 1, 10, 28)
    for model, path in (("a", "model.pt"), ("b", "model-b.pt")):
        final = torch.load(outputs.path / path)
        assert all(torch.isfinite(v.float()).all() for v in final.values())
        start = initial[model].state_dict()
        assert any(not torch.equal(final[k], start[k]) for k in final), f"{strategy} left {model} unchanged"
    if strategy == "scaffold":  # control variates for each model a client trained and sent
        deltas = {int(r.content[wire.NODE_RECORD][wire.NODE_KEY]): r.content[wire.CV_DELTA] for r in grid.replies}
        assert {wire.model_of(k) for k in deltas[0]} == {"a", "b"} and {wire.model_of(k) for k in deltas[1]} == {"b"}
    if strategy == "fedprox":
        assert all(m.content[wire.CONFIG][wire.PROXIMAL_MU] == 0.1 for m in grid.sent)


def test_streams_first_drives_the_epoch_the_others_cycle() -> None:
    first = Stream({"x": torch.arange(10), "i": torch.arange(10)}, 4, images=())
    second = Stream({"x": torch.arange(100, 106)}, 4, images=())
    task = LocalTask({"labeled": first, "unlabeled": second}, loss=lambda models, batch: torch.zeros(()))
    batches = list(iterate_batches(task, torch.Generator().manual_seed(0), torch.device("cpu"), lambda x: x))
    assert len(batches) == 3  # ceil(10 / 4) steps, driven by the first stream
    assert sorted(torch.cat([b["labeled"]["i"] for b in batches]).tolist()) == list(range(10))
    seen = torch.cat([b["unlabeled"]["x"] for b in batches]).tolist()
    # batches of 4 and 2 (a full pass), then a new, reshuffled pass
    assert [len(b["unlabeled"]["x"]) for b in batches] == [4, 2, 4] and sorted(seen[:6]) == list(range(100, 106))
    again = list(iterate_batches(task, torch.Generator().manual_seed(0), torch.device("cpu"), lambda x: x))
    assert all(torch.equal(a["unlabeled"]["x"], b["unlabeled"]["x"]) for a, b in zip(batches, again))


def test_missing_part_names_method_part_and_node(tmp_path: Path) -> None:
    cfg = resolve_config({})
    with pytest.raises(MissingPartError, match=r"method 'needs-prior' needs the 'class-prior' part.*simulated partition 0 of 2"):
        client_from_node_config(cfg, {"partition-id": 0, "num-partitions": 2}, method="needs-prior", parts=["class-prior"])
    # a deployed node without labels, asked for by the supervised reference
    from fedul_flwr.data.simulated import client_usets
    from fedul_flwr.data.node_folder.writer import write_node_dir

    data = load_run_dataset(cfg)
    usets, _ = client_usets(resolve_config({"samples-per-client": 100}), 0, 2)
    node = write_node_dir(tmp_path / "node", data.train_x, usets, data.class_names, max_set_size=5)
    with pytest.raises(MissingPartError, match=rf"method 'supervised' needs the 'labeled' part.*{re.escape(str(node))}"):
        from fedul_flwr.data.datasets import run_dataset_info

        client_from_node_config(cfg, {"data-dir": str(node)}, method="supervised", parts=["labeled"],
                                facts=run_dataset_info(cfg))


def test_apps_never_branch_on_a_method_name() -> None:
    package = Path(server_app.__file__).parent
    sources = {p.name: p.read_text() for p in package.glob("*app*.py")}
    assert set(sources) == {"client_app.py", "server_app.py"}
    for name in METHODS.names():
        for file, text in sources.items():
            assert not re.search(rf"""["']{re.escape(name)}["']""", text), (file, name)


def test_a_node_data_dir_that_cannot_be_resolved_names_the_key(tmp_path: Path) -> None:
    """A SuperNode's ``data-dir`` node config bypasses the run config's check: its symlink
    loop is a NodeDataError naming the key, not a bare RuntimeError."""
    from fedul_flwr.data.datasets import run_dataset_info
    from fedul_flwr.data.node_folder.layout import NodeDataError

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    cfg = resolve_config({})
    with pytest.raises(NodeDataError, match=re.escape(f"data-dir={str(tmp_path / 'a')!r}: the path cannot be resolved")):
        client_from_node_config(cfg, {"data-dir": str(tmp_path / "a")}, method="fedul", parts=["usets"],
                                facts=run_dataset_info(cfg))
