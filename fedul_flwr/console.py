"""What a run prints: one line per round (test accuracy, seconds, ETA) and the summary line by
default, Flower's full logs as well with ``verbose=true``.

Flower's console handler (``flwr.common.logger.console_handler``, the one whose output
``flwr run --stream`` and ``flwr log`` show) gets a filter that lets through warnings and
errors, and the project's progress lines (:data:`PROGRESS`, a child of Flower's logger). The
filter sits on that handler and not on the logger, so every other handler of Flower's logger
(the run folder's ``flower.log`` of the ``fedul`` grid runner, pytest's ``caplog``) still gets
everything. Two warnings the project's own settings cause are dropped unless verbose: Flower's
"fraction_evaluate is set to 0.0" (the server evaluates centrally: no client evaluation is
intended) and Ray's tip about accelerator variables for actors with ``num_gpus=0``.

A run the project refuses (a configuration error, :func:`print_in_one_line`) is told in one
line by the ServerApp; Flower then logs the same exception with its traceback ("Simulation
raised an exception" / "ServerApp raised an exception"): the console handler drops that
traceback (the line stays). So does a run that stops mid-way (failed replies, a crash): its
``status=failed`` summary is the one line (:func:`mark_reported`); ``verbose=true`` keeps the
traceback.
"""

from __future__ import annotations

import logging
import time
import warnings

from flwr.common.logger import FLOWER_LOGGER, console_handler

__all__ = ["PROGRESS", "RoundClock", "mark_reported", "print_in_one_line", "reported", "set_verbose"]

PROGRESS = logging.getLogger(f"{FLOWER_LOGGER.name}.fedul-flwr")
"""The progress lines of a run (one per round); shown whether or not ``verbose``."""
PROGRESS.setLevel(logging.INFO)

_PROJECT_CAUSED = ("fraction_evaluate is set to 0.0",)
"""Flower warnings that the project's settings cause on purpose (message starts)."""
_RAY_TIP = r"Tip: In future versions of Ray, Ray will no longer override accelerator"


_WAITING = "Waiting for nodes to connect"
"""Flower's line (every second) while a round waits for ``min-available-nodes``: shown once per
count, so a run waiting for a dead node does not look like one that trains."""


class QuietFilter(logging.Filter):
    """Keeps warnings and errors (but :data:`_PROJECT_CAUSED`), the :data:`PROGRESS` lines, and
    Flower's :data:`_WAITING` line once per node count."""

    def __init__(self) -> None:
        super().__init__()
        self._waiting: object = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == PROGRESS.name:
            return True
        if str(record.msg).startswith(_WAITING):
            seen, self._waiting = self._waiting, record.args
            return record.args != seen
        if record.levelno < logging.WARNING:
            return False
        return not str(record.msg).startswith(_PROJECT_CAUSED)


_QUIET = QuietFilter()


def set_verbose(verbose: bool) -> None:
    """Quiet (``False``: :class:`QuietFilter` on Flower's console handler, Ray's tip ignored)
    or Flower's full console log (``True``) for this process. Idempotent."""
    console_handler.removeFilter(_QUIET)
    _ONE_LINE.verbose = verbose
    if verbose:
        warnings.filterwarnings("default", message=_RAY_TIP, category=FutureWarning)
        return
    console_handler.addFilter(_QUIET)
    warnings.filterwarnings("ignore", message=_RAY_TIP, category=FutureWarning)


class OneLineErrors(logging.Filter):
    """Removes the traceback from records whose exception is one of ``types``, or (unless
    verbose) one the app has already told in one line (:func:`mark_reported`); the record,
    its message and level, stay."""

    def __init__(self) -> None:
        super().__init__()
        self.types: tuple[type[BaseException], ...] = ()
        self.verbose = False

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and (isinstance(exc, self.types) or (getattr(exc, _REPORTED, False) and not self.verbose)):
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


_REPORTED = "_fedul_reported"
_ONE_LINE = OneLineErrors()


def mark_reported(exc: BaseException) -> None:
    """Mark ``exc`` as told in one line by the app (a run that stopped mid-way has written and
    logged its ``status=failed`` summary): Flower's console then shows no traceback of it,
    unless ``verbose=true``."""
    try:
        setattr(exc, _REPORTED, True)
    except AttributeError:  # an exception type without a __dict__
        pass


def reported(exc: BaseException) -> bool:
    """Whether ``exc`` was told in one line by the app already (:func:`mark_reported`)."""
    return bool(getattr(exc, _REPORTED, False))


def print_in_one_line(*types: type[BaseException]) -> None:
    """Show exceptions of ``types`` without a traceback on Flower's console (what ``flwr run
    --stream`` and ``flwr log`` show), whether or not verbose: for errors whose message is the
    whole story and that the app has already logged in one line (a refused setting names its
    key and value). Other handlers of Flower's logger that come before the console handler
    still get the traceback. Replaces the types of an earlier call; idempotent."""
    _ONE_LINE.types = tuple(types)
    console_handler.removeFilter(_ONE_LINE)
    console_handler.addFilter(_ONE_LINE)


def _clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class RoundClock:
    """The progress line of each round: round, headline test accuracy, seconds the round took,
    and the estimated time to the last round (mean seconds per round so far times the rounds
    left).

    Parameters
    ----------
    num_rounds : int
        The run's last round.
    start_round : int
        Rounds done before this start (a resumed run); the estimate counts only this start's.
    """

    def __init__(self, num_rounds: int, start_round: int = 0) -> None:
        self.num_rounds = num_rounds
        self.start_round = start_round
        self.started = self.last = time.monotonic()

    def line(self, server_round: int, accuracy: float | None) -> str:
        """The line after ``server_round`` (round ``start_round``: the model this start begins
        from, the initial model or a resumed run's checkpoint); accuracy in [0, 1], ``None`` for
        a round not evaluated (``evaluate-every``)."""
        now = time.monotonic()
        took, self.last = now - self.last, now
        if server_round <= self.start_round:  # the estimate counts the training rounds only
            self.started = now
            start = "(resumed from the checkpoint)" if self.start_round else "(initial model)"
            return f"round {server_round}/{self.num_rounds}: test-accuracy {100 * accuracy:.2f}% {start}"
        per_round = (now - self.started) / (server_round - self.start_round)
        eta = per_round * (self.num_rounds - server_round)
        tested = "" if accuracy is None else f"test-accuracy {100 * accuracy:.2f}%, "
        return f"round {server_round}/{self.num_rounds}: {tested}{took:.1f}s, ETA {_clock(eta)}"
