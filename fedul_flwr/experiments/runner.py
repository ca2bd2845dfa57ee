"""The grid runner shared by ``fedul reproduce`` and ``fedul compare``: resumable in-process
federations, one JSON record per finished run, a progress bar, one log file per run.

A grid is a list of :class:`RunSpec` (where a run goes in a table) with its complete run
configuration. Each run goes through the real ServerApp logic and the real ClientApp via
:class:`fedul_flwr.inprocess.InProcessGrid` (no Ray) and writes its run folder under the
configuration's ``output-dir``. Then:

- its record ``<records>/<run-id>.json`` (run config, resolved config, per-round metrics,
  last-round and best test error, test error at the best-validation round, every
  predictor's errors, wall time, the device and the card or CPU model) is written
  atomically, so a run with a record is skipped and an interrupted grid resumes where it
  stopped: a run without a record continues after the last round of its checkpoint where
  that is exact (:func:`resumable_round`), else it starts afresh -- its old run folder is
  then renamed aside with its log and failure record, never deleted
  (:func:`fedul_flwr.store.set_aside`; ``--clean`` lists such folders, ``--clean --yes``
  removes them);
- every cell runs under its run folder's lock (:class:`fedul_flwr.store.FolderLock`), so two
  runners on one ``--out`` split the grid: a cell whose folder another live process holds is
  skipped with one line (``busy: run X is being trained by PID N on host H``), untouched, and
  a cell another runner recorded meanwhile is not trained again; every file goes through
  :func:`fedul_flwr.store.write_atomic`;
- a run that raises (a NaN loss, too many failed replies, out of memory) is one failed
  cell: its failure record ``<records>/failed/<run-id>.json`` (error type, message, last
  finished round, run folder, log) is never read as a record, every other run goes on, the
  tables are rendered from the records that exist, and the command ends with one line per
  failed cell and exit status 1 (:class:`GridResult`); the next invocation runs the cell
  again;
- settings that change only output (:data:`fedul_flwr.resume.OUTPUT_KEYS`: ``verbose``,
  ``tensorboard``, the run's name and folder, ...) never make a run another one, and in
  float32 (``precision=fp32``) neither does ``device``: a record made on ``cuda`` counts
  for the ``cpu`` cell and a run stopped on one device continues on the other
  (:func:`fedul_flwr.resume.run_settings`, the rule a resumed checkpoint follows too);
- ``stop_after`` (``--stop-after MINUTES``) ends the grid before the limit: runs stop
  between rounds when the next would not end in time (:class:`StoppableGrid`), runs still
  going near the limit are terminated, none gets a record, each continues on the next
  invocation from its checkpoint; the last line says what is left and the exit status is
  75 (:data:`EXIT_STOPPED`);
- Flower's log of the run goes to ``<run folder>/flower.log`` (not to the terminal); the
  terminal shows a progress bar with the time estimate (on a terminal) and one summary line
  per finished run;
- Ctrl-C or SIGTERM stops the runner and its worker processes; a worker whose runner died
  (SIGKILL included) is gone on its own, even while it is still starting or mid-evaluation:
  at once on Linux (the kernel's parent-death signal), within about 1.2 s elsewhere (a
  watchdog; :mod:`fedul_flwr.experiments.worker_start`); an unfinished run writes no record,
  only its per-round checkpoint;
- every record, failure record and checkpoint is read through the store
  (:func:`read_record`, :func:`fedul_flwr.store.read_json`): a damaged one is named in one line
  and set aside (``<name>.damaged-<UTC time>``, never overwritten or deleted), and the cell
  is recorded again from its complete run folder (:func:`record_from_folder`) or trained;
  every move and removal goes through the store too (:func:`fedul_flwr.store.move`,
  ``remove``, ``remove_tree``: lock checked, folder fsynced);
- a full device (:class:`fedul_flwr.store.NoSpace`) is no failed cell: it stops the runner
  and its workers with one line naming the file, the space it needs and the space free
  (the CLI's ``fedul: error: no space left on device writing ...``), no failure record is
  written and every record written before stays whole; a cell is not started where the
  device has less room than the largest run folder this invocation finished;
- a run whose clients and resolved settings (its name aside) equal those of a recorded run,
  e.g. of another grid, is not trained again: it gets a copy of that record with ``same-run-as``.

``jobs`` runs go at once, each in its own spawned worker process (:func:`run_in_workers`;
a worker the OS kills is its run's failure record, never a grid that hangs), each with ``threads`` torch threads
(0: the machine's cores divided by ``jobs``); every run seeds itself, so the results do not
depend on ``jobs``. A run trains its round's clients on the cohort path of its ``cohort``
setting (:func:`fedul_flwr.execution.cohort_path`: on a CPU with 2+ threads, as many clients at
once as threads, each on one; on a GPU one batched model); its record names the path
(``cohort``). On one CUDA card each worker takes ``1 / jobs`` of its memory
(:func:`share_gpu`).

The grid runner is split by role; this module schedules the cells and re-exports the names
its callers import from it:

- :mod:`fedul_flwr.experiments.records`: :class:`RunSpec`, a record's schema, reading and
  writing records and failure records, :func:`record_from_folder`, shared records;
- :mod:`fedul_flwr.experiments.grid_run`: one run in this process (:func:`execute`,
  :class:`StoppableGrid`, :func:`share_gpu`);
- :mod:`fedul_flwr.experiments.cells`: one cell's run folder under its lock (resume or set
  aside, failure records, :func:`resumable_round`);
- :mod:`fedul_flwr.experiments.workers`: the ``--jobs`` worker processes;
- :mod:`fedul_flwr.experiments.grid_cli`: the flags every grid command shares.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from fedul_flwr.config import ConfigError
from fedul_flwr.experiments.cells import (
    Cell, RunOutcome, checkpoint_round, folder_size, record_failure, resumable_round, run_cell,
)
from fedul_flwr.experiments.grid_cli import add_common_arguments, clean, parse_overrides, parse_seeds
from fedul_flwr.experiments.grid_run import (
    GPU_SHARE, StoppableGrid, StopRequested, cohort_record, device_name, execute, flower_log_to, share_gpu,
)
from fedul_flwr.experiments.records import (
    FAILED_DIR, FAILURE_KEYS, LOG_FILE, RECORD_KEYS, RunSpec, best_val_round, check_records_match, failure_line,
    failure_path, load_failures, load_records, read_record, record_from_folder, recorded_runs, same_settings,
    setting_differences, share_record, summary_line,
)
from fedul_flwr.experiments.workers import exit_on_sigterm, run_in_worker, run_in_workers
from fedul_flwr.preflight import check_dataset, resolve_config
from fedul_flwr.resume import run_settings
from fedul_flwr.store import FolderLock, NoSpace, RunFolderInUse, sweep_temporary

# the names tests/test_methods.py and tests/test_grid_runner.py call by their old private spelling
_recorded_runs, _share_record = recorded_runs, share_record

__all__ = [
    "EXIT_FAILED", "EXIT_STOPPED", "FAILED_DIR", "FAILURE_KEYS", "GPU_SHARE", "LOG_FILE", "RECORD_KEYS", "Cell",
    "GridResult", "RunOutcome", "RunSpec", "StopRequested", "StoppableGrid", "add_common_arguments", "best_val_round",
    "check_records_match", "check_run_configs", "clean", "cohort_record", "device_name", "execute", "failure_line",
    "failure_path", "flower_log_to", "load_failures", "load_records", "parse_overrides", "parse_seeds", "read_record",
    "record_failure", "record_from_folder", "recorded_runs", "resumable_round", "run_cells", "run_grid",
    "run_in_worker", "run_in_workers", "run_settings", "same_settings", "setting_differences", "share_gpu",
    "share_record", "stop_times", "summary_line", "threads_per_job",
]  # fmt: skip


def threads_per_job(threads: int, jobs: int) -> int:
    """torch threads of each run: ``threads``, or (0) the machine's cores divided by ``jobs``."""
    return threads or max(1, (os.cpu_count() or 1) // max(1, jobs))


def check_run_configs(runs: Sequence[tuple[RunSpec, dict[str, Any]]], datasets: bool = False) -> None:
    """Resolve every run's configuration and, with ``datasets``, check its dataset
    (:func:`fedul_flwr.preflight.check_dataset`: every image read once per dataset; for the
    runs still to train, so a finished grid renders without its data).

    Raises
    ------
    fedul_flwr.config.ConfigError
        For the first invalid one, naming the run, the key and the value (and the flags that
        set them: ``--data-dir``, ``--set KEY=VALUE``).
    """

    for spec, run_config in runs:
        try:
            cfg = resolve_config(dict(run_config))
            if datasets:
                check_dataset(cfg)  # every image, once per dataset (cached)
        except ConfigError as exc:
            raise ConfigError(f"run {spec.run_id}: {exc} (data-dir is --data-dir, other keys --set KEY=VALUE)") from exc


@dataclass
class GridResult:
    """What a grid invocation (:func:`run_cells`) leaves.

    Attributes
    ----------
    records : list of dict
        The records of the grid's runs that exist (old and new), in the order of the runs.
    failed : list of dict
        The failure records of the runs that failed in this invocation (one per cell).
    unfinished : list of RunOutcome
        Runs the time limit (``stop_after``) left without a record: stopped at a round
        boundary or never started, each with the round its checkpoint holds.
    stop_after : float or None
        The time limit in minutes, if one was given.
    busy : list of RunOutcome
        Runs another live process was training (their folders untouched) and that still have
        no record.
    """

    records: list[dict[str, Any]]
    failed: list[dict[str, Any]] = field(default_factory=list)
    unfinished: list[RunOutcome] = field(default_factory=list)
    stop_after: float | None = None
    busy: list[RunOutcome] = field(default_factory=list)

    def final_lines(self) -> list[str]:
        """One line per failed cell, then (after a time limit) one line saying what is left."""
        lines = [failure_line(f) for f in self.failed]
        if self.unfinished:
            going = [f"{o.run_id} (after round {o.round})" for o in self.unfinished if o.round]
            fresh = len(self.unfinished) - len(going)
            lines.append(
                f"stopped by --stop-after {self.stop_after:g} (minutes): {len(self.unfinished)} run(s) left without a "
                f"record, {len(going)} to continue from their checkpoint" + (f" [{', '.join(going)}]" if going else "")
                + (f", {fresh} to start" if fresh else "") + "; run the same command again to go on"
            )  # fmt: skip
        if self.busy:
            lines.append(f"{len(self.busy)} run(s) were being trained by another process and have no record yet "
                         f"[{', '.join(o.run_id for o in self.busy)}]; run the same command again once it ends")  # fmt: skip
        return lines

    @property
    def exit_code(self) -> int:
        """:data:`EXIT_FAILED` if a run failed, :data:`EXIT_STOPPED` if the time limit left
        runs or another process still trains some, else 0."""
        return EXIT_FAILED if self.failed else EXIT_STOPPED if self.unfinished or self.busy else 0


EXIT_FAILED = 1
"""Exit status of a grid command with a failed run (its other runs finished and rendered)."""


EXIT_STOPPED = 75
"""Exit status of a grid command that ``--stop-after`` stopped with runs left, or that left
runs another process was training (none failed): ``EX_TEMPFAIL`` of sysexits.h, "try again"
-- the same command continues them."""


def run_grid(
    runs: Sequence[tuple[RunSpec, dict[str, Any]]], records_dir: Path, jobs: int = 1, threads: int = 0, name: str = "grid"
) -> list[dict[str, Any]]:
    """Run every run whose record is missing and return the records of all ``runs``
    (:func:`run_cells`' records: a failed run has none)."""
    return run_cells(runs, records_dir, jobs, threads, name).records


def run_cells(
    runs: Sequence[tuple[RunSpec, dict[str, Any]]],
    records_dir: Path,
    jobs: int = 1,
    threads: int = 0,
    name: str = "grid",
    stop_after: float | None = None,
    started: float | None = None,
) -> GridResult:
    """Run every run whose record is missing: the grid runner of ``fedul reproduce`` and
    ``fedul compare``.

    A run that raises is one failed cell: its failure record goes to
    ``<records_dir>/failed/<run-id>.json`` (:func:`failure_path`; never read as a record, so
    the next invocation runs the cell again) and every other run goes on.

    Parameters
    ----------
    runs : sequence of (RunSpec, dict)
        Each run's place in the table and its complete run config.
    records_dir : Path
        Where the records are (``<run-id>.json``).
    jobs : int
        Runs at once (spawned worker processes; 1: in this process unless ``stop_after``).
        On one CUDA card, each takes ``1 / jobs`` of its memory (:func:`share_gpu`).
    threads : int
        torch threads per run (0: cores // jobs).
    name : str
        Shown in the progress bar.
    stop_after : float or None
        Minutes after which nothing may still run. A run stops at a round boundary when its
        next round would end later (:class:`StoppableGrid`), no run starts after
        :func:`stop_times`' soft limit, and runs still going at its hard limit are
        terminated (their checkpoint holds their last finished round). Unfinished runs get
        no record; the next invocation continues them.
    started : float or None
        ``time.time()`` from which ``stop_after`` counts (the command's start; None: now).

    Returns
    -------
    GridResult
        The records, this invocation's failures and the runs the limit left.
    """

    check_run_configs(runs)  # a grid with a bad run is refused before anything runs or is written
    check_records_match(runs, records_dir)  # a record answers only for the run it was made by
    todo = [(s, rc, str(records_dir / f"{s.run_id}.json")) for s, rc in runs if not (records_dir / f"{s.run_id}.json").exists()]
    if todo:  # a run recorded already, e.g. in another grid, is not trained again
        recorded = recorded_runs(records_dir)
        todo = [(s, rc, path) for s, rc, path in todo if not share_record(s, rc, Path(path), recorded)]
    check_run_configs([(s, rc) for s, rc, _ in todo], datasets=True)  # every image the runs will train on
    records_dir.mkdir(parents=True, exist_ok=True)

    for folder in (records_dir, records_dir / FAILED_DIR):
        sweep_temporary(folder)  # partial records of a killed writer
    per_run = threads_per_job(threads, jobs)
    soft, hard = stop_times(stop_after, started) if stop_after is not None else (None, None)
    print(f"[{name}] {len(runs) - len(todo)} of {len(runs)} runs have records; running {len(todo)}, "
          f"{jobs} at a time, {per_run} torch thread(s) each"
          + (f"; stopping within {stop_after:g} min" if stop_after is not None else ""), flush=True)  # fmt: skip
    start = time.time()
    outcomes: dict[str, RunOutcome] = {}
    with tqdm(total=len(todo), desc=name, unit="run", disable=None, file=sys.stderr) as bar:

        def report(outcome: RunOutcome) -> None:
            outcomes[outcome.run_id] = outcome
            bar.update(1)  # a no-op where the bar is off (not a terminal)
            done, elapsed = len(outcomes), time.time() - start
            eta = elapsed / done * (len(todo) - done)
            head = f"[{done}/{len(todo)} {_clock(elapsed)} elapsed, ~{_clock(eta)} left]"
            if outcome.note and outcome.status != "recorded":
                bar.write(f"{head} {outcome.note}" if outcome.status == "busy" else f"{head} {outcome.run_id}: {outcome.note}")
            if outcome.status == "finished":
                bar.write(f"{head} {summary_line(outcome.record or {})}")
            elif outcome.status == "failed":
                bar.write(f"{head} {failure_line(outcome.record or {})}")
            elif outcome.status == "stopped":
                when = f"after round {outcome.round} (checkpointed)" if outcome.round else "before its first round"
                bar.write(f"{head} {outcome.run_id}: stopped by the time limit {when}")
            elif outcome.status == "recorded" and outcome.note:
                bar.write(f"{head} {outcome.run_id}: recorded meanwhile by another runner")
            if outcome.status == "finished" and outcome.record is not None:
                largest[0] = max(largest[0], folder_size(Path(outcome.record["run-dir"])))

        largest = [0]  # bytes of the largest run folder this invocation finished

        def room_for(item: tuple[Any, ...]) -> None:
            """Stop before a cell when its device has less room than the largest run folder this
            invocation finished (the grid's cells are alike): a full device is not a failed cell."""
            run_dir = Cell.of(item[1], item[2]).run_dir
            free = _free_space(run_dir)
            if free is not None and free < largest[0]:
                raise NoSpace(run_dir, largest[0])

        def run(items: list[tuple[Any, ...]]) -> None:
            if soft is not None and time.time() >= soft:
                return  # no time left for a round: start no worker
            if jobs <= 1 and hard is None:
                for item in items:
                    room_for(item)
                    report(run_cell(*item))
                return
            # SIGTERM (kill, a scheduler's time limit) becomes SystemExit here, so leaving the
            # ``with`` block terminates the workers instead of leaving them running orphaned
            previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
            try:
                run_in_workers(items, jobs, hard, report, room_for)
            finally:
                signal.signal(signal.SIGTERM, previous)

        args = {spec.run_id: (spec, rc, path, per_run, jobs, soft) for spec, rc, path in todo}
        run(list(args.values()))
        # a cell another runner held may be free by now (that runner ended or stopped it): one more pass
        again = [args[o.run_id] for o in outcomes.values() if o.status == "busy" and _free(args[o.run_id])]
        if again:
            bar.write(f"[{name}] {len(again)} cell(s) another runner held are free now: running them")
            run(again)
    records_done = {s.run_id for s, _, path in todo if Path(path).exists()}
    mine = [o for o in outcomes.values() if o.status in ("stopped", "not-started") and o.run_id not in records_done]
    held = [o for o in outcomes.values() if o.status == "busy" and o.run_id not in records_done]
    for spec, rc, path in todo:  # never tried (the time limit): this runner's, unless another runner has it
        if spec.run_id in outcomes or spec.run_id in records_done:
            continue
        outcome = RunOutcome(spec.run_id, "not-started", round=checkpoint_round(Cell.of(rc, path).run_dir))
        (mine if _free(args[spec.run_id]) else held).append(outcome)
    failed = [o.record for o in outcomes.values() if o.status == "failed" and o.record is not None]
    return GridResult(load_records([s for s, _ in runs], records_dir), failed, mine, stop_after, held)


def _free(item: tuple[Any, ...]) -> bool:
    """Whether the run folder of a cell (:func:`run_cell`'s arguments) has no live holder."""

    try:
        FolderLock.acquire(Cell.of(item[1], item[2]).run_dir).release()
    except RunFolderInUse:
        return False
    return True


def stop_times(minutes: float, now: float | None = None) -> tuple[float, float]:
    """The soft and hard limits (``time.time()`` values) of a grid that must end within
    ``minutes`` from ``now``: a margin of 15 s + 10% (at most 120 s) before the limit no
    round may still run (the soft limit), half of it before the limit the runs still going
    are terminated (the hard limit), which leaves the rest for rendering the tables and the
    interpreter's exit (seconds on a loaded machine: torch's and Flower's teardown).

    Raises
    ------
    ValueError
        If ``minutes`` is not positive.
    """
    if not minutes > 0:
        raise ValueError(f"--stop-after {minutes!r}: expected a positive number of minutes")
    limit = (time.time() if now is None else now) + 60 * minutes
    margin = min(120.0, 15 + 6 * minutes)
    return limit - margin, limit - margin / 2


def _free_space(path: Path) -> int | None:
    """Bytes free on the file system of ``path`` (or of its nearest existing folder)."""

    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
