"""Compare the per-round metrics of two folders of reproduction records, run by run.

A record is the JSON file ``scripts/reproduce.py`` writes per run. Two records match
*bit for bit* when every metric of every round is equal as a float (wall times aside);
otherwise the first round and metric that differ are printed with both values.

Used to check that a change of the code leaves results unchanged: run the same grid
before and after the change (same machine, same ``--threads``) and compare::

    python scripts/compare_records.py docs/reproduce/cpu/records outputs/verify/cpu/records
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


def main(argv: Sequence[str] | None = None) -> int:
    """Print one line per record present in both folders; exit code 1 if any differs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="folder of records (e.g. docs/reproduce/cpu/records)")
    parser.add_argument("second", type=Path, help="folder of records to compare with")
    args = parser.parse_args(argv)
    common = sorted({p.name for p in args.first.glob("*.json")} & {p.name for p in args.second.glob("*.json")})
    if not common:
        print(f"no record is in both {args.first} and {args.second}", file=sys.stderr)
        return 1
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
