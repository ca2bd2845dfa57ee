"""Why the HASSLE tables come out as they do: each predictor's accuracy over windows of rounds.

HASSLE ("Federated Semi-Supervised Learning with Annotation Heterogeneity") evaluates three
predictors every round: SM (the supervised side, f(w_S) + f(r_{U-S})), UM (the unsupervised
side, f(w_U) + f(r_{S-U})) and EM, the mean of their logits. On a Dirichlet(0.1) split a
single round swings by several points, and a side can fall to chance for a round (one class
predicted for every test image) when the (pseudo-)labels of the round's clients name few
classes. The last and the best round alone therefore do not show how the methods compare.
The records of the ``hassle-*`` grids carry every round's test accuracy of every predictor,
from which :func:`render_diagnostics` tabulates:

- the mean test accuracy of each predictor over windows of rounds (1-50, 51-100, ...), for
  the baselines over the same rounds;
- the number of rounds in which a predictor is at chance: accuracy <= 1/K + 1 point.

Cells are means over seeds; a window past a run's last round is left empty.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["at_chance", "predictor_columns", "render_diagnostics"]

WINDOW = 50
"""Rounds per window."""


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


def render_diagnostics(records: Sequence[Mapping[str, Any]], num_classes: int = 10, window: int = WINDOW) -> str:
    """Markdown table: per setting, column and predictor, the mean test accuracy (%) over each
    window of rounds and the rounds at chance (module doc).

    Parameters
    ----------
    records : sequence of Mapping
        Records of a ``hassle-*`` grid (any subset).
    num_classes : int
        K of the dataset (10 for every dataset here).
    window : int
        Rounds per window.

    Returns
    -------
    str
        The table, empty without records.

    Raises
    ------
    ValueError
        If ``window`` < 1 or ``num_classes`` < 2.
    """
    if window < 1 or num_classes < 2:
        raise ValueError(f"window must be >= 1 and num_classes >= 2, got {window} and {num_classes}")
    if not records:
        return ""
    last = max(int(r["last-round"]) for r in records)
    windows = [(lo, min(lo + window - 1, last)) for lo in range(1, last + 1, window)]
    cells: dict[tuple[str, str, str, str], list[Mapping[str, Any]]] = {}  # (row, column, label, metric) -> runs
    for r in records:
        for label, key in predictor_columns(r):
            cells.setdefault((r["spec"]["row"], r["spec"]["column"], label, key), []).append(r)
    head = "| setting | method | predictor | " + " | ".join(f"rounds {a}-{b}" for a, b in windows) + " | rounds at chance |"
    lines = [head, "|---|---|---|" + "---|" * (len(windows) + 1)]
    for (row, column, label, key), runs in cells.items():
        per_run = [{int(m["round"]): float(m[key]) for m in r["metrics"] if key in m and int(m["round"]) >= 1} for r in runs]
        means = []
        for a, b in windows:
            values = [statistics.fmean(v for n, v in acc.items() if a <= n <= b) for acc in per_run
                      if any(a <= n <= b for n in acc)]  # fmt: skip
            means.append(f"{100 * statistics.fmean(values):.2f}" if values else "-")
        chance = [sum(at_chance(v, num_classes) for v in acc.values()) for acc in per_run]
        rounds = [len(acc) for acc in per_run]
        chance_text = " / ".join(f"{c} of {n}" for c, n in zip(chance, rounds, strict=True))
        lines.append(f"| {row} | {column} | {label or '-'} | " + " | ".join(means) + f" | {chance_text} |")
    return "\n".join(lines)
