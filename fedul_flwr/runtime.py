"""Process-level runtime choices shared by both apps: torch threads, device, loop execution,
model seeds."""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedul_flwr import get_logger
from fedul_flwr.acceleration import Acceleration

if TYPE_CHECKING:
    from fedul_flwr.config import RunConfig

log = get_logger(__name__)


@functools.cache
def configure_threads(threads: int = 0) -> int:
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


def model_seed(seed: int, index: int, node_key: int | None = None) -> int:
    """Seed of the initial weights of a method's model number ``index``.

    The server's exchanged models: ``(seed, index)``, with the first model seeded by the run
    seed itself. A model kept on a node (never exchanged): ``(seed, index, node_key)``.
    """
    if node_key is None and index == 0:
        return int(seed)
    words = [seed, index] if node_key is None else [seed, index, node_key]
    return int(np.random.SeedSequence(words).generate_state(1)[0])
