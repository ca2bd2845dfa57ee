"""Reproduction runner: the paper's comparisons (Lu et al., ICLR 2022, Table 1, App. E) as a
resumable grid of in-process Flower federations, rendered beside the paper's numbers.

Each run is (grid, dataset, partition, sets, method, seed, extra overrides). It goes through
the real ServerApp logic and the real ClientApp via :class:`fedul_flwr.inprocess.InProcessGrid`
(no Ray), writes its Flower run folder under ``<out>/<profile>/runs/<run-id>/`` and one JSON
record ``<out>/<profile>/records/<run-id>.json`` (run config, resolved config, per-round
metrics, last-round test error, test error at the best-validation round, wall time, device).
A run whose record exists is skipped, so an interrupted grid resumes where it stopped. Ctrl-C
or SIGTERM stops the runner and its ``--jobs`` workers; an unfinished run writes no record.
A run that fails is one failed cell (a failure record in ``records/failed/``, one line at the
end, exit status 1); the others finish and are rendered. ``--stop-after MINUTES`` ends the
grid before the limit, every unfinished run checkpointed and continued by the same command
(exit status 75 while runs are left). See :mod:`fedul_flwr.experiments.runner`.

Two errors are reported, never mixed:

- ``last``: test error of the final model (no labels used anywhere);
- ``best-val``: test error at the round with the lowest error on the *labeled* validation
  split (``val-fraction`` = 20% of the training data, as in the paper, App. D). This
  model selection uses labels -- the paper's (and the authors' code's) protocol.

Tables: ``<out>/<profile>/results.md``, the paper's layout (rows = dataset x setting,
columns = methods, cells = M = 10 / 20 / 40), ``ours [paper]`` in % error, mean (std) over
seeds when there are several; ``FedAvg 100%`` is the supervised reference of Theorem 4 and
``gap`` = FedUL - FedAvg 100%. Plots: ``<out>/<profile>/plots/<grid>-<row>-<sub>.png``,
test accuracy per round of every method (mean over seeds).

Profiles (``--profile``):

- ``cpu``: LeNet (``small-cnn``), 8 rounds, Adam lr 1e-3, B = 128, E = 1, one seed, full
  MNIST, ``precision=fp32`` (``auto`` would pick bfloat16 on CPUs with AVX512-BF16 or AMX
  and float32 elsewhere, so the same run would give other numbers on another machine, and a
  run continued on another machine would change precision midway). Measured here
  (single-thread CPU time per optimiser step on a 9.6k-image client: FedUL 76 ms, FedPL
  89 ms, FedLLP 68 ms, FedLLP-VAT 219 ms, supervised 77 ms; 22k-image test + validation
  evaluation ~4.4 s) the MNIST part of Table 1 (6 cells x 4 methods + 2 x FedAvg 10% + 2 x
  FedAvg 100%) costs ~1,220 CPU-s per round, so 8 rounds with ``--jobs 2`` on two idle
  cores take ~80 min (estimate, not a full run).
- ``paper``: the paper's CNN (``paper-cnn``, Table D.2; ResNet-18 on CIFAR-10, Table D.3),
  100 rounds, Adam lr 1e-4, B = 128, E = 1, L1 weight by M from Table D.4 (MNIST 10 -> 1e-5,
  20 -> 5e-5, 40/30 -> 2e-6; CIFAR-10 2e-5 / 1e-5 / 4e-6), seeds 0, 1, 2; for a GPU
  (``device=auto``).

Examples::

    fedul reproduce --grid table1 --profile cpu --data-dir /path/to/torchvision-root --jobs 2
    fedul reproduce --grid table1 --profile paper --data-dir /data
    fedul reproduce --grid smoke --profile cpu          # 2 rounds, embedded sample
    fedul reproduce --grid table1 --profile cpu --render-only
    fedul reproduce --grid table1 --list                 # the runs, nothing executed
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedul_flwr import get_logger
from fedul_flwr.config import default_config, load_preset, server_dp_weights
from fedul_flwr.experiments.round_windows import format_seeds, missing_seeds, render_windows
from fedul_flwr.experiments.runner import (
    FAILED_DIR,
    RunSpec,
    add_common_arguments,
    clean,
    load_failures,
    load_records,
    parse_overrides,
    parse_seeds,
    run_cells,
)
from fedul_flwr.experiments.tables import markdown_table
from fedul_flwr.store import write_atomic

# --------------------------------------------------------------------------- methods

# table column -> run-config overrides; FedAvg columns use true labels (supervised reference)
METHOD_COLUMNS: dict[str, dict[str, Any]] = {
    "FedUL": {"method": "fedul"},
    "FedPL": {"method": "fedpl"},
    "FedLLP": {"method": "fedllp"},
    "FedLLP-VAT": {"method": "fedllp-vat"},
    "FedAvg 10%": {"method": "supervised", "label-fraction": 0.1},
    "FedAvg 100%": {"method": "supervised", "label-fraction": 1.0},
}
METHOD_KEYS = {"fedul": "FedUL", "fedpl": "FedPL", "fedllp": "FedLLP", "fedllp-vat": "FedLLP-VAT",
               "fedavg-10": "FedAvg 10%", "fedavg-100": "FedAvg 100%"}  # fmt: skip
SUPERVISED = ("FedAvg 10%", "FedAvg 100%")  # sets do not matter: one run per row
# FedPU (Lin et al., ICML 2022): its baselines in the paper's naming of the tables
FEDPU_COLUMNS: dict[str, dict[str, Any]] = {
    "Baseline-1": {"method": "supervised", "label-fraction": 1.0, "client-setting": "pu"},  # labeled positives only
    "FedPU": {"method": "fedpu", "client-setting": "pu"},
    "uPU (conventional PU)": {"method": "fedpu", "fedpu-loss": "upu", "client-setting": "pu"},
    "FedPU, Eq. 10": {"method": "fedpu", "fedpu-loss": "eq10-nn", "client-setting": "pu"},  # the default is nnpu
    "Baseline-2 (supervised)": {"method": "supervised", "label-fraction": 1.0, "client-setting": "usets"},
}
# FedDB (Zhu et al., IJCAI 2024): the ablation of its Table 4 (FixMatch -> +DPL -> +DPL+DMA)
# beside the lower baseline, supervised FedAvg on the labeled images only (weakly augmented)
FEDDB_COLUMNS: dict[str, dict[str, Any]] = {
    "FedAvg (labeled only)": {"method": "supervised", "label-fraction": 1.0, "augment": "weak"},
    "FixMatch": {"method": "fixmatch"},
    "FixMatch-DPL": {"method": "fixmatch-dpl"},
    "FedDB": {"method": "feddb"},
    # the aggregation weight that counts the examples that trained the model this round
    "FixMatch (used weights)": {"method": "fixmatch", "fixmatch-weight": "used"},
}
FEDDB_ROWS: list[tuple[str, dict[str, Any]]] = [
    ("IID", {"partition": "iid"}),
    ("Dir(0.3)", {"partition": "dirichlet", "dirichlet-alpha": 0.3}),
    ("Dir(0.1)", {"partition": "dirichlet", "dirichlet-alpha": 0.1}),
]
FEDDB_PROTOCOLS = {"cpu": ("feddb-cpu", 20), "paper": ("feddb", 100)}  # profile -> (preset, clients)
# HASSLE (FSSL with annotation heterogeneity): Table 1 (labeled share), Table 7 (Dirichlet alpha
# at 10%) and the GRA / MPA ablation of Table 2, on 20 clients of the ``hassle`` preset. The 5%
# layout is the one its extraction shows (2 partially labeled clients, 18 unlabeled).
HASSLE_EQUATIONS: dict[str, Any] = {"hassle-phase-order": "residual-first", "hassle-pairing": "previous",
                                     "hassle-shared-init": False, "hassle-gamma-form": "mean", "hassle-gamma": 0.01}  # fmt: skip
"""HASSLE as its equations read (each residual trained against the received dual models, the
previous round's pairing of the text, separate initial weights, gamma 0.01 as FedProx's mu, the
method's defaults): the setting the HASSLE runs of ``hassle-table1``, ``hassle-table7``,
``hassle-ablation`` and ``hassle-sweep``'s ``preset`` row were recorded with, pinned so that
their records stay theirs whatever the ``hassle`` preset holds."""
HASSLE_COLUMNS: dict[str, dict[str, Any]] = {
    "FedAvg (labeled only)": {"method": "supervised", "label-fraction": 1.0},
    "FedProx (labeled only)": {"method": "supervised", "label-fraction": 1.0, "strategy": "fedprox", "proximal-mu": 0.01},
    # the weights its records were trained with; the presets' "used" is hassle-sweep's column
    "FedAvg+FixMatch": {"method": "fixmatch", "fixmatch-weight": "epoch"},
    "HASSLE": {"method": "hassle", **HASSLE_EQUATIONS},
}
HASSLE_SHARES = {"5%": {"labeled-share": 0.05, "label-layout": "P*2,U*18"},
                 "10%": {"labeled-share": 0.1, "label-layout": "ALL"},
                 "20%": {"labeled-share": 0.2, "label-layout": "ALL"}}  # fmt: skip
# Every row twice: on the preset's split (``inner-dirichlet``, per-client class mixtures, the
# paper's App. B.1) and on the per-class split (``dirichlet``) the first runs here used. Table 1
# also runs at the paper's lr 0.1 on the preset's split (the preset keeps lr 0.01: at 0.1 FedAvg
# on the labeled data goes to chance at 5%; docs/hassle.md, "lr").
HASSLE_SPLITS = {"": {}, ", per-class split": {"partition": "dirichlet"}}
HASSLE_PAPER_LR = {", lr 0.1": {"lr": 0.1}}
HASSLE_ROWS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    grid: [(label + suffix, {**over, **variant}) for suffix, variant in variants.items() for label, over in rows]
    for grid, rows, variants in (
        ("hassle-table1", [(f"Fashion-MNIST {k}", v) for k, v in HASSLE_SHARES.items()], {**HASSLE_SPLITS, **HASSLE_PAPER_LR}),
        ("hassle-table7", [(f"Fashion-MNIST 10%, alpha={a}", {**HASSLE_SHARES["10%"], "dirichlet-alpha": a}) for a in (0.01, 0.1, 1.0)], HASSLE_SPLITS),
        ("hassle-ablation", [("Fashion-MNIST 10%", HASSLE_SHARES["10%"])], HASSLE_SPLITS),
    )
}  # fmt: skip
HASSLE_ABLATION: dict[str, dict[str, Any]] = {  # GRA: residual models; MPA: the proximity term
    name: {"method": "hassle", **HASSLE_EQUATIONS, **over} for name, over in (
        ("neither", {"hassle-residual-width": 0.0, "hassle-gamma": 0.0}),
        ("MPA", {"hassle-residual-width": 0.0}),
        ("GRA", {"hassle-gamma": 0.0}),
        ("GRA + MPA", {}),
        # the residual added to the same round's dual model instead of the one it was trained against
        ("GRA, same-round pairing", {"hassle-gamma": 0.0, "hassle-pairing": "current"}),
        ("GRA + MPA, same-round pairing", {"hassle-pairing": "current"}),
    )
}
# What HASSLE's paper leaves open, one factor at a time from the ``hassle`` preset (Fashion-MNIST
# 10%, the preset's split, lr 0.01, gamma 0.01 in FedProx's form, residual first, separate
# initial weights, no warm-up, no threshold, 1 local epoch): one row per variant, HASSLE's
# predictors (with the dual models alone) as columns, FedAvg on the labeled data in the first row.
_ALG1 = {"hassle-phase-order": "dual-first", "hassle-pairing": "current"}  # Alg. 1's order, the pairing it implies
_COMBINED = {**_ALG1, "hassle-shared-init": True}
_GAMMA_SUM = {"hassle-gamma-form": "sum"}
HASSLE_SWEEP: dict[str, dict[str, Any]] = {
    "preset": {},
    "Alg. 1 phase order": {"hassle-phase-order": "dual-first"},
    "Alg. 1 phase order, same-round pairing": _ALG1,
    **{f"gamma {g:g}, Eq. 12's sum form": {**_GAMMA_SUM, "hassle-gamma": g} for g in (1.0, 10.0, 100.0)},
    "same initial weights": {"hassle-shared-init": True},
    **{f"warm-up {r} rounds": {"hassle-warmup-rounds": r} for r in (10, 20)},
    "threshold 0.95": {"hassle-threshold": 0.95},
    "2 local epochs": {"local-epochs": 2},
    "lr 0.1": {"lr": 0.1},
    "combined": _COMBINED,
    "combined, lr 0.1": {**_COMBINED, "lr": 0.1},
    "Alg. 1 phase order, same-round pairing, lr 0.1": {**_ALG1, "lr": 0.1},
    "combined, gamma 100": {**_COMBINED, **_GAMMA_SUM, "hassle-gamma": 100.0},
    "combined, gamma 100, lr 0.1": {**_COMBINED, **_GAMMA_SUM, "hassle-gamma": 100.0, "lr": 0.1},
}
"""The combined rows take the single changes that put EM highest at rounds 101-110 of the
seed-0 runs (Alg. 1's phase order with the same-round pairing it implies, and the same initial
weights); once at the preset's lr 0.01 and once at the paper's lr 0.1. The row after them is
the combination without the same initial weights at lr 0.1 (with them, w_U's loss exploded in
round 1 at seed 0); it diverged too, in round 5. The ``gamma 100`` rows add the third single
change that helped at seed 0 once all of them had run (gamma 100 in Eq. 12's sum form: EM
over the last 10 rounds 72.03% against the preset's 70.23%), again at both lrs."""
HASSLE_SWEEP_BASELINES: dict[str, dict[str, Any]] = {
    "FedAvg (labeled only)": HASSLE_COLUMNS["FedAvg (labeled only)"],
    **{f"FedAvg+FixMatch, weights {w}": {"method": "fixmatch", "fixmatch-weight": w} for w in ("epoch", "all", "used")},
}
"""The baselines of ``hassle-sweep``'s preset row: FedAvg on the labeled data, and FixMatch
with each aggregation weight of ``fixmatch-weight``."""
HASSLE_SWEEP_FEDAVG_ROWS = ("lr 0.1", "2 local epochs")
"""Rows of ``hassle-sweep`` that also run FedAvg on the labeled data with the row's change: a
higher lr or more local epochs trains the baseline more too, so EM is compared with it there."""
HASSLE_SWEEP_SEEDS = (0, 1)
"""Seeds of ``hassle-sweep`` when ``--seeds`` is not given (the profile's otherwise)."""
BRACKET_NOTES = {  # what the [paper] numbers are where they are not the same experiment
    "feddb-ablation": "[paper]: the paper's CIFAR-10 numbers (WRN-28-2, 100 clients), for reference only.",
    "hassle-ablation": "[paper]: the paper's Table 2, on CIFAR-10 (ResNet-8), for reference only.",
    "hassle-table1": "[paper]: trained with SGD lr 0.1, as the rows marked lr 0.1 are; the others use the `hassle` "
                     "preset's lr 0.01, at which FedAvg on the labeled data trains at every share here (docs/hassle.md).",
    "hassle-table7": "[paper]: trained with SGD lr 0.1; the `hassle` preset uses lr 0.01 (docs/hassle.md).",
    "feddb-recipe": "[paper]: the paper's CIFAR-10 numbers (WRN-28-2, 100 clients), for reference only.",
    "hassle-recipe": "[paper]: Table 1, Fashion-MNIST 10%, SGD lr 0.1 (its weight decay and clipping not stated).",
    "hassle-sweep": "[paper]: Table 1, Fashion-MNIST 10%, trained with SGD lr 0.1; the rows named `lr 0.1` train at "
                    "that lr, the others at the `hassle` preset's lr 0.01.",
}
ACCURACY_GRIDS = ("fedpu-table1", "fedpu-table2", "fedpu-table3", "fedpu-table6", "fedpu-table7", "feddb-ablation",
                  *HASSLE_ROWS, "hassle-sweep", "feddb-svhn", "feddb-cifar100", "hassle-cifar100",
                  "fixmatch-central", "feddb-recipe", "hassle-recipe")  # fmt: skip
"""Grids rendered in % test accuracy (the FedPU paper's unit); the others in % test error."""

# The semi-supervised recipe (FixMatch's paper, FedDB's code): each piece alone on top of the
# loop as it was before them, then all together, centrally (one client) and in the FedDB and
# HASSLE Fashion-MNIST grids, with labeled-only FedAvg on the same weak views beside them.
def recipe_of(preset: str, base: str) -> dict[str, Any]:
    """What preset ``preset`` sets beyond preset ``base`` (one source for a recipe's values)."""
    over, under = load_preset(preset), load_preset(base)
    return {k: v for k, v in over.items() if under.get(k, default_config().get(k)) != v}


RECIPE_OFF: dict[str, Any] = {"nesterov": False, "weight-decay": 0.0, "grad-clip-norm": 0.0, "lr-schedule": "exponential",
                              "ema-decay": 0.0, "local-optimizer-state": "fresh", "fixmatch-strong-augment": "strong"}  # fmt: skip
"""The loop without the recipe's pieces (the defaults): SGD with heavy-ball momentum, a fresh
optimiser every round, a constant step size, RandAugment at a fixed magnitude, no EMA."""
CENTRAL_ROWS: dict[str, dict[str, Any]] = {
    "without the recipe": RECIPE_OFF,
    "+ EMA (0.999 per step)": {**RECIPE_OFF, "ema-decay": 0.984},
    "+ cosine schedule": {**RECIPE_OFF, "lr-schedule": "cosine"},
    "+ weight decay 5e-4": {**RECIPE_OFF, "weight-decay": 5e-4},
    "+ Nesterov": {**RECIPE_OFF, "nesterov": True},
    "+ kept optimizer": {**RECIPE_OFF, "local-optimizer-state": "kept"},
    "+ random-magnitude RandAugment": {**RECIPE_OFF, "fixmatch-strong-augment": "strong-random"},
    "+ clipping at 1 (FedDB's code)": {**RECIPE_OFF, "grad-clip-norm": 1.0},
    "the whole recipe (fixmatch preset)": {},
}
"""Rows of ``fixmatch-central``: the ``fixmatch`` preset (FixMatch's recipe on one client) with
every piece off, with one piece on, and as it is."""
CENTRAL_COLUMNS: dict[str, dict[str, Any]] = {
    "Supervised (labeled only, weak views)": {"method": "supervised", "label-fraction": 1.0, "augment": "weak"},
    "FixMatch": {"method": "fixmatch"},
}
CENTRAL_STEPS = {"1,600 steps": {"num-rounds": 100}, "6,400 steps": {"num-rounds": 400}}
"""Sub-columns of ``fixmatch-central``: 16 steps a round (1000 labels, B = 64)."""
CENTRAL_LONG_ROWS = ("without the recipe", "the whole recipe (fixmatch preset)")
"""The rows also run at 6,400 steps, and the only rows with the supervised column."""
FEDDB_RECIPE_COLUMNS = {k: FEDDB_COLUMNS[k] for k in ("FedAvg (labeled only)", "FixMatch", "FedDB")}
"""Columns of ``feddb-recipe``: FedDB's ablation, labeled-only FedAvg on the same weak views."""
HASSLE_RECIPE_COLUMNS: dict[str, dict[str, Any]] = {
    "FedAvg (labeled only, weak views)": {"method": "supervised", "label-fraction": 1.0, "augment": "weak"},
    "FedAvg (labeled only, plain images)": {"method": "supervised", "label-fraction": 1.0},
    "FedAvg+FixMatch, weights all": {"method": "fixmatch", "fixmatch-weight": "all"},
    "HASSLE": {"method": "hassle"},
}
"""Columns of ``hassle-recipe``: HASSLE as the ``hassle`` preset sets it, FixMatch with the
preset's ``all`` weights, and FedAvg on the labeled images with and without FixMatch's weak view."""
HASSLE_RECIPE_SEEDS = (0, 1, 2)


def recipe_specs(grid: str, profile: str, seeds: Sequence[int]) -> list[RunSpec]:
    """Runs of ``fixmatch-central``, ``feddb-recipe`` and ``hassle-recipe`` (see their rows)."""
    if grid == "fixmatch-central":
        return [RunSpec(grid, row, col, sub, s, 1, "fixmatch", {**row_over, **col_over, **sub_over})
                for row, row_over in CENTRAL_ROWS.items() for col, col_over in CENTRAL_COLUMNS.items()
                for sub, sub_over in CENTRAL_STEPS.items() for s in seeds
                if row in CENTRAL_LONG_ROWS or (col == "FixMatch" and sub == "1,600 steps")]  # fmt: skip
    # FixMatch's form of the cosine: these grids' runs began before the code's form was read off
    authors = {**recipe_of("feddb-authors", "feddb"), "lr-schedule": "cosine"}
    if grid == "feddb-recipe":
        preset, clients = FEDDB_PROTOCOLS[profile]
        return [RunSpec(grid, row, col, "*", s, clients, preset, {**authors, **row_over, **col_over})
                for row, row_over in FEDDB_ROWS for col, col_over in FEDDB_RECIPE_COLUMNS.items() for s in seeds]  # fmt: skip
    local = {k: v for k, v in authors.items() if k not in ("strategy", "server-lr", "server-momentum")}
    rows = {"the recipe, lr 0.1": {**local, "lr": 0.1}, "the recipe, lr 0.01": local}
    return [RunSpec(grid, row, col, "*", s, 20, "hassle", {**HASSLE_SHARES["10%"], **row_over, **col_over})
            for row, row_over in rows.items() for col, col_over in HASSLE_RECIPE_COLUMNS.items() for s in seeds]  # fmt: skip


RECIPE_GRIDS = ("fixmatch-central", "feddb-recipe", "hassle-recipe")
RECIPE_SEEDS = (0, 1)
"""Seeds of ``fixmatch-central`` and ``feddb-recipe`` when ``--seeds`` is not given."""


# --------------------------------------------------------------------------- paper numbers

DATASET_LABELS = {"mnist": "MNIST", "fashion-mnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "mnist-sample": "MNIST-sample"}
PARTITION_LABELS = {"iid": "IID", "noniid": "non-IID", "dirichlet": "Dirichlet"}


def _table(rows: Mapping[str, Mapping[str, Sequence[float]]], subs: Sequence[str]) -> dict[tuple[str, str, str], float]:
    out = {}
    for row, cols in rows.items():
        for col, values in cols.items():
            for sub, value in zip(subs if len(values) > 1 else ("*",), values):
                out[(row, col, sub)] = value
    return out


_M = ("10", "20", "40")
# Table 1 (5 clients) and Table E.13 (10 clients): mean error %, M = 10 / 20 / 40; FedAvg 10%
# does not depend on M (key "*").
PAPER: dict[str, dict[tuple[str, str, str], float]] = {
    "table1": _table({
        "MNIST IID": {"FedUL": (0.78, 1.12, 1.00), "FedPL": (2.12, 2.98, 3.90), "FedLLP": (19.00, 4.38, 10.11),
                      "FedLLP-VAT": (20.53, 4.40, 11.96), "FedAvg 10%": (1.79,)},
        "MNIST non-IID": {"FedUL": (2.98, 1.77, 1.64), "FedPL": (15.54, 7.54, 5.76), "FedLLP": (20.52, 6.63, 5.53),
                          "FedLLP-VAT": (23.39, 11.76, 7.82), "FedAvg 10%": (3.82,)},
        "CIFAR-10 IID": {"FedUL": (18.56, 19.66, 20.31), "FedPL": (34.60, 42.06, 46.20),
                         "FedLLP": (77.01, 78.74, 73.75), "FedLLP-VAT": (77.56, 84.18, 78.65), "FedAvg 10%": (32.85,)},
        "CIFAR-10 non-IID": {"FedUL": (42.92, 35.24, 31.43), "FedPL": (70.65, 63.53, 53.78),
                             "FedLLP": (81.12, 65.51, 65.72), "FedLLP-VAT": (81.55, 70.51, 60.23), "FedAvg 10%": (58.62,)},
    }, _M),
    "table-e13": _table({
        "MNIST IID": {"FedUL": (0.74, 1.05, 1.47), "FedPL": (2.19, 2.55, 3.13), "FedLLP": (10.11, 24.23, 32.53),
                      "FedLLP-VAT": (25.83, 28.40, 34.46), "FedAvg 10%": (1.58,)},
        "MNIST non-IID": {"FedUL": (1.91, 1.45, 1.27), "FedPL": (12.24, 5.73, 4.16), "FedLLP": (20.81, 17.67, 14.98),
                          "FedLLP-VAT": (17.26, 18.45, 13.62), "FedAvg 10%": (3.03,)},
        "CIFAR-10 IID": {"FedUL": (20.40, 21.61, 22.71), "FedPL": (40.47, 46.44, 51.58),
                         "FedLLP": (76.23, 78.10, 79.10), "FedLLP-VAT": (76.25, 76.26, 80.44), "FedAvg 10%": (33.57,)},
        "CIFAR-10 non-IID": {"FedUL": (39.20, 34.12, 32.21), "FedPL": (68.53, 61.49, 55.89),
                             "FedLLP": (84.11, 71.69, 58.21), "FedLLP-VAT": (82.17, 72.34, 59.42), "FedAvg 10%": (52.48,)},
    }, _M),
    "table-e12": _table({
        "MNIST IID": {"FedUL": (1.19,), "FedPL": (3.74,), "FedLLP": (5.22,), "FedLLP-VAT": (2.24,), "FedAvg 10%": (2.21,)},
        "MNIST non-IID": {"FedUL": (2.31,), "FedPL": (12.03,), "FedLLP": (4.26,), "FedLLP-VAT": (3.88,),
                          "FedAvg 10%": (3.42,)},
    }, ("*",)),
    "table-e9": _table({"MNIST non-IID": {"FedUL": (2.98, 3.02, 3.10, 3.02, 3.49)}}, ("0", "0.2", "0.4", "0.8", "1.6")),
    "table-e10": _table({"MNIST non-IID": {"FedUL": (3.56, 2.62, 1.97, 1.75, 1.72)}}, ("10", "20", "30", "40", "50")),
    "table-e11": _table({
        "E=1": {"FedUL": (7.99, 2.93, 3.69)}, "E=4": {"FedUL": (2.54, 4.16, 2.81)}, "E=16": {"FedUL": (2.92, 3.51, 2.88)},
    }, ("16", "128", "inf")),
}  # fmt: skip
PAPER["table1-uniform"] = PAPER["table1-authors"] = PAPER["table1"]
PAPER["fashion"] = {}
PAPER["smoke"] = PAPER["loop-check"] = {}


# --------------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class Profile:
    """Compute settings shared by every run of a grid (see module doc)."""

    overrides: dict[str, Any]
    seeds: tuple[int, ...]
    # dataset ("*": any other) -> number of sets -> L1 weight (App. D, Table D.4)
    l1_by_sets: dict[str, dict[str, float]] = field(default_factory=dict)
    # dataset -> extra overrides (e.g. the CIFAR-10 model)
    by_dataset: dict[str, dict[str, Any]] = field(default_factory=dict)
    # preset -> extra overrides, applied after the others (another method's protocol)
    by_preset: dict[str, dict[str, Any]] = field(default_factory=dict)
    # presets whose own values beat this profile's overrides (a protocol of another method,
    # complete in its preset)
    preset_first: tuple[str, ...] = ()


PROFILES = {
    "cpu": Profile({"model": "small-cnn", "num-rounds": 8, "lr": 0.001, "batch-size": 128, "local-epochs": 1,
                    "device": "cpu", "precision": "fp32"}, seeds=(0,),
                   by_preset={"fedpu": {"num-rounds": 12, "batch-size": 100, "local-optimizer": "adam",
                                        "local-momentum": 0.0, "lr-decay": 1.0, "lr": 0.001}},
                   preset_first=("feddb-cpu", "hassle", "fixmatch")),
    "paper": Profile({"model": "paper-cnn", "num-rounds": 100, "lr": 0.0001, "batch-size": 128, "local-epochs": 1,
                      "device": "auto"}, seeds=(0, 1, 2),
                     l1_by_sets={"*": {"10": 1e-5, "20": 5e-5, "30": 2e-6, "40": 2e-6},
                                 "cifar10": {"10": 2e-5, "20": 1e-5, "30": 4e-6, "40": 4e-6}},
                     by_dataset={"cifar10": {"model": "resnet18"}},
                     by_preset={"fedpu": {"model": "small-cnn", "num-rounds": 200, "lr": 0.01, "l1-weight": 0.0},
                                "feddb": {"l1-weight": 0.0}},
                     preset_first=("feddb", "hassle")),
}  # fmt: skip

# --------------------------------------------------------------------------- grids


def _rows(datasets: Iterable[str], partitions: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{DATASET_LABELS.get(d, d)} {PARTITION_LABELS.get(p, p)}", {"dataset": d, "partition": p})
        for d in datasets
        for p in partitions
    ]


def table_specs(
    grid: str,
    preset: str,
    rows: list[tuple[str, dict[str, Any]]],
    sets: Sequence[str],
    columns: Sequence[str],
    seeds: Sequence[int],
    clients: int,
    extra: Mapping[str, Any] | None = None,
) -> list[RunSpec]:
    """Runs of a Table-1-style grid: rows x methods x sets x seeds (supervised columns
    once per row, with the first ``sets`` value)."""
    specs = []
    for row, row_over in rows:
        for column in columns:
            for sub in sets if column not in SUPERVISED else ("*",):
                m = sets[0] if sub == "*" else sub
                over = {**row_over, "num-sets": m, **METHOD_COLUMNS[column], **(extra or {})}
                specs.extend(RunSpec(grid, row, column, sub, s, clients, preset, over) for s in seeds)
    return specs


def sweep_specs(
    grid: str, preset: str, row: str, column: str, values: Sequence[tuple[str, dict[str, Any], int]], seeds: Sequence[int]
) -> list[RunSpec]:
    """Runs of a one-method sweep: ``values`` = (sub label, overrides, clients)."""
    over = METHOD_COLUMNS[column]
    return [RunSpec(grid, row, column, sub, s, c, preset, {**over, **o}) for sub, o, c in values for s in seeds]


# FedPU's MNIST tables: rows (label, clients, overrides) and sub-columns (label, overrides)
_IID = {"dataset": "mnist", "partition": "iid"}
_SHARDS = {"dataset": "mnist", "partition": "shards"}
FEDPU_ROWS: dict[str, list[tuple[str, int, dict[str, Any]]]] = {
    "fedpu-table1": [(f"{c} clients x {d}, {'overlap' if c * d > 10 else 'no overlap'}", c, {**_IID, "positive-classes": str(d)})
                     for c, d in ((10, 2), (4, 6), (2, 9), (10, 1), (5, 2), (2, 5))],
    "fedpu-table2": [(f"[{d}], {'overlap' if sum(map(int, d.split(','))) > 10 else 'no overlap'}", d.count(",") + 1,
                      {**_IID, "positive-classes": d})
                     for d in ("2,3,4,6,7,8", "1,2,4,6,7", "2,4,6,8", "3,7", "2,3,5", "1,2,3,4")],
    "fedpu-table3": [("5-class, [2 x 10]", 10, {**_SHARDS, "shards-per-client": 5, "positive-classes": "2"}),
                     ("5-class, [1 x 10]", 10, {**_SHARDS, "shards-per-client": 5, "positive-classes": "1"}),
                     ("5-class, [4,4,3,3,2,2,1,1,1,1]", 10,
                      {**_SHARDS, "shards-per-client": 5, "positive-classes": "4,4,3,3,2,2,1,1,1,1"}),
                     ("2-class, [1 x 10]", 10, {**_SHARDS, "shards-per-client": 2, "positive-classes": "1"})],
    "fedpu-table6": [("4 clients x 6, overlap", 4, {**_IID, "positive-classes": "6"})],
    "fedpu-table7": [("IID, 5 clients x 2", 5, {**_IID, "positive-classes": "2"}),
                     ("5-class, [2 x 10]", 10, {**_SHARDS, "shards-per-client": 5, "positive-classes": "2"})],
}  # fmt: skip
FEDPU_SUBS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "fedpu-table3": [("pi global", {"class-prior": "global"}), ("pi client", {"class-prior": "client"})],
    "fedpu-table6": [(label, {"pu-labeled-fraction": f}) for label, f in (("1/3", 1 / 3), ("1/2", 0.5), ("2/3", 2 / 3))],
    "fedpu-table7": [(f"pi={v}", {"class-prior": v}) for v in ("0.1", "0.05", "0.08")],
}
"""Sub-columns: table 3 (non-IID) with the global class prior (the paper's text) and with each
client's class mix of its unlabeled images (the authors' code): under non-IID the two differ,
and the PU risk of a client needs the class prior of *its* unlabeled data."""


# the paper's accuracies (%), Lin et al. (ICML 2022), in the order of FEDPU_ROWS (and FEDPU_SUBS):
# (Baseline-1, FedPU, Baseline-2); Table 7 is CIFAR-10 in the paper (FedPU only), so it has none
_FEDPU_PAPER: dict[str, list[tuple[float, ...]]] = {
    "fedpu-table1": [(85.47, 92.50, 97.95), (92.10, 95.08, 98.05), (93.15, 95.37, 98.20), (37.13, 84.15, 97.95),
                     (73.41, 93.45, 98.03), (74.00, 93.73, 98.20)],
    "fedpu-table2": [(93.84, 95.32, 97.91), (93.81, 95.01, 98.03), (92.27, 95.28, 98.05), (89.68, 94.68, 98.20),
                     (71.46, 93.65, 98.16), (74.27, 94.48, 98.05)],
    "fedpu-table3": [(25.47, 91.67, 97.47), (24.37, 91.24, 97.47), (76.92, 92.16, 97.47), (69.24, 91.29, 96.19)],
    "fedpu-table6": [(91.22, 94.46, 98.05), (93.24, 95.31, 98.05), (94.11, 95.60, 98.05)],
}  # fmt: skip
for _grid, _values in _FEDPU_PAPER.items():
    if _grid == "fedpu-table6":  # one row, the sub-columns are the labeled fractions
        _cells = [(FEDPU_ROWS[_grid][0][0], sub) for sub, _ in FEDPU_SUBS[_grid]]
    else:
        _cells = [(row[0], "*") for row in FEDPU_ROWS[_grid]]
    PAPER[_grid] = {}
    for (_row, _sub), _triple in zip(_cells, _values, strict=True):
        for _col, _v in zip(("Baseline-1", "FedPU", "Baseline-2 (supervised)"), _triple, strict=True):
            PAPER[_grid][(_row, _col, "*" if _col.startswith("Baseline-2") else _sub)] = _v
PAPER["fedpu-table7"] = {}
# FedDB's CIFAR-10 rows (Tables 1-3: IID, delta = 0.3, delta = 0.1; mean of 4 runs, best test
# accuracy during training), shown for reference beside any dataset
PAPER["feddb-ablation"] = {
    (row, column, "*"): value
    for column, values in (("FedAvg (labeled only)", (58.42, 47.72, 33.53)), ("FixMatch", (65.80, 50.99, 35.14)),
                           ("FixMatch-DPL", (66.97, 53.92, 37.13)), ("FedDB", (67.32, 55.00, 37.95)))
    for (row, _), value in zip(FEDDB_ROWS, values, strict=True)
}  # fmt: skip


# HASSLE's Table 1 and 7 (Fashion-MNIST columns; Top-1 %, alpha = 0.1 unless stated, 3 seeds)
# and Table 2 (CIFAR-10 10%, shown for reference beside Fashion-MNIST)
_HASSLE_PAPER = {"FedAvg (labeled only)": (69.09, 78.25, 82.95, 62.14, 82.51),
                 "FedProx (labeled only)": (69.71, 79.14, 83.17, 63.64, 83.37),
                 "FedAvg+FixMatch": (73.09, 80.83, 83.93, 68.19, 85.79),
                 "HASSLE SM": (77.83, 83.22, 86.15, 72.43, 87.18), "HASSLE UM": (77.98, 83.91, 86.34, 73.54, 87.34),
                 "HASSLE EM": (78.04, 84.04, 86.67, 73.79, 87.51)}  # 5%, 10%, 20%, alpha 0.01, alpha 1  # fmt: skip
_HASSLE_PAPER_INDEX = {"labeled-share": {0.05: 0, 0.1: 1, 0.2: 2}, "dirichlet-alpha": {0.01: 3, 0.1: 1, 1.0: 4}}
"""Which paper number a row gets, by the setting its grid varies: the row's labeled share
(Table 1) or Dirichlet alpha (Table 7)."""
PAPER.update({grid: {(row, col, "*"): v[_HASSLE_PAPER_INDEX[key][over[key]]]
                     for col, v in _HASSLE_PAPER.items() for row, over in HASSLE_ROWS[grid]}
              for grid, key in (("hassle-table1", "labeled-share"), ("hassle-table7", "dirichlet-alpha"))})  # fmt: skip
PAPER["feddb-recipe"] = {key: v for key, v in PAPER["feddb-ablation"].items() if key[1] in FEDDB_RECIPE_COLUMNS}
PAPER["hassle-recipe"] = {(row, col, "*"): _HASSLE_PAPER[paper][1] for row in ("the recipe, lr 0.1", "the recipe, lr 0.01")
                          for col, paper in (("FedAvg (labeled only, weak views)", "FedAvg (labeled only)"),
                                             ("FedAvg (labeled only, plain images)", "FedAvg (labeled only)"),
                                             ("FedAvg+FixMatch, weights all", "FedAvg+FixMatch"),
                                             ("HASSLE SM", "HASSLE SM"), ("HASSLE UM", "HASSLE UM"), ("HASSLE EM", "HASSLE EM"))}  # fmt: skip
PAPER["hassle-sweep"] = {(row, col, "*"): v[1] for col, v in _HASSLE_PAPER.items() if col.startswith(("FedAvg (", "HASSLE"))
                         for row in ("preset", "lr 0.1")}  # fmt: skip
PAPER["hassle-sweep"].update({("preset", col, "*"): _HASSLE_PAPER["FedAvg+FixMatch"][1]
                              for col in HASSLE_SWEEP_BASELINES if col.startswith("FedAvg+FixMatch")})
PAPER["hassle-ablation"] = {(row, f"{col} {p}", "*"): v for row, _ in HASSLE_ROWS["hassle-ablation"] for col, values in
                            (("neither", (57.85, 61.07, 61.86)), ("MPA", (65.04, 65.98, 66.47)),
                             ("GRA", (62.11, 64.09, 64.54)), ("GRA + MPA", (66.34, 67.14, 67.79)))
                            for p, v in zip(("SM", "UM", "EM"), values)}  # fmt: skip


def hassle_specs(grid: str, seeds: Sequence[int]) -> list[RunSpec]:
    """Runs of a HASSLE table: rows x (baselines and HASSLE, or the ablation's variants) x seeds."""
    columns = HASSLE_ABLATION if grid == "hassle-ablation" else HASSLE_COLUMNS
    return [RunSpec(grid, row, column, "*", s, 20, "hassle", {**row_over, **col_over})
            for row, row_over in HASSLE_ROWS[grid] for column, col_over in columns.items() for s in seeds]  # fmt: skip


def hassle_sweep_specs(seeds: Sequence[int]) -> list[RunSpec]:
    """Runs of ``hassle-sweep``: every variant of :data:`HASSLE_SWEEP` (a row) with HASSLE,
    and the baselines of :data:`HASSLE_SWEEP_BASELINES` once, in the preset's row, at
    Fashion-MNIST 10%, and FedAvg on the labeled data in the rows that change what it trains
    with too (:data:`HASSLE_SWEEP_FEDAVG_ROWS`: lr 0.1, 2 local epochs)."""
    share = HASSLE_SHARES["10%"]
    specs = [RunSpec("hassle-sweep", row, "HASSLE", "*", s, 20, "hassle", {**share, "method": "hassle", **HASSLE_EQUATIONS, **over})
             for row, over in HASSLE_SWEEP.items() for s in seeds]  # fmt: skip
    fedavg = "FedAvg (labeled only)"
    row_baselines = [RunSpec("hassle-sweep", row, fedavg, "*", s, 20, "hassle",
                             {**share, **HASSLE_SWEEP_BASELINES[fedavg], **HASSLE_SWEEP[row]})
                     for row in HASSLE_SWEEP_FEDAVG_ROWS for s in seeds]  # fmt: skip
    return specs + [RunSpec("hassle-sweep", "preset", column, "*", s, 20, "hassle", {**share, **over})
                    for column, over in HASSLE_SWEEP_BASELINES.items() for s in seeds] + row_baselines  # fmt: skip


# --------------------------------------------------------------------------- the GPU grids


@dataclass(frozen=True)
class GpuGrid:
    """A grid of a paper's protocol that needs a GPU (``--profile paper`` only): its runs and the
    GPU time one run is estimated to take, shown on its results page until it has run.

    Attributes
    ----------
    preset : str
        The preset of the protocol; its values beat the profile's (``l1-weight`` stays 0).
    clients : int
        SuperNodes of every run.
    rows, columns : list and dict
        Row label -> overrides, and column label -> overrides (rows x columns x seeds runs).
    round_s : float
        Estimated seconds per round on one H100 GPU.
    basis : str
        How ``round_s`` was estimated (a sentence).
    """

    preset: str
    clients: int
    rows: list[tuple[str, dict[str, Any]]]
    columns: dict[str, dict[str, Any]]
    round_s: float
    basis: str


_FEDDB_PAPER_COLUMNS = {k: v for k, v in FEDDB_COLUMNS.items() if k != "FixMatch (used weights)"}
_FEDDB_ROUND = ("one FedDB paper-protocol round of WRN-28-2 on CIFAR-10 (`fedul benchmark --only augment "
                "--augment-device cuda --feddb-round`: 10 clients of 40 labels, 5 local epochs of one step of 64 "
                "labeled + 448 unlabeled images) took 2.16 s on an H100")  # fmt: skip
GPU_GRIDS: dict[str, GpuGrid] = {
    # FedDB's SVHN column (Tables 1-3): 1000 labels IID, 4000 at delta = 0.3 and 0.1
    "feddb-svhn": GpuGrid("feddb-svhn", 100, [(label, {**over, "num-labeled": n}) for (label, over), n
                                              in zip(FEDDB_ROWS, (1000, 4000, 4000), strict=True)],
                          _FEDDB_PAPER_COLUMNS, 2.2,
                          _FEDDB_ROUND + "; SVHN has the same image shape and 10 to 40 labels per client, one "
                          "step per local epoch, and 733 rather than 500 unlabeled images for APP-U"),  # fmt: skip
    # FedDB's CIFAR-100 column: 10000 labels in every row
    "feddb-cifar100": GpuGrid("feddb-cifar100", 100, [(label, {**over, "num-labeled": 10_000}) for label, over in FEDDB_ROWS],
                              _FEDDB_PAPER_COLUMNS, 4.3,
                              _FEDDB_ROUND + "; CIFAR-100's 100 labels per client take two steps per local epoch, "
                              "about twice the round"),  # fmt: skip
    # HASSLE's CIFAR-100 columns of Table 1 (5 / 10 / 20% labels) and Table 7 (alpha 0.01 and 1 at 10%)
    "hassle-cifar100": GpuGrid("hassle-cifar100", 20,
                               [(f"CIFAR-100 {k}", v) for k, v in HASSLE_SHARES.items()]
                               + [(f"CIFAR-100 10%, alpha={a}", {**HASSLE_SHARES["10%"], "dirichlet-alpha": a}) for a in (0.01, 1.0)],
                               {**HASSLE_COLUMNS, "HASSLE": {"method": "hassle"}}, 8.0,  # the preset's HASSLE
                               "not measured: 8 clients per round, each one local epoch over ~2500 images in "
                               "~20 steps of 128 per phase; HASSLE's phases train and query four ResNet-8 "
                               "models, ~80 steps per client at an assumed 10 ms each (small models on a GPU "
                               "are bound by kernel launches), plus the test set for three predictors"),  # fmt: skip
}
"""The grids of the papers' columns this machine cannot run (no GPU, no copies of SVHN and
CIFAR-100): ``fedul reproduce --grid <name> --profile paper --data-dir <torchvision root>``."""
HASSLE_ROWS["hassle-cifar100"] = GPU_GRIDS["hassle-cifar100"].rows  # HASSLE's tables: windows and predictors
# the papers' accuracies (%): FedDB's Tables 1-3 (mean of 4 runs, best test accuracy during training)
PAPER.update({grid: {(row, column, "*"): value for column, values in table.items()
                     for (row, _), value in zip(GPU_GRIDS[grid].rows, values, strict=True)}
              for grid, table in (
                  ("feddb-svhn", {"FedAvg (labeled only)": (25.10, 69.44, 32.21), "FixMatch": (87.44, 86.61, 74.31),
                                  "FixMatch-DPL": (88.00, 85.87, 76.29), "FedDB": (86.75, 85.99, 76.20)}),
                  ("feddb-cifar100", {"FedAvg (labeled only)": (32.00, 31.34, 28.78), "FixMatch": (24.72, 25.47, 25.90),
                                      "FixMatch-DPL": (26.44, 28.47, 27.76), "FedDB": (26.71, 29.28, 27.99)}),
              )})  # fmt: skip
# HASSLE's Tables 1 and 7, CIFAR-100 (Top-1 %): 5%, 10%, 20% (alpha 0.1), then alpha 0.01 and 1 at 10%
_HASSLE_CIFAR100 = {"FedAvg (labeled only)": (17.36, 28.43, 39.52, 22.87, 29.45),
                    "FedProx (labeled only)": (17.51, 28.76, 39.89, 23.28, 30.94),
                    "FedAvg+FixMatch": (17.96, 29.56, 41.94, 27.54, 33.16),
                    "HASSLE SM": (25.52, 34.11, 43.05, 31.84, 35.09), "HASSLE UM": (26.15, 34.25, 43.95, 32.17, 35.74),
                    "HASSLE EM": (26.58, 34.33, 44.24, 32.56, 35.95)}  # fmt: skip
_HASSLE_CIFAR100["HASSLE"] = _HASSLE_CIFAR100["HASSLE EM"]  # the headline, until runs name the predictors
PAPER["hassle-cifar100"] = {(row, column, "*"): value for column, values in _HASSLE_CIFAR100.items()
                            for (row, _), value in zip(GPU_GRIDS["hassle-cifar100"].rows, values, strict=True)}  # fmt: skip
BRACKET_NOTES["feddb-svhn"] = BRACKET_NOTES["feddb-cifar100"] = (
    "[paper]: FedDB's Tables 1-3, mean of 4 runs of the best test accuracy during training.")
BRACKET_NOTES["hassle-cifar100"] = "[paper]: HASSLE's Tables 1 and 7; before any run, HASSLE's [paper] is its EM predictor."


def gpu_specs(grid: str, args: argparse.Namespace, seeds: Sequence[int]) -> list[RunSpec]:
    """Runs of a :data:`GPU_GRIDS` grid: rows x columns x seeds, each from the grid's preset
    (its values given as the run's overrides, so they beat the profile's).

    Raises
    ------
    SystemExit
        Unless ``--profile paper``: the grid is the paper's GPU protocol.
    """
    if args.profile != "paper":
        raise SystemExit(f"grid {grid!r} is the paper's protocol for a GPU: use --profile paper")
    g = GPU_GRIDS[grid]
    protocol = {**load_preset(g.preset), "l1-weight": 0.0}
    return [RunSpec(grid, row, column, "*", s, g.clients, g.preset, {**protocol, **row_over, **col_over})
            for row, row_over in g.rows for column, col_over in g.columns.items() for s in seeds]  # fmt: skip


def gpu_plan(grid: str, specs: Sequence[RunSpec], records: Sequence[Mapping[str, Any]]) -> str:
    """The results page's note on a :data:`GPU_GRIDS` grid's missing runs: the command and the
    estimated GPU time per run and for those missing."""
    g = GPU_GRIDS[grid]
    rounds = int(load_preset(g.preset)["num-rounds"])
    hours = g.round_s * rounds / 3600
    missing = len(specs) - len(records)
    seeds = ",".join(str(s) for s in dict.fromkeys(spec.seed for spec in specs))
    return (f"{missing} of {len(specs)} runs not run here yet. "
            f"Each run: preset `{g.preset}`, {g.clients} SuperNodes, {rounds} rounds; GPU time about "
            f"{g.round_s:g} s per round, {hours:.2f} h per run, {missing * hours:.1f} h for the missing runs on one "
            f"H100 (estimate: {g.basis}). Run them (seeds {seeds}) with:\n\n"
            f"```bash\nfedul reproduce --grid {grid} --profile paper --data-dir /path/to/torchvision-root "
            f"--out docs/reproduce\n```")  # fmt: skip


def fedpu_specs(grid: str, seeds: Sequence[int]) -> list[RunSpec]:
    """Runs of a FedPU table: rows x FedPU's columns x sub-columns x seeds (the supervised
    Baseline-2 once per row: it does not depend on the PU sub-setting; both baselines once per
    row where the sub-columns change only the class prior, which they do not use)."""
    specs = []
    subs_of_grid = FEDPU_SUBS.get(grid, [("*", {})])
    prior_only = all(set(over) <= {"class-prior"} for _, over in subs_of_grid)  # the baselines use no prior
    for row, clients, row_over in FEDPU_ROWS[grid]:
        for column, col_over in FEDPU_COLUMNS.items():
            subs = subs_of_grid
            if column.startswith("Baseline-2") or (prior_only and column.startswith("Baseline")):
                subs = [("*", {})]
            for sub, sub_over in subs:
                over = {**row_over, **col_over, **sub_over}
                specs.extend(RunSpec(grid, row, column, sub, s, clients, "fedpu", over) for s in seeds)
    return specs


def build_grid(name: str, args: argparse.Namespace, seeds: Sequence[int]) -> list[RunSpec]:
    """The runs of grid ``name`` (filtered by ``--methods``, ``--datasets``, ``--partitions``,
    ``--sets`` where they apply).

    Raises
    ------
    SystemExit
        On an unknown grid name.
    """
    columns = [METHOD_KEYS[m] for m in args.methods.split(",")]
    datasets = args.datasets.split(",")
    partitions = args.partitions.split(",")
    sets = args.sets.split(",")
    if name == "table1":
        return table_specs(name, "table1", _rows(datasets, partitions), sets, columns, seeds, 5)
    if name == "table1-uniform":
        return table_specs(name, "table1", _rows(datasets, partitions), sets, columns, seeds, 5,
                           {"prior-scheme": "uniform"})  # fmt: skip
    if name == "table1-authors":
        extra = {k: v for k, v in load_preset("authors-code").items() if v != default_config().get(k)}
        return table_specs(name, "table1", _rows(datasets, partitions), sets, columns, seeds, 5, extra)
    if name == "table-e13":
        return table_specs(name, "table-e13", _rows(datasets, partitions), sets, columns, seeds, 10)
    if name == "table-e12":
        return table_specs(name, "table-e12", _rows(datasets, partitions), ["10,20,30,40,50"], columns, seeds, 5)
    if name == "fashion":
        return table_specs(name, "table1", _rows(["fashion-mnist"], ["iid"]), ["10"], columns, seeds, 5)
    if name == "smoke":
        extra = {"num-rounds": 2, "samples-per-client": 300}
        return table_specs(name, "", _rows(["mnist-sample"], ["iid"]), ["10"], columns, seeds, 2,
                           {"val-fraction": 0.2, **extra})  # fmt: skip
    if name == "table-e9":
        values = [(e, {"prior-noise": float(e)}, 5) for e in ("0", "0.2", "0.4", "0.8", "1.6")]
        return sweep_specs(name, "table-e9", "MNIST non-IID", "FedUL", values, seeds)
    if name == "table-e10":
        values = [(str(c), {}, c) for c in (10, 20, 30, 40, 50)]
        return sweep_specs(name, "table-e10", "MNIST non-IID", "FedUL", values, seeds)
    if name in GPU_GRIDS:
        return gpu_specs(name, args, seeds)
    if name in FEDPU_ROWS:
        return fedpu_specs(name, seeds)
    if name in HASSLE_ROWS:
        return hassle_specs(name, seeds)
    if name == "hassle-sweep":
        return hassle_sweep_specs(seeds)
    if name in RECIPE_GRIDS:
        return recipe_specs(name, args.profile, seeds)
    if name == "feddb-ablation":
        preset, clients = FEDDB_PROTOCOLS[args.profile]
        return [RunSpec(name, row, column, "*", s, clients, preset, {**row_over, **col_over})
                for row, row_over in FEDDB_ROWS for column, col_over in FEDDB_COLUMNS.items() for s in seeds]  # fmt: skip
    if name == "loop-check":  # the loop's execution settings must not cost accuracy
        row = {"dataset": "mnist", "partition": "iid", "num-sets": 10}
        values = [(sub, {**row, **over}, 5) for sub, over in LOOP_VARIANTS.items()]
        return sweep_specs(name, "table1", "MNIST IID", "FedUL", values, seeds)
    if name == "augment-check":  # does the FedUL authors' rotation close the gap to supervised FedAvg?
        row = {"dataset": "mnist", "partition": "iid", "num-sets": 10, "num-rounds": 20}
        values = [(sub, {**row, "augment": sub}, 5) for sub in ("none", "rotate")]
        return [spec for column in ("FedUL", "FedAvg 100%")
                for spec in sweep_specs(name, "table1", "MNIST IID, 20 rounds", column, values, seeds)]  # fmt: skip
    if name == "table-e11":
        specs = []
        for e in (1, 4, 16):
            values = [(b, {"local-epochs": e, "batch-size": 100_000 if b == "inf" else int(b)}, 5) for b in ("16", "128", "inf")]
            specs += sweep_specs(name, "table-e11", f"E={e}", "FedUL", values, seeds)
        return specs
    raise SystemExit(f"unknown grid {name!r}; choose from {GRIDS}")


GRIDS = ("table1", "table1-uniform", "table1-authors", "table-e13", "table-e12", "table-e9", "table-e10",
         "table-e11", "fashion", "smoke", "loop-check", "augment-check", *ACCURACY_GRIDS)  # fmt: skip
LOOP_VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {"precision": "fp32", "memory-format": "contiguous", "fused-optimizer": False},
    "defaults": {},
    "bf16": {"precision": "bf16"},
}
"""Columns of the ``loop-check`` grid: the plain float32 NCHW loop, the defaults, forced bf16."""

# --------------------------------------------------------------------------- running


def run_config_of(spec: RunSpec, profile: Profile, data_dir: str, out_dir: Path, user: Mapping[str, Any]) -> dict[str, Any]:
    """The complete dashed-key run config of ``spec``: defaults < preset < profile < spec <
    ``--set`` values. The preset is expanded here (and ``preset`` left empty) so that a value
    equal to its default still beats the preset (see :func:`fedul_flwr.config.compose_config`)."""
    values: dict[str, Any] = {**default_config(), **load_preset(spec.preset), **profile.overrides}
    dataset = str(spec.overrides.get("dataset", values["dataset"]))
    values.update(profile.by_dataset.get(dataset, {}))
    l1 = profile.l1_by_sets.get(dataset, profile.l1_by_sets.get("*", {}))
    if l1:  # Table D.4 has 10 / 20 / 30 sets; 40 takes the 30 column
        values["l1-weight"] = l1.get(str(spec.overrides.get("num-sets", values["num-sets"])).split(",")[0], 0.0)
    if spec.preset in profile.preset_first:
        values.update(load_preset(spec.preset))
    values.update(profile.by_preset.get(spec.preset, {}))
    values.update(spec.overrides)
    values.update({"seed": spec.seed, "preset": "", "output-dir": str(out_dir / "runs"), "run-name": spec.run_id})
    if data_dir:
        values["data-dir"] = data_dir
    values.update(user)
    # --set differential-privacy=server-* on a grid that pins num-examples weights: what flwr run does
    if server_dp_weights(values, {k: "user" if k in user else "grid" for k in values}):
        get_logger(__name__).warning("run %s: set for server-side DP (its noise assumes equal client weights): "
                                     "aggregation-weights='uniform' (the grid's value was not typed)", spec.run_id)  # fmt: skip
    return values


# --------------------------------------------------------------------------- rendering


def _fmt(values: Sequence[float]) -> str:
    """A cell over seeds (fractions in, % out): ``m``, or ``m (std; each seed)``."""
    return format_seeds([100 * v for v in values])


# (headline method, its reference): the gap column of a table that has both
GAPS = (("FedUL", "FedAvg 100%"), ("FedPU", "Baseline-2 (supervised)"))


TAIL_ROUNDS = 10
"""Rounds averaged by the ``tail-test-error`` measure."""


def record_value(record: Mapping[str, Any], key: str) -> float | None:
    """A record's value of ``key`` (``None`` where it has none).

    ``tail-test-error`` (``tail-test-error-<predictor>``) is derived from the per-round
    metrics: 1 - the mean test accuracy (of that predictor) over the last
    :data:`TAIL_ROUNDS` trained rounds; the other keys are the record's own.
    """
    if not key.startswith("tail-test-error"):
        return record.get(key)
    column = "test-accuracy" + key[len("tail-test-error") :]
    accuracies = [m[column] for m in record.get("metrics", []) if m.get("round", 0) >= 1 and m.get(column) is not None]
    return 1.0 - statistics.fmean(accuracies[-TAIL_ROUNDS:]) if accuracies else None


def render_table(grid: str, specs: Sequence[RunSpec], records: Sequence[Mapping[str, Any]], key: str) -> str:
    """Markdown table of ``key`` (``last-test-error`` / ``tail-test-error`` / ``best-test-error`` /
    ``best-val-test-error``, :func:`record_value`): rows x methods, cells ``ours [paper]`` per
    sub-column joined by `` / ``; % error, or % accuracy for the grids of
    :data:`ACCURACY_GRIDS` (the unit of their paper)."""
    paper = PAPER.get(grid, {})
    accuracy = grid in ACCURACY_GRIDS
    rows = list(dict.fromkeys(s.row for s in specs))
    # a column whose runs have several predictors (HASSLE: SM, UM and the headline EM) shows
    # one column per predictor, "<column> <name>", the headline last
    names = {r["spec"]["column"]: r.get("predictors", []) for r in records}
    shown: dict[str, tuple[str, str]] = {}  # shown column -> (spec column, record key)
    for col in dict.fromkeys(s.column for s in specs):
        found = names.get(col, [])
        if len(found) < 2:  # one predictor: the plain column and the record's headline key
            shown[col] = (col, key)
            continue
        for name in found[1:] + found[:1]:
            shown[f"{col} {name}"] = (col, key if name == found[0] else f"{key}-{name}")
    columns = list(shown)
    subs = list(dict.fromkeys(s.sub for s in specs if s.sub != "*"))
    values: dict[tuple[str, str, str], list[float]] = defaultdict(list)  # in seed order
    seeds: dict[tuple[str, str, str], list[int]] = defaultdict(list)  # the seeds of those values
    ran: dict[tuple[str, str, str], list[int]] = defaultdict(list)  # (row, spec column, sub) -> seeds run
    for r in sorted(records, key=lambda r: int(r["spec"].get("seed", 0))):
        s = r["spec"]
        ran[(s["row"], s["column"], s["sub"])].append(int(s.get("seed", 0)))
        for label, (col, k) in shown.items():
            value = record_value(r, k) if col == s["column"] else None
            if value is not None:
                values[(s["row"], label, s["sub"])].append(1.0 - value if accuracy else value)
                seeds[(s["row"], label, s["sub"])].append(int(s.get("seed", 0)))
    several = len({sp.seed for sp in specs}) > 1  # a cell of one seed then names it
    gap = next(((a, b) for a, b in GAPS if a in columns and b in columns), None)
    head = ["setting", *columns] + ([f"gap {gap[0]} - {gap[1]}"] if gap else [])
    lines = []
    for row in rows:
        cells = [row]
        for col in columns:
            own = [x for x in dict.fromkeys(sp.sub for sp in specs if sp.column == shown[col][0]) if x != "*"]
            cell_subs = own or ["*"]  # a column run once per row (a supervised reference) has one cell
            parts = []
            for sub in cell_subs:
                ours = _fmt(values.get((row, col, sub), []))
                held = seeds.get((row, col, sub), [])
                note = missing_seeds(held, ran.get((row, shown[col][0], sub), []))
                ours += note or (f" (seed {held[0]})" if several and len(held) == 1 else "")
                ref = paper.get((row, col, sub), paper.get((row, col, "*")))  # "*": one number per row
                parts.append(ours if ref is None else f"{ours} [{ref:.2f}]")
            cells.append(" / ".join(parts))
        if gap:
            gaps = []
            for sub in subs or ["*"]:
                ul = values.get((row, gap[0], sub), [])
                ref = values.get((row, gap[1], sub)) or values.get((row, gap[1], "*"), [])
                gaps.append(f"{100 * (statistics.fmean(ul) - statistics.fmean(ref)):+.2f}" if ul and ref else "-")
            cells.append(" / ".join(gaps))
        lines.append(cells)
    return markdown_table(head, lines)


def plot_curves(grid: str, records: Sequence[Mapping[str, Any]], plots_dir: Path) -> list[Path]:
    """One PNG per (row, sub): test accuracy per round of every method (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, str], dict[str, list[list[tuple[int, float]]]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        s = r["spec"]
        curve = [(int(m["round"]), m["test-accuracy"]) for m in r["metrics"] if "test-accuracy" in m]
        subs = [s["sub"]] if s["sub"] != "*" else sorted({x["spec"]["sub"] for x in records if x["spec"]["row"] == s["row"]} - {"*"}) or ["*"]
        for sub in subs:  # supervised references appear in every sub-plot of their row
            groups[(s["row"], sub)][s["column"]].append(curve)
    plots_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for (row, sub), methods in sorted(groups.items()):
        fig, ax = plt.subplots(figsize=(6, 4))
        for column, curves in methods.items():
            rounds = sorted(set.intersection(*(set(x for x, _ in c) for c in curves)))
            mean = [100 * statistics.fmean(dict(c)[x] for c in curves) for x in rounds]
            ax.plot(rounds, mean, marker="o", ms=3, label=column, ls="--" if column in SUPERVISED else "-")
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{grid}: {row}" + ("" if sub == "*" else f", {sub}"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = "".join(c if c.isalnum() or c in "-_." else "-" for c in f"{grid}-{row}-{sub}") + ".png"
        write_atomic(plots_dir / name, lambda fh: fig.savefig(fh, format="png", dpi=110))
        plt.close(fig)
        paths.append(plots_dir / name)
    return paths


def total_run_time(records: Sequence[Mapping[str, Any]]) -> float:
    """Seconds of training behind ``records``: each trained run once, a shared record
    (``same-run-as``) standing for its original whether or not that is among ``records``."""
    return sum({r.get("same-run-as") or r["run-id"]: float(r["wall-time-s"]) for r in records}.values())


def seconds_per_round(record: Mapping[str, Any]) -> float | None:
    """Median seconds between consecutive rounds of a record (from the cumulative
    ``wall-time`` of its metric rows; robust to the jump where a run was continued)."""
    times = {int(m["round"]): float(m["wall-time"]) for m in record.get("metrics", []) if "wall-time" in m}
    steps = [times[n] - times[n - 1] for n in sorted(times) if n >= 1 and n - 1 in times and times[n] >= times[n - 1]]
    return statistics.median(steps) if steps else None


def _section(name: str, title: str, body: str) -> list[str]:
    """A results-page section between snippet markers, so the docs include it by name
    (``--8<-- "<page>:<name>"``) instead of retyping it."""
    return [f"### {title}", "", f"<!-- --8<-- [start:{name}] -->", body, f"<!-- --8<-- [end:{name}] -->", ""]


def _device(record: Mapping[str, Any]) -> str:
    """The device a record was trained on, with its card or CPU model where recorded
    (``cuda (NVIDIA H100 80GB HBM3)``); older records: the configured ``device``."""
    if "device" not in record:
        return str(record.get("config", {}).get("device", "-"))
    return f"{record['device']} ({record['device-name']})" if record.get("device-name") else str(record["device"])


def _short(error: str, limit: int = 160) -> str:
    """``error`` on one line, cut at ``limit`` characters (``|`` escaped for a table cell)."""
    one = " ".join(error.split()).replace("|", "/")
    return one if len(one) <= limit else one[: limit - 3] + "..."


def render(grid: str, profile_name: str, specs: Sequence[RunSpec], records: Sequence[Mapping[str, Any]], out_dir: Path,
           failures: Sequence[Mapping[str, Any]] = ()) -> Path:  # fmt: skip
    """Write ``results-<grid>.md`` (the tables, settings, wall time) and the plots.

    Each table sits between named snippet markers (``last``, ``tail``, ``best``, ``best-val``,
    ``windows``, ``diagnostics``, ``failed``, ``wall-time``), which the docs include with
    ``--8<-- "docs/reproduce/<profile>/results-<grid>.md:<name>"``. ``failures``: the failure
    records of runs without a record (:func:`~fedul_flwr.experiments.runner.load_failures`),
    listed with their error and the last round they completed; their cells stay empty.
    """
    done = len(records)
    wall = total_run_time(records)
    sub_name = "sets M" if grid.startswith("table1") or grid in ("table-e13", "fashion", "smoke") else "sweep value"
    subs = " / ".join(dict.fromkeys(s.sub for s in specs if s.sub != "*"))
    unit = "accuracy" if grid in ACCURACY_GRIDS else "error"
    text = [
        f"## {grid} ({profile_name} profile)",
        "",
        f"{done} of {len(specs)} runs" + (f" ({len(failures)} more failed: see Failed runs)" if failures else "")
        + f"; total run time {wall / 60:.1f} min. Cells: % test {unit}, ours [paper]"
        + (f" for {sub_name} = {subs}" if subs else "") + "; mean (std; each seed in ascending order) when there "
        "are several seeds." + (f" {BRACKET_NOTES[grid]}" if grid in BRACKET_NOTES else ""),
        "",
    ]
    if grid in GPU_GRIDS and len(records) < len(specs):
        text += _section("plan", "Not run here: the command and the GPU time", gpu_plan(grid, specs, records))
    text += _section("last", f"Last-round test {unit}" + ("" if grid in ACCURACY_GRIDS else " (no labels used)"),
                     render_table(grid, specs, records, "last-test-error"))  # fmt: skip
    windowed = grid in ("feddb-ablation", "hassle-sweep", "feddb-svhn", "feddb-cifar100", *RECIPE_GRIDS) or grid in HASSLE_ROWS  # single rounds swing by points on non-IID splits
    if windowed:
        text += _section("tail", f"Mean test {unit} over the last {TAIL_ROUNDS} rounds (single rounds swing by points "
                         "on non-IID splits)", render_table(grid, specs, records, "tail-test-error"))  # fmt: skip
        why = "the paper's measure" if grid.startswith("feddb") else "the round with the highest accuracy"
        text += _section("best", f"Best test {unit} during training ({why}; selects by test labels)",
                         render_table(grid, specs, records, "best-test-error"))  # fmt: skip
    if any(r.get("best-val-test-error") is not None for r in records) or grid not in ACCURACY_GRIDS:
        text += _section("best-val", f"Test {unit} at the best-validation round (model selection USES LABELS: 20% "
                         "labeled hold-out)", render_table(grid, specs, records, "best-val-test-error"))  # fmt: skip
    if windowed and records:  # each predictor's course, beside the baselines'
        text += _section("windows", "Why: each predictor's mean test accuracy (%) by windows of rounds, its range over "
                         "the last rounds, and rounds at chance", render_windows(records))  # fmt: skip
    # the pseudo-labels (and, for FedDB, APP-U and DMA's weights) by round: every run of the FedDB
    # grid and of the HASSLE sweep; on the HASSLE tables the FixMatch baseline's
    diagnosed = records if grid in ("feddb-ablation", "hassle-sweep") else [
        r for r in records if grid in HASSLE_ROWS and r["config"].get("method") == "fixmatch"]  # fmt: skip
    if diagnosed:
        from fedul_flwr.experiments.feddb_diagnostics import render_diagnostics

        title = {"feddb-ablation": "pseudo-labels, APP-U and DMA's weights",
                 "hassle-sweep": "HASSLE's pseudo-labels (Eq. 11)"}.get(grid, "FedAvg+FixMatch's pseudo-labels")  # fmt: skip
        shown = {1, 5, 10, 20, 50, 100, 150, 200} if grid == "hassle-sweep" else {10, 50, 100, 150, 200}
        rounds = sorted(shown & set(range(1, max(int(r["last-round"]) for r in diagnosed) + 1)))
        text += _section("diagnostics", f"Why: {title} by round", render_diagnostics(diagnosed, rounds=rounds))
    if failures:  # a failed run is a result too: what failed and when
        rows = [[f["run-id"], f.get("round-reached", "-"), f"{f.get('error-type', '')}: {_short(str(f.get('error', '')))}"]
                for f in failures]  # fmt: skip
        text += _section("failed", "Failed runs (no cell; the run folder keeps the log)",
                         markdown_table(["run", "last completed round", "error"], rows))  # fmt: skip
    if records:  # every run's wall time and the settings that decide it
        rows = []
        for r in sorted(records, key=lambda r: r["run-id"]):
            c = r["config"]
            loop = " ".join(str(c.get(k, "-")) for k in ("precision", "memory-format"))
            loop += " fused" if c.get("fused-optimizer") else (" per-parameter" if "fused-optimizer" in c else "")
            shared = f" (= {r['same-run-as']})" if r.get("same-run-as") else ""
            per_round = seconds_per_round(r)
            rows.append([f"{r['run-id']}{shared}", f"{r['wall-time-s']:.0f}", "-" if per_round is None else f"{per_round:.1f}",
                         r.get("threads", "-"), _device(r), loop, r.get("resumed-after-round", "-")])  # fmt: skip
        head = ["run", "wall time (s)", "s per round (median)", "threads", "device", "loop", "continued after round"]
        text += _section("wall-time", "Wall time per run", markdown_table(head, rows))
    plots = plot_curves(grid, records, out_dir / "plots") if records else []
    text += [f"![{p.stem}](plots/{p.name})" for p in plots]
    path = out_dir / f"results-{grid}.md"
    out_dir.mkdir(parents=True, exist_ok=True)  # a GPU grid's page is rendered before any run
    write_atomic(path, "\n".join(text) + "\n")
    return path


# --------------------------------------------------------------------------- CLI


def recorded_seeds(records_dir: Path, grid: str) -> tuple[int, ...]:
    """The seeds of ``grid``'s runs that have a record or a failure record in ``records_dir``
    (from the file names ``<grid>__...__s<seed>.json``), ascending; empty without any."""
    pattern = re.compile(rf"{re.escape(grid)}__.*__s(\d+)\.json")
    files = [*records_dir.glob(f"{grid}__*.json"), *(records_dir / FAILED_DIR).glob(f"{grid}__*.json")]
    return tuple(sorted({int(m.group(1)) for f in files if (m := pattern.fullmatch(f.name))}))


def select_runs(specs: Sequence[RunSpec], patterns: str) -> list[RunSpec]:
    """The runs whose id matches one of the comma-separated shell-style ``patterns``
    (:func:`fnmatch.fnmatchcase`), those of the first pattern first, each run once.

    Raises
    ------
    SystemExit
        If a pattern matches no run of the grid (the message names it).
    """
    chosen: dict[str, RunSpec] = {}
    for pattern in (p.strip() for p in patterns.split(",") if p.strip()):
        matches = [spec for spec in specs if fnmatch.fnmatchcase(spec.run_id, pattern)]
        if not matches:
            raise SystemExit(f"--runs {pattern!r}: matches no run of this grid (fedul reproduce --list shows them)")
        for spec in matches:
            chosen.setdefault(spec.run_id, spec)
    return list(chosen.values())


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``fedul reproduce`` (see the module doc)."""
    p.add_argument("--grid", default="table1", choices=GRIDS, help="the table to reproduce")
    p.add_argument("--profile", default="cpu", choices=sorted(PROFILES), help="compute settings of every run")
    p.add_argument("--methods", default=",".join(METHOD_KEYS), help="comma list of columns (table1*)")
    p.add_argument("--datasets", default="mnist", help="comma list of table rows (table1*, table-e12, table-e13)")
    p.add_argument("--partitions", default="iid,noniid", help="comma list of table rows (table1*)")
    p.add_argument("--sets", default="10,20,40", help="comma list of M values (table1*, table-e13)")
    p.add_argument("--subs", default="", help="comma list: run only these sub-columns (e.g. loop-check's plain,defaults)")
    p.add_argument("--runs", default="", help="comma list of shell-style patterns of run ids (see --list): run only "
                   "the matching runs, in the order of the patterns; the tables still show every recorded run")
    add_common_arguments(p, out="outputs/reproduce", seeds_help="comma list; empty: the profile's seeds")
    p.add_argument("--list", action="store_true", help="print the runs and exit")
    p.add_argument("--render-only", action="store_true", help="only render tables and plots of existing records")


def run(args: argparse.Namespace) -> int:
    """``fedul reproduce``: run the grid's missing runs (those ``--runs`` selects), render its
    tables from every recorded run.

    Exit status: 0 when every selected run has a record (``--render-only``: every run of the
    grid); 1 when a run failed (one line per failed cell at the end; the others finished and
    are rendered) or runs are missing; 75 when ``--stop-after`` left runs to continue (and
    none failed)."""
    profile = PROFILES[args.profile]
    default_seeds = {"hassle-sweep": HASSLE_SWEEP_SEEDS, "hassle-recipe": HASSLE_RECIPE_SEEDS,
                     "fixmatch-central": RECIPE_SEEDS, "feddb-recipe": RECIPE_SEEDS}.get(args.grid, profile.seeds)
    seeds = parse_seeds(args.seeds) or default_seeds
    out_dir = Path(args.out).expanduser().resolve() / args.profile
    # the page shows the grid at its default seeds, at those given and at every seed on record:
    # neither a run of one seed nor a re-render drops the other seeds' cells from the tables
    page_seeds = sorted({*default_seeds, *seeds, *recorded_seeds(out_dir / "records", args.grid)})
    specs = build_grid(args.grid, args, tuple(page_seeds))
    if args.subs:
        specs = [spec for spec in specs if spec.sub in args.subs.split(",")]
    runnable = [spec for spec in specs if spec.seed in seeds]
    selected = select_runs(runnable, args.runs) if args.runs else runnable
    common, targeted = parse_overrides(args.set)
    if targeted:
        raise SystemExit(f"--set {next(iter(targeted))}:...: fedul reproduce takes key=value without a column")
    if args.clean:
        return clean(out_dir / "runs", args.yes)
    if args.list:
        for spec in selected:
            print(spec.run_id, spec.clients, "clients", json.dumps(spec.overrides))
        print(f"{len(selected)} runs")
        return 0
    result = None
    if not args.render_only:
        runs = [(spec, run_config_of(spec, profile, args.data_dir, out_dir, common)) for spec in selected]
        result = run_cells(runs, out_dir / "records", jobs=args.jobs, threads=args.threads, name=args.grid,
                           stop_after=args.stop_after, started=getattr(args, "started", None))  # fmt: skip
    records = load_records(specs, out_dir / "records")
    if records or args.grid in GPU_GRIDS:  # a GPU grid's page shows the paper's numbers and the plan
        path = render(args.grid, args.profile, specs, records, out_dir, load_failures(specs, out_dir / "records"))
        print(path.read_text())
        print(f"wrote {path}")
    else:
        print(f"no records of grid {args.grid!r} in {out_dir / 'records'}: nothing to render", file=sys.stderr)
    if result is None:
        missing = [s.run_id for s in specs if s.run_id not in {r.get("run-id") for r in records}]
        if missing:
            named = ", ".join(missing[:5]) + (f", ... ({len(missing) - 5} more)" if len(missing) > 5 else "")
            print(f"fedul: exit status 1: {len(missing)} of {len(specs)} runs of grid {args.grid!r} have no record "
                  f"({named})", file=sys.stderr, flush=True)  # fmt: skip
        return 0 if records and not missing else 1
    for line in result.final_lines():
        print(line, flush=True)
    if result.exit_code:
        return result.exit_code
    return 0 if len(result.records) == len(selected) else 1
