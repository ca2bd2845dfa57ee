"""Grids of runs as data: a grid file (YAML, read through OmegaConf) and the runs it names.

A grid is a table of runs: rows x columns x sub-columns (the cells of a column) x seeds, each
run the overrides of its row, column and sub-column on top of a preset. The named grids live
beside the method whose paper they reproduce, ``fedul_flwr/methods/<folder>/grids/<name>.yaml``,
and in ``conf/grids/<name>.yaml`` where no one method owns them (:func:`grid_files`); a user's
grid is any file of the same schema (``fedul reproduce --grid path/to/grid.yaml``). The page's
numbers of the paper (``[paper]``) are in the same file, per cell.

The schema (every key optional but ``columns`` and one of ``rows`` / ``rows-from``)::

    name: my-grid              # the grid's name in run ids and page names (default: file stem)
    extends: table1            # a named grid whose top-level keys this file takes unless it sets
                               # them (a key set to null is dropped)
    title: one line            # what the grid is
    profiles: [paper]          # the --profile values it runs with (default: every profile)
    preset: table1             # the runs' preset, or per profile: {cpu: feddb-cpu, paper: feddb}
    clients: 5                 # SuperNodes of each run (default 2), or per profile; a row or sub-column may set its own
    seeds: [0, 1]              # default seeds (default: the profile's)
    unit: error                # error | accuracy: what the cells show, in %
    sub-label: sweep value     # what the sub-columns are, in the page's first line
    note: "[paper]: ..."       # what the [paper] numbers are, in the page's first line
    from-preset: {preset: feddb-authors, beyond: feddb, drop: [strategy]}
                               # every run's overrides: the preset's values (those that differ from
                               # preset `beyond`'s; "" = the defaults), less the `drop` keys
    set: {val-fraction: 0.2}   # every run's overrides, over from-preset's
    precedence: [grid, row, column, sub]   # the order the overrides apply in (the last wins)
    rows:                      # row name -> {set: overrides, clients: SuperNodes}
      MNIST IID: {set: {dataset: mnist, partition: iid}}
    rows-from:                 # or: rows from the command's options, one per value (product)
      - {option: datasets, key: dataset, labels: {mnist: MNIST}}
    columns:                   # column name -> {key, set, once-per-row, rows}
      FedUL: {key: fedul, set: {method: fedul}}       # key: --methods picks columns by it
      FedAvg 10%: {set: {method: supervised, label-fraction: 0.1}, once-per-row: first-sub}
                               # once-per-row: one run per row (sub "*"), with the first
                               # sub-column's overrides (first-sub) or none (plain);
                               # rows: [..]: the column runs only in those rows
    subs:                      # sub-column name -> {set, clients, rows}; none: one cell "*"
      "10": {set: {num-sets: "10"}}
    subs-from: {option: sets, key: num-sets}  # or: one sub-column per value of the option
    parts:                     # runs in this order: each part the named rows x columns
      - {rows: [preset], columns: [FedAvg 10%]}   # (default: one part, every row x column)
    page:                      # what the page shows beyond the last-round and best-val tables
      windows: true            # the tail, best and window tables (rounds swing on non-IID splits)
      best-why: "..."          # why the best round is shown (default: the round with the highest accuracy)
      diagnostics: {title: "...", rounds: [10, 50], methods: [fixmatch]}   # pseudo-labels by round
      gap: [FedUL, FedAvg 100%]   # a column "gap headline - reference" where both are shown
    gpu: {round-s: 2.2, basis: "..."}   # a GPU grid: its page shows the command and the GPU time
    paper:                     # the paper's numbers (%): row -> column -> number or {sub: number}
      MNIST IID: {FedUL: {"10": 0.78}, FedAvg 10%: 1.79}

Every error is one line, :class:`GridError`, naming the file and the key (and row or column).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fedul_flwr.config import CONF_DIR, METHODS_DIR, default_config, load_preset, preset_files
from fedul_flwr.experiments.records import RunSpec
from fedul_flwr.registry import closest

__all__ = ["Cells", "Grid", "GridError", "grid_files", "load_grid", "named_grids", "read_grid"]

OPTIONS = ("datasets", "partitions", "sets")
"""The options of ``fedul reproduce`` that ``rows-from`` and ``subs-from`` read values from."""
LEVELS = ("grid", "row", "column", "sub")
"""Where a run's overrides come from; ``precedence`` orders them (default: this order)."""
_KEYS = {
    "grid": {"name", "extends", "title", "profiles", "preset", "clients", "seeds", "unit", "sub-label", "note",
             "from-preset", "set", "precedence", "rows", "rows-from", "columns", "subs", "subs-from", "parts",
             "page", "gpu", "paper"},
    "row": {"set", "clients"},
    "column": {"key", "set", "once-per-row", "rows"},
    "sub": {"set", "clients", "rows"},
    "axis": {"option", "key", "labels"},
    "from-preset": {"preset", "beyond", "drop"},
    "part": {"rows", "columns"},
    "page": {"windows", "best-why", "diagnostics", "gap"},
    "diagnostics": {"title", "rounds", "methods"},
    "gpu": {"round-s", "basis"},
}  # fmt: skip


RUNNER_KEYS = ("output-dir", "run-name", "seed")
"""Run-config keys the runner sets for every run (the run's folder and the grid's seeds), which a
grid file may not set."""


class GridError(ValueError):
    """A grid file that cannot be read or says something invalid; the message is one line that
    names the file and the key (and the row or column)."""


@dataclass(frozen=True)
class Cells:
    """A row, a column or a sub-column of a grid.

    Attributes
    ----------
    name : str
        Its label on the page (and in the run ids).
    overrides : dict
        Run-config values of its runs.
    clients : int or None
        SuperNodes of its runs (``None``: the grid's).
    key : str
        A column's name for ``--methods`` (``""``: none).
    once : str
        A column run once per row: ``"first-sub"`` (with the first sub-column's overrides),
        ``"plain"`` (with none); ``""``: once per sub-column.
    rows : tuple of str
        The rows a column or sub-column runs in (empty: every row).
    """

    name: str
    overrides: dict[str, Any] = field(default_factory=dict)
    clients: int | None = None
    key: str = ""
    once: str = ""
    rows: tuple[str, ...] = ()


@dataclass(frozen=True)
class Axis:
    """``rows-from`` / ``subs-from``: one row (sub-column) per value of a command option, named by
    ``labels`` (the value itself where it has none), setting run-config key ``key`` to it."""

    option: str
    key: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Grid:
    """A grid read from its file (:func:`read_grid`); :meth:`specs` gives its runs.

    Attributes
    ----------
    name, path, title : str, Path or None, str
        Its name (the run ids' first part), its file, its one-line title.
    profiles : tuple of str
        The profiles it runs with (empty: every one).
    preset, clients : dict
        Profile (``"*"``: any) -> the runs' preset and SuperNodes.
    seeds : tuple of int
        Default seeds (empty: the profile's).
    unit : str
        ``"error"`` or ``"accuracy"`` (% in the page's cells).
    sub_label, note : str
        The page's words for the sub-columns and for the ``[paper]`` numbers.
    base : dict
        ``from-preset``: ``preset``, ``beyond``, ``drop``.
    overrides : dict
        ``set``: every run's overrides.
    precedence : tuple of str
        The order :data:`LEVELS` apply in.
    rows, columns, subs : tuple of Cells
    rows_from : tuple of Axis
    subs_from : Axis or None
    parts : tuple of (tuple, tuple)
        (rows, columns) of each part (empty: all).
    page : dict
        ``windows`` (bool), ``best-why`` (str), ``diagnostics`` (dict or None).
    gpu : dict or None
        ``round-s`` and ``basis`` of a GPU grid.
    paper : dict
        (row, column, sub) -> the paper's number (%); sub ``"*"``: one number for the row.
    """

    name: str
    path: Path | None = None
    title: str = ""
    profiles: tuple[str, ...] = ()
    preset: dict[str, str] = field(default_factory=lambda: {"*": ""})
    clients: dict[str, int] = field(default_factory=lambda: {"*": 2})
    seeds: tuple[int, ...] = ()
    unit: str = "error"
    sub_label: str = "sweep value"
    note: str = ""
    base: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    precedence: tuple[str, ...] = LEVELS
    rows: tuple[Cells, ...] = ()
    rows_from: tuple[Axis, ...] = ()
    columns: tuple[Cells, ...] = ()
    subs: tuple[Cells, ...] = ()
    subs_from: Axis | None = None
    parts: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()
    page: dict[str, Any] = field(default_factory=dict)
    gpu: dict[str, Any] | None = None
    paper: dict[tuple[str, str, str], float] = field(default_factory=dict)

    @property
    def accuracy(self) -> bool:
        """Whether the page shows % accuracy (else % error)."""
        return self.unit == "accuracy"

    def _error(self, text: str) -> GridError:
        return GridError(f"{self.path or self.name}: {text}")

    def for_profile(self, profile: str) -> tuple[str, int]:
        """(preset, SuperNodes) of the runs under ``profile``.

        Raises
        ------
        GridError
            If the grid does not run with ``profile`` or has no value for it.
        """
        if self.profiles and profile not in self.profiles:
            what = "the paper's protocol for a GPU" if self.gpu else f"for --profile {'/'.join(self.profiles)} only"
            raise self._error(f"profiles: grid {self.name!r} is {what}: use --profile {'/'.join(self.profiles)}")
        values = []
        for key, table in (("preset", self.preset), ("clients", self.clients)):
            if profile not in table and "*" not in table:
                raise self._error(f"{key}: no value for profile {profile!r} (it has {sorted(table)})")
            values.append(table.get(profile, table.get("*")))
        return str(values[0]), int(values[1])

    def grid_overrides(self) -> dict[str, Any]:
        """Every run's overrides: ``from-preset``'s values, then ``set``'s."""
        values: dict[str, Any] = {}
        if self.base:
            preset, beyond = load_preset(self.base["preset"]), self.base.get("beyond")
            if beyond is not None:
                under, defaults = load_preset(beyond), default_config()
                preset = {k: v for k, v in preset.items() if under.get(k, defaults.get(k)) != v}
            values = {k: v for k, v in preset.items() if k not in self.base.get("drop", ())}
        return {**values, **self.overrides}

    def _axes(self, axes: Sequence[Axis], options: Mapping[str, str]) -> list[Cells]:
        values = [[v for v in str(options.get(a.option, "")).split(",") if v] for a in axes]
        return [Cells(" ".join(a.labels.get(v, v) for a, v in zip(axes, combo, strict=True)),
                      {a.key: v for a, v in zip(axes, combo, strict=True)})
                for combo in itertools.product(*values)]  # fmt: skip

    def row_cells(self, options: Mapping[str, str]) -> list[Cells]:
        """The rows: those of the file, or one per combination of the ``rows-from`` options."""
        return self._axes(self.rows_from, options) if self.rows_from else list(self.rows)

    def sub_cells(self, options: Mapping[str, str]) -> list[Cells]:
        """The sub-columns: those of the file, or one per value of the ``subs-from`` option."""
        return self._axes([self.subs_from], options) if self.subs_from else list(self.subs)

    def column_cells(self, methods: str = "") -> list[Cells]:
        """The columns, in the grid's order, or those whose ``key`` ``methods`` lists (comma
        separated), in its order; ``methods`` is ignored by a grid whose columns have no key.

        Raises
        ------
        GridError
            If ``methods`` names a key no column has.
        """
        keyed = {c.key: c for c in self.columns if c.key}
        chosen = [m.strip() for m in methods.split(",") if m.strip()]
        if not chosen or not keyed:
            return list(self.columns)
        for m in chosen:
            if m not in keyed:
                raise self._error(f"--methods {m!r}: no column has that key{closest(m, keyed)}; keys: {list(keyed)}")
        return [keyed[m] for m in chosen]

    def specs(self, profile: str, seeds: Sequence[int], options: Mapping[str, str] | None = None) -> list[RunSpec]:
        """The runs of the grid under ``profile`` for ``seeds``.

        ``options``: the command's ``datasets``, ``partitions``, ``sets`` (comma lists read by
        ``rows-from`` / ``subs-from``) and ``methods`` (:meth:`column_cells`). Part by part, row
        by row, column by column, sub-column by sub-column, seed by seed; each run's overrides
        are its levels' in ``precedence`` order, its SuperNodes the sub-column's, else the
        row's, else the grid's.

        Raises
        ------
        GridError
            If the grid does not run with ``profile`` or ``methods`` names an unknown key.
        """
        options = options or {}
        preset, clients = self.for_profile(profile)
        presets = preset_files()
        for key, name in (("preset", preset), ("from-preset: preset", self.base.get("preset", "")),
                          ("from-preset: beyond", self.base.get("beyond") or "")):  # fmt: skip
            if name and name not in presets:
                raise self._error(f"{key}: {name!r} is no preset{closest(name, presets)}")
        grid = self.grid_overrides()
        rows = self.row_cells(options)
        columns = self.column_cells(str(options.get("methods", "")))
        subs = self.sub_cells(options)
        by_row, by_column = {r.name: r for r in rows}, {c.name: c for c in columns}
        specs = []
        for part_rows, part_columns in self.parts or (((), ()),):
            chosen_rows = [by_row[n] for n in part_rows if n in by_row] if part_rows else rows
            chosen_columns = [by_column[n] for n in part_columns if n in by_column] if part_columns else columns
            for row in chosen_rows:
                for column in chosen_columns:
                    if column.rows and row.name not in column.rows:
                        continue
                    if column.once:
                        first = subs[0].overrides if subs and column.once == "first-sub" else {}
                        cells = [Cells("*", first)]
                    else:
                        cells = [s for s in subs if not s.rows or row.name in s.rows] or [Cells("*")]
                    for sub in cells:
                        levels = {"grid": grid, "row": row.overrides, "column": column.overrides, "sub": sub.overrides}
                        over = {k: v for level in self.precedence for k, v in levels[level].items()}
                        n = (None if column.once else sub.clients) or row.clients or clients
                        specs.extend(RunSpec(self.name, row.name, column.name, sub.name, s, n, preset, dict(over))
                                     for s in seeds)  # fmt: skip
        return specs


# --------------------------------------------------------------------------- files


def grid_files() -> dict[str, Path]:
    """Every named grid by name: ``fedul_flwr/methods/*/grids/*.yaml`` and ``conf/grids/*.yaml``.

    Raises
    ------
    GridError
        If two files define the same name (naming both).
    """
    found: dict[str, Path] = {}
    for path in [*sorted(METHODS_DIR.glob("*/grids/*.yaml")), *sorted((CONF_DIR / "grids").glob("*.yaml"))]:
        if path.stem in found:
            raise GridError(f"grid {path.stem!r} is defined twice: {found[path.stem]} and {path}; rename one")
        found[path.stem] = path
    return found


def named_grids() -> tuple[str, ...]:
    """The names of the named grids, sorted."""
    return tuple(sorted(grid_files()))


def _raw(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The top-level mapping of ``path`` with the grid it ``extends`` filled in."""
    try:
        loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except (OSError, OmegaConfBaseException, ValueError, yaml.YAMLError) as exc:
        raise GridError(f"{path}: cannot read it as YAML: {' '.join(str(exc).split())[:200]}") from exc
    if not isinstance(loaded, dict):
        raise GridError(f"{path}: a grid file is a mapping of keys (name, rows, columns, ...), not {type(loaded).__name__}")
    raw = {str(k): v for k, v in loaded.items()}
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    files = grid_files()
    if not isinstance(parent, str) or parent not in files:
        raise GridError(f"{path}: extends: {parent!r} is no named grid{closest(str(parent), files)}")
    if files[parent] in (path, *seen):
        raise GridError(f"{path}: extends: {parent!r} extends itself (through {[p.name for p in seen]})")
    inherited = {k: v for k, v in _raw(files[parent], (*seen, path)).items() if k != "name"}
    return {k: v for k, v in {**inherited, **raw}.items() if v is not None}


def load_grid(name_or_path: str | Path) -> Grid:
    """A named grid (:func:`grid_files`) or the grid file at a path (``*.yaml`` / ``*.yml``).

    Raises
    ------
    GridError
        If there is no such grid, or its file is invalid (:func:`read_grid`).
    """
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or Path(text).is_file():
        path = Path(text).expanduser()
        if not path.is_file():
            raise GridError(f"{path}: {'a folder, not a grid file' if path.is_dir() else 'no such grid file'}")
        return read_grid(path)
    files = grid_files()
    if text not in files:
        raise GridError(f"--grid {text!r}: no such grid{closest(text, files)}; named grids: {', '.join(sorted(files))}")
    return read_grid(files[text])


def read_grid(path: Path) -> Grid:
    """Read and check the grid file ``path`` (the schema: see the module doc).

    Raises
    ------
    GridError
        One line naming the file and the key: a file that is not YAML, an unknown key, a
        run-config key that does not exist, a value of the wrong type, a row or column that a
        part, a restriction or a paper number names but the grid lacks.
    """
    return _Reader(path).grid(_raw(path))


class _Reader:
    """Checks a grid file's values, each error naming the file and where in it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.config_keys = set(default_config())

    def fail(self, where: str, text: str) -> GridError:
        return GridError(f"{self.path}: {where}: {text}")

    def mapping(self, value: Any, where: str, kind: str | None = None) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a mapping, got {value!r}")
        out = {str(k): v for k, v in value.items()}
        if kind:
            for key in out:
                if key not in _KEYS[kind]:
                    raise self.fail(where, f"unknown key {key!r}{closest(key, _KEYS[kind])}; keys: {sorted(_KEYS[kind])}")
        return out

    def names(self, value: Any, where: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
            raise self.fail(where, f"expected a list of names, got {value!r}")
        return tuple(str(v) for v in value)

    def overrides(self, value: Any, where: str) -> dict[str, Any]:
        values = self.mapping(value if value is not None else {}, where)
        for key, v in values.items():
            if key not in self.config_keys:
                raise self.fail(where, f"{key!r} is not a run-config key{closest(key, self.config_keys)}")
            if key in RUNNER_KEYS:
                raise self.fail(where, f"{key!r} is the runner's: every run goes to <out>/<profile>/runs/<run id> "
                                       "(choose the folder with --out)")
            if not isinstance(v, bool | int | float | str):
                raise self.fail(f"{where}: {key}", f"a run-config value is a bool, number or string, not {v!r}")
        return values

    def by_profile(self, value: Any, where: str, kind: type) -> dict[str, Any]:
        table = self.mapping(value, where) if isinstance(value, dict) else {"*": value}
        for profile, v in table.items():
            if not isinstance(v, kind) or isinstance(v, bool):
                raise self.fail(f"{where}: {profile}" if profile != "*" else where, f"expected a {kind.__name__}, got {v!r}")
        return table

    def cells(self, value: Any, where: str, kind: str) -> tuple[Cells, ...]:
        out = []
        for name, spec in self.mapping(value, where).items():
            at = f"{where}: {name!r}"
            spec = self.mapping(spec if spec is not None else {}, at, kind)
            clients = spec.get("clients")
            if clients is not None and (not isinstance(clients, int) or isinstance(clients, bool) or clients < 1):
                raise self.fail(f"{at}: clients", f"expected a positive integer, got {clients!r}")
            once = spec.get("once-per-row", "")
            if once not in ("", "first-sub", "plain"):
                raise self.fail(f"{at}: once-per-row", f"expected first-sub or plain, got {once!r}")
            out.append(Cells(name, self.overrides(spec.get("set"), f"{at}: set"), clients, str(spec.get("key", "")), once,
                             self.names(spec.get("rows", []), f"{at}: rows")))  # fmt: skip
        return tuple(out)

    def axis(self, value: Any, where: str) -> Axis:
        spec = self.mapping(value, where, "axis")
        if spec.get("option") not in OPTIONS:
            raise self.fail(f"{where}: option", f"expected one of {list(OPTIONS)}, got {spec.get('option')!r}")
        self.overrides({spec.get("key"): ""}, f"{where}: key")
        return Axis(spec["option"], str(spec["key"]), {str(k): str(v) for k, v in self.mapping(spec.get("labels", {}), f"{where}: labels").items()})

    def grid(self, raw: dict[str, Any]) -> Grid:
        raw = self.mapping(raw, "top level", "grid")
        name = str(raw.get("name", self.path.stem))
        if not name or any(not (c.isalnum() or c in "-_.") for c in name):
            raise self.fail("name", f"{name!r}: use letters, digits, '-', '_' and '.' (it names files)")
        named = grid_files().get(name)
        if named is not None and named.resolve() != self.path.resolve():
            raise self.fail("name", f"{name!r} is the named grid of {named} (its run ids and records): give this "
                                    "grid another name (its file's or a 'name:' key)")
        if "columns" not in raw or ("rows" in raw) == ("rows-from" in raw):
            raise self.fail("top level", "a grid has columns and either rows or rows-from")
        rows = self.cells(raw.get("rows", {}), "rows", "row")
        columns = self.cells(raw["columns"], "columns", "column")
        subs = self.cells(raw.get("subs", {}), "subs", "sub")
        rows_from = raw.get("rows-from", [])
        if not isinstance(rows_from, list):
            raise self.fail("rows-from", f"expected a list of {{option, key, labels}}, got {rows_from!r}")
        axes = tuple(self.axis(a, f"rows-from: {i}") for i, a in enumerate(rows_from))
        if not columns or not (rows or axes):
            raise self.fail("columns" if not columns else "rows", "empty: a grid needs at least one row and one column")
        row_names = {r.name for r in rows}
        for c in (*columns, *subs):
            unknown = [r for r in c.rows if row_names and r not in row_names]
            if unknown:
                raise self.fail(f"{c.name!r}: rows", f"no row {unknown[0]!r}{closest(unknown[0], row_names)}")
        parts = []
        if not isinstance(raw.get("parts", []), list):
            raise self.fail("parts", f"expected a list of {{rows, columns}}, got {raw['parts']!r}")
        for i, part in enumerate(raw.get("parts", [])):
            part = self.mapping(part, f"parts: {i}", "part")
            p_rows, p_cols = self.names(part.get("rows", []), f"parts: {i}: rows"), self.names(part.get("columns", []), f"parts: {i}: columns")
            for what, got, known in (("rows", p_rows, row_names), ("columns", p_cols, {c.name for c in columns})):
                bad = [n for n in got if known and n not in known]
                if bad:
                    raise self.fail(f"parts: {i}: {what}", f"no {what[:-1]} {bad[0]!r}{closest(bad[0], known)}")
            parts.append((p_rows, p_cols))
        precedence = self.names(raw.get("precedence", list(LEVELS)), "precedence")
        if sorted(precedence) != sorted(LEVELS):
            raise self.fail("precedence", f"expected an order of {list(LEVELS)}, got {list(precedence)}")
        base = self.mapping(raw.get("from-preset", {}), "from-preset", "from-preset")
        if base and not isinstance(base.get("preset"), str):
            raise self.fail("from-preset: preset", f"expected a preset name, got {base.get('preset')!r}")
        unit = raw.get("unit", "error")
        if unit not in ("error", "accuracy"):
            raise self.fail("unit", f"expected error or accuracy, got {unit!r}")
        seeds = raw.get("seeds", [])
        if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
            raise self.fail("seeds", f"expected a list of integers, got {seeds!r}")
        page = self.mapping(raw.get("page", {}), "page", "page")
        gap = page.get("gap", [])
        if gap and len(self.names(gap, "page: gap")) != 2:
            raise self.fail("page: gap", f"expected [headline column, reference column], got {gap!r}")
        if "diagnostics" in page:
            page["diagnostics"] = self.mapping(page["diagnostics"], "page: diagnostics", "diagnostics")
        gpu = self.mapping(raw["gpu"], "gpu", "gpu") if "gpu" in raw else None
        if gpu is not None and not (isinstance(gpu.get("round-s"), int | float) and isinstance(gpu.get("basis"), str)):
            raise self.fail("gpu", "expected round-s (seconds per round) and basis (how it was estimated)")
        return Grid(
            name=name, path=self.path, title=str(raw.get("title", "")),
            profiles=self.names(raw.get("profiles", []), "profiles"),
            preset=self.by_profile(raw.get("preset", ""), "preset", str),
            clients=self.by_profile(raw.get("clients", 2), "clients", int),
            seeds=tuple(seeds), unit=unit, sub_label=str(raw.get("sub-label", "sweep value")), note=str(raw.get("note", "")),
            base={**base, "drop": self.names(base.get("drop", []), "from-preset: drop")} if base else {},
            overrides=self.overrides(raw.get("set"), "set"), precedence=precedence, rows=rows, rows_from=axes,
            columns=columns, subs=subs, subs_from=self.axis(raw["subs-from"], "subs-from") if "subs-from" in raw else None,
            parts=tuple(parts), page=page, gpu=gpu, paper=self.paper(raw.get("paper", {}), {c.name for c in columns}),
        )  # fmt: skip

    def paper(self, value: Any, columns: set[str]) -> dict[tuple[str, str, str], float]:
        out = {}
        for row, cells in self.mapping(value, "paper").items():
            for column, v in self.mapping(cells, f"paper: {row!r}").items():
                if column not in columns and column.rsplit(" ", 1)[0] not in columns:  # "<column> <predictor>"
                    raise self.fail(f"paper: {row!r}", f"no column {column!r}{closest(column, columns)}")
                for sub, number in (self.mapping(v, f"paper: {row!r}: {column!r}") if isinstance(v, dict) else {"*": v}).items():
                    if not isinstance(number, int | float) or isinstance(number, bool):
                        raise self.fail(f"paper: {row!r}: {column!r}", f"expected a number, got {number!r}")
                    out[(row, column, sub)] = float(number)
        return out
