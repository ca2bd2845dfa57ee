"""``--jobs`` worker processes: each run of a grid in its own spawned process.

:func:`run_in_workers` runs each cell (:func:`fedul_flwr.experiments.cells.run_cell`'s
arguments) in a spawned process, at most ``jobs`` at once. A worker the OS kills (out of
memory, a signal, a crash in native code) is its run's failure record, never a grid that hangs.
Ctrl-C or SIGTERM stops the runner and its workers; a worker whose runner died (SIGKILL
included) is gone on its own, even while it is still starting or mid-evaluation: at once on
Linux (the kernel's parent-death signal), within about 1.2 s elsewhere (a watchdog;
:mod:`fedul_flwr.experiments.worker_start`); an unfinished run writes no record, only its
per-round checkpoint.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from fedul_flwr.experiments import worker_start
from fedul_flwr.experiments.cells import Cell, RunOutcome, record_failure, run_cell
from fedul_flwr.store import FolderLock, NoSpace, RunFolderInUse, no_space

__all__ = ["exit_on_sigterm", "run_in_worker", "run_in_workers"]


def run_in_workers(items: Sequence[tuple[Any, ...]], jobs: int, hard: float | None,
                   report: Callable[[RunOutcome], None], before: Callable[[tuple[Any, ...]], None] | None = None,
                   ) -> None:  # fmt: skip
    """Each run of ``items`` (:func:`run_cell`'s arguments) in its own spawned
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


def run_in_worker(conn: Connection, item: tuple[Any, ...]) -> None:
    """A ``--jobs`` worker process's run, once it is bound to die with its runner
    (:func:`fedul_flwr.experiments.worker_start.start`, the process's target, which calls
    this): one run (:func:`run_cell`), its outcome sent back on ``conn``.

    SIGTERM stops the run (``status=stopped`` in its folder, its checkpoint holding the last
    finished round); the runner's death ends the worker (Linux: the kernel's SIGKILL at once;
    elsewhere the watchdog's SIGTERM, then ``os._exit``), whatever the run is doing, so a rerun
    never races an orphan. A full device (:class:`fedul_flwr.store.NoSpace`) is sent back as
    the outcome: the runner stops the grid. The process ends with ``os._exit`` once its run
    has ended (every file written and synced), without the interpreter's teardown."""

    signal.signal(signal.SIGTERM, exit_on_sigterm)
    code = 0
    try:
        outcome: RunOutcome | NoSpace
        try:
            outcome = run_cell(*item)
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


def _worker_died(item: tuple[Any, ...], why: str, seconds: float) -> RunOutcome:
    """The outcome of a run whose worker died without one: its failure record, written under
    the folder's lock (the dead worker's is free); ``busy`` if another runner took the folder
    in between (nothing of it is touched then)."""

    spec, run_config, path = item[0], item[1], item[2]
    cell = Cell.of(run_config, path)
    try:
        lock = FolderLock.acquire(cell.run_dir)
    except RunFolderInUse as exc:
        return RunOutcome(spec.run_id, "busy", note=f"its worker died ({why}); busy: run {spec.run_id} is being "
                          f"trained by {exc.holder}")  # fmt: skip
    with lock:
        return record_failure(spec, run_config, cell, lock, "WorkerDied", f"the run's worker process ended without an outcome "
                     f"({why}; SIGKILL is the kernel's out-of-memory killer's)", seconds)  # fmt: skip


def exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM as ``SystemExit(128 + signum)``: leaving a ``with`` or ``try`` block cleans up."""
    raise SystemExit(128 + signum)
