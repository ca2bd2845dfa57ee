"""The grid runner shared by ``fedul reproduce`` and ``fedul compare``: resumable in-process
federations, one JSON record per finished run, a progress bar, one log file per run.

A grid is a list of :class:`RunSpec` (where a run goes in a table) with its complete run
configuration. Each run goes through the real ServerApp logic and the real ClientApp via
:class:`fedul_flwr.inprocess.InProcessGrid` (no Ray) and writes its run folder under the
configuration's ``output-dir``. Then:

- its record ``<records>/<run-id>.json`` (run config, resolved config, per-round metrics,
  last-round and best test error, test error at the best-validation round, every
  predictor's errors, wall time) is written atomically, so a run with a record is skipped
  and an interrupted grid resumes where it stopped: a run without a record continues after
  the last round of its checkpoint where that is exact (:func:`resumable_round`), else it
  starts afresh;
- Flower's log of the run goes to ``<run folder>/flower.log`` (not to the terminal); the
  terminal shows a progress bar with the time estimate (on a terminal) and one summary line
  per finished run;
- Ctrl-C or SIGTERM stops the runner and its worker processes; an unfinished run writes no
  record, only its per-round checkpoint;
- a run whose clients and resolved settings (its name aside) equal those of a recorded run,
  e.g. of another grid, is not trained again: it gets a copy of that record with ``same-run-as``.

``jobs`` runs go at once in spawned worker processes, each with ``threads`` torch threads
(0: the machine's cores divided by ``jobs``); every run seeds itself, so the results do not
depend on ``jobs``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import platform
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "RunSpec", "add_common_arguments", "best_val_round", "check_run_configs", "execute", "load_records", "parse_overrides", "parse_seeds",
    "resumable_round", "run_grid", "run_settings", "threads_per_job",
]  # fmt: skip

LOG_FILE = "flower.log"
"""Name of a run's Flower log inside its run folder."""


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


def threads_per_job(threads: int, jobs: int) -> int:
    """torch threads of each run: ``threads``, or (0) the machine's cores divided by ``jobs``."""
    return threads or max(1, (os.cpu_count() or 1) // max(1, jobs))


def best_val_round(metrics: Sequence[Mapping[str, float]]) -> int | None:
    """Round >= 1 with the lowest ``val-error`` (earliest on ties); None without validation."""
    rows = [r for r in metrics if r["round"] >= 1 and "val-error" in r]
    return int(min(rows, key=lambda r: (r["val-error"], r["round"]))["round"]) if rows else None


@contextlib.contextmanager
def flower_log_to(path: Path) -> Iterator[None]:
    """Send Flower's log (the ``flwr`` logger and the project's loggers under it) to ``path``
    instead of the terminal while the block runs."""
    import flwr.common.logger  # noqa: F401  (attaches Flower's console handler: take it off after that)

    logger = logging.getLogger("flwr")
    console = [h for h in logger.handlers if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for h in console:
        logger.removeHandler(h)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()
        for h in console:
            logger.addHandler(h)


def execute(spec: RunSpec, run_config: dict[str, Any], threads: int = 0) -> dict[str, Any]:
    """Run one federation in this process and return its JSON record.

    Parameters
    ----------
    spec : RunSpec
        Where the run goes in the table.
    run_config : dict
        Complete run config (dashed keys, with ``output-dir`` and ``run-name``).
    threads : int
        torch threads (0: leave as is).

    Returns
    -------
    dict
        The record (see the module doc). Deterministic for a given run config on CPU, apart
        from the ``wall-time`` entries.

    Raises
    ------
    fedul_flwr.config.ConfigError
        If ``run_config`` is invalid.
    """
    import torch

    from fedul_flwr.client_app import app
    from fedul_flwr.checks import resolve_config
    from fedul_flwr.data import simulated
    from fedul_flwr.inprocess import InProcessGrid
    from fedul_flwr.methods import get_method
    from fedul_flwr.server_app import run_federation

    if threads:
        torch.set_num_threads(threads)
    start = time.time()
    cfg = resolve_config(run_config)
    outputs = run_federation(InProcessGrid(app, spec.clients, run_config), cfg)
    simulated.load_client.cache_clear()  # a grid visits many configs: free the client tensors
    metrics = [outputs.rows[r] for r in sorted(outputs.rows)]
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
        "wall-time-s": time.time() - start,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "run-dir": str(outputs.path),
    }


def resumable_round(run_config: Mapping[str, Any]) -> int:
    """Last round of an unfinished run that can be continued from its checkpoint, else 0.

    A run folder without a record holds a stopped run. It is continued (``resume=true``)
    where its ``checkpoint.pt`` was written with the same resolved settings (those of
    :data:`~fedul_flwr.checks.RESUME_FREE_KEYS` aside, ``num-rounds`` among them) and the
    strategy keeps all its state on the server (:data:`~fedul_flwr.checkpoint.RESUMABLE_STRATEGIES`); such a run ends with the weights
    of an uninterrupted one. Anything else (no or unreadable checkpoint, other settings,
    SCAFFOLD) is started afresh (0).
    """
    from fedul_flwr.checkpoint import RESUMABLE_STRATEGIES, CheckpointError, load_checkpoint
    from fedul_flwr.checks import resolve_config, resume_conflicts

    if run_config.get("strategy") not in RESUMABLE_STRATEGIES:
        return 0
    try:
        ckpt = load_checkpoint(Path(run_config["output-dir"]) / run_config["run-name"])
    except CheckpointError:  # none (the run stopped before its first round) or unreadable
        return 0
    if ckpt.random_state is None:  # written before the sampling state was saved: not exact
        return 0
    same = not resume_conflicts(ckpt.config, resolve_config(dict(run_config)))  # the ServerApp's own rule
    return ckpt.round if same and ckpt.round < int(run_config["num-rounds"]) else 0


def _execute_to_file(spec: RunSpec, run_config: dict[str, Any], path: str, threads: int) -> dict[str, Any]:
    """:func:`execute` with Flower's log in the run folder; writes the record atomically.
    A stopped run is continued from its checkpoint where :func:`resumable_round` allows."""
    run_dir = Path(run_config["output-dir"]) / run_config["run-name"]
    log = run_dir.parent / f"{run_config['run-name']}.{LOG_FILE}"  # the run folder may not exist yet
    resumed = resumable_round(run_config)
    if resumed:
        run_config = {**run_config, "resume": True}
    else:  # a run without a record never finished (a killed grid): its folder and log start afresh
        shutil.rmtree(run_dir, ignore_errors=True)
        log.unlink(missing_ok=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    if resumed and (run_dir / LOG_FILE).is_file():
        (run_dir / LOG_FILE).replace(log)  # the log goes on
    with flower_log_to(log):
        record = execute(spec, run_config, threads)
    log.replace(run_dir / LOG_FILE)
    if resumed:  # the stopped part's rows (the server kept them): their running time counts too
        from fedul_flwr.outputs import running_time

        record["resumed-after-round"] = resumed
        record["wall-time-s"] += running_time(r for r in record["metrics"] if r["round"] <= resumed)
    record["log"] = str(run_dir / LOG_FILE)
    _write_record(Path(path), record)
    return record


def _write_record(path: Path, record: Mapping[str, Any]) -> None:
    """Write a record atomically: a killed run leaves no record, so it is redone on resume."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)


def _execute_to_file_star(args: tuple[RunSpec, dict[str, Any], str, int]) -> dict[str, Any]:
    return _execute_to_file(*args)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


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


def check_run_configs(runs: Sequence[tuple[RunSpec, dict[str, Any]]]) -> None:
    """Resolve every run's configuration.

    Raises
    ------
    fedul_flwr.config.ConfigError
        For the first invalid one, naming the run, the key and the value (and the flags that
        set them: ``--data-dir``, ``--set KEY=VALUE``).
    """
    from fedul_flwr.checks import resolve_config
    from fedul_flwr.config import ConfigError

    for spec, run_config in runs:
        try:
            resolve_config(dict(run_config))
        except ConfigError as exc:
            raise ConfigError(f"run {spec.run_id}: {exc} (data-dir is --data-dir, other keys --set KEY=VALUE)") from exc


def run_grid(
    runs: Sequence[tuple[RunSpec, dict[str, Any]]], records_dir: Path, jobs: int = 1, threads: int = 0, name: str = "grid"
) -> list[dict[str, Any]]:
    """Run every run whose record is missing and return the records of all ``runs``.

    Parameters
    ----------
    runs : sequence of (RunSpec, dict)
        Each run's place in the table and its complete run config.
    records_dir : Path
        Where the records are (``<run-id>.json``).
    jobs : int
        Runs at once (spawned worker processes; 1: in this process).
    threads : int
        torch threads per run (0: cores // jobs).
    name : str
        Shown in the progress bar.

    Returns
    -------
    list of dict
        The records of ``runs`` that exist (old and new), in the order of ``runs``.
    """
    from tqdm import tqdm

    check_run_configs(runs)  # a grid with a bad run is refused before anything runs or is written
    records_dir.mkdir(parents=True, exist_ok=True)
    todo = [(s, rc, str(records_dir / f"{s.run_id}.json")) for s, rc in runs if not (records_dir / f"{s.run_id}.json").exists()]
    if todo:  # a run recorded already, e.g. in another grid, is not trained again
        recorded = _recorded_runs(records_dir)
        todo = [(s, rc, path) for s, rc, path in todo if not _share_record(s, rc, Path(path), recorded)]
    per_run = threads_per_job(threads, jobs)
    print(f"[{name}] {len(runs) - len(todo)} of {len(runs)} runs have records; running {len(todo)}, "
          f"{jobs} at a time, {per_run} torch thread(s) each", flush=True)  # fmt: skip
    start = time.time()
    with tqdm(total=len(todo), desc=name, unit="run", disable=None, file=sys.stderr) as bar:

        finished = 0

        def report(record: dict[str, Any]) -> None:
            nonlocal finished
            finished += 1
            bar.update(1)  # a no-op where the bar is off (not a terminal)
            done, elapsed = finished, time.time() - start
            eta = elapsed / done * (len(todo) - done)
            bar.write(f"[{done}/{len(todo)} {_clock(elapsed)} elapsed, ~{_clock(eta)} left] {summary_line(record)}")

        if jobs <= 1:
            for spec, rc, path in todo:
                report(_execute_to_file(spec, rc, path, per_run))
        else:
            # SIGTERM (kill, a scheduler's time limit) becomes SystemExit here, so leaving the
            # ``with`` block terminates the workers instead of leaving them running orphaned
            previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
            try:
                with multiprocessing.get_context("spawn").Pool(jobs) as pool:
                    args = [(spec, rc, path, per_run) for spec, rc, path in todo]
                    for record in pool.imap_unordered(_execute_to_file_star, args):
                        report(record)
            finally:
                signal.signal(signal.SIGTERM, previous)
    return load_records([s for s, _ in runs], records_dir)


DISPLAY_KEYS = ("verbose",)
"""Settings that change only what a run prints, never its result (nor its checkpoint's match)."""
SHARED_FREE = ("run-name", "resume", "output-dir")
"""Resolved settings that do not change a run's result: two runs equal in all others are one."""


def run_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved settings that can change a run: all but the options of methods other than
    the run's ``method`` (:attr:`Method.options`) and :data:`DISPLAY_KEYS`. So a checkpoint or a record written before
    another method gained an option still matches its run.

    Raises
    ------
    UnknownChoiceError
        If ``config["method"]`` names no method.
    """
    from fedul_flwr.methods import METHODS, get_method

    own = {o.key for o in get_method(str(config["method"])).options}
    foreign = {o.key for name in METHODS.names() for o in get_method(name).options} - own
    return {k: v for k, v in config.items() if k not in foreign and k not in DISPLAY_KEYS}


def _settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`run_settings` without :data:`SHARED_FREE`."""
    return {k: v for k, v in run_settings(config).items() if k not in SHARED_FREE}


def same_settings(recorded: Mapping[str, Any], requested: Mapping[str, Any]) -> bool:
    """Whether two runs' settings (:func:`_settings`) are one run's. A key one of them lacks
    (added to the project after its record was written) counts as its default, the rule a
    resumed checkpoint follows (:func:`fedul_flwr.checks.resume_conflicts`): a new key's
    default keeps the behaviour the older record was trained with."""
    from fedul_flwr.config import default_config

    defaults = default_config()
    return all(recorded.get(k, defaults.get(k)) == requested.get(k, defaults.get(k)) for k in {*recorded, *requested})


def _recorded_runs(records_dir: Path) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    """The trained (not shared) records in ``records_dir``: (clients, resolved settings, record)."""
    runs = []
    for path in sorted(records_dir.glob("*.json")):
        record = json.loads(path.read_text())
        if "config" in record and "spec" in record and not record.get("same-run-as"):
            runs.append((record["spec"]["clients"], _settings(record["config"]), record))
    return runs


def _share_record(spec: RunSpec, run_config: dict[str, Any], path: Path, recorded: Sequence[tuple[int, dict[str, Any], dict[str, Any]]]) -> bool:
    """Write ``spec``'s record from a recorded run of the same clients and settings, if any.

    Two grids may hold the same run (HASSLE's full method is a column of Table 1 and of the
    ablation). A record of ``recorded`` (:func:`_recorded_runs`) with as many clients and the
    same resolved settings (:func:`same_settings`; name and folder aside) is copied under this
    run's id with ``same-run-as`` naming the original; nothing is trained. Returns whether it was.
    """
    from fedul_flwr.checks import resolve_config

    requested = _settings(resolve_config(dict(run_config)).as_dict())
    record = next((r for clients, settings, r in recorded if clients == spec.clients and same_settings(settings, requested)), None)
    if record is None:
        return False
    _write_record(path, {**record, "run-id": spec.run_id, "spec": asdict(spec), "run-config": run_config,
                         "same-run-as": record["run-id"]})  # fmt: skip
    print(f"[{spec.grid}] {spec.run_id}: the same run as {record['run-id']} (record shared)", flush=True)
    return True


def load_records(specs: Sequence[RunSpec], records_dir: Path) -> list[dict[str, Any]]:
    """The existing records of ``specs``, in their order."""
    paths = [records_dir / f"{s.run_id}.json" for s in specs]
    return [json.loads(p.read_text()) for p in paths if p.exists()]


# --------------------------------------------------------------------------- flag conventions


def _data_dir(text: str) -> str:
    return str(Path(text).expanduser().resolve()) if text else ""


def add_common_arguments(p: argparse.ArgumentParser, out: str, seeds_help: str = "comma list of seeds") -> None:
    """The flags every grid command shares: ``--seeds 0,1``, ``--data-dir``, ``--out``,
    ``--set KEY=VALUE`` (repeatable), ``--jobs``, ``--threads`` (0: cores // jobs)."""
    p.add_argument("--seeds", default="", help=seeds_help)
    p.add_argument("--data-dir", default="", type=_data_dir,
                   help="torchvision root of the non-embedded datasets (made absolute)")  # fmt: skip
    p.add_argument("--out", default=out, help="results folder: records/, runs/ (each with its flower.log), tables")
    p.add_argument("--set", action="append", default=[], metavar="[COLUMN:]KEY=VALUE",
                   help="run-config value for every run (or only a column's runs, where the command has columns)")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1, help="runs at once (worker processes)")
    p.add_argument("--threads", type=int, default=0, help="torch threads per run; 0: the machine's cores // jobs")


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"0,1,2"`` -> ``(0, 1, 2)``; ``""`` -> ``()``.

    Raises
    ------
    SystemExit
        On a value that is not an integer (the message names it).
    """
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise SystemExit(f"--seeds {text!r}: expected a comma list of integers, e.g. 0,1,2") from None


def parse_overrides(items: Sequence[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``--set`` values: ``key=value`` (every run) and ``column:key=value`` (one column's
    runs), typed like the key's default.

    Raises
    ------
    SystemExit
        On a malformed item or a key that ``[tool.flwr.app.config]`` lacks.
    """
    from fedul_flwr.config import ConfigError, coerce_value, default_config

    defaults = default_config()
    common: dict[str, Any] = {}
    targeted: dict[str, dict[str, Any]] = {}
    for item in items:
        target, _, assignment = item.rpartition(":") if ":" in item.split("=", 1)[0] else ("", "", item)
        key, sep, text = assignment.partition("=")
        if not sep or key not in defaults:
            raise SystemExit(f"--set {item!r}: expected [column:]key=value with a key of [tool.flwr.app.config]")
        try:
            value = coerce_value(key, text, type(defaults[key]))
        except ConfigError as exc:
            raise SystemExit(f"--set {item!r}: {exc}") from None
        (targeted.setdefault(target, {}) if target else common)[key] = value
    return common, targeted
