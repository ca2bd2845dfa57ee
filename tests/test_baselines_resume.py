"""Resumed runs of the compared methods that keep state between rounds: a run stopped after
round k and resumed (``resume=true``) records the rounds an uninterrupted run records and ends
with its weights, bit for bit -- FedMatch, whose server keeps every client's psi and embedding
to choose helpers (in the checkpoint), and RSCFed with teachers restarted every round, whose
consensus sub-sets are drawn per round. RSCFed's kept teachers live in the nodes' states, which
a resumed run does not have: the resumed run says so and starts them anew."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch

from fedul_flwr.checkpoint import CHECKPOINT_FILE, load_checkpoint
from fedul_flwr.client_app import app as client_app
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import get_method
from fedul_flwr.methods.fedmatch.helpers import HELPERS_SENT, FedMatchAggregation
from fedul_flwr.outputs import read_metrics
from fedul_flwr.preflight import resolve_config
from fedul_flwr.server_app import run_federation

FEDMATCH = {"method": "fedmatch", "client-setting": "labels-at-clients", "samples-per-client": 100, "num-labeled": 200,
            "fedmatch-helpers": 2, "fedmatch-helper-interval": 1, "device": "cpu"}  # fmt: skip
RSCFED = {"method": "rscfed", "client-setting": "annotation-heterogeneity", "label-layout": "L,P,U,U",
          "labeled-share": 0.4, "samples-per-client": 120, "batch-size": 32, "lr": 0.05, "local-optimizer": "sgd",
          "rscfed-subset-size": 2, "device": "cpu"}  # fmt: skip
CLOCK = ("wall-time",)  # the wall-clock column: the only one a resume may change


def _run(tmp_path: Path, base: dict[str, Any], nodes: int, **overrides: Any):
    rc = {**base, "output-dir": str(tmp_path), "min-available-nodes": nodes, "min-train-nodes": 1, **overrides}
    return run_federation(InProcessGrid(client_app, nodes, rc), resolve_config(rc))


def _learned(path: Path) -> list[dict[str, Any]]:
    """Every recorded round without its clock columns."""
    return [{k: v for k, v in row.items() if k not in CLOCK} for row in read_metrics(path)]


def _digest(path: Path) -> str:
    """SHA-256 of the final model's tensors (``model.pt``), in key order."""
    state = torch.load(path / "model.pt", weights_only=True)
    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode())
        h.update(state[key].contiguous().numpy().tobytes())
    return h.hexdigest()


def _stopped_and_resumed(tmp_path: Path, base: dict[str, Any], nodes: int, stop: int, rounds: int, **overrides: Any):
    """(the uninterrupted run, the run stopped after ``stop`` rounds and resumed to ``rounds``)."""
    full = _run(tmp_path, base, nodes, **{"num-rounds": rounds, "run-name": "full", **overrides})
    _run(tmp_path, base, nodes, **{"num-rounds": stop, "run-name": "part", **overrides})
    resumed = _run(tmp_path, base, nodes, **{"num-rounds": rounds, "run-name": "part", "resume": True, **overrides})
    return full, resumed


def test_fedmatch_resumed_after_round_two_continues_with_the_helpers_of_the_uninterrupted_run(
    tmp_path: Path, small_test_set: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 clients, 2 helpers every round: the resumed round 3 sends every client the helpers the
    uninterrupted run's round 3 sends (their number, the psi's themselves through the metrics
    and the weights), and the checkpoint holds the server's kept psi and embeddings."""
    sent: dict[str, list[tuple[int, int]]] = {}
    configure = FedMatchAggregation.configure_train

    def recording(self, server_round, arrays, config, grid):  # type: ignore[no-untyped-def]
        messages = configure(self, server_round, arrays, config, grid)
        run = str(self.run_config.run_name)
        sent.setdefault(run, []).extend((server_round, int(m.content["config"][HELPERS_SENT])) for m in messages)
        return messages

    monkeypatch.setattr(FedMatchAggregation, "configure_train", recording)
    full, resumed = _stopped_and_resumed(tmp_path, FEDMATCH, 3, stop=2, rounds=3)
    assert sorted(sent["full"]) == sorted(sent["part"]) and (3, 2) in sent["part"]  # helpers in the resumed round
    assert _learned(resumed.path) == _learned(full.path)
    assert _digest(resumed.path) == _digest(full.path)
    kept = load_checkpoint(resumed.path).strategy_state
    assert {"helper_psi", "helper_embeddings"} <= set(kept)
    assert sorted(kept["helper_embeddings"]["items"]) == ["0", "1", "2"]  # by node key (partition id)


def test_fedmatch_resumes_from_a_checkpoint_without_the_helper_state(
    tmp_path: Path, small_test_set: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint written before the helper state was saved still loads: the resumed round
    sends no helpers (nobody heard from yet), says so in one log line, and the run finishes."""
    _run(tmp_path, FEDMATCH, 3, **{"num-rounds": 1, "run-name": "old"})
    path = tmp_path / "old" / CHECKPOINT_FILE
    payload = torch.load(path, weights_only=True)
    payload["strategy_state"] = {k: v for k, v in payload["strategy_state"].items() if not k.startswith("helper_")}
    torch.save(payload, path)
    with caplog.at_level("INFO"):
        out = _run(tmp_path, FEDMATCH, 3, **{"num-rounds": 2, "run-name": "old", "resume": True})
    assert [r["round"] for r in read_metrics(out.path)] == [0, 1, 2]
    assert any("holds no helper state" in r.getMessage() for r in caplog.records)


def test_rscfed_resumed_after_round_one_records_the_rounds_of_the_uninterrupted_run(
    tmp_path: Path, small_test_set: None
) -> None:
    """4 clients, half of them a round, teachers restarted every round (``rscfed-teacher =
    "round"``, whose teacher lives within the round): the resumed rounds 2-3 draw the clients,
    the sub-sets and the weights of the uninterrupted run."""
    full, resumed = _stopped_and_resumed(tmp_path, RSCFED, 4, stop=1, rounds=3,
                                         **{"fraction-train": 0.5, "rscfed-teacher": "round"})  # fmt: skip
    assert _learned(resumed.path) == _learned(full.path)
    assert _digest(resumed.path) == _digest(full.path)


def test_rscfed_with_kept_teachers_says_a_resume_starts_them_anew(
    tmp_path: Path, small_test_set: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The kept teachers live in the nodes' states, which a resumed run does not have: the
    resumed run warns once, and in its first round every node with unlabeled images starts a
    new teacher from the global model with the count 0, as in round 1 of the run."""
    method = get_method("rscfed")
    original = method.local_update
    seen: list[tuple[int, int, bool, int]] = []  # (round, node key, new teacher, updates before the round)

    def recording(self, client, models, ctx, loop):  # type: ignore[no-untyped-def]
        new = self.fresh_teacher(client, models, ctx) if "unlabeled" in client.parts() else False
        result = original(self, client, models, ctx, loop)
        if "unlabeled" in client.parts():
            seen.append((ctx.server_round, ctx.node_key, new, self._earlier))
        return result

    monkeypatch.setattr(method, "local_update", recording)
    _run(tmp_path, RSCFED, 4, **{"num-rounds": 2, "run-name": "kept"})
    with caplog.at_level("WARNING"):
        _run(tmp_path, RSCFED, 4, **{"num-rounds": 3, "run-name": "kept", "resume": True})
    assert sum("mean teachers do not outlive" in r.getMessage() for r in caplog.records) == 1
    rounds = {r: sorted((node, new, earlier) for rr, node, new, earlier in seen if rr == r) for r in (1, 2, 3)}
    assert rounds[3] == [(node, True, 0) for node, _, _ in rounds[1]] and rounds[1]
    assert all(not new and earlier > 0 for _, new, earlier in rounds[2])
