"""A grid's results page: its tables beside the paper's numbers, its plots and its wall times,
from the records of its runs (:mod:`fedul_flwr.experiments.grids` says what the grid is).

``<out>/<profile>/results-<grid>.md``: rows x columns, cells ``ours [paper]`` per sub-column
joined by `` / ``, % test error (or % accuracy, the grid's ``unit``), mean (std; each seed in
ascending order) when there are several seeds; ``gap`` = headline - reference column where the
grid's ``page: gap`` names two columns it shows. Plots: ``<out>/<profile>/plots/<grid>-<row>-<sub>.png``,
test accuracy per round of every column (mean over seeds). Two errors are never mixed:
``last`` (the final model: no round chosen by labels) and ``best-val`` (the round with the lowest error on
the labeled validation split: that model selection uses labels).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedul_flwr.config import default_config, load_preset
from fedul_flwr.experiments.feddb_diagnostics import render_diagnostics
from fedul_flwr.experiments.grids import Grid, GridError, load_grid
from fedul_flwr.experiments.round_windows import format_seeds, missing_seeds, render_windows
from fedul_flwr.experiments.records import RunSpec
from fedul_flwr.experiments.tables import markdown_table
from fedul_flwr.store import write_atomic

__all__ = ["TAIL_ROUNDS", "as_grid", "gpu_plan", "missing_plan", "plot_curves", "record_value", "render", "render_table",
           "seconds_per_round", "total_run_time"]  # fmt: skip

TAIL_ROUNDS = 10
"""Rounds averaged by the ``tail-test-error`` measure."""


def as_grid(grid: Grid | str) -> Grid:
    """``grid``, or the named grid of that name, or (no such grid) a bare one of that name: no
    paper numbers, % error, no gap."""
    if isinstance(grid, Grid):
        return grid
    try:
        return load_grid(grid)
    except GridError:
        return Grid(grid)


def _fmt(values: Sequence[float]) -> str:
    """A cell over seeds (fractions in, % out): ``m``, or ``m (std; each seed)``."""
    return format_seeds([100 * v for v in values])


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


def render_table(grid: Grid | str, specs: Sequence[RunSpec], records: Sequence[Mapping[str, Any]], key: str) -> str:
    """Markdown table of ``key`` (``last-test-error`` / ``tail-test-error`` / ``best-test-error`` /
    ``best-val-test-error``, :func:`record_value`): rows x columns, cells ``ours [paper]`` per
    sub-column joined by `` / ``; % error, or % accuracy where the grid's unit is accuracy."""
    grid = as_grid(grid)
    paper, accuracy = grid.paper, grid.accuracy
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
    pair = tuple(grid.page.get("gap", ()))
    gap = pair if len(pair) == 2 and all(c in columns for c in pair) else None
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


def plot_curves(grid: Grid | str, records: Sequence[Mapping[str, Any]], plots_dir: Path) -> list[Path]:
    """One PNG per (row, sub): test accuracy per round of every column (mean over seeds); the
    references run once per row with the first sub-column (``once-per-row: first-sub``) dashed."""
    import matplotlib  # deferred: a heavy import only a page with records needs

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: after choosing the Agg backend

    grid = as_grid(grid)
    dashed = {c.name for c in grid.columns if c.once == "first-sub"}
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
            ax.plot(rounds, mean, marker="o", ms=3, label=column, ls="--" if column in dashed else "-")
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{grid.name}: {row}" + ("" if sub == "*" else f", {sub}"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = "".join(c if c.isalnum() or c in "-_." else "-" for c in f"{grid.name}-{row}-{sub}") + ".png"
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


def gpu_plan(grid: Grid, profile: str, specs: Sequence[RunSpec], records: Sequence[Mapping[str, Any]]) -> str:
    """The results page's note on a GPU grid's (``gpu:``) missing runs: the command and the
    estimated GPU time per run and for those missing."""
    preset, clients = grid.for_profile(profile)
    rounds = int(load_preset(preset)["num-rounds"])
    round_s = float(grid.gpu["round-s"]) if grid.gpu else 0.0
    hours = round_s * rounds / 3600
    missing = len(specs) - len(records)
    seeds = ",".join(str(s) for s in dict.fromkeys(spec.seed for spec in specs))
    basis = grid.gpu["basis"] if grid.gpu else ""
    return (f"{missing} of {len(specs)} runs not run here yet. "
            f"Each run: preset `{preset}`, {clients} SuperNodes, {rounds} rounds; GPU time about "
            f"{round_s:g} s per round, {hours:.2f} h per run, {missing * hours:.1f} h for the missing runs on one "
            f"H100 (estimate: {basis}). Run them (seeds {seeds}) with:\n\n"
            f"```bash\nfedul reproduce --grid {grid.name} --profile {profile} --data-dir /path/to/torchvision-root "
            f"--out docs/reproduce\n```")  # fmt: skip


def missing_plan(grid: Grid, profile: str, specs: Sequence[RunSpec], records: Sequence[Mapping[str, Any]]) -> str:
    """The results page's note on a grid's runs without a record (not run yet, stopped, or
    failed): per column, the cells and seeds missing and their cost at the median seconds per
    round of the column's recorded runs on this page (:func:`seconds_per_round`; the threads
    and device those runs had), and the command that runs them. A column with no recorded run
    has no estimate."""
    done = {r["run-id"] for r in records}
    column_of = {spec.run_id: spec.column for spec in specs}
    preset_rounds = int({**default_config(), **load_preset(grid.for_profile(profile)[0])}["num-rounds"])
    by_column: dict[str, list[RunSpec]] = defaultdict(list)
    for spec in specs:
        if spec.run_id not in done:
            by_column[spec.column].append(spec)
    rows, total, unknown = [], 0.0, 0
    for column in [c for c in dict.fromkeys(spec.column for spec in specs) if c in by_column]:  # the grid's order
        missing = by_column[column]
        rates = [rate for r in records if r["run-id"] in column_of and column_of[r["run-id"]] == column
                 and (rate := seconds_per_round(r)) is not None]  # fmt: skip
        cells = "; ".join(f"{row}{'' if sub == '*' else ' ' + sub} s"
                          + ",".join(str(s.seed) for s in missing if (s.row, s.sub) == (row, sub))
                          for row, sub in dict.fromkeys((s.row, s.sub) for s in missing))  # fmt: skip
        rounds = [int(s.overrides.get("num-rounds", preset_rounds)) for s in missing]
        if rates:
            rate = statistics.median(rates)
            hours = rate * sum(rounds) / 3600
            total += hours
            rows.append([column, len(missing), cells, f"{rate:.1f}", f"{hours:.1f}"])
        else:
            unknown += len(missing)
            rows.append([column, len(missing), cells, "- (no run yet)", "-"])
    head = ["column", "runs", "rows (sub-columns) and seeds", "s per round (median of its recorded runs)", "hours at that rate"]
    seeds = ",".join(str(seed) for seed in sorted({spec.seed for runs in by_column.values() for spec in runs}))
    cost = (f", about {total:.1f} hours at the rates above, one run after another, on the threads and device of the "
            "recorded runs (Wall time per run)" if total else "")  # fmt: skip
    if unknown:
        cost += (f"; {unknown} of them are in columns with no recorded run and not counted" if total
                 else ", in columns with no recorded run to estimate their cost from")  # fmt: skip
    return (markdown_table(head, rows) + f"\n\n{sum(map(len, by_column.values()))} runs{cost}. Run them with the "
            f"command below (OUT: the folder that holds this page's `{profile}/` folder; `--data-dir` only for datasets "
            "that are not embedded). A stopped run continues from its checkpoint; the runner trains only the runs "
            "without a record, and refuses, naming them, settings that differ from those the page's records were "
            "made with (give those with `--set`):\n\n"
            f"```bash\nfedul reproduce --grid {grid.name} --profile {profile} --seeds {seeds} "
            "--data-dir /path/to/torchvision-root --out OUT\n```")  # fmt: skip


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


def _wall_times(records: Sequence[Mapping[str, Any]]) -> str:
    """Every run's wall time and the settings that decide it."""
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
    return markdown_table(head, rows)


def render(grid: Grid | str, profile_name: str, specs: Sequence[RunSpec], records: Sequence[Mapping[str, Any]],
           out_dir: Path, failures: Sequence[Mapping[str, Any]] = ()) -> Path:  # fmt: skip
    """Write ``results-<grid>.md`` (the tables, settings, wall time) and the plots.

    Each table sits between named snippet markers (``plan``, ``last``, ``tail``, ``best``,
    ``best-val``, ``windows``, ``diagnostics``, ``failed``, ``missing``, ``wall-time``), which the docs
    include with ``--8<-- "docs/reproduce/<profile>/results-<grid>.md:<name>"``. ``failures``:
    the failure records of runs without a record
    (:func:`~fedul_flwr.experiments.records.load_failures`), listed with their error and the
    last round they completed; their cells stay empty.
    """
    grid = as_grid(grid)
    wall = total_run_time(records)
    subs = " / ".join(dict.fromkeys(s.sub for s in specs if s.sub != "*"))
    unit = grid.unit
    text = [
        f"## {grid.name} ({profile_name} profile)",
        "",
        f"{len(records)} of {len(specs)} runs" + (f" ({len(failures)} more failed: see Failed runs)" if failures else "")
        + f"; total run time {wall / 60:.1f} min. Cells: % test {unit}, ours [paper]"
        + (f" for {grid.sub_label} = {subs}" if subs else "") + "; mean (std; each seed in ascending order) when there "
        "are several seeds." + (f" {grid.note}" if grid.note else ""),
        "",
    ]
    if grid.gpu and len(records) < len(specs):
        text += _section("plan", "Not run here: the command and the GPU time", gpu_plan(grid, profile_name, specs, records))
    text += _section("last", f"Last-round test {unit}" + ("" if grid.accuracy else " (the final model: no round chosen by labels)"),
                     render_table(grid, specs, records, "last-test-error"))  # fmt: skip
    windowed = bool(grid.page.get("windows"))  # single rounds swing by points on non-IID splits
    if windowed:
        text += _section("tail", f"Mean test {unit} over the last {TAIL_ROUNDS} rounds (single rounds swing by points "
                         "on non-IID splits)", render_table(grid, specs, records, "tail-test-error"))  # fmt: skip
        why = grid.page.get("best-why", "the round with the highest accuracy")
        text += _section("best", f"Best test {unit} during training ({why}; selects by test labels)",
                         render_table(grid, specs, records, "best-test-error"))  # fmt: skip
    if any(r.get("best-val-test-error") is not None for r in records) or not grid.accuracy:
        text += _section("best-val", f"Test {unit} at the best-validation round (model selection USES LABELS: 20% "
                         "labeled hold-out)", render_table(grid, specs, records, "best-val-test-error"))  # fmt: skip
    if windowed and records:  # each predictor's course, beside the baselines'
        text += _section("windows", "Why: each predictor's mean test accuracy (%) by windows of rounds, its range over "
                         "the last rounds, and rounds at chance", render_windows(records))  # fmt: skip
    diagnostics = grid.page.get("diagnostics")
    if diagnostics:  # the pseudo-labels (FedDB: with APP-U and DMA's weights) by round
        methods = diagnostics.get("methods")
        diagnosed = [r for r in records if not methods or r["config"].get("method") in methods]
        if diagnosed:
            shown = set(diagnostics.get("rounds", (10, 50, 100, 150, 200)))
            rounds = sorted(shown & set(range(1, max(int(r["last-round"]) for r in diagnosed) + 1)))
            text += _section("diagnostics", f"Why: {diagnostics.get('title', 'pseudo-labels')} by round",
                             render_diagnostics(diagnosed, rounds=rounds))  # fmt: skip
    if failures:  # a failed run is a result too: what failed and when
        rows = [[f["run-id"], f.get("round-reached", "-"), f"{f.get('error-type', '')}: {_short(str(f.get('error', '')))}"]
                for f in failures]  # fmt: skip
        text += _section("failed", "Failed runs (no cell; the run folder keeps the log)",
                         markdown_table(["run", "last completed round", "error"], rows))  # fmt: skip
    if not grid.gpu and len(records) < len(specs):
        text += _section("missing", "Not run yet: the runs without a record, their cost and the command",
                         missing_plan(grid, profile_name, specs, records))  # fmt: skip
    if records:
        text += _section("wall-time", "Wall time per run", _wall_times(records))
    plots = plot_curves(grid, records, out_dir / "plots") if records else []
    text += [f"![{p.stem}](plots/{p.name})" for p in plots]
    path = out_dir / f"results-{grid.name}.md"
    out_dir.mkdir(parents=True, exist_ok=True)  # a GPU grid's page is rendered before any run
    write_atomic(path, "\n".join(text) + "\n")
    return path
