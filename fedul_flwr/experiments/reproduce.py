"""``fedul reproduce``: a grid of runs (a paper's table, or a user's grid file) as resumable
in-process Flower federations, rendered beside the paper's numbers.

The grid is named (``--grid table1``: a file of ``fedul_flwr/methods/<folder>/grids/`` or
``conf/grids/``) or a path to a grid file (``--grid my-grid.yaml``); the schema is in
:mod:`fedul_flwr.experiments.grids` and docs/reproduce.md. Each run goes through the real
ServerApp logic and the real ClientApp via :class:`fedul_flwr.inprocess.InProcessGrid` (no
Ray), writes its Flower run folder under ``<out>/<profile>/runs/<run-id>/`` and one JSON record
``<out>/<profile>/records/<run-id>.json``. A run whose record exists is skipped, so an
interrupted grid resumes where it stopped. Ctrl-C or SIGTERM stops the runner and its
``--jobs`` workers; an unfinished run writes no record. A run that fails is one failed cell (a
failure record in ``records/failed/``, one line at the end, exit status 1); the others finish
and are rendered. ``--stop-after MINUTES`` ends the grid before the limit, every unfinished run
checkpointed and continued by the same command (exit status 75 while runs are left). See
:mod:`fedul_flwr.experiments.runner`. The page: :mod:`fedul_flwr.experiments.render`; the
compute profiles: :mod:`fedul_flwr.experiments.profiles`.

Examples::

    fedul reproduce --grid table1 --profile cpu --data-dir /path/to/torchvision-root --jobs 2
    fedul reproduce --grid table1 --profile paper --data-dir /data
    fedul reproduce --grid smoke --profile cpu          # 2 rounds, embedded sample
    fedul reproduce --grid my-grid.yaml                 # a grid file of one's own
    fedul reproduce --grid table1 --profile cpu --render-only
    fedul reproduce --grid table1 --list                 # the runs, nothing executed
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedul_flwr.experiments.grid_cli import add_common_arguments, clean, parse_overrides, parse_seeds
from fedul_flwr.experiments.grids import Grid, GridError, load_grid, named_grids
from fedul_flwr.experiments.profiles import PROFILES, Profile, run_config_of
from fedul_flwr.experiments.records import FAILED_DIR, RunSpec, load_failures, load_records
from fedul_flwr.experiments.render import (
    TAIL_ROUNDS,
    record_value,
    render,
    render_table,
    seconds_per_round,
    total_run_time,
)
from fedul_flwr.experiments.runner import run_cells
from fedul_flwr.preflight import check_federation_size, check_node_counts, check_simulation, resolve_config

__all__ = ["PROFILES", "TAIL_ROUNDS", "Profile", "RunSpec", "add_arguments", "grid_runs", "record_value",
           "recorded_seeds", "render", "render_table", "run", "run_config_of", "seconds_per_round", "select_runs",
           "total_run_time"]  # fmt: skip


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
    p.add_argument("--grid", default="table1", metavar="NAME|FILE.yaml",
                   help=f"the grid: a named one ({', '.join(named_grids())}) or a grid file (docs/reproduce.md)")
    p.add_argument("--profile", default="cpu", choices=sorted(PROFILES), help="compute settings of every run")
    p.add_argument("--methods", default="", help="comma list of column keys, in this order (grids whose columns "
                   "have keys, e.g. table1's fedul,fedpl,fedllp,fedllp-vat,fedavg-10,fedavg-100); empty: every column")
    p.add_argument("--datasets", default="mnist", help="comma list of table rows (grids with rows-from: table1*, table-e12, table-e13)")
    p.add_argument("--partitions", default="iid,noniid", help="comma list of table rows (grids with rows-from)")
    p.add_argument("--sets", default="10,20,40", help="comma list of M values (grids with subs-from: table1*, table-e13)")
    p.add_argument("--subs", default="", help="comma list: run only these sub-columns (e.g. loop-check's plain,defaults)")
    p.add_argument("--runs", default="", help="comma list of shell-style patterns of run ids (see --list): run only "
                   "the matching runs, in the order of the patterns; the tables still show every recorded run")
    add_common_arguments(p, out="outputs/reproduce", seeds_help="comma list; empty: the grid's (else the profile's) seeds")
    p.add_argument("--list", action="store_true", help="print the runs and exit")
    p.add_argument("--render-only", action="store_true", help="only render tables and plots of existing records")


def grid_runs(grid: Grid, args: argparse.Namespace, seeds: Sequence[int]) -> list[RunSpec]:
    """The runs of ``grid`` under ``args`` (``--profile``, ``--methods``, ``--datasets``,
    ``--partitions``, ``--sets``, ``--subs``) for ``seeds``.

    Raises
    ------
    GridError
        If the grid does not run with the profile or ``--methods`` names no column's key.
    """
    options = {k: getattr(args, k) for k in ("datasets", "partitions", "sets", "methods")}
    specs = grid.specs(args.profile, seeds, options)
    return [spec for spec in specs if spec.sub in args.subs.split(",")] if args.subs else specs


def _check_runs(grid: Grid, runs: Sequence[tuple[RunSpec, dict]], typed: Mapping[str, Any] | None = None) -> None:
    """Refuse the grid before any run starts (nothing written) if a run's settings do not pass
    the checks ``fedul check --federation-config "num-supernodes=<clients>"`` makes
    (:func:`~fedul_flwr.preflight.resolve_config`, :func:`~fedul_flwr.preflight.check_simulation`,
    the node counts and the federation size): one line naming the grid's file, the run's row,
    column and sub-column, and the key; where the refused key was given by ``--set``
    (``typed``), the line begins with that ``--set`` value, not the grid's file."""
    for spec, rc in runs:
        try:
            cfg = resolve_config(rc)
            check_simulation(cfg)
            if spec.clients < 1:
                raise ValueError(f"clients={spec.clients} must be an integer >= 1")
            check_node_counts(cfg, spec.clients)
            check_federation_size(cfg, spec.clients)
        except ValueError as exc:
            where = f"row {spec.row!r}, column {spec.column!r}" + (f", sub {spec.sub!r}" if spec.sub != "*" else "")
            message = " ".join(str(exc).split())
            given = [f"--set {k}={v}" for k, v in (typed or {}).items() if message.startswith(f"{k}=")]
            source = given[0] if given else str(grid.path or grid.name)
            raise SystemExit(f"{source}: {where}: {message}") from None


def _check_run_ids(grid: Grid, specs: Sequence[RunSpec]) -> None:
    """Refuse a grid two of whose cells get one run id with different settings (names that
    differ only where a run id cannot, ``"x y"`` and ``"x-y"``): they would share one record."""
    seen: dict[str, RunSpec] = {}
    for spec in specs:
        first = seen.setdefault(spec.run_id, spec)
        if first is not spec and (first.clients, first.preset, first.overrides) != (spec.clients, spec.preset, spec.overrides):
            cells = [f"row {s.row!r}, column {s.column!r}" + (f", sub {s.sub!r}" if s.sub != "*" else "") for s in (first, spec)]
            raise SystemExit(f"{grid.path or grid.name}: {cells[0]} and {cells[1]} get one run id {spec.run_id!r} with "
                             "other settings (they would share one record); rename one")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """``fedul reproduce``: run the grid's missing runs (those ``--runs`` selects), render its
    tables from every recorded run.

    Exit status: 0 when every selected run has a record (``--render-only``: every run of the
    grid); 1 when a run failed (one line per failed cell at the end; the others finished and
    are rendered) or runs are missing; 75 when ``--stop-after`` left runs to continue (and
    none failed). A grid that cannot be read, or whose runs' settings do not pass the checks,
    exits with one line naming its file and where in it, before anything is written."""
    try:
        grid = load_grid(args.grid)
    except GridError as exc:
        raise SystemExit(str(exc)) from None
    profile = PROFILES[args.profile]
    default_seeds = grid.seeds or profile.seeds
    seeds = parse_seeds(args.seeds) or default_seeds
    out_dir = Path(args.out).expanduser().resolve() / args.profile
    # the page shows the grid at its default seeds, at those given and at every seed on record:
    # neither a run of one seed nor a re-render drops the other seeds' cells from the tables
    page_seeds = sorted({*default_seeds, *seeds, *recorded_seeds(out_dir / "records", grid.name)})
    try:
        specs = grid_runs(grid, args, tuple(page_seeds))
    except GridError as exc:
        raise SystemExit(str(exc)) from None
    _check_run_ids(grid, specs)
    runnable = [spec for spec in specs if spec.seed in seeds]
    selected = select_runs(runnable, args.runs) if args.runs else runnable
    common, _ = parse_overrides(args.set)  # no column: --set's parser refuses one here
    if args.clean:
        return clean(out_dir / "runs", args.yes)
    if args.list:
        for spec in selected:
            print(spec.run_id, spec.clients, "clients", json.dumps({**spec.overrides, **common}))  # --set wins
        print(f"{len(selected)} runs")
        return 0
    result = None
    if not args.render_only:
        runs = [(spec, run_config_of(spec, profile, args.data_dir, out_dir, common)) for spec in selected]
        _check_runs(grid, runs, common)
        result = run_cells(runs, out_dir / "records", jobs=args.jobs, threads=args.threads, name=grid.name,
                           stop_after=args.stop_after, started=getattr(args, "started", None))  # fmt: skip
    records = load_records(specs, out_dir / "records")
    if records or grid.gpu:  # a GPU grid's page shows the paper's numbers and the plan
        path = render(grid, args.profile, specs, records, out_dir, load_failures(specs, out_dir / "records"))
        print(path.read_text())
        print(f"wrote {path}")
    else:
        print(f"no records of grid {grid.name!r} in {out_dir / 'records'}: nothing to render", file=sys.stderr)
    if result is None:
        missing = [s.run_id for s in specs if s.run_id not in {r.get("run-id") for r in records}]
        if missing:
            named = ", ".join(missing[:5]) + (f", ... ({len(missing) - 5} more)" if len(missing) > 5 else "")
            print(f"fedul: exit status 1: {len(missing)} of {len(specs)} runs of grid {grid.name!r} have no record "
                  f"({named})", file=sys.stderr, flush=True)  # fmt: skip
        return 0 if records and not missing else 1
    for line in result.final_lines():
        print(line, flush=True)
    if result.exit_code:
        return result.exit_code
    return 0 if len(result.records) == len(selected) else 1
