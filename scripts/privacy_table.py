"""Accuracy against privacy spent on the embedded MNIST sample: the table of docs/privacy.md.

Runs FedUL (the defaults: 5 clients, M = 10 sets, LeNet, Adam lr 1e-3) without DP, with
Flower's central DP (``server-fixed``, several noise multipliers z at clipping norm C = 1) and
with local DP (``client-local``, several per-round epsilons), each through the grid runner
(the real ServerApp logic and ClientApp in an in-process Flower grid: the same numbers as
``flwr run .`` with the same settings), and renders the last round's test accuracy beside the
(epsilon, delta) the run recorded (``privacy-epsilon``, Google's dp-accounting RDP
accountant, ``fedul_flwr.privacy.privacy_spent``).

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

REPO = Path(__file__).resolve().parent.parent
CLIENTS = 5
SETTINGS: list[tuple[str, dict[str, Any]]] = [
    ("none", {"differential-privacy": "none"}),
    *[(f"server-fixed, z = {z}, C = 1", {"differential-privacy": "server-fixed", "dp-noise-multiplier": z,
                                          "dp-clipping-norm": 1.0}) for z in (0.02, 0.05, 0.2)],
    # dp-sensitivity = 2C: two updates clipped to C differ by at most 2C, so each reply is
    # (dp-epsilon, dp-delta)-DP by the Gaussian mechanism's classic bound
    *[(f"client-local, {e:g} per round, C = 1", {"differential-privacy": "client-local", "dp-epsilon": e,
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
        epsilon = last.get(wire.PRIVACY_EPSILON)
        rows.append([
            record["spec"]["row"],
            f"{100 * last['test-accuracy']:.2f}",
            "-" if epsilon is None else f"{epsilon:.3g}",
            "-" if epsilon is None else f"{cfg['dp-delta']:g}",
        ])  # fmt: skip
    head = (f"FedUL on the embedded MNIST sample (`dataset=mnist-sample`, 5 clients, M = 10, seed 0), "
            f"{rounds} rounds; rendered by `python scripts/privacy_table.py` from its records.")  # fmt: skip
    table = markdown_table(["differential privacy", "test accuracy % (last round)", "epsilon", "delta"], rows)
    return f"{head}\n\n<!-- --8<-- [start:table] -->\n{table}\n<!-- --8<-- [end:table] -->\n"


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
    (args.out / "results.md").write_text(render(records, args.rounds))
    print(args.out / "results.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
