"""The grid runner never loses work: a failed run is one failed cell, settings that change only
output never make another run, fp32 runs move between devices, ``--stop-after`` ends a grid in
time and the next invocation finishes it (:mod:`fedul_flwr.experiments.runner`).

The runs are in-process federations on the embedded MNIST sample; the ``fedul reproduce``
tests go through the command line with spawned workers (their central evaluation uses the
whole sample test set)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fedul_flwr import cli
from fedul_flwr.checkpoint import CHECKPOINT_FILE, load_checkpoint
from fedul_flwr.preflight import resolve_config
from fedul_flwr.resume import OUTPUT_KEYS, RESUME_FREE_KEYS, check_resume, resume_conflicts
from fedul_flwr.config import ConfigError
from fedul_flwr.experiments import grids, reproduce, runner

SMOKE = ["reproduce", "--grid", "smoke", "--threads", "1"]
TINY = {"dataset": "mnist-sample", "samples-per-client": 150, "num-sets": 10, "batch-size": 32, "val-fraction": 0.0}


def _spec(grid: str = "g", column: str = "FedAvg 10%") -> runner.RunSpec:
    return runner.RunSpec(grid, "MNIST-sample IID", column, "*", 0, 2, "", {})


def _config(tmp_path: Path, spec: runner.RunSpec, **overrides: object) -> dict:
    """The cpu profile's complete run config of a tiny supervised run (fp32 on the CPU)."""
    over = {**TINY, "method": "supervised", "label-fraction": 0.1, "num-rounds": 2, **overrides}
    return reproduce.run_config_of(dataclasses.replace(spec, overrides=over), reproduce.PROFILES["cpu"], "", tmp_path, {})


def _sweep(seeds: list[int]) -> list[runner.RunSpec]:
    """The runs of the ``hassle-sweep`` grid at ``seeds``."""
    return grids.load_grid("hassle-sweep").specs("cpu", seeds)


def _folder(rc: dict) -> Path:
    return Path(rc["output-dir"]) / rc["run-name"]


def record_of(spec: runner.RunSpec, config: dict, **fields: object) -> dict:
    """A whole record of ``spec`` (every key of :data:`runner.RECORD_KEYS`, of its type) made
    with ``config``, ``fields`` over it: what a test writes into a grid's records by hand."""
    rows = [{"round": 1, "test-accuracy": 0.5, "test-error": 0.5, "wall-time": 1.0}]
    return {"run-id": spec.run_id, "spec": dataclasses.asdict(spec), "run-config": {}, "config": config, "metrics": rows,
            "last-round": 1, "last-test-error": 0.5, "best-test-error": 0.5, "best-round": 1, "best-val-round": None,
            "best-val-test-error": None, "predictors": ["f"], "wall-time-s": 1.0, "threads": 1, "cohort": None,
            "device": "cpu", "device-name": None, "run-dir": "runs/x", **fields}  # fmt: skip


def _strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall-time"} for r in rows]


# --------------------------------------------------------------------------- failed cells


def test_a_failed_run_is_one_failed_cell_and_never_blocks_its_rerun(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """FedPL with an exploding mix weight turns its loss NaN in round 1 and the run fails;
    the FedAvg run in the other worker finishes, the table is rendered from it, the command
    ends with one line for the failed cell and exit status 1. The failure record is no
    result and does not block the cell: the next invocation runs it again."""
    out = tmp_path / "out"
    bad = ["--set", "fedpl-mix-weight=1e39", "--set", "fedpl-threshold=0.1"]
    assert cli.main([*SMOKE, "--methods", "fedpl,fedavg-10", "--jobs", "2", "--out", str(out), *bad]) == 1
    stdout = capsys.readouterr().out
    records = out / "cpu" / "records"
    fedpl, fedavg = "smoke__MNIST-sample-IID__FedPL__10__s0", "smoke__MNIST-sample-IID__FedAvg-10pct__-__s0"
    assert (records / f"{fedavg}.json").is_file() and not (records / f"{fedpl}.json").exists()
    page = (out / "cpu" / "results-smoke.md").read_text()
    assert "| MNIST-sample IID |" in page  # rendered from what exists
    assert "1 more failed" in page and f"| {fedpl} | 0 " in page  # the page lists the failed run
    failure = json.loads(runner.failure_path(records, fedpl).read_text())
    assert failure["error-type"] == "NoSuccessfulReplyError" and "nan" in failure["error"]
    assert failure["round-reached"] == 0 and Path(failure["run-dir"]).name == fedpl
    assert "Traceback" in Path(failure["log"]).read_text()  # the traceback is in the run's log, not the terminal
    lines = stdout.strip().splitlines()
    assert [line for line in lines if line.startswith("FAILED ")] == [lines[-1]]  # one line per failed cell, at the end
    assert lines[-1].startswith(f"FAILED {fedpl}: NoSuccessfulReplyError after round 0: ")
    assert lines[-2].startswith("wrote ")
    # the failure blocks nothing: rerun (without the exploding weight), the cell trains and its failure record goes
    assert cli.main([*SMOKE, "--methods", "fedpl", "--out", str(out)]) == 0
    assert (records / f"{fedpl}.json").is_file() and not runner.failure_path(records, fedpl).exists()
    assert len(list(records.glob("*.json"))) == 2
    assert "failed" not in (out / "cpu" / "results-smoke.md").read_text().lower()  # its failure is history


def test_a_worker_the_os_kills_is_one_failed_cell_and_the_grid_goes_on(tmp_path: Path) -> None:
    """SIGKILL (what the kernel's out-of-memory killer sends) to the worker of one run of a
    ``--jobs 2`` grid: that run becomes a failure record naming the signal, the other run
    finishes, the command exits 1 instead of waiting for the dead worker forever, and the
    next invocation continues the killed run to its record."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "out"
    command = [sys.executable, "-m", "fedul_flwr.cli", *SMOKE, "--methods", "fedavg-10,fedpl", "--out", str(out),
               "--set", "num-rounds=6"]  # fmt: skip
    killed = "smoke__MNIST-sample-IID__FedAvg-10pct__-__s0"
    lock = out / "cpu" / "runs" / ".locks" / f"{killed}.lock"
    grid = subprocess.Popen([*command, "--jobs", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (lock.is_file() and lock.read_text().strip()) and grid.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        os.kill(json.loads(lock.read_text())["pid"], signal.SIGKILL)
        output, _ = grid.communicate(timeout=300)
    finally:
        grid.kill()
    assert grid.returncode == 1, output
    records = out / "cpu" / "records"
    assert (records / "smoke__MNIST-sample-IID__FedPL__10__s0.json").is_file()  # the other run finished
    failure = json.loads(runner.failure_path(records, killed).read_text())
    assert failure["error-type"] == "WorkerDied" and "killed by signal 9" in failure["error"]
    assert output.strip().splitlines()[-1].startswith(f"FAILED {killed}: WorkerDied after round {failure['round-reached']}")
    assert subprocess.run(command, capture_output=True, text=True, timeout=300).returncode == 0
    record = json.loads((records / f"{killed}.json").read_text())
    assert record["last-round"] == 6 and record.get("resumed-after-round", 0) == failure["round-reached"]
    assert not runner.failure_path(records, killed).exists()


# --------------------------------------------------------------------------- output-only keys


def test_output_keys_are_one_list_and_never_make_another_run(tmp_path: Path, small_test_set: None) -> None:
    """``verbose`` (and every other output-only key) is free on resume and in the runner: a
    stopped run resumed with ``verbose=true`` is accepted, and a grid with ``--set
    verbose=true`` continues the checkpointed run instead of starting it afresh."""
    assert set(OUTPUT_KEYS) | {"num-rounds"} == set(RESUME_FREE_KEYS) and "verbose" in OUTPUT_KEYS
    spec = _spec()
    rc = _config(tmp_path, spec)
    runner.execute(spec, {**rc, "num-rounds": 1})  # stopped after round 1
    loud = {**rc, "verbose": True}
    assert check_resume(resolve_config({**loud, "resume": True}), _folder(rc)).round == 1
    assert runner.resumable_round(loud) == 1
    [record] = runner.run_grid([(spec, loud)], tmp_path / "records")
    assert record["resumed-after-round"] == 1 and record["last-round"] == 2


def test_a_run_folder_with_trained_rounds_is_set_aside_never_deleted(tmp_path: Path, small_test_set: None) -> None:
    """A checkpointed run that another setting cannot continue (here another lr) starts
    afresh; its folder, checkpoint and log are kept under a new name."""
    spec = _spec()
    rc = _config(tmp_path, spec)
    runner.run_grid([(spec, {**rc, "num-rounds": 1, "lr": 2 * rc["lr"]})], tmp_path / "other-records")
    before = (_folder(rc) / CHECKPOINT_FILE).read_bytes()
    [record] = runner.run_grid([(spec, rc)], tmp_path / "records")
    assert "resumed-after-round" not in record
    [aside] = [p for p in _folder(rc).parent.iterdir() if p.name.startswith(f"{spec.run_id}.set-aside-")]
    assert (aside / CHECKPOINT_FILE).read_bytes() == before and (aside / "flower.log").is_file()


# --------------------------------------------------------------------------- devices


@contextlib.contextmanager
def _saved_as_on_cuda() -> Iterator[None]:
    """``torch.save`` tags every storage ``cuda:0``, as a process whose tensors are on the
    GPU writes them (a CPU-only machine cannot hold CUDA tensors)."""
    registry = torch.serialization._package_registry
    entry = (0, lambda storage: "cuda:0", lambda obj, location: None)
    registry.insert(0, entry)
    try:
        yield
    finally:
        registry.remove(entry)


def test_a_run_stopped_on_cuda_goes_on_on_the_cpu_in_fp32(tmp_path: Path, small_test_set: None) -> None:
    """A checkpoint written on ``cuda`` (its settings say so and its storages are CUDA's)
    continues on the CPU: loaded with ``map_location``, the device is free in fp32. In
    bfloat16-capable ``precision=auto`` the device still counts."""
    spec = _spec()
    rc = _config(tmp_path, spec)
    whole = runner.execute(spec, {**rc, "output-dir": str(tmp_path / "whole")})  # uninterrupted, for the numbers
    runner.execute(spec, {**rc, "num-rounds": 1})
    path = _folder(rc) / CHECKPOINT_FILE
    payload = torch.load(path, weights_only=False)
    payload["config"]["device"] = "cuda"
    with _saved_as_on_cuda():
        torch.save(payload, path)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(path, weights_only=True)  # the file really holds CUDA storages
    ckpt = load_checkpoint(_folder(rc))
    assert all(t.device.type == "cpu" for t in ckpt.state_dict.values())
    assert resume_conflicts(ckpt.config, resolve_config({**rc, "precision": "auto"})) == [
        "device: 'cuda' in the checkpoint, 'cpu' now", "precision: 'fp32' in the checkpoint, 'auto' now"]  # fmt: skip
    assert runner.resumable_round(rc) == 1
    [continued] = runner.run_grid([(spec, rc)], tmp_path / "records")
    assert continued["resumed-after-round"] == 1 and continued["device"] == "cpu" and continued["device-name"]
    assert _strip(continued["metrics"]) == _strip(whole["metrics"])


def test_a_record_made_on_cuda_in_fp32_counts_for_the_cpu_cell(tmp_path: Path) -> None:
    """A record's device does not make it another run in fp32 (another grid's cpu cell shares
    it, nothing trained); with ``precision=auto`` it does."""
    spec = _spec("gpu-grid")
    rc = _config(tmp_path, spec)
    made = resolve_config({**rc, "device": "cuda"}).as_dict()
    records = tmp_path / "records"
    records.mkdir()
    record = record_of(spec, made, **{"device": "cuda", "device-name": "NVIDIA H100 80GB HBM3"})
    (records / f"{spec.run_id}.json").write_text(json.dumps(record))
    cpu = _spec("cpu-grid")
    assert runner._share_record(cpu, _config(tmp_path, cpu), records / "cpu.json", runner._recorded_runs(records))
    assert json.loads((records / "cpu.json").read_text())["same-run-as"] == spec.run_id
    bf16 = {**record, "config": {**made, "precision": "auto"}}
    (records / f"{spec.run_id}.json").write_text(json.dumps(bf16))
    auto = _config(tmp_path, cpu, precision="auto")
    assert not runner._share_record(cpu, auto, records / "auto.json", runner._recorded_runs(records))


def test_a_run_of_one_seed_keeps_the_other_seeds_on_the_page(tmp_path: Path) -> None:
    """``--seeds 1`` runs only seed 1, yet the page still shows the grid's default seeds'
    records (a seed-1 run once re-rendered ``hassle-sweep`` with its seed-0 cells gone), and
    a re-render shows every seed on record."""
    records = tmp_path / "cpu" / "records"
    records.mkdir(parents=True)
    command = ["reproduce", "--grid", "hassle-sweep", "--out", str(tmp_path), "--render-only"]
    for seed, accuracy in ((0, 0.75), (1, 0.25)):
        spec = next(s for s in _sweep([seed]) if s.column == "FedAvg (labeled only)")
        rows = [{"round": n, "test-accuracy": accuracy, "wall-time": float(n)} for n in range(1, 11)]
        record = record_of(spec, {"method": "supervised"}, **{"last-test-error": 1 - accuracy, "last-round": 10,
                                                            "wall-time-s": 10.0, "metrics": rows})  # fmt: skip
        (records / f"{spec.run_id}.json").write_text(json.dumps(record))
        cli.main([*command, "--seeds", str(seed)])
        page = (tmp_path / "cpu" / "results-hassle-sweep.md").read_text()
        assert page.count("75.00") >= 1 and f"{seed + 1} of " in page  # seed 0's cell stays
    assert "50.00 (35.36; 75.00, 25.00)" in page  # both seeds in one cell: mean (std; each seed)
    # a re-render without --seeds shows every seed on record, not only the defaults (a seed-1
    # record of ``feddb-ablation``, whose default is seed 0, once fell off its page that way)
    spec = next(s for s in _sweep([2]) if s.column == "FedAvg (labeled only)")
    (records / f"{spec.run_id}.json").write_text(json.dumps({**record, "spec": dataclasses.asdict(spec), "run-id": spec.run_id}))
    cli.main(command)
    page = (tmp_path / "cpu" / "results-hassle-sweep.md").read_text()
    assert "3 of " in page and "41.67 (28.87; 75.00, 25.00, 25.00)" in page


def test_a_cell_that_lacks_seeds_of_its_setting_names_the_seeds_it_holds() -> None:
    """A predictor that only the newer records of a setting have (HASSLE's w_S, added after the
    sweep's first seed-0 run) is one seed's value beside two-seed cells: it says so."""
    specs = [s for s in _sweep([0, 1]) if s.row == "preset" and s.column == "HASSLE"]
    records = []
    for spec, predictors in zip(specs, (["EM", "SM", "UM"], ["EM", "SM", "UM", "w_S"]), strict=True):
        rows = [{"round": n, **{f"test-accuracy{'' if p == 'EM' else '-' + p}": 0.5 + spec.seed / 10 for p in predictors}}
                for n in range(1, 11)]  # fmt: skip
        records.append({"spec": dataclasses.asdict(spec), "run-id": spec.run_id, "predictors": predictors, "metrics": rows,
                        "last-round": 10})  # fmt: skip
    table = reproduce.render_table("hassle-sweep", specs, records, "tail-test-error")
    preset = next(line for line in table.splitlines() if line.startswith("| preset"))
    assert "60.00 (seed 1; not recorded at seed 0)" in preset  # w_S
    assert preset.count("55.00 (7.07; 50.00, 60.00)") == 3  # EM, SM, UM: both seeds


def test_gpu_share_and_stop_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU no memory cap is set, on a card the cap names its index; the time limits leave a margin of 15 s + 10% (at most 120 s)."""
    assert runner.share_gpu(torch.device("cpu"), 4) is None
    asked: list[tuple[float, object]] = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: asked.append((f, d)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert runner.share_gpu(torch.device("cuda"), 4) == pytest.approx(0.225)
    assert runner.share_gpu(torch.device("cuda:1"), 2) == pytest.approx(0.45)
    assert asked == [(pytest.approx(0.225), 0), (pytest.approx(0.45), 1)]  # a card index: torch refuses a bare "cuda"
    assert runner.stop_times(10, now=0.0) == (525.0, 562.5)
    assert runner.stop_times(0.5, now=0.0) == (12.0, 21.0)
    assert runner.stop_times(60, now=0.0) == (3480.0, 3540.0)
    with pytest.raises(ValueError, match="positive"):
        runner.stop_times(0)


# --------------------------------------------------------------------------- --stop-after


def test_stop_after_ends_a_grid_in_time_and_the_next_invocation_finishes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that cannot finish in the limit is stopped before it (between rounds, or ended at
    the hard limit), leaves no record but a checkpoint, and the command says so with exit
    status 75; the same command without the limit continues it to one record."""
    out = tmp_path / "out"
    limit = 0.5  # minutes
    command = [*SMOKE, "--methods", "fedavg-10", "--out", str(out), "--set", "num-rounds=40"]
    start = time.monotonic()
    assert cli.main([*command, "--stop-after", str(limit)]) == runner.EXIT_STOPPED
    assert time.monotonic() - start < 60 * limit
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"stopped by --stop-after {limit:g} (minutes): 1 run(s) left without a record")
    records = out / "cpu" / "records"
    assert not list(records.glob("*.json"))
    run_dir = out / "cpu" / "runs" / "smoke__MNIST-sample-IID__FedAvg-10pct__-__s0"
    stopped = load_checkpoint(run_dir).round if (run_dir / CHECKPOINT_FILE).exists() else 0
    assert stopped < 40 and (stopped == 0 or f"(after round {stopped})" in last)
    if (run_dir / "summary.txt").exists():  # stopped between rounds: on record as stopped, not failed
        assert " status=stopped reason=StopRequested: " in (run_dir / "summary.txt").read_text()
    assert cli.main([*command, "--set", f"num-rounds={stopped + 1}"]) == 0  # resume may set num-rounds
    [record] = [json.loads(p.read_text()) for p in records.glob("*.json")]
    assert record["last-round"] == stopped + 1 and record.get("resumed-after-round", 0) == stopped


def test_a_cell_of_one_seed_of_several_names_its_seed() -> None:
    """On a grid of several seeds, a cell that holds one seed's value says which seed it is
    (a failed or unrun seed 0 must not pass a seed-1 number off as seed 0's); a cell holding
    every seed shows the mean, std and each seed."""
    specs = [runner.RunSpec("g", row, "FedAvg", "*", seed, 2, "", {}) for row in ("a", "b") for seed in (0, 1)]
    records = [{"spec": dataclasses.asdict(s), "last-test-error": 0.1 * (1 + s.seed)} for s in specs if s.row == "a" or s.seed == 1]
    table = reproduce.render_table("g", specs, records, "last-test-error")
    row_a = next(line for line in table.splitlines() if line.startswith("| a "))
    row_b = next(line for line in table.splitlines() if line.startswith("| b "))
    assert "15.00 (7.07; 10.00, 20.00)" in row_a and "(seed" not in row_a
    assert "20.00 (seed 1)" in row_b


def test_a_record_made_with_other_settings_never_stands_for_the_asked_run(tmp_path: Path) -> None:
    """A record is keyed by its run id, which does not name --set values: asked with other
    settings (here server-side DP on a grid recorded without it), the grid is refused in one
    line naming the record and the settings that differ, nothing trained; output-only keys
    and keys the record lacks at their default still match it."""
    spec = _spec()
    rc = _config(tmp_path, spec)
    records = tmp_path / "records"
    records.mkdir()
    recorded = resolve_config(rc).as_dict()
    (records / f"{spec.run_id}.json").write_text(json.dumps(record_of(spec, recorded)))
    runner.check_records_match([(spec, {**rc, "verbose": True})], records)  # output-only: the same run
    older = {k: v for k, v in recorded.items() if k != "dp-clipped-count-stddev"}  # made before the key existed
    (records / f"{spec.run_id}.json").write_text(json.dumps(record_of(spec, older)))
    runner.check_records_match([(spec, rc)], records)
    dp = {**rc, "differential-privacy": "server-fixed", "aggregation-weights": "uniform"}
    with pytest.raises(ConfigError, match=rf"^run {re.escape(spec.run_id)}: its record .* was made with other settings "
                       r"\(aggregation-weights='num-examples' there, 'uniform' here, differential-privacy='none' there, "
                       r"'server-fixed' here\)") as refused:  # fmt: skip
        runner.run_cells([(spec, dp)], records)
    assert "\n" not in str(refused.value) and not _folder(rc).exists()


def test_a_run_whose_checkpoint_is_at_num_rounds_writes_its_outputs_without_training(tmp_path: Path) -> None:
    """A run whose last checkpoint reached ``num-rounds`` but whose model, plot and summary
    were never written (a full device after the checkpoint) continues from it: no round is
    trained again (the checkpoint is untouched), the outputs are written, the metrics are the
    run's own."""
    spec = _spec()
    rc = _config(tmp_path, spec)
    whole = runner.execute(spec, rc)
    folder = _folder(rc)
    for name in ("model.pt", "accuracy.png", "summary.txt"):
        (folder / name).unlink(missing_ok=True)
    checkpoint = (folder / CHECKPOINT_FILE).read_bytes(), (folder / CHECKPOINT_FILE).stat().st_mtime_ns
    assert runner.resumable_round(rc) == 2
    [continued] = runner.run_grid([(spec, rc)], tmp_path / "records")
    assert continued["resumed-after-round"] == 2 and continued["last-round"] == 2
    assert ((folder / CHECKPOINT_FILE).read_bytes(), (folder / CHECKPOINT_FILE).stat().st_mtime_ns) == checkpoint
    assert continued["metrics"] == whole["metrics"]
    assert (folder / "model.pt").is_file() and (folder / "summary.txt").read_text().rstrip().endswith(" status=ok")
    assert not list(tmp_path.glob("**/*.set-aside-*"))
    # a run that ended whole is still not resumed: nothing to continue
    with pytest.raises(ConfigError, match="nothing to resume"):
        check_resume(resolve_config({**rc, "resume": True}), folder)
