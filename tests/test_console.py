"""What a run prints: by default Flower's console shows warnings, errors and the project's one
progress line per round; ``verbose=true`` shows Flower's full log again. Other handlers of
Flower's logger (a grid run's ``flower.log``) always get everything."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator

import pytest
from flwr.common.logger import FLOWER_LOGGER, console_handler, log

from fedul_flwr.console import PROGRESS, RoundClock, set_verbose


@pytest.fixture
def console() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    old = console_handler.setStream(stream)
    attached = console_handler in FLOWER_LOGGER.handlers
    if not attached:
        FLOWER_LOGGER.addHandler(console_handler)
    try:
        yield stream
    finally:
        set_verbose(False)
        console_handler.setStream(old)
        if not attached:
            FLOWER_LOGGER.removeHandler(console_handler)


def _emit() -> None:
    log(logging.INFO, "Starting FedAvg strategy: ConfigRecord (train): {'run-config': ...}")
    log(logging.WARNING, "fraction_evaluate is set to 0.0. Federated evaluation will be skipped.")
    log(logging.WARNING, "a warning the user must see")
    PROGRESS.info("round 1/2: test-accuracy 80.00%, 3.0s, ETA 3s")


def test_quiet_console_shows_progress_and_real_warnings_only(console: io.StringIO) -> None:
    set_verbose(False)
    set_verbose(False)  # idempotent
    _emit()
    text = console.getvalue()
    assert "round 1/2: test-accuracy 80.00%" in text and "a warning the user must see" in text
    assert "ConfigRecord" not in text and "fraction_evaluate" not in text
    assert len(text.strip().splitlines()) == 2


def test_verbose_console_shows_flowers_log(console: io.StringIO) -> None:
    set_verbose(True)
    _emit()
    text = console.getvalue()
    assert "ConfigRecord" in text and "fraction_evaluate" in text and "round 1/2" in text


def test_round_clock_reports_seconds_and_eta() -> None:
    clock = RoundClock(num_rounds=4)
    assert clock.line(0, 0.1) == "round 0/4: test-accuracy 10.00% (initial model)"
    line = clock.line(1, 0.805)
    assert re.fullmatch(r"round 1/4: test-accuracy 80\.50%, \d+\.\ds, ETA \d+s", line), line
    resumed = RoundClock(num_rounds=10, start_round=8)
    assert resumed.line(8, 0.9) == "round 8/10: test-accuracy 90.00% (resumed from the checkpoint)"
    assert "round 9/10" in resumed.line(9, 0.91)


def test_a_run_that_stopped_midway_shows_its_summary_line_without_traceback() -> None:
    """An exception the ServerApp has told in its ``status=failed`` summary loses its traceback
    on Flower's console, unless verbose; an unmarked one keeps it."""
    import logging

    from fedul_flwr.console import _ONE_LINE, mark_reported, set_verbose

    def record(exc: BaseException) -> logging.LogRecord:
        return logging.LogRecord("flwr", logging.ERROR, __file__, 1, "ServerApp raised an exception", None,
                                 (type(exc), exc, None))  # fmt: skip

    told, untold = RuntimeError("round 3: no successful reply"), RuntimeError("a bug")
    mark_reported(told)
    try:
        set_verbose(False)
        kept, plain = record(told), record(untold)
        _ONE_LINE.filter(kept), _ONE_LINE.filter(plain)
        assert kept.exc_info is None and plain.exc_info is not None
        set_verbose(True)
        verbose = record(told)
        _ONE_LINE.filter(verbose)
        assert verbose.exc_info is not None
    finally:
        set_verbose(False)


def test_waiting_for_nodes_is_shown_once_per_count(console: io.StringIO) -> None:
    """Flower logs its wait for ``min-available-nodes`` every second at INFO: the quiet console
    shows it once per node count, so a run waiting for a dead node says so."""
    set_verbose(False)
    for count in (2, 2, 2, 1, 1):
        log(logging.INFO, "Waiting for nodes to connect: %d connected (minimum required: %d).", count, 3)
    lines = [line for line in console.getvalue().splitlines() if "Waiting for nodes" in line]
    assert len(lines) == 2 and "2 connected" in lines[0] and "1 connected" in lines[1]
