"""Compare the per-round metrics of two folders of reproduction records, run by run.

A record is the JSON file ``fedul reproduce`` writes per run. Two records match
*bit for bit* when every metric of every round is equal as a float (wall times aside);
otherwise the first round and metric that differ are printed with both values.

Used to check that a change of the code leaves results unchanged: run the same grid
before and after the change (same machine, same ``--threads``) and compare::

    python scripts/compare_records.py docs/reproduce/cpu/records outputs/verify/cpu/records

``--wall-times`` instead prints a markdown table of the runs in both folders: each run's wall
time in both, their ratio, and the last-round test errors (e.g. the grid before and after a
change of the training loop)::

    python scripts/compare_records.py docs/reproduce/cpu/records docs/reproduce/fast-loop/cpu/records --wall-times
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def first_difference(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> str | None:
    """``None`` if the metric rows are equal (wall times aside), else a description of the
    first difference (round, metric, both values)."""
    if len(a) != len(b):
        return f"{len(a)} rows against {len(b)}"
    for row_a, row_b in zip(a, b):
        keys = sorted((set(row_a) | set(row_b)) - {"wall-time"})
        for key in keys:
            if row_a.get(key) != row_b.get(key):
                return f"round {row_a.get('round')}: {key} {row_a.get(key)!r} != {row_b.get(key)!r}"
    return None


def wall_time_table(first: Path, second: Path, names: Sequence[str]) -> str:
    """Markdown table: per run, wall time (s) in ``first`` and ``second``, the ratio
    first / second, the last-round test errors (%); a total row."""
    lines = [f"| run | wall time (s), {first} | wall time (s), {second} | ratio | last test error (%), first / second |",
             "|---|---|---|---|---|"]  # fmt: skip
    totals = [0.0, 0.0]
    for name in names:
        a = json.loads((first / name).read_text())
        b = json.loads((second / name).read_text())
        wa, wb = float(a["wall-time-s"]), float(b["wall-time-s"])
        totals[0] += wa
        totals[1] += wb
        err = f"{100 * a['last-test-error']:.2f} / {100 * b['last-test-error']:.2f}"
        lines.append(f"| {name[:-5]} | {wa:.0f} | {wb:.0f} | {wa / wb:.2f}x | {err} |")
    lines.append(f"| **all {len(names)} runs** | {totals[0]:.0f} | {totals[1]:.0f} | {totals[0] / totals[1]:.2f}x | |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print one line per record present in both folders; exit code 1 if any differs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="folder of records (e.g. docs/reproduce/cpu/records)")
    parser.add_argument("second", type=Path, help="folder of records to compare with")
    parser.add_argument("--wall-times", action="store_true", help="print a markdown table of wall times instead")
    args = parser.parse_args(argv)
    common = sorted({p.name for p in args.first.glob("*.json")} & {p.name for p in args.second.glob("*.json")})
    if not common:
        print(f"no record is in both {args.first} and {args.second}", file=sys.stderr)
        return 1
    if args.wall_times:
        print(wall_time_table(args.first, args.second, common))
        return 0
    differ = 0
    for name in common:
        a = json.loads((args.first / name).read_text())
        b = json.loads((args.second / name).read_text())
        diff = first_difference(a["metrics"], b["metrics"])
        differ += diff is not None
        last = f"last-round test error {100 * a['last-test-error']:.2f}% / {100 * b['last-test-error']:.2f}%"
        print(f"{name[:-5]}: {'bit-identical' if diff is None else 'differs, first at ' + diff}; {last}")
    print(f"{len(common) - differ} of {len(common)} runs bit-identical")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
