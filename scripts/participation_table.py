"""What each ``participation`` mode costs in epsilon at docs/privacy.md's settings: the table of
its "Participation and the privacy spent" section.

For the quickstart's federation (5 nodes, 5 rounds, delta = 1e-5) and the table's noise
multipliers, the epsilon a ``server-fixed`` run records (``fedul_flwr.privacy.accounting.privacy_spent``,
the same call the server makes after each round) under: every node every round
(``fraction-train=1``), a fixed-size cohort of 3 of the 5 (``fraction-train=0.6``), and Poisson
sampling with q = 0.6 (``participation=poisson``), with the neighbouring relation each names. No
training: the figures depend on the settings alone.

    python scripts/participation_table.py            # (re)write docs/reproduce/privacy/participation.md
    python scripts/participation_table.py --check    # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedul_flwr import wire
from fedul_flwr.preflight import resolve_config
from fedul_flwr.experiments.tables import markdown_table
from fedul_flwr.privacy.accounting import neighbours, privacy_spent
from fedul_flwr.store import write_atomic

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "docs" / "reproduce" / "privacy" / "participation.md"
NODES, ROUNDS = 5, 5
MULTIPLIERS = (0.02, 0.05, 0.2, 0.8)
MODES = [
    ("every node every round", {"fraction-train": 1.0}),
    ("fixed-size, 3 of 5", {"fraction-train": 0.6}),
    ("poisson, q = 0.6", {"fraction-train": 0.6, "participation": "poisson"}),
]


def render() -> str:
    """The Markdown of the table (one row per mode, the recorded epsilon after one round and after
    ``ROUNDS`` rounds per multiplier)."""
    rows = []
    for label, values in MODES:
        cells = [label]
        named = ""
        for z in MULTIPLIERS:
            cfg = resolve_config({"differential-privacy": "server-fixed", "dp-noise-multiplier": z, "min-train-nodes": 2,
                                  "min-available-nodes": NODES, **values})  # fmt: skip
            one = privacy_spent(cfg, 1, NODES)[wire.PRIVACY_EPSILON]
            spent = privacy_spent(cfg, ROUNDS, NODES)[wire.PRIVACY_EPSILON]
            cells.append(f"{one:.3g} / {spent:.3g}")
            named = neighbours(cfg, NODES)
        rows.append([*cells, f"`{named}`"])
    head = (f"`server-fixed` on {NODES} nodes at delta = 1e-5: the recorded `privacy-epsilon` after 1 / {ROUNDS} rounds; "
            "rendered by `python scripts/participation_table.py`.")  # fmt: skip
    table = markdown_table(["participation", *[f"z = {z:g}" for z in MULTIPLIERS], "neighbours="], rows)
    return f"{head}\n\n{table}\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help=f"exit 1 if {OUTPUT} is stale")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.is_file() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run python scripts/participation_table.py", file=sys.stderr)
            return 1
        return 0
    write_atomic(OUTPUT, text)
    print(OUTPUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
