"""Process-level runtime choices shared by both apps: torch threads, device, loop execution,
how the in-process engine trains a round's clients (the cohort path), model seeds."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from fedul_flwr import get_logger
from fedul_flwr.acceleration import Acceleration
from fedul_flwr.rng import model_seed as _rng_model_seed

if TYPE_CHECKING:
    from fedul_flwr.config import RunConfig

log = get_logger(__name__)


_PINNED: list[int] = []  # the thread count pinned_threads fixes for this process (empty: none)


@contextlib.contextmanager
def pinned_threads(threads: int) -> Iterator[None]:
    """Within the block torch's intra-op thread count of this process is ``threads`` and
    :func:`configure_threads` leaves it; afterwards the count and the pin are as before. The
    in-process engine pins one thread while it trains several clients at once in threads
    (``cohort = "parallel"``): torch's thread pool is shared by the whole process."""
    before, pins = torch.get_num_threads(), list(_PINNED)
    torch.set_num_threads(threads)
    _PINNED[:] = [threads]
    try:
        yield
    finally:
        _PINNED[:] = pins
        torch.set_num_threads(before)


def configure_threads(threads: int = 0) -> int:
    """:func:`_configure_threads` unless :func:`pinned_threads` fixed the count (then that count)."""
    return _PINNED[0] if _PINNED else _configure_threads(threads)


@functools.cache
def _configure_threads(threads: int = 0) -> int:
    """Set torch's intra-op thread count of this process.

    Parameters
    ----------
    threads : int
        The run setting ``client-threads``: ``n > 0`` uses exactly n threads; ``0`` uses the
        process's CPU share, ``OMP_NUM_THREADS`` (Ray sets it to each simulated client's
        ``client-resources-num-cpus``; a deployed SuperNode may set it too), without which
        torch would start one thread per core in every client and oversubscribe the machine.
        The thread count changes the order of floating-point reductions (convolution
        gradients), hence the last bits of the weights: runs compare bit for bit only at
        the same thread count.

    Returns
    -------
    int
        The thread count in use.
    """
    share = os.environ.get("OMP_NUM_THREADS")
    if threads > 0:
        torch.set_num_threads(threads)
    elif share and share.isdigit() and int(share) > 0:
        torch.set_num_threads(int(share))
    log.info("torch uses %d thread(s) in this process (client-threads=%d, OMP_NUM_THREADS=%s)", torch.get_num_threads(), threads, share)
    return torch.get_num_threads()


def pick_device(name: str) -> torch.device:
    """``auto`` -> CUDA when present, else CPU; ``cpu`` / ``cuda`` as given.

    Raises
    ------
    RuntimeError
        If ``cuda`` is requested on a machine without a CUDA device.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' but torch sees no CUDA device on this node")
    return torch.device(name)


def loop_acceleration(cfg: RunConfig, device: torch.device) -> Acceleration:
    """The run's ``precision``, ``memory-format``, ``fused-optimizer`` and ``compile``
    resolved on ``device`` (``auto`` decided by this node's hardware)."""
    return Acceleration.resolve(
        device, precision=cfg.precision, memory_format=cfg.memory_format,
        fused_optimizer=cfg.fused_optimizer, compile=cfg.compile,
    )  # fmt: skip


COHORT_PATHS = ("sequential", "parallel", "batched")
"""How the in-process engine trains a round's clients: one after another with the run's torch
threads; several at once in threads, one torch thread each (CPU); or as one batched model
(:mod:`fedul_flwr.cohort`)."""


def cohort_path(cohort: str, device: torch.device, threads: int, client_threads: int = 0) -> tuple[str, int]:
    """The cohort path of the in-process engine and how many clients it trains at once.

    ``cohort = "auto"`` picks by device, as measured (``fedul benchmark --only peers``): on a
    CPU with 2+ threads ``parallel`` with as many clients at once as threads (a step of a few
    images uses several cores poorly, and training stacked weights on a CPU was slower than
    one client after another: grouped convolutions); on one thread ``sequential``; on a GPU
    ``batched`` (one client's small kernels leave the card idle).

    Parameters
    ----------
    cohort : str
        The run setting ``cohort``: ``auto``, ``sequential``, ``parallel`` or ``batched``.
    device : torch.device
        The training device.
    threads : int
        The run's torch thread budget (``torch.get_num_threads()`` of the runner).
    client_threads : int
        The run setting ``client-threads`` (auto stays sequential on a CPU when it asks for
        more than one).

    Returns
    -------
    (str, int)
        The path and the clients at once (``parallel``: ``threads``, at least 2; ``batched``:
        0, every client of the round; ``sequential``: 1).

    Raises
    ------
    ValueError
        For ``parallel`` on a CUDA device.
    """
    if cohort == "parallel" and device.type != "cpu":
        raise ValueError(f"cohort='parallel' trains clients in threads on a CPU; the device is {device.type} (use cohort='auto')")
    if cohort == "auto":
        if device.type == "cuda":
            cohort = "batched"
        elif device.type == "cpu" and threads >= 2 and client_threads <= 1:
            cohort = "parallel"
        else:
            cohort = "sequential"
    if cohort == "parallel":
        return cohort, max(2, threads)
    return cohort, 0 if cohort == "batched" else 1


def model_seed(seed: int, index: int, node_key: int | None = None) -> int:
    """Seed of the initial weights of a method's model number ``index``: :func:`fedul_flwr.rng.model_seed`."""
    return _rng_model_seed(seed, index, node_key)
