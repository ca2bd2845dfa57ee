"""Timing the shared training loop from outside (the benchmarks' breakdown of a round)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import fedul_flwr.training as training_module


@contextlib.contextmanager
def timed_train_local(record: Callable[[float], None]) -> Iterator[None]:
    """Within the block every :func:`fedul_flwr.training.train_local` call (the ClientApp reaches
    it through ``LocalLoop.run``, which looks it up in its module) reports its wall seconds to
    ``record``; afterwards the function is the original again."""
    original = training_module.train_local

    def timed(*a: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*a, **kw)
        finally:
            record(time.perf_counter() - start)

    training_module.train_local = timed  # type: ignore[assignment]
    try:
        yield
    finally:
        training_module.train_local = original  # type: ignore[assignment]
