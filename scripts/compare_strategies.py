"""Compare server strategies under FedUL on non-IID unlabeled clients.

Runs FedUL (Lu et al., ICLR 2022) with each server strategy -- FedAvg, FedProx (Li et al.
2020), SCAFFOLD (Karimireddy et al. 2020), FedNova (Wang et al. 2020), FedAdam (Reddi et al.
2021), or any of ``fedavgm``, ``fedyogi``, ``fedadagrad`` -- with the same data, rounds and
seeds, through the real ServerApp logic and ClientApp in an in-process Flower grid
(:class:`fedul_flwr.inprocess.InProcessGrid`, no Ray). Default setting: MNIST, non-IID
split (2 majority classes per client), 5 clients, M = 10 sets per client.

Writes ``<out>/strategies.json`` (one record per run: strategy, seed, the run-config
overrides, per-round test error, final and best test error, run folder) and
``<out>/strategies.md`` (mean and std over seeds of the final and the best test error, %).
"Best" is the best round's *test* error (an oracle early stop, as the paper's model
selection on labeled data); "final" uses no labels at all.

Strategy-specific settings used unless overridden (``--set``): FedProx ``proximal-mu =
0.01``; SCAFFOLD ``scaffold-option = I`` (with the default Adam clients it diverged
on MNIST non-IID; the README's SGD-client command, ``--set local-optimizer=sgd``, is the
fair SCAFFOLD run, see "The comparison table"); FedAdam ``server-lr = 0.01``; the others take the app's
defaults (pyproject.toml).

``--jobs N`` runs N federations at once in worker processes, each with
``--threads`` torch threads (default: cores // N); every run seeds itself, so the results
do not depend on N (up to float summation order with other thread counts). ``--reuse``
reads runs already finished in ``<out>/runs`` with the same config instead of training
them again (an interrupted comparison continues where it stopped).

Examples::

    # the table in the README (2 CPU cores: ~13 min per run, two runs at a time)
    python scripts/compare_strategies.py --data-dir /work/shared/data --rounds 20 --seeds 0 1 --jobs 2 --reuse
    # smoke check on the embedded sample
    python scripts/compare_strategies.py --dataset mnist-sample --rounds 2
    # unequal local work (FedNova's and SCAFFOLD's case), plain SGD clients
    python scripts/compare_strategies.py --data-dir /data --set local-epochs-per-client=1,2,5 \\
        --set local-optimizer=sgd --set lr=0.05 --set fedprox:proximal-mu=0.1
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent
if str(PROJECT) not in sys.path:
    sys.path.insert(0, str(PROJECT))

from fedul_flwr.config import default_config, resolve_config  # noqa: E402
from fedul_flwr.data.datasets import DATASETS  # noqa: E402
from fedul_flwr.strategies import STRATEGIES  # noqa: E402

DEFAULT_STRATEGIES = ("fedavg", "fedprox", "scaffold", "fednova", "fedadam")
STRATEGY_SETTINGS: dict[str, dict[str, Any]] = {
    "fedprox": {"proximal-mu": 0.01},
    "scaffold": {"scaffold-option": "I"},
    # Flower's default server step (eta = 0.1 per coordinate) moves every weight of the small
    # CNN by up to 0.1 a round on top of Adam clients; the README's smoke run diverged with it
    "fedadam": {"server-lr": 0.01},
}
BASE_SETTINGS: dict[str, Any] = {"method": "fedul", "dataset": "mnist", "partition": "noniid", "num-sets": 10}


def _parse_sets(items: Sequence[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``key=value`` (every run) and ``strategy:key=value`` (that strategy's runs)."""
    common: dict[str, Any] = {}
    per_strategy: dict[str, dict[str, Any]] = {}
    defaults = default_config()
    for item in items:
        target, _, assignment = item.rpartition(":") if ":" in item.split("=", 1)[0] else ("", "", item)
        key, sep, text = assignment.partition("=")
        if not sep or key not in defaults:
            raise SystemExit(f"--set {item!r}: expected [strategy:]key=value with a key of pyproject.toml")
        (per_strategy.setdefault(target, {}) if target else common)[key] = text  # typed by resolve_config
    return common, per_strategy


def finished_run(run_config: dict[str, Any]) -> Path | None:
    """The run folder of ``run_config`` if a finished run with the same config is there.

    A run is finished when its folder holds ``model.pt`` (written after the last round) and
    its ``config.json`` equals the resolved ``run_config``; ``--reuse`` then reads its
    ``metrics.json`` instead of training again (an interrupted comparison continues).
    """
    path = Path(run_config["output-dir"]) / run_config["run-name"]
    if not (path / "model.pt").is_file() or not (path / "config.json").is_file():
        return None
    saved = json.loads((path / "config.json").read_text())
    wanted = json.loads(json.dumps(resolve_config(run_config).as_dict(), sort_keys=True))
    return path if saved == wanted else None


def run_one(run_config: dict[str, Any], num_clients: int, reuse: bool = False) -> dict[str, Any]:
    """One in-process federation (or, with ``reuse``, its finished run folder); returns its
    per-round test errors and run folder."""
    from fedul_flwr.outputs import read_metrics

    done = finished_run(run_config) if reuse else None
    if done is not None:
        rows = {int(r["round"]): r for r in read_metrics(done)}
        path = done
    else:
        from fedul_flwr.client_app import app
        from fedul_flwr.inprocess import InProcessGrid
        from fedul_flwr.server_app import run_federation

        random.seed(int(run_config["seed"]))  # Flower samples nodes with the global `random`
        shutil.rmtree(Path(run_config["output-dir"]) / run_config["run-name"], ignore_errors=True)  # the runner reruns it
        outputs = run_federation(InProcessGrid(app, num_clients, run_config), resolve_config(run_config))
        rows, path = outputs.rows, outputs.path
    errors = {r: row["test-error"] for r, row in sorted(rows.items()) if "test-error" in row}
    last = max(errors)
    best = min((r for r in errors if r > 0), key=lambda r: errors[r], default=last)
    return {
        "test-error": errors,
        "final-error": errors[last],
        "best-error": errors[best],
        "best-round": best,
        "run-dir": str(path),
    }


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _cell(values: list[float]) -> str:
    mean = 100 * statistics.fmean(values)
    return f"{mean:.2f}" if len(values) == 1 else f"{mean:.2f} ({100 * statistics.stdev(values):.2f})"


def render(records: list[dict[str, Any]], header: str) -> str:
    """Markdown table: rows = strategies, final and best test error % (mean (std) over seeds)."""
    lines = [header, "", "| strategy | settings | final test error % | best test error % | seeds |", "|---|---|---|---|---|"]
    for strategy in dict.fromkeys(r["strategy"] for r in records):
        rows = [r for r in records if r["strategy"] == strategy]
        settings = ", ".join(f"{k}={v}" for k, v in rows[0]["strategy-settings"].items()) or "-"
        finals, bests = [r["final-error"] for r in rows], [r["best-error"] for r in rows]
        lines.append(f"| {strategy} | {settings} | {_cell(finals)} | {_cell(bests)} | {len(rows)} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default="", help="absolute torchvision root (not needed for mnist-sample)")
    parser.add_argument("--dataset", default=BASE_SETTINGS["dataset"], choices=DATASETS.names())
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--strategies", nargs="+", default=list(DEFAULT_STRATEGIES), choices=STRATEGIES.names())
    parser.add_argument("--set", action="append", default=[], metavar="[STRATEGY:]KEY=VALUE")
    parser.add_argument("--out", default=str(PROJECT / "outputs" / "strategies"))
    parser.add_argument("--jobs", type=int, default=1, help="federations run at once (worker processes)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per job; 0: cores // jobs")
    parser.add_argument("--reuse", action="store_true", help="read finished runs with the same config from --out")
    args = parser.parse_args(argv)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)

    out = Path(args.out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    common, per_strategy = _parse_sets(args.set)
    base = {
        **BASE_SETTINGS,
        "dataset": args.dataset,
        "data-dir": str(Path(args.data_dir).expanduser().resolve()) if args.data_dir else "",
        "num-rounds": args.rounds,
        "min-available-nodes": min(args.clients, int(default_config()["min-available-nodes"])),
        "min-train-nodes": min(args.clients, int(default_config()["min-train-nodes"])),
        "output-dir": str(out / "runs"),
        **common,
    }
    runs = []
    for strategy in args.strategies:
        settings = {**STRATEGY_SETTINGS.get(strategy, {}), **per_strategy.get(strategy, {})}
        for seed in args.seeds:
            run_config = {**base, **settings, "strategy": strategy, "seed": seed, "run-name": f"{strategy}-s{seed}"}
            runs.append((strategy, seed, settings, run_config))
    records: list[dict[str, Any]] = []
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.jobs, mp_context=context, initializer=_init_worker, initargs=(threads,)) as pool:
        futures = [pool.submit(run_one, run_config, args.clients, args.reuse) for *_, run_config in runs]
        print(f"[compare_strategies] {len(runs)} runs, {args.jobs} at a time, {threads} torch thread(s) each", flush=True)
        for (strategy, seed, settings, run_config), future in zip(runs, futures):
            result = future.result()
            records.append({"strategy": strategy, "seed": seed, "strategy-settings": settings, "run-config": run_config, **result})
            print(
                f"[compare_strategies] {strategy} seed={seed}: final {100 * result['final-error']:.2f}% "
                f"best {100 * result['best-error']:.2f}% (round {result['best-round']})",
                flush=True,
            )
            (out / "strategies.json").write_text(json.dumps(records, indent=1) + "\n")
    header = (
        f"FedUL, {args.dataset} {base['partition']}, {args.clients} clients, M = {base['num-sets']}, "
        f"{args.rounds} rounds, seeds {' '.join(map(str, args.seeds))}"
        + (f"; common overrides: {', '.join(f'{k}={v}' for k, v in common.items())}" if common else "")
    )
    table = render(records, header)
    (out / "strategies.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
