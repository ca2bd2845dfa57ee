"""torch's global CPU generator, seeded, one thread at a time.

A few library calls draw only from torch's global generator: Kornia's flip and erasing
(:mod:`fedul_flwr.augment`) and the initialisers of ``torch.nn`` layers
(:func:`fedul_flwr.models.build_model`). The project forks that generator, seeds it and
restores it around such calls, so the draws are a function of the seed. When the in-process
engine trains several clients at once in threads (``cohort = "parallel"``,
:mod:`fedul_flwr.inprocess`), two forks could interleave and one client's draws would take the
other's seed: :func:`seeded_global_rng` holds a process-wide lock for the block.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

__all__ = ["seeded_global_rng"]

_LOCK = threading.RLock()


@contextlib.contextmanager
def seeded_global_rng(seed: int) -> Iterator[None]:
    """Within the block, torch's global CPU generator starts from ``seed``; afterwards it is
    as it was. One thread at a time (a process-wide re-entrant lock).

    Parameters
    ----------
    seed : int
        Seed of the global CPU generator for the block (``torch.manual_seed`` range).
    """
    with _LOCK, torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        yield
