"""The run store under concurrency and crashes, with real processes: two ``fedul reproduce``
runners on one ``--out`` (started together, and one started mid-cell), a runner SIGKILLed with
``--jobs 2``, concurrent writers and readers of one record, a failed cell run again, every
file write of the package through the one atomic helper, and every rename, unlink, tree
removal and log file through the store."""

from __future__ import annotations

import ast
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.flower_harness import children

from fedul_flwr import server_app
from fedul_flwr.experiments import runner
from fedul_flwr.store import LOCK_DIR, SET_ASIDE, FolderLock, RunFolderInUse, write_json

REPO = Path(__file__).resolve().parent.parent
GRID = [sys.executable, "-m", "fedul_flwr.cli", "reproduce", "--grid", "smoke", "--threads", "1",
        "--set", "num-rounds=2", "--set", "samples-per-client=150"]  # fmt: skip
CELLS = ["--methods", "fedul,fedpl,fedavg-10"]
RUN_LINE = re.compile(r"(smoke__\S+): last-round test error")


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def _records(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((out / "cpu" / "records").glob("*.json"))}


def _holders(out: Path) -> dict[str, int]:
    """Run id -> PID named by each held lock of ``out``'s run folders."""
    held = {}
    for path in (out / "cpu" / "runs" / LOCK_DIR).glob("*.lock"):
        try:
            FolderLock.acquire(out / "cpu" / "runs" / path.stem).release()
        except RunFolderInUse:
            try:
                held[path.stem] = int(json.loads(path.read_text())["pid"])
            except (ValueError, KeyError):
                pass  # its holder has not written itself yet
    return held


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def _check_one_writer(out: Path, run_ids: list[str]) -> None:
    """Every cell has its record, and its folder's files are those of the process that wrote
    the record: the same metric rows (wall times included, which no two processes share), its
    log in the folder; no folder set aside, no log left beside the folders, no temporary file,
    every lock file still there and free."""
    records = _records(out)
    assert sorted(records) == sorted(run_ids)
    runs = out / "cpu" / "runs"
    for run_id, record in records.items():
        folder = Path(record["run-dir"])
        assert folder == runs / run_id
        assert record["metrics"] == json.loads((folder / "metrics.json").read_text()), run_id
        assert record["log"] == str(folder / "flower.log") and (folder / "flower.log").is_file()
        assert (folder / "flower.log").read_text().count("fedul-flwr: run folder ") == 1, run_id  # one attempt
    assert not [p for p in runs.iterdir() if SET_ASIDE in p.name or p.name.endswith(".log")]
    assert not list(out.rglob("*.tmp"))
    assert {p.stem for p in (runs / LOCK_DIR).glob("*.lock")} == set(run_ids) and not _holders(out)


def _trained(output: str) -> list[str]:
    return RUN_LINE.findall(output)


def _list(extra: list[str]) -> list[str]:
    listed = subprocess.run([*GRID, *extra, "--list", "--out", "/nonexistent"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in listed.stdout.splitlines()[:-1]]


def test_two_runners_started_together_split_the_grid(tmp_path: Path) -> None:
    """Each cell is trained by exactly one of them; the other says ``busy`` (or finds it
    recorded) and goes on with its own cells; together they leave the records of one runner."""
    out = tmp_path / "out"
    command = [*GRID, *CELLS, "--out", str(out)]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    second = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outputs = [p.communicate(timeout=600)[0] for p in (first, second)]
    codes = sorted(p.returncode for p in (first, second))
    assert codes in ([0, 0], [0, 75]), outputs  # 75: it left a cell the other was still training
    run_ids = _list(CELLS)
    trained = _trained(outputs[0]) + _trained(outputs[1])
    assert sorted(trained) == sorted(run_ids), outputs  # each cell trained once
    _check_one_writer(out, run_ids)


def test_a_runner_started_mid_cell_skips_the_busy_cell_and_touches_nothing_of_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = [*GRID, *CELLS, "--out", str(out)]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: bool(_holders(out)) or first.poll() is not None, 240, "the first runner's first cell")
        (busy, pid), = _holders(out).items()
        assert pid == first.pid
        second = subprocess.run(command, capture_output=True, text=True, timeout=600)
    finally:
        output = first.communicate(timeout=600)[0]
    assert f"busy: run {busy} is being trained by PID {first.pid} on host " in second.stdout, second.stdout
    assert first.returncode in (0, 75) and second.returncode in (0, 75), (output, second.stdout)
    run_ids = _list(CELLS)
    assert sorted(_trained(output) + _trained(second.stdout)) == sorted(run_ids)
    _check_one_writer(out, run_ids)


def test_a_sigkilled_runner_leaves_no_worker_and_its_rerun_equals_an_uninterrupted_grid(tmp_path: Path) -> None:
    """SIGKILL to a ``--jobs 2`` runner mid-training: its workers notice and stop (none alive
    2 s later, their locks free); the rerun continues each run from its checkpoint to the
    metrics of a grid that was never interrupted."""
    two = ["--methods", "fedul,fedpl", "--jobs", "2"]
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    grid = subprocess.Popen([*GRID, *two, "--out", str(killed)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: len(_holders(killed)) == 2 and any((killed / "cpu" / "runs").glob("*/checkpoint.pt")),
                  300, "two workers training, one checkpoint written")  # fmt: skip
        workers = list(_holders(killed).values())
        assert grid.pid not in workers
        grid.send_signal(signal.SIGKILL)
        grid.wait()
        # gone, and their locks free (the kernel frees a lock once the last of a process's threads has ended)
        _wait_for(lambda: not any(_alive(pid) for pid in workers) and not _holders(killed), 2,
                  "the orphaned workers to stop")  # fmt: skip
    finally:
        grid.kill()
    assert subprocess.run([*GRID, *two, "--out", str(killed)], capture_output=True, timeout=600).returncode == 0
    assert subprocess.run([*GRID, *two, "--out", str(clean)], capture_output=True, timeout=600).returncode == 0
    resumed, uninterrupted = _records(killed), _records(clean)
    assert sorted(resumed) == sorted(uninterrupted) and len(resumed) == 2

    def curve(record: dict) -> list:
        return [(r["round"], r["test-accuracy"], r["test-loss"]) for r in record["metrics"]]

    for run_id, record in resumed.items():
        assert curve(record) == curve(uninterrupted[run_id]), run_id


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_a_runner_sigkilled_while_its_workers_start_leaves_no_worker(tmp_path: Path) -> None:
    """SIGKILL to a ``--jobs 2`` runner while its spawned workers are still starting (importing
    torch and the app, no run begun, no lock taken): they are gone within 2 s (the kernel's
    parent-death signal, asked for before any heavy import), not when they finish starting."""
    out = tmp_path / "out"
    grid = subprocess.Popen([*GRID, "--methods", "fedul,fedpl", "--jobs", "2", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    workers: list[int] = []
    try:
        _wait_for(lambda: len(children(grid.pid)) >= 2, 300, "two spawned workers")
        workers = children(grid.pid)
        assert not _holders(out), "a worker began its run already: not the start-up this test is about"
        grid.send_signal(signal.SIGKILL)
        grid.wait()
        _wait_for(lambda: not any(_alive(pid) for pid in workers), 2, "the starting workers to stop")
    finally:
        grid.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not list((out / "cpu" / "records").glob("*.json"))


def _write_records(path: str, writer: int, times: int) -> int:
    """``times`` whole records written to ``path``, once both readers read; the errors."""
    folder = Path(path).parent
    _wait_for(lambda: len(list(folder.glob("reading-*"))) == 2, 120, "the readers")
    errors = 0
    for i in range(times):
        try:
            write_json(Path(path), {"writer": writer, "i": i, "payload": [writer * 1000 + i] * 4000})
        except Exception:  # noqa: BLE001 -- counted
            errors += 1
    return errors


def _read_records(path: str, reader: int) -> tuple[int, int, int]:
    """Reads of ``path`` until the writers are done: (whole records, unparsable ones, errors)."""
    folder = Path(path).parent
    (folder / f"reading-{reader}").touch()
    reads = unparsable = errors = 0
    while not (folder / "done").exists():
        try:
            record = json.loads(Path(path).read_text())
            assert record["payload"] == [record["writer"] * 1000 + record["i"]] * 4000
            reads += 1
        except FileNotFoundError:
            errors += 1
        except (ValueError, AssertionError, KeyError):
            unparsable += 1
    return reads, unparsable, errors


def test_concurrent_writers_and_readers_of_one_record_see_only_whole_records(tmp_path: Path) -> None:
    folder = tmp_path / "records"
    folder.mkdir()
    path = folder / "record.json"
    write_json(path, {"writer": 0, "i": -1, "payload": [-1] * 4000})
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(5) as pool:
        readers = [pool.apply_async(_read_records, (str(path), r)) for r in range(2)]
        writers = [pool.apply_async(_write_records, (str(path), w, 150)) for w in (1, 2, 3)]
        write_errors = [w.get(timeout=300) for w in writers]
        (tmp_path / "records" / "done").touch()
        reads = [r.get(timeout=300) for r in readers]
    assert write_errors == [0, 0, 0]
    assert all(unparsable == 0 and errors == 0 for _, unparsable, errors in reads), reads
    assert all(n > 10 for n, _, _ in reads), reads
    assert sorted(p.name for p in folder.iterdir()) == ["done", "reading-0", "reading-1", "record.json"]  # no temporary file


def test_a_failed_cell_run_again_keeps_the_failed_folder_set_aside_with_its_log(
    tmp_path: Path, small_test_set: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that fails in round 1 (no checkpoint) has a failure record and a folder with the
    traceback in its log. Run again, its folder is set aside, never deleted: the log is kept,
    and so is the failure record, inside the set-aside folder and pointing at its log."""
    from tests.test_grid_runner import _config, _folder, _spec

    spec = _spec()
    rc = _config(tmp_path, spec)
    records = tmp_path / "records"

    def boom(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("the disk is full")

    with monkeypatch.context() as patch:
        patch.setattr(server_app, "save_checkpoint", boom)
        result = runner.run_cells([(spec, rc)], records)
    failure_path = runner.failure_path(records, spec.run_id)
    assert result.exit_code == runner.EXIT_FAILED and failure_path.is_file()
    assert "the disk is full" in (_folder(rc) / "flower.log").read_text()
    result = runner.run_cells([(spec, rc)], records)
    assert result.exit_code == 0 and not failure_path.exists()
    [aside] = [p for p in _folder(rc).parent.iterdir() if p.name.startswith(f"{spec.run_id}{SET_ASIDE}")]
    assert "the disk is full" in (aside / "flower.log").read_text()
    [kept] = aside.glob("failure-*.json")
    failure = json.loads(kept.read_text())
    assert failure["log"] == str(aside / "flower.log") and failure["run-dir"] == str(aside)
    assert result.records[0]["log"] == str(_folder(rc) / "flower.log")
    assert "the disk is full" not in (_folder(rc) / "flower.log").read_text()


WRITES = re.compile(r"""open\([^)]*["'][wax]b?\+?["']|\.open\(\s*["'][wax]|\.write_text\(|\.write_bytes\(|torch\.save\(|"""
                    r"""savefig\(|np\.save\(|json\.dump\(|\.to_csv\(|shutil\.copy""")
WRITERS_OUTSIDE_THE_STORE = {
    # the user's node data folder, written once into a fresh folder (fedul node-data write): not a run's file
    "fedul_flwr/data/node_folder/writer.py",
    # a worker's stderr stream (an append-only log)
    "fedul_flwr/experiments/hassle_bench.py",
}


def test_every_file_write_goes_through_the_store() -> None:
    """No module of the package and no script writes a file by itself: each write is
    ``write_atomic`` (a call on the same line) or one of the named exceptions."""
    found = {}
    for path in sorted([*(REPO / "fedul_flwr").rglob("*.py"), *(REPO / "scripts").glob("*.py")]):
        rel = str(path.relative_to(REPO))
        if rel == "fedul_flwr/store.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if WRITES.search(code) and "write_atomic(" not in code and not code.strip().startswith(('"', "'", "``")):
                found.setdefault(rel, []).append(f"{number}: {line.strip()}")
    assert set(found) <= WRITERS_OUTSIDE_THE_STORE, {k: v for k, v in found.items() if k not in WRITERS_OUTSIDE_THE_STORE}


MOVES = {"replace", "rename", "unlink", "rmtree", "rmdir", "removedirs", "move", "remove", "copytree"}
"""Calls that move or remove files (``str.replace`` and ``dataclasses.replace`` told apart below)."""
LOG_HANDLERS = {"FileHandler", "RotatingFileHandler", "TimedRotatingFileHandler", "WatchedFileHandler"}
MOVERS_OUTSIDE_THE_STORE: dict[str, set[str]] = {}
"""Module -> calls allowed outside fedul_flwr/store.py (none today)."""


def _moves_and_log_handlers(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, call) of each rename, replace, unlink, tree removal, move and log file handler in
    ``tree``, however its call is split over lines: ``os.replace``/``os.rename``/``os.remove``,
    ``shutil.move``/``rmtree``/``copytree``, ``Path.replace(target)`` (one argument: not
    ``str.replace(old, new)``), ``.rename``, ``.unlink``, ``.rmdir``, ``logging.*FileHandler``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
        if name in LOG_HANDLERS:
            hit = True
        elif name == "replace":  # os.replace, or Path.replace(target); not str.replace(a, b) nor dataclasses.replace
            hit = owner == "os" or (owner != "dataclasses" and len(node.args) == 1 and not node.keywords)
        elif name in ("move", "remove", "copytree"):
            hit = owner in ("shutil", "os")
        else:
            hit = name in MOVES
        if hit:
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_move_guard_sees_calls_split_over_lines() -> None:
    source = "import os, shutil\nos.replace(\n    a,\n    b)\nshutil.rmtree(\n  x)\np.unlink(\n missing_ok=True)\n" \
             "'a'.replace('b', 'c')\nlogging.FileHandler(\n path)\nq.replace(\n  t)\n"
    assert [line for line, _ in _moves_and_log_handlers(ast.parse(source))] == sorted([2, 5, 7, 10, 12])


def test_every_rename_unlink_tree_removal_and_log_file_goes_through_the_store() -> None:
    """No module of the package and no script renames, replaces, unlinks, moves or removes a
    file or a tree, or opens a log file, by itself (found with ``ast``, so a call split over
    lines is seen): each goes through :func:`fedul_flwr.store.move`, ``remove``,
    ``remove_tree``, ``set_aside``, ``set_aside_damaged`` or ``RunLogHandler`` (lock checked,
    folder fsynced, a full device named)."""
    found = {}
    for path in sorted([*(REPO / "fedul_flwr").rglob("*.py"), *(REPO / "scripts").glob("*.py")]):
        rel = str(path.relative_to(REPO))
        if rel == "fedul_flwr/store.py":
            continue
        calls = [f"{line}: {call}" for line, call in _moves_and_log_handlers(ast.parse(path.read_text()))
                 if call.split("(")[0].rsplit(".", 1)[-1] not in MOVERS_OUTSIDE_THE_STORE.get(rel, set())]  # fmt: skip
        if calls:
            found[rel] = calls
    assert not found, found


def test_a_busy_cell_freed_during_the_pass_is_run_and_an_identical_cell_is_trained_once(
    tmp_path: Path, small_test_set: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cell A's folder is held (another runner) when the grid reaches it, and freed while cell B
    trains: the grid runs A in a second pass instead of exiting 75 for a cell nobody trains.
    Cell C has B's settings under another name: it gets B's record (``same-run-as``), even
    though B was recorded during this invocation."""
    from tests.test_grid_runner import _config, _folder, _spec

    a, b, c = _spec(column="A"), _spec(column="B"), _spec(column="C")
    rc = {s.column: _config(tmp_path, s) for s in (a, b, c)}
    rc["A"] = {**rc["A"], "lr": 2 * rc["A"]["lr"]}  # another run than B and C
    other_runner = FolderLock.acquire(_folder(rc["A"]))
    original = server_app.save_checkpoint

    def release_a(run_dir, *args, **kwargs):  # type: ignore[no-untyped-def]
        if Path(run_dir) == _folder(rc["B"]):
            other_runner.release()
        return original(run_dir, *args, **kwargs)

    monkeypatch.setattr(server_app, "save_checkpoint", release_a)
    result = runner.run_cells([(a, rc["A"]), (b, rc["B"]), (c, rc["C"])], tmp_path / "records")
    out = capsys.readouterr().out
    assert f"busy: run {a.run_id} is being trained by PID {os.getpid()} on host " in out
    assert "1 cell(s) another runner held are free now: running them" in out
    assert result.exit_code == 0 and not result.busy and len(result.records) == 3
    records = {r["spec"]["column"]: r for r in result.records}
    assert records["C"]["same-run-as"] == b.run_id and "same-run-as" not in records["B"]
    assert not _folder(rc["C"]).exists()  # nothing trained for C


def test_a_writer_killed_mid_write_leaves_no_partial_file_once_the_folder_is_taken_again(tmp_path: Path) -> None:
    """SIGKILL between a temporary file's write and its rename leaves ``.<name>.<pid>-<hex>.tmp``:
    the next holder of the folder (a resume, a set-aside, a grid's records) removes those of dead
    writers only; a live writer's temporary file and every real file stay."""
    from fedul_flwr.store import set_aside, sweep_temporary

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder = tmp_path / "run"
    folder.mkdir()
    write_json(folder / "metrics.json", [{"round": 0}])
    partial = folder / f".metrics.csv.{dead.pid}-0123456789ab.tmp"
    live = folder / f".metrics.json.{os.getpid()}-0123456789ab.tmp"
    partial.write_bytes(b"round,test-acc")
    live.write_bytes(b"[")
    assert sweep_temporary(folder) == [partial]
    assert sorted(p.name for p in folder.iterdir()) == sorted([live.name, "metrics.json"])
    partial.write_bytes(b"round,test-acc")
    live.unlink()
    with FolderLock.acquire(folder) as lock:
        aside = set_aside(folder, lock)
    assert aside is not None and [p.name for p in aside.iterdir()] == ["metrics.json"]
