"""One run of a grid in this process: a federation through the real ServerApp and ClientApp.

:func:`execute` runs one :class:`~fedul_flwr.experiments.records.RunSpec` with its complete run
configuration through :class:`fedul_flwr.inprocess.InProcessGrid` (no Ray) and returns its
record (:mod:`fedul_flwr.experiments.records`). A round's clients train on the cohort path of
the run's ``cohort`` setting (:func:`fedul_flwr.execution.cohort_path`: on a CPU with 2+
threads, as many clients at once as threads, each on one; on a GPU one batched model); the
record names the path (``cohort``). On one CUDA card each of ``jobs`` runs takes ``1 / jobs`` of
its memory (:func:`share_gpu`). A time limit stops a run between rounds
(:class:`StoppableGrid`), and Flower's log goes to a file (:func:`flower_log_to`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import flwr.common.logger  # noqa: F401  (attaches Flower's console handler, which flower_log_to takes off)
import torch
from flwr.app import Message, MessageType

from fedul_flwr.client_app import app
from fedul_flwr.config import ConfigError
from fedul_flwr.data import simulated
from fedul_flwr.execution import cohort_path, pick_device
from fedul_flwr.experiments.bench_core import cpu_model
from fedul_flwr.experiments.records import RunSpec, run_results
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.outputs import RunStopped
from fedul_flwr.preflight import resolve_config
from fedul_flwr.server_app import run_federation
from fedul_flwr.store import FolderLock, RunLogHandler

__all__ = ["GPU_SHARE", "StopRequested", "StoppableGrid", "cohort_record", "device_name", "execute", "flower_log_to", "share_gpu"]


@contextlib.contextmanager
def flower_log_to(path: Path) -> Iterator[RunLogHandler]:
    """Send Flower's log (the ``flwr`` logger and the project's loggers under it) to ``path``
    instead of the terminal while the block runs (:class:`fedul_flwr.store.RunLogHandler`: a
    full device silences it, and the block's end raises its :class:`~fedul_flwr.store.NoSpace`)."""
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
        **run_results(spec, run_config, cfg, metrics),
        "wall-time-s": time.time() - start,
        "threads": torch.get_num_threads(),
        "cohort": cohort_record(grid),
        "device": device.type,
        "device-name": device_name(device),
        "run-dir": str(outputs.path),
    }


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

    fraction = GPU_SHARE / jobs
    index = device.index if device.index is not None else torch.cuda.current_device()  # "cuda" names no card
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction


GPU_SHARE = 0.9
"""Share of a CUDA card's memory the ``--jobs`` runs on it split among them (each process's
CUDA context, a few hundred MiB, comes on top of the allocator's cap)."""


def device_name(device: torch.device) -> str:
    """The card's name (``NVIDIA H100 80GB HBM3``) or the CPU's model, for a run's record."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()
