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
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.app import Message, MessageType

from fedul_flwr.resume import run_settings
from fedul_flwr.experiments import worker_start
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.outputs import RunStopped
from fedul_flwr.store import (
    Check, DamagedFile, NoSpace, RunLogHandler, is_int, is_number, list_of, no_space, of_type, optional, read_json,
    set_aside_damaged,
)

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from fedul_flwr.store import FolderLock

    import torch

__all__ = [
    "EXIT_FAILED", "EXIT_STOPPED", "GridResult", "RunOutcome", "RunSpec", "StopRequested", "StoppableGrid",
    "add_common_arguments", "best_val_round", "check_run_configs", "device_name", "execute", "failure_line",
    "failure_path", "load_failures", "load_records", "parse_overrides", "parse_seeds", "read_record", "record_from_folder",
    "resumable_round", "run_cells", "run_grid", "run_in_worker", "run_in_workers",
    "run_settings", "share_gpu", "stop_times", "threads_per_job",
]  # fmt: skip

LOG_FILE = "flower.log"
"""Name of a run's Flower log inside its run folder."""


@dataclass(frozen=True)
class RunSpec:
    """One run of a grid: where it goes in the table and what it overrides.

    Attributes
    ----------
    grid : str
        The grid's name (e.g. ``"table1"``, ``"compare"``).
    row, column, sub : str
        Table row (e.g. ``"MNIST IID"``), column (e.g. ``"FedUL"``) and sub-column inside a
        cell (e.g. the number of sets ``"10"``; ``"*"``: none).
    seed : int
        The run's seed.
    clients : int
        Number of simulated clients (nodes).
    preset : str
        The preset the run starts from (``""``: the defaults).
    overrides : dict
        Run-config values of this run.
    """

    grid: str
    row: str
    column: str
    sub: str
    seed: int
    clients: int
    preset: str
    overrides: dict[str, Any]

    @property
    def run_id(self) -> str:
        """File-safe id, unique within a results folder."""
        text = f"{self.grid}__{self.row}__{self.column}__{self.sub}__s{self.seed}"
        return "".join(c if c.isalnum() or c in "-_." else "-" for c in text.replace("%", "pct"))


def threads_per_job(threads: int, jobs: int) -> int:
    """torch threads of each run: ``threads``, or (0) the machine's cores divided by ``jobs``."""
    return threads or max(1, (os.cpu_count() or 1) // max(1, jobs))


def best_val_round(metrics: Sequence[Mapping[str, float]]) -> int | None:
    """Round >= 1 with the lowest ``val-error`` (earliest on ties); None without validation."""
    rows = [r for r in metrics if r["round"] >= 1 and "val-error" in r]
    return int(min(rows, key=lambda r: (r["val-error"], r["round"]))["round"]) if rows else None


@contextlib.contextmanager
def flower_log_to(path: Path) -> Iterator[RunLogHandler]:
    """Send Flower's log (the ``flwr`` logger and the project's loggers under it) to ``path``
    instead of the terminal while the block runs (:class:`fedul_flwr.store.RunLogHandler`: a
    full device silences it, and the block's end raises its :class:`~fedul_flwr.store.NoSpace`)."""
    import flwr.common.logger  # noqa: F401  (attaches Flower's console handler: take it off after that)

    logger = logging.getLogger("flwr")
    console = [h for h in logger.handlers if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    handler = RunLogHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for h in console:
        logger.removeHandler(h)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        handler.close()
        for h in console:
            logger.addHandler(h)
    handler.raise_if_full()


def execute(
    spec: RunSpec, run_config: dict[str, Any], threads: int = 0, *, jobs: int = 1, stop_at: float | None = None,
    lock: FolderLock | None = None,
) -> dict[str, Any]:
    """Run one federation in this process and return its JSON record.

    Parameters
    ----------
    spec : RunSpec
        Where the run goes in the table.
    run_config : dict
        Complete run config (dashed keys, with ``output-dir`` and ``run-name``).
    threads : int
        torch threads (0: leave as is).
    jobs : int
        Runs of the grid at once: on a CUDA device this process takes its share of the
        card's memory (:func:`share_gpu`).
    stop_at : float or None
        ``time.time()`` by which no round may still be running (:class:`StoppableGrid`).
    lock : FolderLock or None
        The run folder's lock, held by the caller (None: the run takes it).

    Returns
    -------
    dict
        The record (see the module doc). Deterministic for a given run config on CPU, apart
        from the ``wall-time`` entries.

    Raises
    ------
    fedul_flwr.config.ConfigError
        If ``run_config`` is invalid (``cohort='parallel'`` on a CUDA device included).
    StopRequested
        If ``stop_at`` comes before the next round could end (the last finished round is in
        the run's checkpoint).
    """
    import torch

    from fedul_flwr.client_app import app
    from fedul_flwr.preflight import resolve_config
    from fedul_flwr.config import ConfigError
    from fedul_flwr.data import simulated
    from fedul_flwr.execution import cohort_path, pick_device
    from fedul_flwr.server_app import run_federation

    if threads:
        torch.set_num_threads(threads)
    start = time.time()
    cfg = resolve_config(run_config)
    device = pick_device(cfg.device)
    share_gpu(device, jobs)
    try:
        path, workers = cohort_path(cfg.cohort, device, torch.get_num_threads(), cfg.client_threads)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    grid = StoppableGrid(app, spec.clients, run_config, stop_at=stop_at, path=path, workers=workers)
    try:
        outputs = run_federation(grid, cfg, lock=lock)
    finally:  # a grid visits many configs, and a worker goes on after a failed or stopped run
        grid.close()
        simulated.load_client.cache_clear()  # free the client tensors
        if device.type == "cuda":
            torch.cuda.empty_cache()  # and the card's cached blocks, for the other runs on it
    metrics = [outputs.rows[r] for r in sorted(outputs.rows)]
    return {
        **_results(spec, run_config, cfg, metrics),
        "wall-time-s": time.time() - start,
        "threads": torch.get_num_threads(),
        "cohort": cohort_record(grid),
        "device": device.type,
        "device-name": device_name(device),
        "run-dir": str(outputs.path),
    }


def _results(spec: RunSpec, run_config: dict[str, Any], cfg: Any, metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """The part of a run's record that its settings and metric rows make (:func:`execute`)."""
    from fedul_flwr.methods import get_method

    tested = [r for r in metrics if "test-error" in r]
    best = best_val_round(metrics)
    by_round = {int(r["round"]): r for r in metrics}
    names = list(get_method(cfg.method)(cfg).predictors())  # the headline first (HASSLE: EM, SM, UM)
    predictors: dict[str, Any] = {"predictors": names}  # the others are recorded as test-accuracy-<name>
    for name in names[1:]:
        errors = [1.0 - r[f"test-accuracy-{name}"] for r in tested if r["round"] >= 1]
        predictors[f"last-test-error-{name}"] = 1.0 - tested[-1][f"test-accuracy-{name}"]
        predictors[f"best-test-error-{name}"] = min(errors) if errors else None
    later = [r for r in tested if r["round"] >= 1]
    return {
        "run-id": spec.run_id,
        "spec": asdict(spec),
        "run-config": run_config,
        "config": cfg.as_dict(),
        "metrics": metrics,
        "last-round": int(tested[-1]["round"]),
        "last-test-error": tested[-1]["test-error"],
        "best-test-error": min(r["test-error"] for r in later) if later else None,
        "best-round": int(min(later, key=lambda r: (r["test-error"], r["round"]))["round"]) if later else None,
        "best-val-round": best,
        "best-val-test-error": by_round[best]["test-error"] if best is not None else None,
        **predictors,
    }


def record_from_folder(spec: RunSpec, run_config: dict[str, Any], run_dir: Path) -> dict[str, Any] | None:
    """The record of ``spec`` made again from its complete run folder, or ``None`` where the
    folder is not complete: its ``summary.txt`` says ``status=ok``, its ``config.json`` holds
    the settings asked for (:func:`same_settings`) and its ``metrics.json`` every round up to
    ``num-rounds`` with a test error. What a record takes from the process that trained it
    and the folder does not keep is ``None`` (``threads``, ``cohort``, ``device-name``); the
    wall time is the run's (its last metric row); ``rebuilt-from-run-folder`` is true.
    Used when a cell's record was damaged (:func:`read_record`): nothing is trained again.
    Reads only."""
    from fedul_flwr.preflight import resolve_config
    from fedul_flwr.outputs import read_metrics, running_time

    try:
        if not (run_dir / "summary.txt").read_text().rstrip().endswith(" status=ok"):
            return None
        cfg = resolve_config(dict(run_config))
        if not same_settings(run_settings(read_json(run_dir / "config.json")), run_settings(cfg.as_dict())):
            return None
        metrics = read_metrics(run_dir)
        tested = {int(r["round"]) for r in metrics if "test-error" in r}
        if max(tested, default=-1) != cfg.num_rounds or not all(r in tested for r in range(1, cfg.num_rounds + 1)):
            return None
        record = _results(spec, run_config, cfg, metrics)
    except (OSError, ValueError, KeyError, TypeError):  # DamagedFile included: then it is retrained
        return None
    log = run_dir / LOG_FILE
    return {**record, "wall-time-s": running_time(metrics), "threads": None, "cohort": None,
            "device": cfg.as_dict().get("device"), "device-name": None, "run-dir": str(run_dir),
            **({"log": str(log)} if log.is_file() else {}), "rebuilt-from-run-folder": True}  # fmt: skip


def cohort_record(grid: InProcessGrid) -> dict[str, Any]:
    """The record's ``cohort``: the path this process ran the run's rounds on, how many clients
    at once (``"all"`` on the batched path) and, there, how many client trainings joined the
    batched model and how many trained alone (a method, strategy or model the path cannot
    take). A resumed run's rounds before the resume ran in another process, maybe on another
    path: the record names this process's."""
    out: dict[str, Any] = {"path": grid.cohort_path, "clients-at-once": "all" if grid.cohort_path == "batched" else grid.workers}
    if grid.cohort_path == "batched":
        out.update({"trained-batched": grid.trained["batched"], "trained-alone": grid.trained["alone"]})
    return out


class StopRequested(RunStopped):
    """A run stopped at a round boundary because the grid's time limit (``--stop-after``)
    comes before its next round could end; its checkpoint holds every finished round."""


class StoppableGrid(InProcessGrid):
    """:class:`~fedul_flwr.inprocess.InProcessGrid` that stops its run between rounds when
    a time limit comes too close.

    Before sending a round's training messages it raises :class:`StopRequested` when
    ``now + the longest round so far`` would pass ``stop_at``. The ServerApp writes the
    checkpoint of a round at its end (after the central evaluation), so the stopped run can
    be continued exactly from its last finished round; the round that would not have fitted
    is not started. Without a round measured yet (a run's first round here) it stops only
    when ``stop_at`` has passed.

    Parameters
    ----------
    *args
        Those of :class:`~fedul_flwr.inprocess.InProcessGrid`.
    stop_at : float or None
        ``time.time()`` by which no round may still be running; None: no limit.
    """

    def __init__(self, *args: Any, stop_at: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stop_at = stop_at
        self.longest_round = 0.0  # seconds, of the rounds run in this process
        self._round_started: float | None = None

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Flower's round step; a round's training messages first pass the time check."""
        messages = list(messages)
        if self.stop_at is not None and messages and messages[0].metadata.message_type == MessageType.TRAIN:
            now = time.time()
            if self._round_started is not None:
                self.longest_round = max(self.longest_round, now - self._round_started)
            if now + self.longest_round > self.stop_at:
                raise StopRequested(f"stopped before its next round: {self.stop_at - now:.0f}s left, rounds take "
                                    f"up to {self.longest_round:.0f}s")  # fmt: skip
            self._round_started = now
        return super().send_and_receive(messages, timeout=timeout)


def share_gpu(device: torch.device, jobs: int) -> float | None:
    """Cap this process's share of a CUDA card's memory when ``jobs`` runs share it.

    Each ``--jobs`` worker is a process with its own CUDA caching allocator, which keeps
    what it once held: without a cap, one run's peak can leave another none. With
    ``jobs > 1`` on a CUDA ``device``, ``torch.cuda.set_per_process_memory_fraction`` limits
    this process to :data:`GPU_SHARE` / ``jobs`` of the card (a run that needs more fails
    alone, as one failed cell, instead of another run).

    Returns
    -------
    float or None
        The fraction set; None on a CPU or with one job.
    """
    if device.type != "cuda" or jobs <= 1:
        return None
    import torch

    fraction = GPU_SHARE / jobs
    index = device.index if device.index is not None else torch.cuda.current_device()  # "cuda" names no card
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction


GPU_SHARE = 0.9
"""Share of a CUDA card's memory the ``--jobs`` runs on it split among them (each process's
CUDA context, a few hundred MiB, comes on top of the allocator's cap)."""


def device_name(device: torch.device) -> str:
    """The card's name (``NVIDIA H100 80GB HBM3``) or the CPU's model, for a run's record."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from fedul_flwr.experiments.benchmark import machine_info

    return str(machine_info()["cpu"])


def _resume_plan(run_config: Mapping[str, Any]) -> tuple[int, str]:
    """(:func:`resumable_round`, why the stopped run in the run folder cannot go on: ``""``
    where it can or where the folder holds no checkpoint)."""
    from fedul_flwr.checkpoint import RESUMABLE_STRATEGIES, CheckpointError, CheckpointMissing, load_checkpoint
    from fedul_flwr.preflight import resolve_config
    from fedul_flwr.resume import resume_conflicts, run_finished

    ckpt_dir = Path(run_config["output-dir"]) / run_config["run-name"]
    try:
        ckpt = load_checkpoint(ckpt_dir)
    except CheckpointMissing:  # the run stopped before its first checkpoint
        return 0, "it has no checkpoint (no round was checkpointed)"
    except CheckpointError as exc:  # unreadable
        return 0, str(exc)
    if run_config.get("strategy") not in RESUMABLE_STRATEGIES:
        return 0, f"strategy={run_config.get('strategy')!r} cannot be resumed"
    if ckpt.random_state is None:  # written before the sampling state was saved: not exact
        return 0, "its checkpoint predates the saved sampling state"
    conflicts = resume_conflicts(ckpt.config, resolve_config(dict(run_config)))  # the ServerApp's own rule
    if conflicts:
        return 0, "other settings (" + "; ".join(conflicts) + ")"
    rounds = int(run_config["num-rounds"])
    if ckpt.round > rounds or (ckpt.round == rounds and run_finished(ckpt_dir)):  # at num-rounds: outputs written only
        return 0, f"its checkpoint is at round {ckpt.round}, num-rounds={run_config['num-rounds']}"
    return ckpt.round, ""


def resumable_round(run_config: Mapping[str, Any]) -> int:
    """Last round of an unfinished run that can be continued from its checkpoint, else 0.

    A run folder without a record holds a stopped run. It is continued (``resume=true``)
    where its ``checkpoint.pt`` was written with the same resolved settings (``num-rounds``
    and what :func:`~fedul_flwr.resume.run_settings` leaves out aside: the output-only
    :data:`~fedul_flwr.resume.OUTPUT_KEYS`, ``device`` in float32) and the strategy keeps
    all its state on the server (:data:`~fedul_flwr.checkpoint.RESUMABLE_STRATEGIES`); such
    a run ends with the weights of an uninterrupted one. The checkpoint's tensors are loaded
    onto the CPU (``map_location``), so a run stopped on a GPU goes on on a CPU and back.
    Anything else (no or unreadable checkpoint, other settings, SCAFFOLD) is started afresh
    (0), its old folder kept aside (:func:`_set_aside`).
    """
    return _resume_plan(run_config)[0]


@dataclass(frozen=True)
class RunOutcome:
    """What became of one run of a grid.

    Attributes
    ----------
    run_id : str
        The run's id.
    status : str
        ``finished`` (``record`` is its record), ``failed`` (``record`` is its failure
        record), ``stopped`` (by the time limit, at a round boundary), ``not-started``,
        ``busy`` (another live process holds its folder: nothing of it was touched) or
        ``recorded`` (another runner recorded it meanwhile; ``record`` is that record).
    record : dict or None
        See ``status``.
    round : int
        The last round in the run's checkpoint (what a rerun continues from).
    note : str
        What happened to an old run folder, if anything (``""``).
    """

    run_id: str
    status: str
    record: dict[str, Any] | None = None
    round: int = 0
    note: str = ""


def failure_path(records_dir: Path, run_id: str) -> Path:
    """Where a failed run's failure record goes: ``<records>/failed/<run-id>.json``, beside
    the records and never read as one (it never blocks a rerun and is never a result)."""
    return records_dir / FAILED_DIR / f"{run_id}.json"


FAILED_DIR = "failed"
"""Sub-folder of a grid's records that holds the failure records of its failed runs."""


def _checkpoint_round(run_dir: Path) -> int:
    """The round of ``run_dir``'s checkpoint (0: none, or unreadable)."""
    from fedul_flwr.checkpoint import CheckpointError, load_checkpoint

    try:
        return load_checkpoint(run_dir).round
    except CheckpointError:
        return 0


@dataclass(frozen=True)
class _Cell:
    """Where one run of a grid keeps its files: the run folder, the log beside it while the run
    trains (a new run needs an empty folder), and its record and failure record."""

    run_dir: Path
    record: Path

    @classmethod
    def of(cls, run_config: Mapping[str, Any], path: str) -> _Cell:
        from fedul_flwr.outputs import resolve_output_dir

        return cls(resolve_output_dir(str(run_config["output-dir"])) / run_config["run-name"], Path(path))

    @property
    def log(self) -> Path:
        return self.run_dir.parent / f"{self.run_dir.name}.{LOG_FILE}"

    @property
    def failure(self) -> Path:
        return self.record.parent / FAILED_DIR / self.record.name


def _keep_in(folder: Path, source: Path, name: str, lock: FolderLock) -> Path:
    """Move ``source`` into ``folder`` as ``name``, or as ``<stem>-<UTC time><suffix>`` where
    ``name`` is taken: nothing is overwritten (:func:`fedul_flwr.store.move`, ``lock`` held).
    Returns the new path."""
    from fedul_flwr.store import move, utc_stamp

    target = folder / name
    if target.exists():
        stem, dot, suffix = name.partition(".")
        target = folder / f"{stem}-{utc_stamp(precise=True)}{dot}{suffix}"
    return move(source, target, lock)


def _set_aside(cell: _Cell, lock: FolderLock, why: str) -> str:
    """Clear the way for a fresh run of ``cell`` (its lock held): the run folder, if any, is
    set aside (:func:`fedul_flwr.store.set_aside`: renamed, never deleted) with the log of its
    last attempt and its failure record, which is rewritten to point at the set-aside folder and
    log. Returns the note the grid prints ("" when there was no folder)."""
    from fedul_flwr.store import set_aside

    aside = set_aside(cell.run_dir, lock)
    if aside is None:  # a run that died before it made its folder: its log goes on in the new one
        return ""
    log = _keep_in(aside, cell.log, LOG_FILE, lock) if cell.log.is_file() else aside / LOG_FILE
    _retire_failure(cell, aside, lock, {"run-dir": str(aside), "log": str(log)})
    return f"its earlier run folder cannot be continued ({why}): kept as {aside}"


def _retire_failure(cell: _Cell, folder: Path, lock: FolderLock, moved: Mapping[str, str] | None = None) -> None:
    """Move ``cell``'s failure record, if any, into ``folder`` as ``failure-<UTC time>.json``
    (``moved``: the paths it names that changed), so a new attempt never overwrites it and the
    grid no longer lists the cell as failed. A damaged one is set aside where it is
    (:func:`read_record`); where ``folder`` does not exist it is renamed beside itself as
    ``<run-id>.kept-<UTC time>.json``: a failure record is never overwritten."""
    from fedul_flwr.store import move, remove, utc_stamp, write_json

    failure = read_record(cell.failure, failure=True)
    if failure is None:
        return
    if not folder.is_dir():
        move(cell.failure, cell.failure.with_name(f"{cell.failure.stem}.kept-{utc_stamp(precise=True)}.json"), lock)
        return
    write_json(folder / f"failure-{utc_stamp(precise=True)}.json", {**failure, **(moved or {})})
    remove(cell.failure, lock)  # its content lives on in ``folder``


def _execute_to_file(
    spec: RunSpec, run_config: dict[str, Any], path: str, threads: int, jobs: int = 1, stop_at: float | None = None
) -> RunOutcome:
    """:func:`execute` with Flower's log in the run folder; writes the record atomically.

    Everything happens under the run folder's lock (:class:`fedul_flwr.store.FolderLock`): a
    folder another live process holds is ``busy`` and nothing of it is touched; a run another
    runner recorded meanwhile is not trained again. A stopped run is continued from its
    checkpoint where :func:`resumable_round` allows, else its folder is set aside
    (:func:`_set_aside`). A run that raises writes a failure record (:func:`failure_path`)
    instead and returns; one that reaches ``stop_at`` (:class:`StoppableGrid`) writes nothing
    more and keeps its checkpoint.
    """
    from fedul_flwr.store import FolderLock, RunFolderInUse, write_json

    cell = _Cell.of(run_config, path)
    if stop_at is not None and time.time() >= stop_at:
        return RunOutcome(spec.run_id, "not-started", round=_checkpoint_round(cell.run_dir))
    try:
        lock = FolderLock.acquire(cell.run_dir)
    except RunFolderInUse as exc:
        return RunOutcome(spec.run_id, "busy", note=f"busy: run {spec.run_id} is being trained by {exc.holder}")
    with lock:
        record = read_record(cell.record)  # a damaged one is set aside: the cell is recorded again
        if record is not None:  # another runner finished it since this one listed its cells
            return RunOutcome(spec.run_id, "recorded", record, note=f"recorded meanwhile by another runner: {cell.record}")
        if _share_record(spec, run_config, cell.record, _recorded_runs(cell.record.parent)):  # one trained meanwhile
            return RunOutcome(spec.run_id, "recorded", read_record(cell.record))
        record = record_from_folder(spec, run_config, cell.run_dir)
        if record is not None:  # a damaged record of a complete run: written again, nothing trained
            write_json(cell.record, record)
            return RunOutcome(spec.run_id, "finished", record, int(record["last-round"]),
                              note=f"recorded again from its complete run folder {cell.run_dir}")  # fmt: skip
        return _train_cell(spec, run_config, cell, lock, threads, jobs, stop_at)


def _train_cell(spec: RunSpec, run_config: dict[str, Any], cell: _Cell, lock: FolderLock, threads: int, jobs: int,
                stop_at: float | None) -> RunOutcome:  # fmt: skip
    """The body of :func:`_execute_to_file`, ``lock`` held."""
    from fedul_flwr.store import move, write_json

    start, note = time.time(), ""
    try:
        resumed, why = _resume_plan(run_config)
        if resumed:
            run_config = {**run_config, "resume": True}
            _retire_failure(cell, cell.run_dir, lock)  # the run goes on in its folder: so does the story of its failure
            if (cell.run_dir / LOG_FILE).is_file() and not cell.log.exists():
                move(cell.run_dir / LOG_FILE, cell.log, lock)  # the log goes on
        else:  # a run without a record never finished (a killed grid, a failure): it starts afresh
            note = _set_aside(cell, lock, why)
        cell.run_dir.parent.mkdir(parents=True, exist_ok=True)
        with flower_log_to(cell.log) as log_handler:
            try:
                record = execute(spec, run_config, threads, jobs=jobs, stop_at=stop_at, lock=lock)
            except StopRequested as exc:
                logging.getLogger("flwr").info("fedul-flwr: the grid's time limit: %s", exc)
                raise
            except Exception as exc:
                if no_space(exc, cell.run_dir) is None and log_handler.no_space is None:
                    logging.getLogger("flwr").exception("fedul-flwr: run %s failed", spec.run_id)
                raise
        log = _log_into_folder(cell, lock)
        if resumed:  # the stopped part's rows (the server kept them): their running time counts too
            from fedul_flwr.outputs import running_time

            record["resumed-after-round"] = resumed
            record["wall-time-s"] += running_time(r for r in record["metrics"] if r["round"] <= resumed)
        record["log"] = str(log)
        _retire_failure(cell, cell.run_dir, lock)
        write_json(cell.record, record)
    except StopRequested:
        _log_into_folder(cell, lock)
        return RunOutcome(spec.run_id, "stopped", round=_checkpoint_round(cell.run_dir), note=note)
    except Exception as exc:  # noqa: BLE001 -- one failed run is one failed cell, never the grid
        full = no_space(exc, cell.run_dir)
        if full is not None:  # not this cell's failure: the device's, which stops the grid (run_cells)
            with contextlib.suppress(OSError):
                _log_into_folder(cell, lock)
            raise full.needing(_folder_size(cell.run_dir)) from None
        return _fail(spec, run_config, cell, lock, type(exc).__name__, str(exc), time.time() - start, note)
    return RunOutcome(spec.run_id, "finished", record, int(record["last-round"]), note)


def _free_space(path: Path) -> int | None:
    """Bytes free on the file system of ``path`` (or of its nearest existing folder)."""
    import shutil

    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _folder_size(folder: Path) -> int:
    """Bytes of the files under ``folder`` (0 where there is none)."""
    with contextlib.suppress(OSError):
        return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    return 0


def _fail(spec: RunSpec, run_config: dict[str, Any], cell: _Cell, lock: FolderLock, error_type: str, error: str,
          seconds: float, note: str = "") -> RunOutcome:  # fmt: skip
    """Write the failure record of a run that raised or whose worker died (its folder's lock
    held), its log moved into its folder; the outcome the grid reports."""
    from fedul_flwr.store import write_json

    log = _log_into_folder(cell, lock)
    failure = {
        "run-id": spec.run_id, "spec": asdict(spec), "run-config": run_config, "status": "failed",
        "error-type": error_type, "error": error, "round-reached": _checkpoint_round(cell.run_dir),
        "run-dir": str(cell.run_dir), "log": str(log), "wall-time-s": seconds,
    }  # fmt: skip
    _retire_failure(cell, cell.run_dir, lock)
    cell.failure.parent.mkdir(parents=True, exist_ok=True)
    write_json(cell.failure, failure)
    return RunOutcome(spec.run_id, "failed", failure, failure["round-reached"], note)


def _worker_died(item: tuple[Any, ...], why: str, seconds: float) -> RunOutcome:
    """The outcome of a run whose worker died without one: its failure record, written under
    the folder's lock (the dead worker's is free); ``busy`` if another runner took the folder
    in between (nothing of it is touched then)."""
    from fedul_flwr.store import FolderLock, RunFolderInUse

    spec, run_config, path = item[0], item[1], item[2]
    cell = _Cell.of(run_config, path)
    try:
        lock = FolderLock.acquire(cell.run_dir)
    except RunFolderInUse as exc:
        return RunOutcome(spec.run_id, "busy", note=f"its worker died ({why}); busy: run {spec.run_id} is being "
                          f"trained by {exc.holder}")  # fmt: skip
    with lock:
        return _fail(spec, run_config, cell, lock, "WorkerDied", f"the run's worker process ended without an outcome "
                     f"({why}; SIGKILL is the kernel's out-of-memory killer's)", seconds)  # fmt: skip


def run_in_worker(conn: Connection, item: tuple[Any, ...]) -> None:
    """A ``--jobs`` worker process's run, once it is bound to die with its runner
    (:func:`fedul_flwr.experiments.worker_start.start`, the process's target, which calls
    this): one run (:func:`_execute_to_file`), its outcome sent back on ``conn``.

    SIGTERM stops the run (``status=stopped`` in its folder, its checkpoint holding the last
    finished round); the runner's death ends the worker (Linux: the kernel's SIGKILL at once;
    elsewhere the watchdog's SIGTERM, then ``os._exit``), whatever the run is doing, so a rerun
    never races an orphan. A full device (:class:`fedul_flwr.store.NoSpace`) is sent back as
    the outcome: the runner stops the grid. The process ends with ``os._exit`` once its run
    has ended (every file written and synced), without the interpreter's teardown."""
    import traceback

    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    code = 0
    try:
        outcome: RunOutcome | NoSpace
        try:
            outcome = _execute_to_file(*item)
        except Exception as exc:
            full = no_space(exc, item[2])
            if full is None:
                raise
            outcome = full
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the run is over: a SIGTERM from here on ends the process quietly
        with contextlib.suppress(OSError):
            conn.send(outcome)
            conn.close()
    except SystemExit as exc:  # SIGTERM: the run stopped (status=stopped, its checkpoint kept)
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 -- a crash: the runner records WorkerDied with this exit code
        traceback.print_exc()
        code = 1
    finally:
        # every file of the run is written and synced by now: skip the interpreter's teardown
        # (seconds of torch's and Flower's finalisers, during which no watchdog runs any more)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def run_in_workers(items: Sequence[tuple[Any, ...]], jobs: int, hard: float | None,
                   report: Callable[[RunOutcome], None], before: Callable[[tuple[Any, ...]], None] | None = None,
                   ) -> None:  # fmt: skip
    """Each run of ``items`` (:func:`_execute_to_file`'s arguments) in its own spawned
    process, at most ``jobs`` at once, ``report`` called with each outcome as it comes.

    A worker that dies without an outcome (killed by the OS for memory, a signal, a crash in
    native code) is that run's failure: a failure record naming its exit code, and the
    grid goes on with the others (a pool would wait for it forever). At ``hard`` (a
    ``time.time()`` value; None: never) the runs still going are terminated; their
    checkpoints hold their last finished round, and they are not reported. Leaving early
    (Ctrl-C, SIGTERM made SystemExit) terminates every worker too, and a worker whose runner
    dies (even by SIGKILL) stops on its own (:mod:`fedul_flwr.experiments.worker_start`). ``before`` is called with each
    item before its worker starts (e.g. to stop on a full device); a worker that meets a full
    device sends its :class:`~fedul_flwr.store.NoSpace`, which is raised here after the other
    workers are terminated.
    """
    ctx = multiprocessing.get_context("spawn")
    pending, live = list(items), {}
    try:
        while pending or live:
            while pending and len(live) < max(1, jobs):
                item = pending.pop(0)
                if before is not None:
                    before(item)
                receiver, sender = ctx.Pipe(duplex=False)
                # the target imports nothing heavy before it is bound to die with this process
                process = ctx.Process(target=worker_start.start, args=(sender, pickle.dumps((run_in_worker, item)), os.getpid()),
                                      name=f"fedul-run-{item[0].run_id}", daemon=True)  # fmt: skip
                process.start()
                sender.close()  # the child's end: it closes when the child exits, sent or not
                live[receiver] = (process, item, time.time())
            timeout = None if hard is None else max(0.0, hard - time.time())
            ready = multiprocessing.connection.wait(list(live), timeout)
            if not ready:  # the hard limit
                return
            for receiver in ready:
                process, item, started = live.pop(receiver)
                try:
                    outcome = receiver.recv()
                    if isinstance(outcome, NoSpace):  # the device is full: the grid stops (the others too)
                        live[receiver] = (process, item, started)
                        raise outcome
                except EOFError:  # the worker died before it could send its outcome
                    process.join()
                    code = process.exitcode
                    why = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                    outcome = _worker_died(item, why, time.time() - started)
                receiver.close()
                process.join()
                report(outcome)
    finally:
        for process, _, _ in live.values():
            process.terminate()
        for process, _, _ in live.values():
            process.join()


def _log_into_folder(cell: _Cell, lock: FolderLock) -> Path:
    """Move a run's log into its folder (``lock``, its lock, held), where it stays while the run
    is not running; returns where the log is."""
    if cell.log.is_file() and cell.run_dir.is_dir():
        return _keep_in(cell.run_dir, cell.log, LOG_FILE, lock)
    return cell.run_dir / LOG_FILE if cell.run_dir.is_dir() else cell.log


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def summary_line(record: Mapping[str, Any]) -> str:
    """One line per finished run: its id, last-round and best test error, wall time, log."""
    best_val = record.get("best-val-test-error")
    best = record.get("best-test-error")
    return (
        f"{record['run-id']}: last-round test error {100 * record['last-test-error']:.2f}% "
        f"best {'-' if best is None else f'{100 * best:.2f}%'} "
        + ("" if best_val is None else f"at-best-val {100 * best_val:.2f}% ")
        + f"({record['wall-time-s']:.0f}s; log {record.get('log', record.get('run-dir', '-'))})"
    )


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
    from fedul_flwr.preflight import check_dataset, resolve_config
    from fedul_flwr.config import ConfigError

    for spec, run_config in runs:
        try:
            cfg = resolve_config(dict(run_config))
            if datasets:
                check_dataset(cfg)  # every image, once per dataset (cached)
        except ConfigError as exc:
            raise ConfigError(f"run {spec.run_id}: {exc} (data-dir is --data-dir, other keys --set KEY=VALUE)") from exc


def check_records_match(runs: Sequence[tuple[RunSpec, dict[str, Any]]], records_dir: Path) -> None:
    """Refuse a grid whose existing records were made with other settings than the ones asked
    for now (e.g. ``--set differential-privacy=server-fixed`` on a grid recorded without DP):
    a record is keyed by its run id, which does not name ``--set`` values, so it would stand
    for a run that was never trained. Settings are compared as :func:`same_settings` does
    (output-only keys aside, a key the record lacks counting as its default).

    Raises
    ------
    fedul_flwr.config.ConfigError
        Naming the run, its record, and up to three settings that differ.
    """
    from fedul_flwr.preflight import resolve_config
    from fedul_flwr.config import ConfigError

    for spec, run_config in runs:
        path = records_dir / f"{spec.run_id}.json"
        record = read_record(path)
        if record is None:  # none, or damaged (now set aside): the cell is recorded again
            continue
        recorded = run_settings(record.get("config", {}))
        differ = setting_differences(recorded, run_settings(resolve_config(dict(run_config)).as_dict()))
        if not differ:
            continue
        shown = ", ".join(f"{k}={a!r} there, {b!r} here" for k, a, b in differ[:3]) + (
            f" and {len(differ) - 3} more" if len(differ) > 3 else "")  # fmt: skip
        raise ConfigError(
            f"run {spec.run_id}: its record {path} was made with other settings ({shown}); a record answers for the "
            "run that made it: give these settings another --out, or move that record away to train the run anew"
        )


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


def failure_line(failure: Mapping[str, Any]) -> str:
    """One line for a failed run: its id, error type and message (first 200 characters, on
    one line), the last round it finished, its log and failure record."""
    message = " ".join(str(failure["error"]).split())
    message = message if len(message) <= 200 else message[:199] + "…"
    return (f"FAILED {failure['run-id']}: {failure['error-type']} after round {failure['round-reached']}: {message} "
            f"(log {failure['log']})")  # fmt: skip


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
    from tqdm import tqdm

    check_run_configs(runs)  # a grid with a bad run is refused before anything runs or is written
    check_records_match(runs, records_dir)  # a record answers only for the run it was made by
    todo = [(s, rc, str(records_dir / f"{s.run_id}.json")) for s, rc in runs if not (records_dir / f"{s.run_id}.json").exists()]
    if todo:  # a run recorded already, e.g. in another grid, is not trained again
        recorded = _recorded_runs(records_dir)
        todo = [(s, rc, path) for s, rc, path in todo if not _share_record(s, rc, Path(path), recorded)]
    check_run_configs([(s, rc) for s, rc, _ in todo], datasets=True)  # every image the runs will train on
    records_dir.mkdir(parents=True, exist_ok=True)
    from fedul_flwr.store import sweep_temporary

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
                largest[0] = max(largest[0], _folder_size(Path(outcome.record["run-dir"])))

        largest = [0]  # bytes of the largest run folder this invocation finished

        def room_for(item: tuple[Any, ...]) -> None:
            """Stop before a cell when its device has less room than the largest run folder this
            invocation finished (the grid's cells are alike): a full device is not a failed cell."""
            run_dir = _Cell.of(item[1], item[2]).run_dir
            free = _free_space(run_dir)
            if free is not None and free < largest[0]:
                raise NoSpace(run_dir, largest[0])

        def run(items: list[tuple[Any, ...]]) -> None:
            if soft is not None and time.time() >= soft:
                return  # no time left for a round: start no worker
            if jobs <= 1 and hard is None:
                for item in items:
                    room_for(item)
                    report(_execute_to_file(*item))
                return
            # SIGTERM (kill, a scheduler's time limit) becomes SystemExit here, so leaving the
            # ``with`` block terminates the workers instead of leaving them running orphaned
            previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
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
        outcome = RunOutcome(spec.run_id, "not-started", round=_checkpoint_round(_Cell.of(rc, path).run_dir))
        (mine if _free(args[spec.run_id]) else held).append(outcome)
    failed = [o.record for o in outcomes.values() if o.status == "failed" and o.record is not None]
    return GridResult(load_records([s for s, _ in runs], records_dir), failed, mine, stop_after, held)


def _free(item: tuple[Any, ...]) -> bool:
    """Whether the run folder of a cell (:func:`_execute_to_file`'s arguments) has no live holder."""
    from fedul_flwr.store import FolderLock, RunFolderInUse

    try:
        FolderLock.acquire(_Cell.of(item[1], item[2]).run_dir).release()
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


def same_settings(recorded: Mapping[str, Any], requested: Mapping[str, Any]) -> bool:
    """Whether two runs' settings (:func:`~fedul_flwr.resume.run_settings`) are one run's. A key one of them lacks
    (added to the project after its record was written) counts as its default, the rule a
    resumed checkpoint follows (:func:`fedul_flwr.resume.resume_conflicts`): a new key's
    default keeps the behaviour the older record was trained with."""
    return not setting_differences(recorded, requested)


def setting_differences(recorded: Mapping[str, Any], requested: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, recorded value, requested value) of every setting two runs differ in, sorted by key,
    a key one of them lacks counting as its default (:func:`same_settings`)."""
    from fedul_flwr.config import default_config

    defaults = default_config()
    pairs = ((k, recorded.get(k, defaults.get(k)), requested.get(k, defaults.get(k))) for k in sorted({*recorded, *requested}))
    return [(k, a, b) for k, a, b in pairs if a != b]


def _recorded_runs(records_dir: Path) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    """The trained (not shared) records in ``records_dir``: (clients, resolved settings, record)."""
    runs = []
    for path in sorted(records_dir.glob("*.json")):
        record = read_record(path)
        if record is not None and "spec" in record and not record.get("same-run-as"):
            runs.append((record["spec"]["clients"], run_settings(record["config"]), record))
    return runs


def _share_record(spec: RunSpec, run_config: dict[str, Any], path: Path, recorded: Sequence[tuple[int, dict[str, Any], dict[str, Any]]]) -> bool:
    """Write ``spec``'s record from a recorded run of the same clients and settings, if any.

    Two grids may hold the same run (HASSLE's full method is a column of Table 1 and of the
    ablation). A record of ``recorded`` (:func:`_recorded_runs`) with as many clients and the
    same resolved settings (:func:`same_settings`; name and folder aside) is copied under this
    run's id with ``same-run-as`` naming the original; nothing is trained. Returns whether it was.
    """
    from fedul_flwr.preflight import resolve_config
    from fedul_flwr.store import write_json

    requested = run_settings(resolve_config(dict(run_config)).as_dict())
    record = next((r for clients, settings, r in recorded if clients == spec.clients and same_settings(settings, requested)), None)
    if record is None:
        return False
    write_json(path, {**record, "run-id": spec.run_id, "spec": asdict(spec), "run-config": run_config,
                      "same-run-as": record["run-id"]})  # fmt: skip
    print(f"[{spec.grid}] {spec.run_id}: the same run as {record['run-id']} (record shared)", flush=True)
    return True


def _metric_row(row: Any) -> bool:
    """A metric row of a record: a JSON object with an integer ``round``, its other values
    numbers, ``null``, or the lists of node ids (``failed-nodes``, ``trained-nodes``)."""
    return (isinstance(row, dict) and is_int(row.get("round"))
            and all(is_number(v) or v is None or isinstance(v, list) for k, v in row.items() if k != "round"))  # fmt: skip


def _spec(value: Any) -> bool:
    """A record's ``spec``: a JSON object naming its grid's row and column (strings)."""
    return isinstance(value, dict) and all(isinstance(value.get(k), str) for k in ("row", "column"))


_TEXT, _OBJECT = of_type(str), of_type(dict)
RECORD_KEYS: dict[str, Check] = {
    "run-id": _TEXT, "spec": _spec, "run-config": _OBJECT, "config": _OBJECT, "metrics": list_of(_metric_row),
    "last-round": is_int, "last-test-error": is_number, "best-test-error": optional(is_number),
    "best-round": optional(is_int), "best-val-round": optional(is_int), "best-val-test-error": optional(is_number),
    "predictors": list_of(_TEXT), "wall-time-s": is_number, "threads": optional(is_int),
    "cohort": optional(_OBJECT), "device": optional(_TEXT), "device-name": optional(_TEXT), "run-dir": _TEXT,
}  # fmt: skip
"""The declared schema of a record: each key the runner and the grid's page read, and the
check of its value (:func:`fedul_flwr.store.read_json`). A file in a grid's records without
one of them, or with a value its check refuses, is damaged (:func:`read_record`)."""
FAILURE_KEYS: dict[str, Check] = {
    "run-id": _TEXT, "spec": _spec, "run-config": _OBJECT, "error-type": _TEXT, "error": _TEXT,
    "round-reached": optional(is_int), "run-dir": _TEXT, "log": _TEXT, "wall-time-s": is_number,
}  # fmt: skip
"""The declared schema of a failure record (a file in ``<records>/failed``)."""


def read_record(path: Path, failure: bool = False) -> dict[str, Any] | None:
    """The record (or with ``failure`` the failure record) at ``path``, read through the store
    (:func:`fedul_flwr.store.read_json`); ``None`` where there is none. A damaged one (empty,
    cut short, not JSON, not a record) is named in one line on stderr and set aside
    (:func:`fedul_flwr.store.set_aside_damaged`: renamed ``<name>.damaged-<UTC time>``,
    never overwritten or deleted), and ``None`` is returned: the grid then records the cell
    again from its complete run folder (:func:`record_from_folder`) or trains it."""
    keys = FAILURE_KEYS if failure else RECORD_KEYS
    try:
        return read_json(path, dict, keys)
    except FileNotFoundError:
        return None
    except DamagedFile as exc:
        aside = set_aside_damaged(path, read=lambda p: read_json(p, dict, keys))
        if aside is None:  # written whole meanwhile by another runner
            with contextlib.suppress(FileNotFoundError, DamagedFile):
                return read_json(path, dict, keys)
            return None
        print(f"fedul: damaged {'failure record' if failure else 'record'}: {exc}; set aside as {aside.name}",
              file=sys.stderr, flush=True)  # fmt: skip
        return None


def load_records(specs: Sequence[RunSpec], records_dir: Path) -> list[dict[str, Any]]:
    """The existing records of ``specs``, in their order (a damaged one is named and set
    aside, :func:`read_record`)."""
    records = (read_record(records_dir / f"{s.run_id}.json") for s in specs)
    return [r for r in records if r is not None]


def load_failures(specs: Sequence[RunSpec], records_dir: Path) -> list[dict[str, Any]]:
    """The failure records (:func:`failure_path`) of those ``specs`` that have no record, in
    their order: what the grid's page lists as failed runs (a damaged one is named and set
    aside, :func:`read_record`)."""
    paths = [failure_path(records_dir, s.run_id) for s in specs if not (records_dir / f"{s.run_id}.json").exists()]
    failures = (read_record(p, failure=True) for p in paths)
    return [f for f in failures if f is not None]


# --------------------------------------------------------------------------- flag conventions


def _data_dir(text: str) -> str:
    return str(Path(text).expanduser().resolve()) if text else ""


def add_common_arguments(p: argparse.ArgumentParser, out: str, seeds_help: str = "comma list of seeds") -> None:
    """The flags every grid command shares: ``--seeds 0,1``, ``--data-dir``, ``--out``,
    ``--set KEY=VALUE`` (repeatable), ``--jobs``, ``--threads`` (0: cores // jobs),
    ``--clean [--yes]`` (:func:`clean`), ``--stop-after MINUTES`` (:func:`run_cells`' ``stop_after``)."""
    p.add_argument("--seeds", default="", help=seeds_help)
    p.add_argument("--data-dir", default="", type=_data_dir,
                   help="torchvision root of the non-embedded datasets (made absolute)")  # fmt: skip
    p.add_argument("--out", default=out, help="results folder: records/, runs/ (each with its flower.log), tables")
    p.add_argument("--set", action="append", default=[], metavar="[COLUMN:]KEY=VALUE",
                   help="run-config value for every run (or only a column's runs, where the command has columns)")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1, help="runs at once (worker processes)")
    p.add_argument("--threads", type=int, default=0, help="torch threads per run; 0: the machine's cores // jobs")
    p.add_argument("--clean", action="store_true",
                   help="list the set-aside run folders (earlier attempts that could not be continued) and exit")
    p.add_argument("--yes", action="store_true", help="with --clean: remove them")
    p.add_argument("--stop-after", type=_minutes, default=None, metavar="MINUTES",
                   help="end within MINUTES: runs stop between rounds (checkpointed, no record) and continue when the "
                   "same command runs again; exit status 75 while runs are left")  # fmt: skip


def clean(runs_dir: Path, remove: bool) -> int:
    """``--clean``: print the set-aside run folders under ``runs_dir`` (:func:`fedul_flwr.store.set_aside`)
    with their sizes, and with ``remove`` (``--yes``) delete them: the only way this project
    deletes a run folder. Returns the exit status (0)."""
    from fedul_flwr.store import remove_tree, set_aside_folders

    folders = set_aside_folders(runs_dir)
    total = 0
    for folder in folders:
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        total += size
        print(f"{folder}  {size / 2**20:.1f} MiB")
    if not folders:
        print(f"no set-aside run folders in {runs_dir}")
    elif remove:
        for folder in folders:
            remove_tree(folder)
        print(f"removed {len(folders)} set-aside run folder(s), {total / 2**20:.1f} MiB")
    else:
        print(f"{len(folders)} set-aside run folder(s), {total / 2**20:.1f} MiB: add --yes to remove them")
    return 0


def _minutes(text: str) -> float:
    """``--stop-after`` value: a positive number of minutes."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number of minutes")
    return value


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"0,1,2"`` -> ``(0, 1, 2)``; ``""`` -> ``()``.

    Raises
    ------
    SystemExit
        On a value that is not an integer (the message names it).
    """
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise SystemExit(f"--seeds {text!r}: expected a comma list of integers, e.g. 0,1,2") from None


def parse_overrides(items: Sequence[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``--set`` values: ``key=value`` (every run) and ``column:key=value`` (one column's
    runs), typed like the key's default.

    Raises
    ------
    SystemExit
        On a malformed item or a key that ``[tool.flwr.app.config]`` lacks.
    """
    from fedul_flwr.config import ConfigError, coerce_value, default_config

    defaults = default_config()
    common: dict[str, Any] = {}
    targeted: dict[str, dict[str, Any]] = {}
    for item in items:
        target, _, assignment = item.rpartition(":") if ":" in item.split("=", 1)[0] else ("", "", item)
        key, sep, text = assignment.partition("=")
        if not sep or key not in defaults:
            raise SystemExit(f"--set {item!r}: expected [column:]key=value with a key of [tool.flwr.app.config]")
        try:
            value = coerce_value(key, text, type(defaults[key]))
        except ConfigError as exc:
            raise SystemExit(f"--set {item!r}: {exc}") from None
        (targeted.setdefault(target, {}) if target else common)[key] = value
    return common, targeted
