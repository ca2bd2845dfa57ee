"""Process-level runtime choices shared by both apps: device and torch threads."""

from __future__ import annotations

import functools
import logging
import os

import torch

log = logging.getLogger(__name__)


@functools.cache
def configure_threads() -> int:
    """Make torch use as many threads as this process's CPU share.

    Ray sets ``OMP_NUM_THREADS`` to the ``num_cpus`` of each simulated client
    (``client-resources-num-cpus``); a deployed SuperNode may set it too. Without it torch
    would start one thread per core in every client and oversubscribe the machine.
    Returns the thread count in use.
    """
    share = os.environ.get("OMP_NUM_THREADS")
    if share and share.isdigit() and int(share) > 0:
        torch.set_num_threads(int(share))
    log.info("torch uses %d thread(s) in this process (OMP_NUM_THREADS=%s)", torch.get_num_threads(), share)
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
