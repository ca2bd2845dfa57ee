"""The run folder's life (:class:`fedul_flwr.outputs.RunOutputs`): one writer per folder,
nothing changed by a refused start, atomic tables, a summary for a failed run too, and
failures named by the node they happened on.

Each run is an in-process federation (the real ServerApp logic and ClientApp, no Ray) on the
embedded MNIST sample; the real-deployment counterpart (a SuperNode killed mid-run) is in
``tests/test_deployment.py``."""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import re
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.simulation.ray_transport.ray_actor import VirtualClientEngineActor

from fedul_flwr import outputs as outputs_module
from fedul_flwr import server_app, wire
from fedul_flwr.checkpoint import CheckpointError
from fedul_flwr.preflight import resolve_config
from fedul_flwr.client_app import app as client_app
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.outputs import RunFolderInUse, RunOutputs
from fedul_flwr.store import FolderLock, lock_path
from fedul_flwr.server_app import run_federation
from fedul_flwr.strategies import NoSuccessfulReplyError, error_type

pytestmark = pytest.mark.usefixtures("small_test_set")  # central evaluation on 500 test images (tests/conftest.py)

CHEAP = {"num-sets": 10, "samples-per-client": 150, "batch-size": 32, "device": "cpu", "seed": 4,
         "min-available-nodes": 2, "min-train-nodes": 2}  # fmt: skip


def _settings(tmp_path: Path, **overrides: object) -> dict:
    return {**CHEAP, "output-dir": str(tmp_path / "runs"), **overrides}


def _run(tmp_path: Path, clients: int = 2, grid: InProcessGrid | None = None, **overrides: object) -> RunOutputs:
    run_config = _settings(tmp_path, **overrides)
    return run_federation(grid or InProcessGrid(client_app, clients, run_config), resolve_config(run_config))


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
        if ".locks" not in p.relative_to(root).parts  # who last held a folder's lock, not a run's content
    }


def _csv(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as fh:
        return list(csv.DictReader(fh))


# --------------------------------------------------------------------------- one writer


def _free(run_dir: Path) -> bool:
    """Whether no process holds ``run_dir``'s lock (taken and given back here)."""
    try:
        FolderLock.acquire(run_dir).release()
    except RunFolderInUse:
        return False
    return True


def test_two_runs_creating_one_folder_at_once_one_wins(tmp_path: Path) -> None:
    """Eight threads create the same named run folder at the same instant: exactly one gets
    it; the others are refused (the folder is in use, or already holds the winner's run)."""
    cfg = resolve_config(_settings(tmp_path, **{"run-name": "race"}))
    start = threading.Barrier(8)
    won: list[RunOutputs] = []
    refused: list[Exception] = []

    def create() -> None:
        start.wait()
        try:
            won.append(RunOutputs.create(cfg))
        except (RunFolderInUse, FileExistsError) as exc:
            refused.append(exc)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 7, (won, refused)
    won[0].finish()
    assert _free(won[0].path)


def test_a_second_resume_while_the_run_is_alive_is_refused_with_its_pid(tmp_path: Path, monkeypatch) -> None:
    """While a run trains its round 2 (its checkpoint of round 1 on disk), a ``resume=true``
    of the same run folder is refused, naming the live run's PID, and changes nothing; the
    live run finishes undisturbed. Before, both trained into the folder."""
    original = server_app.save_checkpoint
    attempts: list[tuple[Exception | None, bool]] = []

    def then_resume(run_dir, server_round, *args, **kwargs):  # type: ignore[no-untyped-def]
        path = original(run_dir, server_round, *args, **kwargs)
        if server_round == 1:
            before = _snapshot(Path(run_dir))
            try:
                _run(tmp_path, **{"num-rounds": 3, "run-name": "alive", "resume": True})
                attempts.append((None, False))
            except RunFolderInUse as exc:
                attempts.append((exc, _snapshot(Path(run_dir)) == before))
        return path

    monkeypatch.setattr(server_app, "save_checkpoint", then_resume)
    outputs = _run(tmp_path, **{"num-rounds": 2, "run-name": "alive"})
    (refused, unchanged), = attempts
    assert refused is not None and f"PID {os.getpid()} on host " in str(refused) and "\n" not in str(refused)
    assert unchanged
    assert [r["round"] for r in _csv(outputs.path)] == ["0", "1", "2"]
    assert "status=ok" in (outputs.path / "summary.txt").read_text() and _free(outputs.path)


def test_the_lock_of_a_killed_run_is_taken_over_on_resume(tmp_path: Path) -> None:
    """A run killed (SIGKILL) while it held its folder leaves its lock file naming a dead PID; a
    resume on the same host takes the folder over and finishes the run."""
    _run(tmp_path, **{"num-rounds": 1, "run-name": "killed"})
    folder = tmp_path / "runs" / "killed"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from fedul_flwr.store import FolderLock; "
         f"lock = FolderLock.acquire(Path({str(folder)!r})); print('locked', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderInUse, match=f"PID {holder.pid} on host"):
            _run(tmp_path, **{"num-rounds": 2, "run-name": "killed", "resume": True})
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert json.loads(lock_path(folder).read_text())["pid"] == holder.pid  # the stale lock file is still there
    resumed = _run(tmp_path, **{"num-rounds": 2, "run-name": "killed", "resume": True})
    assert [r["round"] for r in _csv(resumed.path)] == ["0", "1", "2"] and _free(folder)


# --------------------------------------------------------------------------- nothing changed until every check passed


def test_resume_of_a_run_with_a_truncated_metric_table_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """metrics.json cut in half (a kill during a write, before writes were atomic): the resume
    is refused in one line naming the file, before config.json or anything else changes.
    Before, config.json was rewritten and the resume then died with a JSONDecodeError."""
    first = _run(tmp_path, **{"num-rounds": 1, "run-name": "cut"})
    table = first.path / "metrics.json"
    table.write_bytes(table.read_bytes()[: len(table.read_bytes()) // 2])
    before = _snapshot(tmp_path)
    with pytest.raises(CheckpointError) as refused:
        _run(tmp_path, **{"num-rounds": 2, "run-name": "cut", "resume": True, "eval-batch-size": 100})
    assert str(table) in str(refused.value) and "\n" not in str(refused.value)
    assert _snapshot(tmp_path) == before


def test_a_crash_while_writing_the_tables_leaves_the_previous_ones_whole(tmp_path: Path, monkeypatch) -> None:
    """The tables are replaced atomically: a crash between writing the new metrics.json and
    putting it in place (here the rename fails) leaves the previous table readable, with the
    rounds it had; no temporary file stays behind, and the stopped run still writes its
    summary and releases the folder."""
    real_replace = os.replace
    calls = {"n": 0}

    def crash_on_round_1(src, dst):  # type: ignore[no-untyped-def]
        if Path(dst).name == "metrics.json" and json.loads(Path(src).read_text())[-1]["round"] == 1:
            calls["n"] += 1
            raise KeyboardInterrupt("killed while writing metrics.json")
        return real_replace(src, dst)

    monkeypatch.setattr(outputs_module.os, "replace", crash_on_round_1)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, **{"num-rounds": 2, "run-name": "crash"})
    run_dir = tmp_path / "runs" / "crash"
    assert calls["n"] >= 1
    assert [r["round"] for r in json.loads((run_dir / "metrics.json").read_text())] == [0]
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    assert "status=stopped reason=KeyboardInterrupt: killed while writing metrics.json" in (run_dir / "summary.txt").read_text()
    assert _free(run_dir)


# --------------------------------------------------------------------------- failures named truly


_BROKEN = [{"partition-id": 0, "num-partitions": 3}] + [{"partition-id": 9, "num-partitions": 3}] * 2


def test_an_aborted_run_writes_its_last_row_and_a_failed_summary(tmp_path: Path) -> None:
    """Two of three nodes fail in round 1 (their data cannot be built), more than
    max-failure-fraction=0.5: the run stops, and its folder still tells what happened: the
    row of round 1 with its failed replies, summary.txt with status=failed and the reason,
    the folder released. Before: no row, no summary."""
    with pytest.raises(NoSuccessfulReplyError):
        _run(tmp_path, 3, InProcessGrid(client_app, 3, _settings(tmp_path), node_configs=_BROKEN),
             **{"num-rounds": 2, "run-name": "stops", "min-train-nodes": 1})  # fmt: skip
    run_dir = tmp_path / "runs" / "stops"
    assert [(r["round"], r["failed-replies"], r["failed-nodes"]) for r in _csv(run_dir)] == [
        ("0", "", ""), ("1", "2", '[[2, "ValueError"], [3, "ValueError"]]')]  # fmt: skip
    assert json.loads((run_dir / "metrics.json").read_text())[1]["failed-nodes"] == [[2, "ValueError"], [3, "ValueError"]]
    summary = (run_dir / "summary.txt").read_text()
    assert summary.count("\n") == 1 and "failed-replies=2 failed-nodes=2(ValueError),3(ValueError) " in summary
    assert "status=failed reason=NoSuccessfulReplyError: round 1: 2 of 3 training replies failed" in summary
    assert _free(run_dir)


def test_the_quiet_console_warns_once_per_round_naming_the_failed_nodes(tmp_path: Path, caplog) -> None:
    """With max-failure-fraction=1 the run goes on; each round prints one warning line with the
    failed nodes' ids and error types (the quiet console shows warnings)."""
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _run(tmp_path, 3, InProcessGrid(client_app, 3, _settings(tmp_path), node_configs=_BROKEN),
             **{"num-rounds": 2, "run-name": "warns", "min-train-nodes": 1, "max-failure-fraction": 1.0})  # fmt: skip
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "training replies failed" in r.getMessage()]
    assert lines == [f"fedul-flwr: round {r}: 2 of 3 training replies failed: node 2 (ValueError), node 3 (ValueError)"
                     for r in (1, 2)]  # fmt: skip


def test_a_lost_node_is_named_by_its_own_id_and_clients_counts_the_nodes_that_trained(tmp_path: Path, monkeypatch) -> None:
    """Node 3 of four dies after round 1: the SuperLink answers for it with Flower's
    NODE_UNAVAILABLE error, whose source is the SuperLink (id 1, also a real node's id here).
    The summary names node 3, and clients=4 counts every node that trained. Before:
    ``failed-nodes=1(NODE_UNAVAILABLE)`` and clients= the connected nodes."""
    grid = InProcessGrid(client_app, 4, _settings(tmp_path))
    original = server_app.save_checkpoint

    def lose_node_3(run_dir, server_round, *args, **kwargs):  # type: ignore[no-untyped-def]
        grid.lost.add(3)
        return original(run_dir, server_round, *args, **kwargs)

    monkeypatch.setattr(server_app, "save_checkpoint", lose_node_3)
    outputs = _run(tmp_path, grid=grid, **{"num-rounds": 2, "run-name": "lost", "max-failure-fraction": 0.5})
    summary = (outputs.path / "summary.txt").read_text()
    assert "clients=4 " in summary and "failed-replies=1 failed-nodes=3(NODE_UNAVAILABLE) " in summary, summary
    rows = json.loads((outputs.path / "metrics.json").read_text())
    assert [r.get("trained-nodes") for r in rows] == [None, [1, 2, 3, 4], [1, 2, 4]]


def test_failed_nodes_stay_consistent_after_a_resume(tmp_path: Path) -> None:
    """The failed nodes are on record per round (metrics.json), so a resumed run's summary
    counts the failed replies and lists the failed nodes of every round, its earlier ones
    included. Before, the count came from the table but the nodes from memory."""
    settings = {"run-name": "resumed", "min-train-nodes": 1, "max-failure-fraction": 1.0}
    grid = InProcessGrid(client_app, 3, _settings(tmp_path), node_configs=_BROKEN)
    _run(tmp_path, 3, grid, **{"num-rounds": 1, **settings})
    repaired = {"partition-id": 1, "num-partitions": 3}
    grid = InProcessGrid(client_app, 3, _settings(tmp_path), node_configs=[_BROKEN[0], repaired, _BROKEN[1]])
    resumed = _run(tmp_path, 3, grid, **{"num-rounds": 2, "resume": True, **settings})
    summary = (resumed.path / "summary.txt").read_text()
    assert "failed-replies=3 failed-nodes=2(ValueError),3(ValueError) " in summary, summary
    assert "clients=2 " in summary  # partition 0 in both rounds, partition 1 in round 2


def test_clients_counts_the_clients_that_trained_not_the_node_ids_of_a_resumed_simulation(tmp_path: Path) -> None:
    """A resumed simulation draws new node ids (Flower's engine does on every start): here the
    partitions 0 and 1 train on nodes 1 and 2, then, resumed, on nodes 3 and 4 (nodes 1 and 2
    fail). ``clients=`` counts the two clients by their stable ``node-key``; before, it counted
    the four node ids."""
    settings = {"run-name": "moved", "min-train-nodes": 1, "max-failure-fraction": 1.0}
    two = [{"partition-id": p, "num-partitions": 2} for p in (0, 1)]
    _run(tmp_path, 2, InProcessGrid(client_app, 2, _settings(tmp_path), node_configs=two), **{"num-rounds": 1, **settings})
    broken = {"partition-id": 9, "num-partitions": 2}
    grid = InProcessGrid(client_app, 4, _settings(tmp_path), node_configs=[broken, broken, *two])
    resumed = _run(tmp_path, 4, grid, **{"num-rounds": 2, "resume": True, **settings})
    rows = json.loads((resumed.path / "metrics.json").read_text())
    assert [r.get("trained-nodes") for r in rows] == [None, [1, 2], [3, 4]]
    assert [r.get("trained-clients") for r in rows] == [None, [0, 1], [0, 1]]
    summary = (resumed.path / "summary.txt").read_text()
    assert " clients=2 " in summary and "failed-nodes=1(ValueError),2(ValueError) " in summary, summary


def test_a_client_error_under_ray_keeps_its_type(tmp_path: Path) -> None:
    """Flower's Ray actor wraps every ClientApp exception in its own ClientAppException (the
    type is lost; the server saw CLIENT_APP_RAISED_EXCEPTION). The ClientApp now answers with
    an error reply naming its exception's type, which the actor passes on as it is."""
    grid = InProcessGrid(client_app, 1, _settings(tmp_path), node_configs=[_BROKEN[1]])
    config = ConfigRecord({wire.RUN_CONFIG: resolve_config(_settings(tmp_path)).to_json(), wire.SERVER_ROUND: 1})
    msg = grid.create_message(RecordDict({wire.ARRAYS: ArrayRecord(), wire.CONFIG: config}), "train", 1, "1")
    msg.metadata.__dict__["_message_id"] = "m1"
    context: Context = grid.contexts[1]
    _, reply, _ = VirtualClientEngineActor.run(object.__new__(VirtualClientEngineActor), lambda: client_app, msg, "0", context)
    assert reply.has_error() and error_type(reply.error) == "ValueError", reply.error


def test_evaluate_every_skips_central_evaluation_between_and_keeps_the_last_round(tmp_path: Path, caplog) -> None:
    """``evaluate-every=2`` over 3 rounds: rounds 0, 2 and 3 (the last) are evaluated; round 1's
    row holds its training replies but no test metric, and its progress line no accuracy; the
    summary and the saved model are those of the last round."""
    with caplog.at_level(logging.INFO, logger="flwr"):
        outputs = _run(tmp_path, **{"num-rounds": 3, "run-name": "every", "evaluate-every": 2})
    rows = {r["round"]: r for r in json.loads((outputs.path / "metrics.json").read_text())}
    assert [r for r in sorted(rows) if "test-accuracy" in rows[r]] == [0, 2, 3]
    assert "test-loss" not in rows[1] and rows[1]["trained-nodes"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("round ")]
    assert re.match(r"round 1/3: \d+\.\ds, ETA ", lines[1]) and "test-accuracy" in lines[2], lines
    assert f"final-test-accuracy={100 * rows[3]['test-accuracy']:.2f}% " in outputs.summary()
