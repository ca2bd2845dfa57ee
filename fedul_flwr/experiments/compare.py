"""Compare server strategies under one method on non-IID clients (``fedul compare``).

Runs a method (FedUL, Lu et al., ICLR 2022, by default) with each server strategy -- FedAvg,
FedProx (Li et al. 2020), SCAFFOLD (Karimireddy et al. 2020), FedNova (Wang et al. 2020),
FedAdam (Reddi et al. 2021), or any registered one -- on the same data, rounds and seeds,
through the grid runner (:mod:`fedul_flwr.experiments.runner`: the real ServerApp logic and
ClientApp in an in-process Flower grid, resumable records, a log file per run). Default
setting: MNIST, non-IID split (2 majority classes per client), 5 clients, M = 10 sets per
client.

Writes ``<out>/records/<run-id>.json`` (one per run), ``<out>/runs/<run-id>/`` (the run
folders) and ``<out>/strategies.md``: mean and std over seeds of the final and the best test
error (%). "Best" is the best round's *test* error (an oracle early stop, as the paper's model
selection on labeled data); "final" uses no labels at all.

Strategy-specific settings used unless overridden (``--set strategy:key=value``): FedProx
``proximal-mu = 0.01``; SCAFFOLD ``scaffold-option = I`` (with the default Adam clients it
diverged on MNIST non-IID; ``--set local-optimizer=sgd`` is the fair SCAFFOLD run, see the
server-strategies page); FedAdam ``server-lr = 0.01``; Krum, MultiKrum and Bulyan need at
least 3 replies a round (``--clients 5`` samples all 5); the others take the app's defaults.

Examples::

    # the table of the docs (2 CPU cores: ~13 min per run, two runs at a time)
    fedul compare --data-dir /path/to/torchvision-root --rounds 20 --seeds 0,1 --jobs 2
    # smoke check on the embedded sample
    fedul compare --dataset mnist-sample --rounds 2
    # unequal local work (FedNova's and SCAFFOLD's case), plain SGD clients
    fedul compare --data-dir /data --set local-epochs-per-client=1,2,5 \\
        --set local-optimizer=sgd --set lr=0.05 --set fedprox:proximal-mu=0.1
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedul_flwr.config import default_config
from fedul_flwr.data.datasets import DATASETS
from fedul_flwr.experiments.runner import (
    RunSpec,
    add_common_arguments,
    clean,
    parse_overrides,
    parse_seeds,
    run_cells,
)
from fedul_flwr.experiments.grid_cli import whole_number
from fedul_flwr.experiments.tables import markdown_table
from fedul_flwr.store import write_atomic
from fedul_flwr.strategies import STRATEGIES

DEFAULT_STRATEGIES = ("fedavg", "fedprox", "scaffold", "fednova", "fedadam")
STRATEGY_SETTINGS: dict[str, dict[str, Any]] = {
    "fedprox": {"proximal-mu": 0.01},
    "scaffold": {"scaffold-option": "I"},
    # Flower's default server step (eta = 0.1 per coordinate) moves every weight of the small
    # CNN by up to 0.1 a round on top of Adam clients; the smoke run diverged with it
    "fedadam": {"server-lr": 0.01},
}
BASE_SETTINGS: dict[str, Any] = {"method": "fedul", "dataset": "mnist", "partition": "noniid", "num-sets": 10}


def compare_runs(args: argparse.Namespace) -> tuple[list[tuple[RunSpec, dict[str, Any]]], dict[str, Any], dict[str, Any]]:
    """The comparison's runs (spec, complete run config), the settings common to all, and the
    ``--set`` values among them."""
    common, per_strategy = parse_overrides(args.set)
    unknown = set(per_strategy) - set(STRATEGIES.names())
    if unknown:
        raise SystemExit(f"--set {sorted(unknown)[0]}:...: not a strategy of {STRATEGIES.names()}")
    out = Path(args.out).expanduser().resolve()
    defaults = default_config()
    robust = 3 if set(args.strategies) & {"krum", "multikrum", "bulyan"} else int(defaults["min-train-nodes"])
    base = {
        **BASE_SETTINGS,
        "dataset": args.dataset,
        "data-dir": args.data_dir,
        "num-rounds": args.rounds,
        "min-available-nodes": min(args.clients, max(robust, int(defaults["min-available-nodes"]))),
        "min-train-nodes": min(args.clients, robust),
        "output-dir": str(out / "runs"),
        **common,
    }
    runs = []
    row = f"{args.dataset} {base['partition']}"
    for strategy in args.strategies:
        settings = {**STRATEGY_SETTINGS.get(strategy, {}), **per_strategy.get(strategy, {})}
        for seed in parse_seeds(args.seeds) or (0,):
            spec = RunSpec("compare", row, strategy, "*", seed, args.clients, "", settings)
            runs.append((spec, {**base, **settings, "strategy": strategy, "seed": seed, "run-name": spec.run_id}))
    return runs, base, common


def _cell(values: list[float]) -> str:
    mean = 100 * statistics.fmean(values)
    return f"{mean:.2f}" if len(values) == 1 else f"{mean:.2f} ({100 * statistics.stdev(values):.2f})"


def render(records: Sequence[dict[str, Any]], header: str) -> str:
    """Markdown table: rows = strategies, final and best test error % (mean (std) over seeds)."""
    cells = []
    for strategy in dict.fromkeys(r["spec"]["column"] for r in records):
        rows = [r for r in records if r["spec"]["column"] == strategy]
        settings = ", ".join(f"{k}={v}" for k, v in rows[0]["spec"]["overrides"].items()) or "-"
        finals = [r["last-test-error"] for r in rows]
        bests = [r["last-test-error"] if r.get("best-test-error") is None else r["best-test-error"] for r in rows]
        cells.append([strategy, settings, _cell(finals), _cell(bests), len(rows)])
    head = ["strategy", "settings", "final test error %", "best test error %", "seeds"]
    return "\n".join([header, "", markdown_table(head, cells)]) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``fedul compare`` (see the module doc)."""
    p.add_argument("--strategies", nargs="+", default=list(DEFAULT_STRATEGIES), choices=STRATEGIES.names(),
                   metavar="STRATEGY", help=f"of {', '.join(STRATEGIES.names())}")  # fmt: skip
    p.add_argument("--dataset", default=BASE_SETTINGS["dataset"], choices=DATASETS.names())
    p.add_argument("--rounds", type=whole_number(1), default=20, help="rounds per run")
    p.add_argument("--clients", type=whole_number(1), default=5, help="simulated clients per run")
    add_common_arguments(p, out="outputs/strategies", seeds_help="comma list of seeds", column_set=True)


def run(args: argparse.Namespace) -> int:
    """``fedul compare``: run the missing runs, write and print ``strategies.md``. Exit status
    as ``fedul reproduce``'s: 1 with a failed run (one line each at the end), 75 when
    ``--stop-after`` left runs, else 0 once every run has a record."""
    out = Path(args.out).expanduser().resolve()
    if args.clean:
        return clean(out / "runs", args.yes)
    runs, base, common = compare_runs(args)
    result = run_cells(runs, out / "records", jobs=args.jobs, threads=args.threads, name="compare",
                       stop_after=args.stop_after, started=getattr(args, "started", None))  # fmt: skip
    records = result.records
    header = (
        f"{base['method']}, {args.dataset} {base['partition']}, {args.clients} clients, M = {base['num-sets']}, "
        f"{args.rounds} rounds, seeds {args.seeds or '0'}"
        + (f"; common overrides: {', '.join(f'{k}={v}' for k, v in common.items())}" if common else "")
    )
    table = render(records, header)
    write_atomic(out / "strategies.md", table)
    print(table)
    for line in result.final_lines():
        print(line, flush=True)
    return result.exit_code or (0 if len(records) == len(runs) else 1)
