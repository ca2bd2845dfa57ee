"""The run store at its edges, with real files, real grids and a real full device: damaged
records and failure records are named in one line and set aside (never overwritten or
deleted) and the grid goes on; a full device (a small tmpfs) stops ``fedul reproduce`` with
one line naming the file and the space, every earlier record whole; a run's log on a full
device goes quiet instead of printing a traceback per message."""

from __future__ import annotations

import json
import re
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedul_flwr import cli
from fedul_flwr.checkpoint import CHECKPOINT_FILE, CheckpointError, load_checkpoint
from fedul_flwr.experiments import cells, runner
from fedul_flwr.store import DAMAGED, DamagedFile, FolderLock, NoSpace, RunLogHandler, read_json, set_aside_damaged, write_json

SMOKE = ["reproduce", "--grid", "smoke", "--threads", "1", "--set", "num-rounds=1", "--set", "samples-per-client=150"]
GRID = [sys.executable, "-m", "fedul_flwr.cli", *SMOKE]
FEDUL, FEDAVG = "smoke__MNIST-sample-IID__FedUL__10__s0", "smoke__MNIST-sample-IID__FedAvg-10pct__-__s0"


# --------------------------------------------------------------------------- damaged files


def test_read_json_names_every_kind_of_damage_in_one_line(tmp_path: Path) -> None:
    whole = tmp_path / "r.json"
    write_json(whole, {"run-id": "x", "metrics": [1, 2, 3]})
    assert read_json(whole, dict, ("run-id",)) == {"run-id": "x", "metrics": [1, 2, 3]}
    text = whole.read_text()
    cases = {"empty.json": "", "cut.json": text[: len(text) // 2], "text.json": "not json\n", "list.json": "[1, 2]\n",
             "keys.json": '{"metrics": []}\n', "binary.json": "\udcff"}  # fmt: skip
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content.encode("utf-8", "surrogateescape"))
        with pytest.raises(DamagedFile) as info:
            read_json(path, dict, ("run-id",))
        assert str(path) in str(info.value) and "\n" not in str(info.value), name
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "none.json")


def test_a_damaged_file_is_set_aside_and_a_whole_one_never(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text('{"run-id": "x", "metr')
    aside = set_aside_damaged(path)
    assert aside is not None and not path.exists() and aside.name.startswith(f"r.json{DAMAGED}")
    assert aside.read_text() == '{"run-id": "x", "metr'  # renamed, never rewritten
    write_json(path, {"run-id": "x"})  # another runner wrote it whole meanwhile: it stays
    assert set_aside_damaged(path) is None and read_json(path) == {"run-id": "x"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["r.json", aside.name])


def test_an_empty_or_cut_checkpoint_is_one_line_naming_the_file(tmp_path: Path) -> None:
    for content in (b"", b"PK\x03\x04 cut short"):
        (tmp_path / CHECKPOINT_FILE).write_bytes(content)
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(tmp_path)
        assert str(tmp_path / CHECKPOINT_FILE) in str(info.value) and "\n" not in str(info.value)


def test_a_damaged_failure_record_is_set_aside_and_a_kept_one_never_overwritten(tmp_path: Path) -> None:
    """A cell that fails again over a cut failure record sets the cut one aside (its bytes
    kept); over a whole one whose run folder is gone, keeps it beside as ``.kept-``."""
    spec = runner.RunSpec("g", "r", "c", "*", 0, 2, "", {})
    rc = {"output-dir": str(tmp_path / "runs"), "run-name": spec.run_id}
    cell = cells.Cell.of(rc, str(tmp_path / "records" / f"{spec.run_id}.json"))
    cell.failure.parent.mkdir(parents=True)
    first = json.dumps({"run-id": spec.run_id, "error-type": "RuntimeError", "error": "first", "round-reached": 3,
                        "log": "/somewhere/flower.log"})  # fmt: skip
    cell.failure.write_text(first[: len(first) // 2])
    with FolderLock.acquire(cell.run_dir) as lock:
        cells.record_failure(spec, rc, cell, lock, "RuntimeError", "second", 1.0)
        [damaged] = cell.failure.parent.glob(f"*{DAMAGED}*")
        assert damaged.read_text() == first[: len(first) // 2]
        assert read_json(cell.failure)["error"] == "second"
        whole = cell.failure.read_bytes()
        cells.record_failure(spec, rc, cell, lock, "RuntimeError", "third", 1.0)
    [kept] = cell.failure.parent.glob("*.kept-*.json")
    assert kept.read_bytes() == whole and read_json(cell.failure)["error"] == "third"
    assert runner.load_failures([spec], tmp_path / "records")[0]["error"] == "third"


@pytest.mark.slow
def test_a_cut_and_an_empty_record_are_named_and_the_grid_finishes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record cut in half and an empty one: ``--render-only`` and a rerun each name the file in
    one line and set it aside (its bytes kept); the rerun records the cut one again from its
    complete run folder (nothing trained, the same metrics) and retrains the other (its run
    folder incomplete), and ends with every record whole and exit status 0."""
    out = tmp_path / "out"
    args = [*SMOKE, "--methods", "fedul,fedavg-10", "--out", str(out)]
    assert cli.main(args) == 0
    records = out / "cpu" / "records"
    original = {p.stem: p.read_text() for p in records.glob("*.json")}
    assert sorted(original) == sorted([FEDUL, FEDAVG])
    cut = original[FEDUL][: len(original[FEDUL]) // 2]
    (records / f"{FEDUL}.json").write_text(cut)
    (records / f"{FEDAVG}.json").write_text("")
    (out / "cpu" / "runs" / FEDAVG / "summary.txt").write_text("")  # its folder no longer says status=ok
    capsys.readouterr()

    assert cli.main([*args, "--render-only"]) == 1  # two runs have no record now: said, not raised
    err = capsys.readouterr().err
    named = [line for line in err.splitlines() if "damaged" in line]
    assert len(named) == 2 and "Traceback" not in err and "fedul: error" not in err, err
    assert any(str(records / f"{FEDUL}.json") in line and "damaged record" in line for line in named)  # the JSON error depends on where the cut lands
    assert any(str(records / f"{FEDAVG}.json") in line and "empty file" in line for line in named)
    asides = {p.name.split(DAMAGED)[0]: p.read_text() for p in records.glob(f"*{DAMAGED}*")}
    assert asides == {f"{FEDUL}.json": cut, f"{FEDAVG}.json": ""}

    (records / f"{FEDUL}.json").write_text(cut)  # cut again: this time a rerun meets it
    assert cli.main(args) == 0
    captured = capsys.readouterr()
    assert f"{FEDUL}: recorded again from its complete run folder" in captured.out
    assert f"{FEDAVG}: last-round test error" in captured.out
    assert not list((out / "cpu" / "runs").glob(f"{FEDUL}.set-aside-*"))  # its folder untouched, nothing trained
    assert sum("damaged" in line for line in captured.err.splitlines()) == 1
    again = {p.stem: json.loads(p.read_text()) for p in records.glob("*.json")}
    assert sorted(again) == sorted([FEDUL, FEDAVG])
    # the same rows, wall times included (a run trained again has its own)
    assert again[FEDUL]["metrics"] == json.loads(original[FEDUL])["metrics"] and again[FEDUL]["rebuilt-from-run-folder"]
    assert again[FEDUL]["last-test-error"] == json.loads(original[FEDUL])["last-test-error"]
    assert len(list(records.glob(f"{FEDUL}.json{DAMAGED}*"))) == 2  # both cut copies kept
    # its folder's checkpoint is at num-rounds: continued from it (outputs written), not set aside
    assert not list((out / "cpu" / "runs").glob(f"{FEDAVG}.set-aside-*"))


# --------------------------------------------------------------------------- a full device


@pytest.fixture
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh tmpfs of ``request.param`` (e.g. ``"8m"``) mounted on a folder of ``tmp_path``:
    a device that really fills. Needs root and a kernel that lets it mount (skipped otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("a full device needs a small tmpfs, and mounting one (mount -t tmpfs) needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={request.param}", "tmpfs", str(disk)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): no device to fill")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _whole_records(out: Path) -> dict[str, dict]:
    records = {p.stem: read_json(p, dict, runner.RECORD_KEYS) for p in (out / "cpu" / "records").glob("*.json")}
    for run_id, record in records.items():  # each the record of its run folder, written before the device filled
        assert record["metrics"] == read_json(Path(record["run-dir"]) / "metrics.json", list), run_id
    return records


def _one_line(stderr: str, disk: Path) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("fedul: error: no space left on device writing ") and f"free on {disk})" in lines[0]
    assert "needs about " in lines[0] or "needs more than " in lines[0]
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("small_disk", ["8m"], indirect=True)
def test_a_full_device_stops_the_grid_in_one_line_with_every_earlier_record_whole(small_disk: Path) -> None:
    """Three cells of 3.4 MB run folders on an 8 MB tmpfs: two are recorded, the third is
    not started (less room than a cell's folder) and no cell gets a failure record."""
    out = small_disk / "out"
    done = subprocess.run([*GRID, "--methods", "fedul,fedpl,fedavg-10", "--out", str(out)], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 1
    line = _one_line(done.stderr, small_disk)
    assert len(_whole_records(out)) == 2 and FEDAVG in line
    assert not (out / "cpu" / "records" / runner.FAILED_DIR).exists()


@pytest.mark.slow
@pytest.mark.parametrize("small_disk", ["2m"], indirect=True)
def test_a_device_that_fills_mid_cell_stops_the_workers_in_one_line(small_disk: Path) -> None:
    """A 2 MB tmpfs fills while a worker (``--jobs 2``) writes its cell's checkpoint: one line
    naming that file, no failure record, no traceback, no logging error."""
    out = small_disk / "out"
    done = subprocess.run([*GRID, "--methods", "fedul,fedpl", "--jobs", "2", "--out", str(out)], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 1
    line = _one_line(done.stderr, small_disk)
    assert str(out / "cpu" / "runs") in line
    assert not list((out / "cpu" / "records").glob("*.json")) and not (out / "cpu" / "records" / runner.FAILED_DIR).exists()


@pytest.mark.parametrize("small_disk", ["1m"], indirect=True)
def test_a_log_on_a_full_device_goes_quiet_and_names_the_file(small_disk: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Where ``logging.FileHandler`` prints a ``--- Logging error ---`` traceback per message on
    a full device, the run's log handler prints nothing and keeps one NoSpace naming its file."""
    filler = small_disk / "filler"
    with open(filler, "wb") as fh, pytest.raises(OSError):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
    logger = logging.getLogger("fedul-test-full-device")
    logger.propagate = False
    plain = logging.FileHandler(small_disk / "plain.log")
    logger.addHandler(plain)
    logger.warning("x" * 10000)
    logger.removeHandler(plain)
    plain.stream = None  # its stream's buffer cannot be flushed on this device: let it go unclosed
    assert "--- Logging error ---" in capsys.readouterr().err  # what the plain handler does
    handler = RunLogHandler(small_disk / "run.log")
    logger.addHandler(handler)
    for i in range(100):
        logger.warning("round %d: %s", i, "x" * 10000)
    logger.removeHandler(handler)
    handler.close()
    assert capsys.readouterr().err == ""
    with pytest.raises(NoSpace) as info:
        handler.raise_if_full()
    assert str(info.value).startswith(f"no space left on device writing {small_disk / 'run.log'} ")
    filler.unlink()


@pytest.mark.slow
def test_a_record_with_fields_of_the_wrong_type_is_damaged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record that is valid JSON but holds a field of the wrong type (a text test error, a
    ``null`` wall time, a list for its config, text for its metrics) is damaged like a cut
    one: ``--render-only`` names it and the key in one line, sets it aside and says which run
    has no record (exit status 1); a rerun records it again from its run folder (exit 0)."""
    out = tmp_path / "out"
    args = [*SMOKE, "--methods", "fedul", "--out", str(out)]
    assert cli.main(args) == 0
    path = out / "cpu" / "records" / f"{FEDUL}.json"
    original = json.loads(path.read_text())
    bad = {"last-test-error": "oops", "wall-time-s": None, "config": [], "metrics": "oops", "last-test-error ": None}
    for key, value in bad.items():
        key = key.strip()  # the second last-test-error: null, not a number
        path.write_text(json.dumps({**original, key: value}))
        capsys.readouterr()
        assert cli.main([*args, "--render-only"]) == 1, key
        err = capsys.readouterr().err
        assert "fedul: error" not in err and "Traceback" not in err, err
        named = [line for line in err.splitlines() if "damaged" in line]
        assert len(named) == 1 and str(path) in named[0] and repr(key) in named[0], err
        assert f"have no record ({FEDUL})" in err, err
        assert not path.exists() and len(list(path.parent.glob(f"{FEDUL}.json{DAMAGED}*"))) >= 1
        path.write_text(json.dumps({**original, key: value}))
        assert cli.main(args) == 0, key
        captured = capsys.readouterr()
        assert f"{FEDUL}: recorded again from its complete run folder" in captured.out, key
        again = json.loads(path.read_text())
        assert again["metrics"] == original["metrics"] and again["last-test-error"] == original["last-test-error"]


def test_a_failure_record_with_fields_of_the_wrong_type_is_damaged(tmp_path: Path) -> None:
    """The failure record's declared schema: a text round or a ``null`` error is damaged."""
    path = tmp_path / "failure.json"
    whole = {"run-id": "x", "spec": {"row": "r", "column": "c"}, "run-config": {}, "error-type": "RuntimeError",
             "error": "boom", "round-reached": 2, "run-dir": "runs/x", "log": "runs/x/flower.log", "wall-time-s": 1.5}
    write_json(path, whole)
    assert read_json(path, dict, runner.FAILURE_KEYS) == whole
    for key, value in {"round-reached": "2", "error": None, "wall-time-s": True, "spec": []}.items():
        write_json(path, {**whole, key: value})
        with pytest.raises(DamagedFile, match=rf"{re.escape(str(path))} is damaged \({re.escape(repr(key))} is "):
            read_json(path, dict, runner.FAILURE_KEYS)


def test_no_space_names_a_small_write_in_bytes_or_kb(tmp_path: Path) -> None:
    """A full device met writing a summary line (a few hundred bytes) says how many bytes, not
    "needs about 0.0 MB"."""
    line = str(NoSpace(tmp_path / "summary.txt", 312))
    assert f"writing {tmp_path / 'summary.txt'} (needs about 312 bytes, " in line and "0.0 MB" not in line
    assert "needs more than 42.0 kB, " in str(NoSpace(tmp_path / "metrics.json", 42_000, at_least=True))
    assert "needs about 3.4 MB, " in str(NoSpace(tmp_path / "checkpoint.pt", 3_400_000))


@pytest.mark.parametrize("small_disk", ["1m"], indirect=True)
def test_a_run_that_meets_a_full_device_before_round_one_leaves_nothing(small_disk: Path) -> None:
    """A device already full when a run starts: the lock's holder line and then the run's
    config.json cannot be written. Before, the lock file's write raised a bare OSError (a
    traceback) and left ``.locks/<run>.lock`` behind; now each is one NoSpace naming its file,
    and neither the lock file, the lock folder nor the run folder is left."""
    from fedul_flwr.client_app import app as client_app
    from fedul_flwr.inprocess import InProcessGrid
    from fedul_flwr.preflight import resolve_config
    from fedul_flwr.server_app import run_federation

    (small_disk / ".locks").mkdir()  # the lock folder of an earlier run: the lock file's own write meets the full device
    filler = small_disk / "filler"
    with open(filler, "wb") as fh, pytest.raises(OSError):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
    with pytest.raises(NoSpace, match=rf"^no space left on device writing {re.escape(str(small_disk / '.locks'))}"):
        FolderLock.acquire(small_disk / "run")
    assert sorted(p.name for p in small_disk.iterdir()) == [".locks", "filler"] and not any((small_disk / ".locks").iterdir())
    (small_disk / ".locks").rmdir()
    with pytest.raises(NoSpace, match=rf"^no space left on device writing {re.escape(str(small_disk / '.locks'))}"):
        FolderLock.acquire(small_disk / "run")  # the lock folder itself cannot be made
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]
    rc = {"output-dir": str(small_disk), "run-name": "full", "num-rounds": 1, "samples-per-client": 60}
    with pytest.raises(NoSpace):
        run_federation(InProcessGrid(client_app, 2, rc), resolve_config(rc))
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]
    filler.unlink()
