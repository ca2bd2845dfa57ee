"""Why the FedDB ablation comes out as it does: the debiasing quantities of each run, by round.

FedDB (Zhu et al., IJCAI 2024) claims two effects on top of FixMatch: DPL (Eq. 14) lets more,
and more balanced, pseudo-labels pass the threshold, and DMA (Eqs. 15-17) picks aggregation
weights beta that move the mixture of the clients' APP-U towards uniform. The records of the
``feddb-ablation`` grid carry the per-round train metrics that show whether either happens:

- ``pseudo-label-share``: fraction of a round's unlabeled images whose (debiased, for DPL)
  pseudo-label passes tau (mean over the round's clients, weighted by examples);
- ``pseudo-label-correct-share`` (simulation: the true classes of the unlabeled images are
  known): the fraction whose pseudo-label passes tau and is the true class, averaged the
  same way; its ratio to ``pseudo-label-share`` is the accuracy of the pseudo-labels
  trained on;
- ``pseudo-label-classes`` (HASSLE): per class, the share of the round's unlabeled images
  kept with that class (K floats); the two largest over their sum is the share of the
  pseudo-labels that fall in two classes (a collapse of the pseudo-labelling model);
- ``app-u``: the clients' APP-U averaged the same way (K floats); its max / min ratio says how
  unequal the model's predictions over the classes are (1 = uniform);
- ``dma-beta``: beta of the round's clients; 1 / sum(beta^2) is its *effective number of
  clients* (= the number of clients when beta is uniform, 1 when one client takes all);
- ``dma-loss-uniform`` and ``dma-loss``: L_aggr = || sum_m beta_m APP-U_m - 1/K || at uniform
  weights and at DMA's beta, i.e. how much of the imbalance DMA can remove.

:func:`render_diagnostics` tabulates them at fixed rounds, mean over seeds. A round missing
from a record (a run resumed from a checkpoint written before train metrics were kept with
each round) is left out of that mean, and the cell says how many seeds it holds.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from fedul_flwr.experiments.tables import markdown_table

__all__ = ["DIAGNOSTIC_ROUNDS", "diagnostics_of", "render_diagnostics"]

DIAGNOSTIC_ROUNDS: tuple[int, ...] = (10, 50, 100, 150)
"""Rounds shown (those past a run's last round are skipped)."""


def diagnostics_of(row: Mapping[str, Any]) -> dict[str, float]:
    """The diagnostic values of one round's metric row (only those the row can give).

    Parameters
    ----------
    row : Mapping
        One entry of a record's ``metrics`` (a round's evaluation and train metrics).

    Returns
    -------
    dict
        ``share`` (% of unlabeled images passing tau, as averaged over the round's clients:
        a client without unlabeled images counts 0), ``pseudo-label-accuracy`` (% of those
        whose pseudo-label is the true class), ``top2-classes`` (% of the kept pseudo-labels
        in their two most frequent classes), ``app-u-ratio`` (max / min of the
        mean APP-U), ``effective-clients`` (1 / sum beta^2), ``dma-loss-uniform`` and
        ``dma-loss``.
    """
    out: dict[str, float] = {}
    if "pseudo-label-share" in row:
        out["share"] = 100.0 * float(row["pseudo-label-share"])
        if "pseudo-label-correct-share" in row and float(row["pseudo-label-share"]) > 0:
            out["pseudo-label-accuracy"] = 100.0 * float(row["pseudo-label-correct-share"]) / float(row["pseudo-label-share"])
    classes = row.get("pseudo-label-classes")
    if isinstance(classes, list) and sum(classes) > 0:
        out["top2-classes"] = 100.0 * sum(sorted(classes)[-2:]) / sum(classes)
    app_u = row.get("app-u")
    if isinstance(app_u, list) and app_u and min(app_u) > 0:
        out["app-u-ratio"] = max(app_u) / min(app_u)
    beta = row.get("dma-beta")
    if isinstance(beta, list) and beta:
        out["effective-clients"] = 1.0 / sum(b * b for b in beta)
    for key in ("dma-loss-uniform", "dma-loss"):
        if key in row:
            out[key] = float(row[key])
    return out


def _cell(values: Sequence[float], seeds: int, digits: int) -> str:
    if not values:
        return "-"
    text = f"{statistics.fmean(values):.{digits}f}"
    return text if len(values) == seeds else f"{text} ({len(values)} of {seeds} seeds)"


def render_diagnostics(records: Sequence[Mapping[str, Any]], rounds: Sequence[int] = DIAGNOSTIC_ROUNDS) -> str:
    """Markdown tables of the debiasing quantities (module doc) per setting (the grid's row) and method.

    Parameters
    ----------
    records : sequence of Mapping
        Records of the ``feddb-ablation`` grid (any subset; runs without the metrics are
        skipped).
    rounds : sequence of int
        Rounds to show.

    Returns
    -------
    str
        One table per quantity (rows: setting x method; columns: rounds), empty if no
        record has any of them.
    """
    by_cell: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        by_cell[(r["spec"]["row"], r["spec"]["column"])].append(r)
    quantities = (
        ("share", "Pseudo-labels passing tau (% of a client's unlabeled images, mean over the round's clients weighted "
                  "by examples; a client without unlabeled images counts 0)", 1),
        ("pseudo-label-accuracy", "Pseudo-labels passing tau that are the true class (%; simulation knows the classes)", 1),
        ("top2-classes", "Pseudo-labels in their two most frequent classes (% of those passing tau)", 1),
        ("app-u-ratio", "APP-U max / min over the classes (mean over the round's clients; 1 = uniform)", 2),
        ("effective-clients", "DMA: effective number of clients 1 / sum(beta^2) (of the round's clients)", 2),
        ("dma-loss-uniform", "DMA: L_aggr at uniform weights", 4),
        ("dma-loss", "DMA: L_aggr at beta", 4),
    )
    text: list[str] = []
    for key, title, digits in quantities:
        lines = []
        for (row, column), runs in by_cell.items():
            per_round = {}
            for rnd in rounds:
                per_round[rnd] = [
                    v for r in runs for m in r["metrics"] if int(m["round"]) == rnd
                    for v in [diagnostics_of(m).get(key)] if v is not None
                ]  # fmt: skip
            if any(per_round.values()):
                lines.append([row, column, *(_cell(per_round[x], len(runs), digits) for x in rounds)])
        if lines:
            head = ["setting", "method", *(f"round {x}" for x in rounds)]
            text += [f"#### {title}", "", markdown_table(head, lines), ""]
    return "\n".join(text)
