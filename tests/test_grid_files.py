"""The grids as data (:mod:`fedul_flwr.experiments.grids`): every named grid file yields the runs
the Python grid tables of ``fedul_flwr/experiments/reproduce.py`` yielded at commit 8f2052c
(``tests/grid_runs_8f2052c.json``, written by that code: ``build_grid`` of every grid under both
profiles and three sets of ``--methods/--datasets/--partitions/--sets``, each run's id, and a
digest of its SuperNodes, preset and overrides), so the records already written are found; the
committed pages render the same from the committed records; a user's grid file runs a round on
the embedded sample with records, resume and a page; a bad grid file is refused in one line
naming the file and the key, with nothing written."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
from pathlib import Path

import pytest

from fedul_flwr import cli
from fedul_flwr.config import default_config, load_preset
from fedul_flwr.experiments import grids, reproduce
from fedul_flwr.experiments.records import RECORD_KEYS
from fedul_flwr.experiments.tables import table_rows
from fedul_flwr.preflight import resolve_config
from fedul_flwr.store import read_json

REPO = Path(__file__).resolve().parent.parent
FIXTURE = json.loads((Path(__file__).parent / "grid_runs_8f2052c.json").read_text())


def _args(grid: str, profile: str, **options: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    reproduce.add_arguments(parser)
    flags = [x for k, v in options.items() for x in (f"--{k}", v)]
    return parser.parse_args(["--grid", grid, "--profile", profile, *flags])


def _digest(specs: list[reproduce.RunSpec]) -> str:
    text = json.dumps([[s.clients, s.preset, sorted(s.overrides.items())] for s in specs], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


ADDED_SINCE = {"feddb-baselines", "feddb-baselines-cifar10", "hassle-baselines", "hassle-baselines-cifar10", "fedpu-table5",
               "fedpu-table5-cifar10", "mixmatch-collapse", "mixmatch-terms"}  # fmt: skip
"""Named grids added after the fixture was taken (the every-row grids of the compared methods,
MixMatch's diagnoses)."""


def test_the_named_grids_are_the_grids_of_the_python_tables() -> None:
    assert set(grids.named_grids()) == {key.split("|")[0] for key in FIXTURE["grids"]} | ADDED_SINCE
    files = grids.grid_files()
    assert files["table1"].parent == REPO / "fedul_flwr" / "methods" / "fedul" / "grids"
    assert files["smoke"].parent == REPO / "conf" / "grids"


@pytest.mark.parametrize("key", sorted(FIXTURE["grids"]))
def test_a_named_grid_yields_the_runs_it_did_as_python(key: str) -> None:
    name, profile, options = key.split("|")
    before = FIXTURE["grids"][key]
    grid = grids.load_grid(name)
    seeds = grid.seeds or reproduce.PROFILES[profile].seeds
    args = _args(name, profile, **FIXTURE["options"][options])
    if "error" in before:
        with pytest.raises(grids.GridError, match="--profile paper"):
            reproduce.grid_runs(grid, args, seeds)
        return
    specs = reproduce.grid_runs(grid, args, seeds)
    assert list(seeds) == before["seeds"]
    assert [s.run_id for s in specs] == before["run-ids"]
    assert _digest(specs) == before["settings"], "same runs, other settings: the records would not count"


# Every committed page of a grid, rendered from its committed records as they are on disk
# (cpu-seeds/ and cpu-20rounds/ hold table1 pages of an older grid layout, kept as written).
PAGES = [("cpu", "cpu", g) for g in ("augment-check", "feddb-ablation", "feddb-recipe", "fedpu-table1", "fedpu-table3",
                                     "fixmatch-central", "hassle-ablation", "hassle-recipe", "hassle-sweep",
                                     "hassle-table1", "hassle-table7", "table1", "table1-uniform", "table-e9",
                                     "fashion", "loop-check", "feddb-baselines", "hassle-baselines", "fedpu-table5",
                                     "mixmatch-collapse", "mixmatch-terms")]  # fmt: skip
PAGES += [("paper", "paper", g) for g in ("feddb-cifar100", "feddb-svhn", "hassle-cifar100", "feddb-baselines-cifar10",
                                          "hassle-baselines-cifar10", "fedpu-table5-cifar10")]  # fmt: skip
PAGES += [("fast-loop/cpu", "cpu", "table1")]


def test_every_committed_record_reads_whole_under_the_declared_schema() -> None:
    """Records written before keys such as ``cohort`` or ``device`` existed are whole (the
    runner would otherwise set them aside as damaged and render nothing)."""
    paths = sorted((REPO / "docs" / "reproduce").glob("**/records/*.json"))
    assert len(paths) > 300
    for path in paths:
        read_json(path, dict, RECORD_KEYS)


@pytest.mark.parametrize("folder,profile,name", PAGES, ids=[f"{f}/{g}" for f, _, g in PAGES])
def test_a_committed_page_renders_the_same_from_its_records(folder: str, profile: str, name: str, tmp_path: Path) -> None:
    base = REPO / "docs" / "reproduce" / folder
    grid = grids.load_grid(name)
    records_dir = base / "records"
    seeds = sorted({*(grid.seeds or reproduce.PROFILES[profile].seeds), *reproduce.recorded_seeds(records_dir, name)})
    specs = reproduce.grid_runs(grid, _args(name, profile), seeds)
    records = [json.loads(p.read_text()) for s in specs if (p := records_dir / f"{s.run_id}.json").is_file()]
    failures = [json.loads(p.read_text()) for s in specs if not (records_dir / f"{s.run_id}.json").is_file()
                and (p := records_dir / "failed" / f"{s.run_id}.json").is_file()]  # fmt: skip
    page = reproduce.render(grid, profile, specs, records, tmp_path, failures).read_text()
    assert page == (base / f"results-{name}.md").read_text()


USER_GRID = """\
title: FedUL and supervised FedAvg on the embedded sample
clients: 2
set: {dataset: mnist-sample, partition: iid, samples-per-client: 150, batch-size: 32, val-fraction: 0.0, num-rounds: 1}
rows:
  MNIST-sample IID: {}
columns:
  FedUL: {set: {method: fedul}}
  FedAvg 10%: {set: {method: supervised, label-fraction: 0.1}, once-per-row: first-sub}
subs:
  "10": {set: {num-sets: 10}}
  "20": {set: {num-sets: 20}}
page:
  gap: [FedUL, FedAvg 10%]
paper:
  MNIST-sample IID: {FedUL: {"10": 0.78}}
"""


@pytest.mark.slow
def test_a_user_grid_file_runs_a_round_on_the_sample_with_records_resume_and_page(tmp_path: Path, capsys) -> None:
    path = tmp_path / "my-grid.yaml"
    path.write_text(USER_GRID)
    out = tmp_path / "out"
    command = ["reproduce", "--grid", str(path), "--out", str(out), "--threads", "1"]
    assert cli.main(command) == 0
    records = out / "cpu" / "records"
    ids = sorted(p.stem for p in records.glob("*.json"))
    assert ids == ["my-grid__MNIST-sample-IID__FedAvg-10pct__-__s0", "my-grid__MNIST-sample-IID__FedUL__10__s0",
                   "my-grid__MNIST-sample-IID__FedUL__20__s0"]  # fmt: skip
    record = json.loads((records / f"{ids[1]}.json").read_text())
    assert record["last-round"] == 1 and str(record["config"]["num-sets"]) == "10" and record["config"]["method"] == "fedul"
    page = (out / "cpu" / "results-my-grid.md").read_text()
    assert page.startswith("## my-grid (cpu profile)\n\n3 of 3 runs") and "gap FedUL - FedAvg 10%" in page
    row = next(line for line in page.splitlines() if line.startswith("| MNIST-sample IID"))
    assert row.count("[0.78]") == 1
    capsys.readouterr()
    stamps = {p.name: p.stat().st_mtime_ns for p in records.glob("*.json")}
    assert cli.main(command) == 0  # resumed: every run has its record, none runs again
    assert {p.name: p.stat().st_mtime_ns for p in records.glob("*.json")} == stamps


BAD = {
    "not a mapping": ("- rows\n- columns\n", "a grid file is a mapping"),
    "not YAML": ("rows: {a: [1, 2}\n", "cannot read it as YAML"),
    "a misspelt key": ("rows: {r: {}}\ncolums: {c: {}}\n", "top level: unknown key 'colums' (did you mean 'columns'?)"),
    "no columns": ("rows: {r: {}}\n", "a grid has columns and either rows or rows-from"),
    "an unknown run-config key": ("rows: {r: {set: {lrr: 0.1}}}\ncolumns: {c: {}}\n",
                                  "rows: 'r': set: 'lrr' is not a run-config key (did you mean 'lr'?)"),
    "a list as a value": ("rows: {r: {}}\ncolumns: {c: {set: {lr: [1, 2]}}}\n", "columns: 'c': set: lr: a run-config value"),
    "a bad value": ("rows: {r: {}}\ncolumns: {c: {set: {method: fedull}}}\n", "row 'r', column 'c': "),
    "a part's unknown row": ("rows: {r: {}}\ncolumns: {c: {}}\nparts: [{rows: [q]}]\n", "parts: 0: rows: no row 'q'"),
    "a paper number of no column": ("rows: {r: {}}\ncolumns: {c: {}}\npaper: {r: {d: 1.0}}\n", "paper: 'r': no column 'd'"),
    "a paper number that is text": ("rows: {r: {}}\ncolumns: {c: {}}\npaper: {r: {c: high}}\n", "expected a number"),
    "an unknown grid to extend": ("extends: tabel1\n", "extends: 'tabel1' is no named grid (did you mean 'table1'?)"),
    "an unknown preset": ("preset: tabel1\nrows: {r: {}}\ncolumns: {c: {}}\n", "preset: 'tabel1' is no preset (did you mean 'table1'?)"),
    "an unknown preset to take values from": ("from-preset: {preset: authors-cod}\nrows: {r: {}}\ncolumns: {c: {}}\n",
                                              "from-preset: preset: 'authors-cod' is no preset"),
    "a bad precedence": ("rows: {r: {}}\ncolumns: {c: {}}\nprecedence: [row, column]\n", "precedence: expected an order"),
    "an unknown option": ("rows-from: [{option: dataset, key: dataset}]\ncolumns: {c: {}}\n", "rows-from: 0: option"),
    "a method outside its client setting": ("rows: {r: {}}\ncolumns: {c: {set: {method: fedpu}}}\n",
                                            "row 'r', column 'c': method='fedpu'"),
    "no clients": ("clients: 0\nrows: {r: {}}\ncolumns: {c: {}}\n", "row 'r', column 'c': clients=0"),
    "a key the runner sets": ("rows: {r: {set: {run-name: x}}}\ncolumns: {c: {}}\n", "rows: 'r': set: 'run-name' is the runner's"),
    "two cells of one run id": ("rows: {x y: {set: {lr: 0.01}}, x-y: {set: {lr: 0.0001}}}\ncolumns: {c: {}}\n",
                                "row 'x y', column 'c' and row 'x-y', column 'c' get one run id"),
    "a named grid's name": ("name: table1\nrows: {r: {}}\ncolumns: {c: {}}\n", "name: 'table1' is the named grid of"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_grid_file_is_refused_in_one_line_naming_the_file_and_key_and_writes_nothing(case: str, tmp_path: Path) -> None:
    text, message = BAD[case]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as refused:
        cli.main(["reproduce", "--grid", str(path), "--out", str(out), "--threads", "1"])
    line = str(refused.value.code)
    assert "\n" not in line and line.startswith(f"{path}: ") and message in line, line
    assert not out.exists()


def test_an_unknown_grid_name_and_a_missing_file_are_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "folder.yaml").mkdir()
    for grid, message in (("tabel1", "--grid 'tabel1': no such grid (did you mean 'table1'?)"),
                          (str(tmp_path / "none.yaml"), "none.yaml: no such grid file"),
                          (str(tmp_path / "folder.yaml"), "folder.yaml: a folder, not a grid file")):  # fmt: skip
        with pytest.raises(SystemExit, match=re.escape(message)):
            cli.main(["reproduce", "--grid", grid, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_grid_extends_a_named_grid_key_by_key(tmp_path: Path) -> None:
    """``extends`` takes each top-level key the file does not set (null drops it)."""
    path = tmp_path / "e13-fashion.yaml"
    path.write_text("extends: table-e13\nrows-from: null\nrows: {F: {set: {dataset: fashion-mnist, partition: iid}}}\n")
    grid = grids.load_grid(path)
    specs = grid.specs("cpu", [0], {"sets": "10", "methods": "fedul"})
    assert [(s.run_id, s.clients, s.preset) for s in specs] == [("e13-fashion__F__FedUL__10__s0", 10, "table-e13")]
    assert specs[0].overrides == {"dataset": "fashion-mnist", "partition": "iid", "num-sets": "10", "method": "fedul"}
    assert grid.paper == grids.load_grid("table-e13").paper


def test_the_example_grid_of_the_docs_is_a_valid_grid(tmp_path: Path) -> None:
    """docs/reproduce.md's example grid file reads, and every run it names passes the checks."""
    text = (REPO / "docs" / "reproduce.md").read_text()
    block = re.search(r"### Grids are files.*?```yaml\n(.*?)```", text, flags=re.S)
    assert block, "docs/reproduce.md: the section 'Grids are files' shows a grid file"
    path = tmp_path / "my-grid.yaml"
    path.write_text(block.group(1))
    grid = grids.load_grid(path)
    specs = grid.specs("cpu", grid.seeds)
    # rows x (FedUL at M = 10, 20 and FedAvg once per row) x seeds
    assert len(specs) == 2 * (2 + 1) * 2 and grid.paper[("MNIST-sample IID", "FedAvg 10%", "*")] == 1.79
    for spec in specs:
        resolve_config(reproduce.run_config_of(spec, reproduce.PROFILES["cpu"], "", tmp_path, {}))


# --------------------------------------------------------------------------- HASSLE's grids


def _equations(grid: grids.Grid) -> dict:
    """HASSLE's column's overrides but the method: its equations as read."""
    column = next(c for c in grid.columns if c.name == "HASSLE")
    return {k: v for k, v in column.overrides.items() if k != "method"}


def test_hassle_table1_rows_carry_their_share_split_and_lr_and_the_papers_number_of_their_share() -> None:
    """Each labeled share three times (preset split, per-class split, the paper's lr 0.1); every
    row's brackets are the paper's Table 1 column of its share, and only the lr 0.1 rows set lr."""
    grid = grids.load_grid("hassle-table1")
    specs = grid.specs("cpu", [0])
    rows = {r.name: r.overrides for r in grid.rows}
    assert len(rows) == 9 and len(specs) == 9 * len(grid.columns)
    for row, over in rows.items():
        share = row.split()[1].rstrip(",")
        assert over["labeled-share"] == float(share.rstrip("%")) / 100
        assert over.get("lr") == (0.1 if row.endswith("lr 0.1") else None)
        assert over.get("partition") == ("dirichlet" if row.endswith("per-class split") else None)
        assert grid.paper[(row, "HASSLE EM", "*")] == {"5%": 78.04, "10%": 84.04, "20%": 86.67}[share]
        assert grid.paper[(row, "FedAvg (labeled only)", "*")] == {"5%": 69.09, "10%": 78.25, "20%": 82.95}[share]
    assert len({s.run_id for s in specs}) == len(specs)


@pytest.mark.parametrize("name", ["hassle-table1", "hassle-table7", "hassle-sweep"])
def test_hassle_equations_pin_every_open_choice_the_hassle_preset_sets(name: str) -> None:
    """The result grids run HASSLE under the ``hassle`` preset with its equations' reading on
    top: every HASSLE option the preset sets is pinned back to the method's default, so a
    change of the preset leaves the equations' reading (and its records) as they were."""
    from fedul_flwr.methods import METHODS

    equations = _equations(grids.load_grid(name))
    hassle_keys = {o.key for o in METHODS.get("hassle").options}
    preset = {k for k in load_preset("hassle") if k in hassle_keys}
    assert preset and preset <= set(equations)
    defaults = default_config()
    assert equations == {k: defaults[k] for k in equations}
    resolved = resolve_config({"preset": "hassle", "method": "hassle", "dataset": "mnist-sample", **equations}).as_dict()
    assert {k: resolved[k] for k in hassle_keys} == {k: defaults[k] for k in hassle_keys}


def test_hassle_sweep_changes_one_factor_from_the_preset_at_ten_percent(tmp_path: Path) -> None:
    """Every sweep row is HASSLE at Fashion-MNIST 10% with the preset's values plus its own
    (one factor; the Alg. 1 order once more with the same-round pairing it implies), on two
    seeds by default; the baselines run once, in the preset's row. Its page tabulates every
    run's pseudo-labels by round."""
    grid = grids.load_grid("hassle-sweep")
    sweep = {r.name: r.overrides for r in grid.rows}
    specs = reproduce.grid_runs(grid, _args("hassle-sweep", "cpu"), grid.seeds)
    assert {s.seed for s in specs} == {0, 1}
    hassle = [s for s in specs if s.column == "HASSLE"]
    assert len(hassle) == 2 * len(sweep) and all(s.preset == "hassle" and s.clients == 20 for s in specs)
    for spec in hassle:
        assert spec.overrides == {**grid.overrides, "method": "hassle", **_equations(grid), **sweep[spec.row]}
        if not spec.row.startswith("combined") and not spec.row.endswith(", lr 0.1"):  # the combinations
            assert len(sweep[spec.row]) <= (2 if "pairing" in spec.row or "sum form" in spec.row else 1)
    assert grid.overrides == {"labeled-share": 0.1, "label-layout": "ALL"}
    combined = sweep["combined, lr 0.1"]
    assert combined == {**sweep["Alg. 1 phase order, same-round pairing"], **sweep["same initial weights"], "lr": 0.1}
    assert sweep["combined, gamma 100, lr 0.1"] == {**combined, **sweep["gamma 100, Eq. 12's sum form"]}
    assert sweep["combined, gamma 100"] == {**sweep["combined"], **sweep["gamma 100, Eq. 12's sum form"]}
    assert {s.row for s in specs if s.column != "HASSLE"} == {"preset", "lr 0.1", "2 local epochs"}
    lr_baseline = [s for s in specs if s.row == "lr 0.1" and s.column != "HASSLE"]
    assert [s.overrides["lr"] for s in lr_baseline] == [0.1, 0.1] and lr_baseline[0].overrides["method"] == "supervised"
    epochs_baseline = [s for s in specs if s.row == "2 local epochs" and s.column != "HASSLE"]
    assert [(s.column, s.overrides["local-epochs"], s.overrides["method"], s.overrides.get("lr")) for s in epochs_baseline] == [
        ("FedAvg (labeled only)", 2, "supervised", None)] * 2  # fmt: skip
    assert sweep["gamma 10, Eq. 12's sum form"] == {"hassle-gamma-form": "sum", "hassle-gamma": 10.0}
    assert len({s.run_id for s in specs}) == len(specs)
    assert grid.paper[("preset", "HASSLE EM", "*")] == 84.04
    one = [s for s in specs if s.seed == 0 and s.row in ("preset", "warm-up 10 rounds") and s.column == "HASSLE"]
    rows = [{"round": n, "test-accuracy": 0.5, "wall-time": float(n), "pseudo-label-share": 1.0, "pseudo-label-correct-share": 0.5,
             "pseudo-label-classes": [0.9, 0.1] + [0.0] * 8} for n in range(11)]  # fmt: skip
    records = [{"spec": dataclasses.asdict(spec), "run-id": spec.run_id, "last-test-error": 0.5, "last-round": 10,
                "wall-time-s": 10.0, "config": {"method": "hassle"}, "metrics": rows} for spec in one]  # fmt: skip
    page = reproduce.render(grid, "cpu", specs, records, tmp_path).read_text()
    table = page[page.index("HASSLE's pseudo-labels (Eq. 11)"):page.index("<!-- --8<-- [end:diagnostics] -->")]
    assert ["warm-up 10 rounds", "HASSLE", "50.0", "50.0", "50.0"] in table_rows(table)  # accuracy at rounds 1, 5, 10
    assert ["preset", "HASSLE", "100.0", "100.0", "100.0"] in table_rows(table)  # two classes hold them all


def test_a_page_lists_its_runs_without_a_record_with_their_cost_from_the_recorded_runs_rate() -> None:
    """The "Not run yet" section: each column's missing cells, estimated from the median seconds
    per round of that column's recorded runs; a column with none recorded has no estimate."""
    from fedul_flwr.experiments.render import missing_plan, seconds_per_round

    grid = grids.load_grid("hassle-baselines")
    specs = reproduce.grid_runs(grid, _args("hassle-baselines", "cpu"), (0, 1))
    records_dir = REPO / "docs" / "reproduce" / "cpu" / "records"
    kept = [s for s in specs if s.column == "RSCFed" and s.seed == 0]
    records = [json.loads((records_dir / f"{s.run_id}.json").read_text()) for s in kept]
    text = missing_plan(grid, "cpu", specs, records)
    rate = seconds_per_round(records[0])
    rounds = int(records[0]["config"]["num-rounds"])
    rscfed = next(line for line in text.splitlines() if line.startswith("| RSCFed "))
    assert [c.strip() for c in rscfed.strip("|").split("|")] == ["RSCFed", "1", "Fashion-MNIST 10% s1", f"{rate:.1f}",
                                                                 f"{rate * rounds / 3600:.1f}"]  # fmt: skip
    fedmatch = next(line for line in text.splitlines() if line.startswith("| FedMatch "))
    assert "Fashion-MNIST 10% s0,1" in fedmatch and "- (no run yet)" in fedmatch
    assert f"{len(specs) - 1} runs, about {rate * rounds / 3600:.1f} hours" in text
    assert "fedul reproduce --grid hassle-baselines --profile cpu --seeds 0,1 " in text
