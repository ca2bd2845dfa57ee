"""How a run's test accuracy moves over the rounds: window means, each seed, the last rounds'
range and the rounds at chance.

On Dirichlet splits a single round swings by several points (the round's clients may hold
one or two classes), so the last and the best round alone do not show how methods compare.
This module tabulates, from the per-round metrics that every record of a grid carries:

- the mean test accuracy of each predictor over windows of rounds (1-50, 51-100, ...);
  with several seeds a cell reads ``mean (std; seed a, seed b, ...)`` (seeds in ascending
  order, :func:`format_seeds`), so a comparison within a seed needs no re-computation;
- the range (min-max) of the test accuracy over the last :data:`RANGE_ROUNDS` rounds, per seed;
- the number of rounds in which a predictor is at chance: accuracy <= 1/K + 1 point.

HASSLE ("Federated Semi-Supervised Learning with Annotation Heterogeneity") evaluates three
predictors every round: SM (the supervised side), UM (the unsupervised side) and EM, the mean
of their logits; each gets its own row (:func:`predictor_columns`). Other methods have one
predictor, ``test-accuracy``. A side can fall to chance for a round (one class predicted for
every test image) when the (pseudo-)labels of the round's clients name few classes.

A window past a run's last round is left empty.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from fedul_flwr.experiments.tables import markdown_table

__all__ = ["RANGE_ROUNDS", "WINDOW", "at_chance", "format_seeds", "missing_seeds", "predictor_columns", "render_windows"]

WINDOW = 50
"""Rounds per window."""

RANGE_ROUNDS = 25
"""Last rounds over which the min-max range is shown."""


def predictor_columns(record: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, metric key) of each predictor of a run: HASSLE's EM, SM, UM (``test-accuracy``,
    ``test-accuracy-SM``, ``test-accuracy-UM``), one ``test-accuracy`` for the others."""
    names = record.get("predictors") or []
    if len(names) < 2:
        return [("", "test-accuracy")]
    return [(names[0], "test-accuracy")] + [(n, f"test-accuracy-{n}") for n in names[1:]]


def at_chance(accuracy: float, num_classes: int) -> bool:
    """Whether a test accuracy (fraction) is at chance: <= 1/K + 0.01."""
    return accuracy <= 1.0 / num_classes + 0.01


def format_seeds(values: Sequence[float]) -> str:
    """A cell of values over seeds (in %, seeds in ascending order): ``m`` for one value,
    ``m (s; a, b, ...)`` for several (mean, sample standard deviation, then each seed's
    value), ``-`` for none."""
    if not values:
        return "-"
    mean = f"{statistics.fmean(values):.2f}"
    if len(values) == 1:
        return mean
    return f"{mean} ({statistics.stdev(values):.2f}; " + ", ".join(f"{v:.2f}" for v in values) + ")"


def missing_seeds(shown: Sequence[int], ran: Sequence[int]) -> str:
    """What a cell says when it holds fewer seeds than its setting ran (a predictor that
    older records of the setting do not have): ``" (seed 1; not recorded at seed 0)"``;
    ``""`` when it holds every seed that ran."""
    absent = sorted(set(ran) - set(shown))
    if not absent or not shown:
        return ""
    held = ", ".join(str(s) for s in sorted(set(shown)))
    gone = ", ".join(str(s) for s in absent)
    return f" (seed{'s' if len(set(shown)) > 1 else ''} {held}; not recorded at seed{'s' if len(absent) > 1 else ''} {gone})"


def render_windows(
    records: Sequence[Mapping[str, Any]],
    num_classes: int = 10,
    window: int = WINDOW,
    range_rounds: int = RANGE_ROUNDS,
) -> str:
    """Markdown table: per setting, method and predictor, the mean test accuracy (%) over each
    window of rounds, the range over the last rounds and the rounds at chance (module doc).

    Parameters
    ----------
    records : sequence of Mapping
        Records of a grid (any subset), each with ``spec`` (``row``, ``column``, ``seed``),
        ``metrics`` (one row per round) and ``last-round``.
    num_classes : int
        K of the dataset (10 for every dataset here).
    window : int
        Rounds per window.
    range_rounds : int
        Last rounds of each run over which the min-max range is given.

    Returns
    -------
    str
        The table, empty without records.

    Raises
    ------
    ValueError
        If ``window`` < 1, ``range_rounds`` < 1 or ``num_classes`` < 2.
    """
    if window < 1 or range_rounds < 1 or num_classes < 2:
        raise ValueError(
            f"window and range_rounds must be >= 1 and num_classes >= 2, got {window}, {range_rounds} and {num_classes}"
        )
    if not records:
        return ""
    last = max(int(r["last-round"]) for r in records)
    windows = [(lo, min(lo + window - 1, last)) for lo in range(1, last + 1, window)]
    cells: dict[tuple[str, str, str, str], list[Mapping[str, Any]]] = {}  # (row, column, label, metric) -> runs
    ran: dict[tuple[str, str], list[int]] = {}  # (row, column) -> the seeds of its runs
    for r in sorted(records, key=lambda r: int(r["spec"].get("seed", 0))):
        ran.setdefault((r["spec"]["row"], r["spec"]["column"]), []).append(int(r["spec"].get("seed", 0)))
        for label, key in predictor_columns(r):
            cells.setdefault((r["spec"]["row"], r["spec"]["column"], label, key), []).append(r)
    head = ["setting", "method", "predictor", *(f"rounds {a}-{b}" for a, b in windows),
            f"range, last {range_rounds} rounds", "rounds at chance"]  # fmt: skip
    lines = []
    for (row, column, label, key), runs in cells.items():
        per_run = [{int(m["round"]): float(m[key]) for m in r["metrics"] if key in m and int(m["round"]) >= 1} for r in runs]
        means = []
        for a, b in windows:
            values = [100 * statistics.fmean(v for n, v in acc.items() if a <= n <= b) for acc in per_run
                      if any(a <= n <= b for n in acc)]  # fmt: skip
            means.append(format_seeds(values))
        tails = [[acc[n] for n in sorted(acc)[-range_rounds:]] for acc in per_run if acc]
        spread = " / ".join(f"{100 * min(t):.1f}-{100 * max(t):.1f}" for t in tails) or "-"
        chance = " / ".join(f"{sum(at_chance(v, num_classes) for v in acc.values())} of {len(acc)}" for acc in per_run)
        note = missing_seeds([int(r["spec"].get("seed", 0)) for r in runs], ran[(row, column)])
        lines.append([row, column, (label or "-") + note, *means, spread, chance])
    return markdown_table(head, lines)
