"""Accuracy against privacy spent on the embedded MNIST sample: the table of docs/privacy.md.

Runs FedUL (the defaults: 5 clients, M = 10 sets, LeNet, Adam lr 1e-3) without DP, with
Flower's central DP (``server-fixed``, several noise multipliers z at clipping norm C = 1) and
with local DP (``client-local``, several per-round epsilons), each through the grid runner
(the real ServerApp logic and ClientApp in an in-process Flower grid: the same numbers as
``flwr run .`` with the same settings), and renders the last round's test accuracy beside the
(epsilon, delta) the run recorded (``fedul_flwr.privacy.accounting.privacy_spent``): the exact epsilon of
one round's release (``privacy-epsilon-round``, the analytic Gaussian mechanism) and the
composed upper bound after the last round (``privacy-epsilon``, Rényi DP; every node trains
every round, so ``server-fixed`` is accounted add-or-remove without sampling; what the other
``participation`` modes cost is ``scripts/participation_table.py``'s table). The DP noise comes from the OS CSPRNG, so a re-run
gives other DP rows (the training itself is seeded).

Writes ``<out>/records/<run-id>.json`` (one per run; a recorded run is not run again),
``<out>/runs/`` (git-ignored) and ``<out>/results.md``, which docs/privacy.md includes.

    python scripts/privacy_table.py                  # run what is missing (~1 min a run on 2 idle cores), render
    python scripts/privacy_table.py --render-only    # render the committed records
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fedul_flwr import wire
from fedul_flwr.config import default_config
from fedul_flwr.experiments.runner import RunSpec, load_records, run_grid
from fedul_flwr.experiments.tables import markdown_table
from fedul_flwr.store import write_atomic

REPO = Path(__file__).resolve().parent.parent
CLIENTS = 5
SETTINGS: list[tuple[str, dict[str, Any]]] = [
    ("none", {"differential-privacy": "none"}),
    # server-side DP: equal client weights, which Flower's noise z C / n assumes (typed here, as the
    # runner counts every key as typed)
    *[(f"server-fixed, z = {z}, C = 1", {"differential-privacy": "server-fixed", "dp-noise-multiplier": z,
                                          "dp-clipping-norm": 1.0, "aggregation-weights": "uniform"})
      for z in (0.02, 0.05, 0.2)],
    # adaptive clipping from C = 1 toward the median update norm; its clipped count shares z
    ("server-adaptive, z = 0.05, C from 1", {"differential-privacy": "server-adaptive", "dp-noise-multiplier": 0.05,
                                             "dp-clipping-norm": 1.0, "aggregation-weights": "uniform"}),
    # dp-sensitivity = 2C: two updates clipped to C differ by at most 2C; LocalDpMod's classic sigma
    # formula makes a reply (dp-epsilon, dp-delta)-DP only for dp-epsilon < 1 (the table shows the exact one)
    *[(f"client-local, dp-epsilon = {e:g}, dp-sensitivity = 2, C = 1", {"differential-privacy": "client-local", "dp-epsilon": e,
                                                    "dp-sensitivity": 2.0, "dp-clipping-norm": 1.0}) for e in (1000.0,)],
]  # fmt: skip


def runs(out: Path, rounds: int) -> list[tuple[RunSpec, dict[str, Any]]]:
    """The grid: one run per setting, seed 0, ``rounds`` rounds on the embedded sample."""
    grid = []
    for label, over in SETTINGS:
        over = {**over, "num-rounds": rounds}
        spec = RunSpec("privacy", label, "FedUL", "*", 0, CLIENTS, "", over)
        run_config = {**default_config(), **over, "output-dir": str(out / "runs"), "run-name": spec.run_id,
                      "device": "cpu", "precision": "fp32"}  # fmt: skip
        grid.append((spec, run_config))
    return grid


def render(records: list[dict[str, Any]], rounds: int) -> str:
    """The results page: one row per setting, test accuracy after the last round and the
    (epsilon, delta) recorded then."""
    rows = []
    for record in records:
        last = record["metrics"][-1]
        cfg = record["config"]
        epsilon, one = last.get(wire.PRIVACY_EPSILON), last.get(wire.PRIVACY_EPSILON_ROUND)
        rows.append([
            record["spec"]["row"],
            f"{100 * last['test-accuracy']:.2f}",
            "-" if one is None else f"{one:.3g}",
            "-" if epsilon is None else f"{epsilon:.3g}",
            "-" if epsilon is None else f"{cfg['dp-delta']:g}",
        ])  # fmt: skip
    by_row = {record["spec"]["row"]: (record["metrics"][-1], record["config"]) for record in records}
    example = _example(by_row, rounds)
    head = (f"FedUL on the embedded MNIST sample (`dataset=mnist-sample`, 5 clients, M = 10, seed 0), "
            f"{rounds} rounds; rendered by `python scripts/privacy_table.py` from its records.")  # fmt: skip
    table = markdown_table(["differential privacy", "test accuracy % (last round)", "epsilon of one round (exact)",
                            f"epsilon after {rounds} rounds (RDP bound)", "delta"], rows)  # fmt: skip
    return (f"{head}\n\n<!-- --8<-- [start:table] -->\n{table}\n<!-- --8<-- [end:table] -->\n\n"
            f"<!-- --8<-- [start:example] -->\n{example}\n<!-- --8<-- [end:example] -->\n")  # fmt: skip


def _example(by_row: dict[str, tuple[dict[str, Any], dict[str, Any]]], rounds: int) -> str:
    """The paragraph of docs/privacy.md that reads the table: the z = 0.05 and z = 0.2 rows against
    no DP, the adaptive row and the local-DP row."""

    def acc(row: str) -> str:
        return f"{100 * by_row[row][0]['test-accuracy']:.2f}%"

    def eps(row: str, key: str = wire.PRIVACY_EPSILON) -> str:
        return f"{by_row[row][0][key]:.3g}"

    labels = [label for label, _ in SETTINGS]
    central, noisier = "server-fixed, z = 0.05, C = 1", "server-fixed, z = 0.2, C = 1"
    adaptive = next(label for label in labels if label.startswith("server-adaptive"))
    local = next(label for label in labels if label.startswith("client-local"))
    delta = f"{by_row[central][1]['dp-delta']:g}"
    return (
        f"So the first example below learns: the z = 0.05 row, {acc(central)} test accuracy after its {rounds} rounds "
        f"({acc('none')} without DP), has spent epsilon = {eps(central)} at delta = {delta} "
        f"({eps(central, wire.PRIVACY_EPSILON_ROUND)} in one round), a bound that protects nobody. At z = 0.2 the "
        f"epsilon falls to {eps(noisier)} and the model reaches {acc(noisier)}. Adaptive clipping at z = 0.05, its "
        f"clipping norm adapted from C = 1, spends what the fixed one does ({eps(adaptive)}) and reaches "
        f"{acc(adaptive)}. Local DP at `dp-epsilon` = 1000 reaches "
        f"{acc(local)}, but one reply alone is {eps(local, wire.PRIVACY_EPSILON_ROUND)}-DP (not 1000: "
        f"`LocalDpMod`'s formula holds only below 1) and the {rounds} rounds {eps(local)}. The DP rows were drawn "
        "with noise from the OS CSPRNG: a re-run gives other accuracies near these (the epsilons stay)."
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "docs" / "reproduce" / "privacy")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch threads per run (0: cores // jobs)")
    p.add_argument("--render-only", action="store_true", help="only render the existing records")
    args = p.parse_args(argv)
    grid = runs(args.out, args.rounds)
    records_dir = args.out / "records"
    if args.render_only:
        records = load_records([s for s, _ in grid], records_dir)
    else:
        records = run_grid(grid, records_dir, jobs=args.jobs, threads=args.threads, name="privacy")
    if len(records) < len(grid):
        print(f"error: {len(grid) - len(records)} of {len(grid)} runs have no record in {records_dir}", file=sys.stderr)
        return 1
    write_atomic(args.out / "results.md", render(records, args.rounds))
    print(args.out / "results.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
