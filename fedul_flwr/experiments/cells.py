"""One cell of a grid: its run folder, the folder's lock, and what the run leaves there.

:func:`run_cell` trains one run (:func:`fedul_flwr.experiments.grid_run.execute`) under its run
folder's lock (:class:`fedul_flwr.store.FolderLock`), so two runners on one ``--out`` split a
grid: a cell whose folder another live process holds is ``busy`` and untouched, and a cell
another runner recorded meanwhile is not trained again. A run without a record continues after
the last round of its checkpoint where that is exact (:func:`resumable_round`), else it starts
afresh and its old run folder is renamed aside with its log and failure record, never deleted
(:func:`fedul_flwr.store.set_aside`). A run that raises is one failed cell: its failure record
(:func:`record_failure`) names the error, the last finished round, the run folder and the log.
A full device (:class:`fedul_flwr.store.NoSpace`) is no failed cell: it is raised, and the
runner stops. Flower's log of the run goes to ``<run folder>/flower.log``; every move and
removal goes through the store (lock checked, folder fsynced).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedul_flwr.checkpoint import RESUMABLE_STRATEGIES, CheckpointError, CheckpointMissing, load_checkpoint
from fedul_flwr.experiments.grid_run import StopRequested, execute, flower_log_to
from fedul_flwr.experiments.records import (
    FAILED_DIR, LOG_FILE, RunSpec, read_record, record_from_folder, recorded_runs, share_record,
)
from fedul_flwr.outputs import resolve_output_dir, running_time
from fedul_flwr.preflight import resolve_config
from fedul_flwr.resume import resume_conflicts, run_finished
from fedul_flwr.store import (
    FolderLock, RunFolderInUse, move, no_space, remove, set_aside, utc_stamp, write_json,
)

__all__ = ["Cell", "RunOutcome", "checkpoint_round", "folder_size", "record_failure", "resumable_round", "run_cell"]


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


def _resume_plan(run_config: Mapping[str, Any]) -> tuple[int, str]:
    """(:func:`resumable_round`, why the stopped run in the run folder cannot go on: ``""``
    where it can or where the folder holds no checkpoint)."""
    ckpt_dir = Path(run_config["output-dir"]) / run_config["run-name"]
    try:
        ckpt = load_checkpoint(ckpt_dir)
    except CheckpointMissing:  # the run stopped before its first checkpoint
        return 0, "it has no checkpoint (no round was checkpointed)"
    except CheckpointError as exc:  # unreadable
        return 0, str(exc)
    if run_config.get("strategy") not in RESUMABLE_STRATEGIES:
        return 0, f"strategy={run_config.get('strategy')!r} cannot be resumed"
    if ckpt.node_draws is None:  # its rounds drew their nodes from Python's random: continued, not exact
        return 0, "its checkpoint predates the seeded node draws"
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


def checkpoint_round(run_dir: Path) -> int:
    """The round of ``run_dir``'s checkpoint (0: none, or unreadable)."""
    try:
        return load_checkpoint(run_dir).round
    except CheckpointError:
        return 0


@dataclass(frozen=True)
class Cell:
    """Where one run of a grid keeps its files: the run folder, the log beside it while the run
    trains (a new run needs an empty folder), and its record and failure record."""

    run_dir: Path
    record: Path

    @classmethod
    def of(cls, run_config: Mapping[str, Any], path: str) -> Cell:
        return cls(resolve_output_dir(str(run_config["output-dir"])) / run_config["run-name"], Path(path))

    @property
    def log(self) -> Path:
        return self.run_dir.parent / f"{self.run_dir.name}.{LOG_FILE}"

    @property
    def failure(self) -> Path:
        return self.record.parent / FAILED_DIR / self.record.name


def run_cell(
    spec: RunSpec, run_config: dict[str, Any], path: str, threads: int, jobs: int = 1, stop_at: float | None = None
) -> RunOutcome:
    """Train one cell: :func:`~fedul_flwr.experiments.grid_run.execute` with Flower's log in the
    run folder; writes the record atomically.

    Everything happens under the run folder's lock (:class:`fedul_flwr.store.FolderLock`): a
    folder another live process holds is ``busy`` and nothing of it is touched; a run another
    runner recorded meanwhile is not trained again. A stopped run is continued from its
    checkpoint where :func:`resumable_round` allows, else its folder is set aside
    (:func:`_set_aside`). A run that raises writes a failure record (:func:`record_failure`,
    :func:`~fedul_flwr.experiments.records.failure_path`) instead and returns; one that reaches
    ``stop_at`` (:class:`~fedul_flwr.experiments.grid_run.StoppableGrid`) writes nothing more
    and keeps its checkpoint.
    """
    cell = Cell.of(run_config, path)
    if stop_at is not None and time.time() >= stop_at:
        return RunOutcome(spec.run_id, "not-started", round=checkpoint_round(cell.run_dir))
    try:
        lock = FolderLock.acquire(cell.run_dir)
    except RunFolderInUse as exc:
        return RunOutcome(spec.run_id, "busy", note=f"busy: run {spec.run_id} is being trained by {exc.holder}")
    with lock:
        record = read_record(cell.record)  # a damaged one is set aside: the cell is recorded again
        if record is not None:  # another runner finished it since this one listed its cells
            return RunOutcome(spec.run_id, "recorded", record, note=f"recorded meanwhile by another runner: {cell.record}")
        if share_record(spec, run_config, cell.record, recorded_runs(cell.record.parent)):  # one trained meanwhile
            return RunOutcome(spec.run_id, "recorded", read_record(cell.record))
        record = record_from_folder(spec, run_config, cell.run_dir)
        if record is not None:  # a damaged record of a complete run: written again, nothing trained
            write_json(cell.record, record)
            return RunOutcome(spec.run_id, "finished", record, int(record["last-round"]),
                              note=f"recorded again from its complete run folder {cell.run_dir}")  # fmt: skip
        return _train_cell(spec, run_config, cell, lock, threads, jobs, stop_at)


def _train_cell(spec: RunSpec, run_config: dict[str, Any], cell: Cell, lock: FolderLock, threads: int, jobs: int,
                stop_at: float | None) -> RunOutcome:  # fmt: skip
    """The body of :func:`run_cell`, ``lock`` held."""
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
            record["resumed-after-round"] = resumed
            record["wall-time-s"] += running_time(r for r in record["metrics"] if r["round"] <= resumed)
        record["log"] = str(log)
        _retire_failure(cell, cell.run_dir, lock)
        write_json(cell.record, record)
    except StopRequested:
        _log_into_folder(cell, lock)
        return RunOutcome(spec.run_id, "stopped", round=checkpoint_round(cell.run_dir), note=note)
    except Exception as exc:  # noqa: BLE001 -- one failed run is one failed cell, never the grid
        full = no_space(exc, cell.run_dir)
        if full is not None:  # not this cell's failure: the device's, which stops the grid (run_cells)
            with contextlib.suppress(OSError):
                _log_into_folder(cell, lock)
            raise full.needing(folder_size(cell.run_dir)) from None
        return record_failure(spec, run_config, cell, lock, type(exc).__name__, str(exc), time.time() - start, note)
    return RunOutcome(spec.run_id, "finished", record, int(record["last-round"]), note)


def _keep_in(folder: Path, source: Path, name: str, lock: FolderLock) -> Path:
    """Move ``source`` into ``folder`` as ``name``, or as ``<stem>-<UTC time><suffix>`` where
    ``name`` is taken: nothing is overwritten (:func:`fedul_flwr.store.move`, ``lock`` held).
    Returns the new path."""
    target = folder / name
    if target.exists():
        stem, dot, suffix = name.partition(".")
        target = folder / f"{stem}-{utc_stamp(precise=True)}{dot}{suffix}"
    return move(source, target, lock)


def _set_aside(cell: Cell, lock: FolderLock, why: str) -> str:
    """Clear the way for a fresh run of ``cell`` (its lock held): the run folder, if any, is
    set aside (:func:`fedul_flwr.store.set_aside`: renamed, never deleted) with the log of its
    last attempt and its failure record, which is rewritten to point at the set-aside folder and
    log. Returns the note the grid prints ("" when there was no folder)."""
    aside = set_aside(cell.run_dir, lock)
    if aside is None:  # a run that died before it made its folder: its log goes on in the new one
        return ""
    log = _keep_in(aside, cell.log, LOG_FILE, lock) if cell.log.is_file() else aside / LOG_FILE
    _retire_failure(cell, aside, lock, {"run-dir": str(aside), "log": str(log)})
    return f"its earlier run folder cannot be continued ({why}): kept as {aside}"


def _retire_failure(cell: Cell, folder: Path, lock: FolderLock, moved: Mapping[str, str] | None = None) -> None:
    """Move ``cell``'s failure record, if any, into ``folder`` as ``failure-<UTC time>.json``
    (``moved``: the paths it names that changed), so a new attempt never overwrites it and the
    grid no longer lists the cell as failed. A damaged one is set aside where it is
    (:func:`read_record`); where ``folder`` does not exist it is renamed beside itself as
    ``<run-id>.kept-<UTC time>.json``: a failure record is never overwritten."""
    failure = read_record(cell.failure, failure=True)
    if failure is None:
        return
    if not folder.is_dir():
        move(cell.failure, cell.failure.with_name(f"{cell.failure.stem}.kept-{utc_stamp(precise=True)}.json"), lock)
        return
    write_json(folder / f"failure-{utc_stamp(precise=True)}.json", {**failure, **(moved or {})})
    remove(cell.failure, lock)  # its content lives on in ``folder``


def record_failure(spec: RunSpec, run_config: dict[str, Any], cell: Cell, lock: FolderLock, error_type: str, error: str,
          seconds: float, note: str = "") -> RunOutcome:  # fmt: skip
    """Write the failure record of a run that raised or whose worker died (its folder's lock
    held), its log moved into its folder; the outcome the grid reports."""
    log = _log_into_folder(cell, lock)
    failure = {
        "run-id": spec.run_id, "spec": asdict(spec), "run-config": run_config, "status": "failed",
        "error-type": error_type, "error": error, "round-reached": checkpoint_round(cell.run_dir),
        "run-dir": str(cell.run_dir), "log": str(log), "wall-time-s": seconds,
    }  # fmt: skip
    _retire_failure(cell, cell.run_dir, lock)
    cell.failure.parent.mkdir(parents=True, exist_ok=True)
    write_json(cell.failure, failure)
    return RunOutcome(spec.run_id, "failed", failure, failure["round-reached"], note)


def _log_into_folder(cell: Cell, lock: FolderLock) -> Path:
    """Move a run's log into its folder (``lock``, its lock, held), where it stays while the run
    is not running; returns where the log is."""
    if cell.log.is_file() and cell.run_dir.is_dir():
        return _keep_in(cell.run_dir, cell.log, LOG_FILE, lock)
    return cell.run_dir / LOG_FILE if cell.run_dir.is_dir() else cell.log


def folder_size(folder: Path) -> int:
    """Bytes of the files under ``folder`` (0 where there is none)."""
    with contextlib.suppress(OSError):
        return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    return 0
