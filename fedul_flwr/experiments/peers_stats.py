"""What the peer benchmark reports from its timings: paired ratios over like-with-like rounds.

Pure functions of the timings (:mod:`fedul_flwr.experiments.peers` measures them), so the
arithmetic is tested on synthetic numbers (``tests/test_peers_ratio.py``).

Like with like. pfl's driver runs one central iteration right before each engine round
(:class:`~fedul_flwr.experiments.peers.PacedGrid`), but the engine's clock of a round stops
when the next round starts, so the engine's last round (the one that holds the run's final
central evaluation) has no time: a phase of ``R + 1`` rounds gives ``R + 1`` pfl iterations and
``R`` engine rounds. :func:`timed_pairs` pairs pfl iteration ``i`` with engine round ``i`` (the
round that ran right after it, on the same machine state) and drops pfl's iteration of the
untimed round. A Ray run's per-round times (differences of its ``metrics.json`` wall times)
include every round; :func:`rounds_without_evaluation` leaves out its first round (actor start)
and every round that holds a central evaluation (``evaluate-every``, the last round), so Ray's
steady median is of the same work as the engine's timed rounds.

The headline ratio pfl / engine is :func:`paired_ratio`: the median over the timed pairs of
``pfl_i / engine_i``. Load that drifts during a benchmark slows both members of a pair alike,
so it cancels in each ratio; a ratio of medians pooled over phases taken minutes apart does
not (it gave 3.90 where the pairs gave 9.65).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["median", "paired_ratio", "rounds_without_evaluation", "summarize", "timed_pairs"]


def median(values: Sequence[float]) -> float:
    """Median of ``values`` (NaN for an empty sequence)."""
    return float(statistics.median(values)) if values else float("nan")


def timed_pairs(pfl_s: Sequence[float], engine_s: Sequence[float], warm: int) -> list[tuple[float, float]]:
    """The (pfl iteration, engine round) pairs of one interleaved phase, the first ``warm`` left out.

    Parameters
    ----------
    pfl_s : sequence of float
        Seconds of each pfl iteration of the phase, in order (one before every engine round).
    engine_s : sequence of float
        Seconds of each timed engine round, in order: one fewer than ``pfl_s`` (the last
        round, with the final evaluation, is not timed) or as many.
    warm : int
        Pairs left out first (start-up, first visits).

    Returns
    -------
    list of (float, float)
        ``(pfl_s[i], engine_s[i])`` for ``warm <= i < len(engine_s)``.

    Raises
    ------
    ValueError
        If ``pfl_s`` does not hold one iteration per engine round (as many, or one more).
    """
    if len(pfl_s) - len(engine_s) not in (0, 1):
        raise ValueError(f"{len(pfl_s)} pfl iterations for {len(engine_s)} timed engine rounds: expected as many or one more")
    return list(zip(pfl_s, engine_s))[warm:]


def paired_ratio(pairs: Sequence[tuple[float, float]]) -> float:
    """Median over ``pairs`` of ``a / b`` (NaN without pairs): pfl / engine where ``pairs`` are
    :func:`timed_pairs` (above 1: the engine is faster).

    Raises
    ------
    ValueError
        If a time is not positive and finite.
    """
    for a, b in pairs:
        if not (0 < a < math.inf and 0 < b < math.inf):
            raise ValueError(f"pair ({a!r}, {b!r}): times must be positive and finite")
    return median([a / b for a, b in pairs])


def rounds_without_evaluation(round_s: Sequence[float], evaluate_every: int, skip_first: int = 1) -> list[float]:
    """A run's per-round times without its first ``skip_first`` rounds and without every round
    that holds a central evaluation.

    This project's ServerApp evaluates centrally at round 0, every ``evaluate-every`` rounds
    and at the last round; ``round_s[r - 1]`` is round ``r``'s time (training, aggregation,
    records, checkpoint and that round's evaluation, if any).

    Parameters
    ----------
    round_s : sequence of float
        Seconds of rounds 1..R.
    evaluate_every : int
        The run's ``evaluate-every`` (>= 1).
    skip_first : int
        Rounds left out first (Ray's first round starts its actors).

    Returns
    -------
    list of float
        The times of rounds ``r`` with ``skip_first < r < R`` and ``r % evaluate_every != 0``.

    Raises
    ------
    ValueError
        If ``evaluate_every`` < 1.
    """
    if evaluate_every < 1:
        raise ValueError(f"evaluate-every={evaluate_every}: expected >= 1")
    last = len(round_s)
    return [s for r, s in enumerate(round_s, start=1) if skip_first < r < last and r % evaluate_every]


def summarize(entry: Mapping[str, Any], warm: int) -> dict[str, Any]:
    """Medians and paired ratios of one thread count's phases.

    ``entry`` maps each engine phase's name (``engine``, ``engine-sequential``, ...) to its
    result, with ``round-s`` (the engine's timed rounds) and ``pfl-round-s`` (the pfl
    iterations interleaved with them; empty without pfl), and optionally ``ray`` with its
    ``median-s``. Each phase's ``pfl-over-<phase>`` is the :func:`paired_ratio` of its own
    pairs; ``pfl-s`` and ``engine-s`` are the medians of the default phase's pairs.
    """
    summary: dict[str, Any] = {}
    for name in ("engine", "engine-sequential", "engine-auto-precision", "engine-fedul", "engine-batched"):
        if name not in entry:
            continue
        phase = entry[name]
        pairs = timed_pairs(phase["pfl-round-s"], phase["round-s"], warm) if phase["pfl-round-s"] else []
        engine_s = median([e for _, e in pairs]) if pairs else median(phase["round-s"][warm:])
        key = "engine" if name == "engine" else name
        summary[f"{key}-s"] = engine_s
        summary["pfl-over-engine" if name == "engine" else f"pfl-over-{name}"] = paired_ratio(pairs)
        if name == "engine":
            summary["pfl-s"] = median([p for p, _ in pairs])
            summary["pairs"] = len(pairs)
    engine = entry["engine"]
    ray_s = entry.get("ray", {}).get("median-s")
    if isinstance(ray_s, float) and ray_s == ray_s:
        summary["ray-s"] = ray_s
        summary["ray-over-engine"] = ray_s / summary["engine-s"]
    timed = slice(warm, len(engine["round-s"]))  # the rounds with a time (not the last, untimed one)
    calls = [c for rnd in engine["call-s"][timed] for c in rnd]
    trains = [t for rnd in engine["train-s"][timed] for t in rnd]
    if calls and engine["clients-at-once"] == 1:
        rounds = len(engine["call-s"][timed])
        summary["breakdown"] = {
            "train-local-s-per-round": sum(trains) / rounds,
            "clientapp-overhead-ms-per-client": 1000 * (sum(calls) - sum(trains)) / len(calls),
            "server-s-per-round": summary["engine-s"] - sum(calls) / rounds,
        }
    return summary
