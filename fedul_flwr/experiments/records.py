"""A grid's records: what a finished run leaves, its schema, how it is read and written.

A grid is a list of :class:`RunSpec` (where a run goes in a table) with its complete run
configuration (:mod:`fedul_flwr.experiments.runner` schedules them). A finished run's record
``<records>/<run-id>.json`` holds its run config, resolved config, per-round metrics, last-round
and best test error, the test error at the best-validation round, every predictor's errors,
wall time, the device and the card or CPU model (:data:`RECORD_KEYS`); a failed run's failure
record ``<records>/failed/<run-id>.json`` (:func:`failure_path`, :data:`FAILURE_KEYS`) is never
read as a record.

Every record is read through the store (:func:`read_record`,
:func:`fedul_flwr.store.read_json`): a damaged one is named in one line and set aside
(``<name>.damaged-<UTC time>``), and the cell is recorded again from its complete run folder
(:func:`record_from_folder`) or trained. Settings that change only output
(:data:`fedul_flwr.resume.OUTPUT_KEYS`) never make a run another one
(:func:`same_settings`); a run whose clients and resolved settings equal those of a recorded
run gets a copy of that record with ``same-run-as`` (:func:`share_record`), and a record made
with other settings than the ones asked for refuses the grid (:func:`check_records_match`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedul_flwr.config import ConfigError, default_config
from fedul_flwr.methods import get_method
from fedul_flwr.outputs import read_metrics, running_time
from fedul_flwr.preflight import resolve_config
from fedul_flwr.resume import run_settings
from fedul_flwr.store import (
    Check, DamagedFile, is_int, is_number, list_of, may_be_absent, of_type, optional, read_json, set_aside_damaged,
    write_json,
)

__all__ = [
    "FAILED_DIR", "FAILURE_KEYS", "LOG_FILE", "RECORD_KEYS", "RunSpec", "best_val_round", "check_records_match",
    "failure_line", "failure_path", "load_failures", "load_records", "read_record", "record_from_folder",
    "recorded_runs", "run_results", "same_settings", "setting_differences", "share_record", "summary_line",
]  # fmt: skip


LOG_FILE = "flower.log"
"""Name of a run's Flower log inside its run folder."""


FAILED_DIR = "failed"
"""Sub-folder of a grid's records that holds the failure records of its failed runs."""


@dataclass(frozen=True)
class RunSpec:
    """One run of a grid: where it goes in the table and what it overrides.

    Attributes
    ----------
    grid : str
        The grid's name (e.g. ``"table1"``, ``"compare"``).
    row, column, sub : str
        Table row (e.g. ``"MNIST IID"``), column (e.g. ``"FedUL"``) and sub-column inside a
        cell (e.g. the number of sets ``"10"``; ``"*"``: none).
    seed : int
        The run's seed.
    clients : int
        Number of simulated clients (nodes).
    preset : str
        The preset the run starts from (``""``: the defaults).
    overrides : dict
        Run-config values of this run.
    """

    grid: str
    row: str
    column: str
    sub: str
    seed: int
    clients: int
    preset: str
    overrides: dict[str, Any]

    @property
    def run_id(self) -> str:
        """File-safe id, unique within a results folder."""
        text = f"{self.grid}__{self.row}__{self.column}__{self.sub}__s{self.seed}"
        return "".join(c if c.isalnum() or c in "-_." else "-" for c in text.replace("%", "pct"))


def best_val_round(metrics: Sequence[Mapping[str, float]]) -> int | None:
    """Round >= 1 with the lowest ``val-error`` (earliest on ties); None without validation."""
    rows = [r for r in metrics if r["round"] >= 1 and "val-error" in r]
    return int(min(rows, key=lambda r: (r["val-error"], r["round"]))["round"]) if rows else None


def run_results(spec: RunSpec, run_config: dict[str, Any], cfg: Any, metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """The part of a run's record that its settings and metric rows make (:func:`fedul_flwr.experiments.grid_run.execute`)."""
    tested = [r for r in metrics if "test-error" in r]
    best = best_val_round(metrics)
    by_round = {int(r["round"]): r for r in metrics}
    names = list(get_method(cfg.method)(cfg).predictors())  # the headline first (HASSLE: EM, SM, UM)
    predictors: dict[str, Any] = {"predictors": names}  # the others are recorded as test-accuracy-<name>
    for name in names[1:]:
        errors = [1.0 - r[f"test-accuracy-{name}"] for r in tested if r["round"] >= 1]
        predictors[f"last-test-error-{name}"] = 1.0 - tested[-1][f"test-accuracy-{name}"]
        predictors[f"best-test-error-{name}"] = min(errors) if errors else None
    later = [r for r in tested if r["round"] >= 1]
    return {
        "run-id": spec.run_id,
        "spec": asdict(spec),
        "run-config": run_config,
        "config": cfg.as_dict(),
        "metrics": metrics,
        "last-round": int(tested[-1]["round"]),
        "last-test-error": tested[-1]["test-error"],
        "best-test-error": min(r["test-error"] for r in later) if later else None,
        "best-round": int(min(later, key=lambda r: (r["test-error"], r["round"]))["round"]) if later else None,
        "best-val-round": best,
        "best-val-test-error": by_round[best]["test-error"] if best is not None else None,
        **predictors,
    }


def record_from_folder(spec: RunSpec, run_config: dict[str, Any], run_dir: Path) -> dict[str, Any] | None:
    """The record of ``spec`` made again from its complete run folder, or ``None`` where the
    folder is not complete: its ``summary.txt`` says ``status=ok``, its ``config.json`` holds
    the settings asked for (:func:`same_settings`) and its ``metrics.json`` every round up to
    ``num-rounds`` with a test error. What a record takes from the process that trained it
    and the folder does not keep is ``None`` (``threads``, ``cohort``, ``device-name``); the
    wall time is the run's (its last metric row); ``rebuilt-from-run-folder`` is true.
    Used when a cell's record was damaged (:func:`read_record`): nothing is trained again.
    Reads only."""
    try:
        if not (run_dir / "summary.txt").read_text().rstrip().endswith(" status=ok"):
            return None
        cfg = resolve_config(dict(run_config))
        if not same_settings(run_settings(read_json(run_dir / "config.json")), run_settings(cfg.as_dict())):
            return None
        metrics = read_metrics(run_dir)
        tested = {int(r["round"]) for r in metrics if "test-error" in r}
        if max(tested, default=-1) != cfg.num_rounds or not all(r in tested for r in range(1, cfg.num_rounds + 1)):
            return None
        record = run_results(spec, run_config, cfg, metrics)
    except (OSError, ValueError, KeyError, TypeError):  # DamagedFile included: then it is retrained
        return None
    log = run_dir / LOG_FILE
    return {**record, "wall-time-s": running_time(metrics), "threads": None, "cohort": None,
            "device": cfg.as_dict().get("device"), "device-name": None, "run-dir": str(run_dir),
            **({"log": str(log)} if log.is_file() else {}), "rebuilt-from-run-folder": True}  # fmt: skip


def failure_path(records_dir: Path, run_id: str) -> Path:
    """Where a failed run's failure record goes: ``<records>/failed/<run-id>.json``, beside
    the records and never read as one (it never blocks a rerun and is never a result)."""
    return records_dir / FAILED_DIR / f"{run_id}.json"


def same_settings(recorded: Mapping[str, Any], requested: Mapping[str, Any]) -> bool:
    """Whether two runs' settings (:func:`~fedul_flwr.resume.run_settings`) are one run's. A key one of them lacks
    (added to the project after its record was written) counts as its default, the rule a
    resumed checkpoint follows (:func:`fedul_flwr.resume.resume_conflicts`): a new key's
    default keeps the behaviour the older record was trained with."""
    return not setting_differences(recorded, requested)


def setting_differences(recorded: Mapping[str, Any], requested: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, recorded value, requested value) of every setting two runs differ in, sorted by key,
    a key one of them lacks counting as its default (:func:`same_settings`)."""
    defaults = default_config()
    pairs = ((k, recorded.get(k, defaults.get(k)), requested.get(k, defaults.get(k))) for k in sorted({*recorded, *requested}))
    return [(k, a, b) for k, a, b in pairs if a != b]


def recorded_runs(records_dir: Path) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    """The trained (not shared) records in ``records_dir``: (clients, resolved settings, record)."""
    runs = []
    for path in sorted(records_dir.glob("*.json")):
        record = read_record(path)
        if record is not None and "spec" in record and not record.get("same-run-as"):
            runs.append((record["spec"]["clients"], run_settings(record["config"]), record))
    return runs


def share_record(spec: RunSpec, run_config: dict[str, Any], path: Path, recorded: Sequence[tuple[int, dict[str, Any], dict[str, Any]]]) -> bool:
    """Write ``spec``'s record from a recorded run of the same clients and settings, if any.

    Two grids may hold the same run (HASSLE's full method is a column of Table 1 and of the
    ablation). A record of ``recorded`` (:func:`recorded_runs`) with as many clients and the
    same resolved settings (:func:`same_settings`; name and folder aside) is copied under this
    run's id with ``same-run-as`` naming the original; nothing is trained. Returns whether it was.
    """
    requested = run_settings(resolve_config(dict(run_config)).as_dict())
    record = next((r for clients, settings, r in recorded if clients == spec.clients and same_settings(settings, requested)), None)
    if record is None:
        return False
    write_json(path, {**record, "run-id": spec.run_id, "spec": asdict(spec), "run-config": run_config,
                      "same-run-as": record["run-id"]})  # fmt: skip
    print(f"[{spec.grid}] {spec.run_id}: the same run as {record['run-id']} (record shared)", flush=True)
    return True


def check_records_match(runs: Sequence[tuple[RunSpec, dict[str, Any]]], records_dir: Path) -> None:
    """Refuse a grid whose existing records were made with other settings than the ones asked
    for now (e.g. ``--set differential-privacy=server-fixed`` on a grid recorded without DP):
    a record is keyed by its run id, which does not name ``--set`` values, so it would stand
    for a run that was never trained. Settings are compared as :func:`same_settings` does
    (output-only keys aside, a key the record lacks counting as its default).

    Raises
    ------
    fedul_flwr.config.ConfigError
        Naming the run, its record, and up to three settings that differ.
    """
    for spec, run_config in runs:
        path = records_dir / f"{spec.run_id}.json"
        record = read_record(path)
        if record is None:  # none, or damaged (now set aside): the cell is recorded again
            continue
        recorded = run_settings(record.get("config", {}))
        differ = setting_differences(recorded, run_settings(resolve_config(dict(run_config)).as_dict()))
        if not differ:
            continue
        shown = ", ".join(f"{k}={a!r} there, {b!r} here" for k, a, b in differ[:3]) + (
            f" and {len(differ) - 3} more" if len(differ) > 3 else "")  # fmt: skip
        raise ConfigError(
            f"run {spec.run_id}: its record {path} was made with other settings ({shown}); a record answers for the "
            "run that made it: give these settings another --out, or move that record away to train the run anew"
        )


def summary_line(record: Mapping[str, Any]) -> str:
    """One line per finished run: its id, last-round and best test error, wall time, log."""
    best_val = record.get("best-val-test-error")
    best = record.get("best-test-error")
    return (
        f"{record['run-id']}: last-round test error {100 * record['last-test-error']:.2f}% "
        f"best {'-' if best is None else f'{100 * best:.2f}%'} "
        + ("" if best_val is None else f"at-best-val {100 * best_val:.2f}% ")
        + f"({record['wall-time-s']:.0f}s; log {record.get('log', record.get('run-dir', '-'))})"
    )


def failure_line(failure: Mapping[str, Any]) -> str:
    """One line for a failed run: its id, error type and message (first 200 characters, on
    one line), the last round it finished, its log and failure record."""
    message = " ".join(str(failure["error"]).split())
    message = message if len(message) <= 200 else message[:199] + "…"
    return (f"FAILED {failure['run-id']}: {failure['error-type']} after round {failure['round-reached']}: {message} "
            f"(log {failure['log']})")  # fmt: skip


def _metric_row(row: Any) -> bool:
    """A metric row of a record: a JSON object with an integer ``round``, its other values
    numbers, ``null``, or the lists of node ids (``failed-nodes``, ``trained-nodes``; older
    records wrote them as text, ``""`` for none)."""
    return (isinstance(row, dict) and is_int(row.get("round"))
            and all(is_number(v) or v is None or isinstance(v, (list, str)) for k, v in row.items() if k != "round"))  # fmt: skip


def _spec(value: Any) -> bool:
    """A record's ``spec``: a JSON object naming its grid's row and column (strings)."""
    return isinstance(value, dict) and all(isinstance(value.get(k), str) for k in ("row", "column"))


_TEXT, _OBJECT = of_type(str), of_type(dict)
RECORD_KEYS: dict[str, Check] = {
    "run-id": _TEXT, "spec": _spec, "run-config": _OBJECT, "config": _OBJECT, "metrics": list_of(_metric_row),
    "last-round": is_int, "last-test-error": is_number, "best-val-round": optional(is_int),
    "best-val-test-error": optional(is_number),     "wall-time-s": is_number, "run-dir": _TEXT,
    # keys records gained over time: a record written before them is whole without them
    "best-test-error": may_be_absent(optional(is_number)), "best-round": may_be_absent(optional(is_int)),
    "predictors": may_be_absent(list_of(_TEXT)), "threads": may_be_absent(optional(is_int)),
    "cohort": may_be_absent(optional(_OBJECT)), "device": may_be_absent(optional(_TEXT)),
    "device-name": may_be_absent(optional(_TEXT)),
}  # fmt: skip
"""The declared schema of a record: each key the runner and the grid's page read, and the
check of its value (:func:`fedul_flwr.store.read_json`). A file in a grid's records without
one of the keys every record has had, or with a value its check refuses, is damaged
(:func:`read_record`); the keys records gained later (``may_be_absent``) may be missing from
older records, whose pages render without them."""


FAILURE_KEYS: dict[str, Check] = {
    "run-id": _TEXT, "spec": _spec, "run-config": _OBJECT, "error-type": _TEXT, "error": _TEXT,
    "round-reached": optional(is_int), "run-dir": _TEXT, "log": _TEXT, "wall-time-s": is_number,
}  # fmt: skip
"""The declared schema of a failure record (a file in ``<records>/failed``)."""


def read_record(path: Path, failure: bool = False) -> dict[str, Any] | None:
    """The record (or with ``failure`` the failure record) at ``path``, read through the store
    (:func:`fedul_flwr.store.read_json`); ``None`` where there is none. A damaged one (empty,
    cut short, not JSON, not a record) is named in one line on stderr and set aside
    (:func:`fedul_flwr.store.set_aside_damaged`: renamed ``<name>.damaged-<UTC time>``,
    never overwritten or deleted), and ``None`` is returned: the grid then records the cell
    again from its complete run folder (:func:`record_from_folder`) or trains it."""
    keys = FAILURE_KEYS if failure else RECORD_KEYS
    try:
        return read_json(path, dict, keys)
    except FileNotFoundError:
        return None
    except DamagedFile as exc:
        aside = set_aside_damaged(path, read=lambda p: read_json(p, dict, keys))
        if aside is None:  # written whole meanwhile by another runner
            with contextlib.suppress(FileNotFoundError, DamagedFile):
                return read_json(path, dict, keys)
            return None
        print(f"fedul: damaged {'failure record' if failure else 'record'}: {exc}; set aside as {aside.name}",
              file=sys.stderr, flush=True)  # fmt: skip
        return None


def load_records(specs: Sequence[RunSpec], records_dir: Path) -> list[dict[str, Any]]:
    """The existing records of ``specs``, in their order (a damaged one is named and set
    aside, :func:`read_record`)."""
    records = (read_record(records_dir / f"{s.run_id}.json") for s in specs)
    return [r for r in records if r is not None]


def load_failures(specs: Sequence[RunSpec], records_dir: Path) -> list[dict[str, Any]]:
    """The failure records (:func:`failure_path`) of those ``specs`` that have no record, in
    their order: what the grid's page lists as failed runs (a damaged one is named and set
    aside, :func:`read_record`)."""
    paths = [failure_path(records_dir, s.run_id) for s in specs if not (records_dir / f"{s.run_id}.json").exists()]
    failures = (read_record(p, failure=True) for p in paths)
    return [f for f in failures if f is not None]
