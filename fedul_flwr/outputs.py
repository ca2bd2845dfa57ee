"""What a run writes: one folder per run under an absolute ``output-dir``.

    <output-dir>/<run-name>/
        config.json     the resolved configuration (every key, after preset and overrides)
        metrics.json    one record per round: round, train-loss, test-loss, test-accuracy,
                        test-error, wall-time (s from the start to the round's evaluation);
                        val-accuracy, val-error on the labeled validation split when
                        val-fraction > 0; for a method with several predictors, the others
                        as test-accuracy-<name> etc.; the train metrics a method records
                        (``Method.recorded_metrics``, e.g. FedDB's APP-U and DMA weights);
                        the round's training replies: failed-replies (errors), idle-replies
                        (clients with nothing to train), failed-nodes ([node id, error type]
                        pairs) and trained-nodes (the node ids that sent a model)
        metrics.csv     the same table as CSV
        model.pt        the method's first exchanged model, the classifier f of FedUL and its
                        baselines (``torch.save`` of its state dict; no Q_c)
        model-<name>.pt every other exchanged model of the method (several models in flight)
        accuracy.png    test accuracy per round
        summary.txt     the one-line summary printed at the end: status=ok, or status=failed
                        (an error) or status=stopped (a time limit, Ctrl-C, SIGTERM) and the reason
        tensorboard/    with tensorboard=true: the same metrics as TensorBoard event files
                        (one scalar per metric and round; a vector metric as <name>/<i>)

One writer per folder: :meth:`RunOutputs.create` takes the folder's lock
(:class:`fedul_flwr.store.FolderLock`, ``<output-dir>/.locks/<run-name>.lock``, naming the
PID and host of the ServerApp) before it writes anything, or runs under the lock its caller
holds (a grid's cell), and :meth:`RunOutputs.finish` releases the lock it took. Every file is
written by :func:`fedul_flwr.store.write_atomic` (a unique temporary file, fsync, rename), so
a run killed mid-write leaves the previous version, never a truncated one.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fedul_flwr import wire
from fedul_flwr.checkpoint import CheckpointError
from fedul_flwr.config import ConfigError, RunConfig, check_run_name
from fedul_flwr.methods import get_method
from fedul_flwr.privacy.accounting import neighbours
from fedul_flwr.store import FolderLock, RunFolderInUse, read_json, remove_tree, sweep_temporary, utc_stamp, write_atomic
from fedul_flwr.strategies.server_training import SERVER_LABELED_IMAGES, SERVER_TRAIN_LOSS

if TYPE_CHECKING:
    from fedul_flwr.strategies import RoundReplies

COLUMNS = ("round", "train-loss", "test-loss", "test-accuracy", "test-error", "val-accuracy", "val-error", "failed-replies",
           "idle-replies", "wall-time")  # fmt: skip
__all__ = ["COLUMNS", "RunFolderExists", "RunFolderInUse", "RunOutputs", "RunStopped", "check_unused", "read_metrics",
           "run_folder", "running_time", "slug"]


class RunStopped(Exception):
    """A run stopped on request between rounds (e.g. a grid's time limit), not by an error:
    :meth:`RunOutputs.finish` writes ``status=stopped``; the checkpoint holds every finished
    round, so ``resume=true`` continues it."""


def resumed_rows(run_dir: Path, last_round: int) -> dict[int, dict[str, Any]]:
    """The metric rows of rounds 0..``last_round`` of a stopped run (``metrics.json``; none
    if the run stopped before writing one). Reads only.

    Raises
    ------
    CheckpointError
        If ``metrics.json`` cannot be read (e.g. truncated), naming the file.
    """
    path = run_dir / "metrics.json"
    if not path.is_file():
        return {}
    try:
        rows = {int(r["round"]): r for r in read_json(path, list)}
    except (OSError, ValueError, KeyError, TypeError) as exc:  # DamagedFile is a ValueError
        reason = " ".join(str(exc).split())
        raise CheckpointError(
            f"resume=true: {path} cannot be read ({type(exc).__name__}: {reason}); nothing was changed (repair the file, "
            "or move it away to resume without the earlier rounds' rows)"
        ) from exc
    return {r: _structured(row) for r, row in rows.items() if r <= last_round}


def _structured(row: dict[str, Any]) -> dict[str, Any]:
    """A row of ``metrics.json`` with ``failed-nodes`` as ``[node id, error type]`` pairs (rows
    written before they were stored so held ``"<id>(<type>),..."``)."""
    failed = row.get("failed-nodes")
    if isinstance(failed, str):
        pairs = (part.partition("(") for part in failed.split(",") if part)
        row = {**row, "failed-nodes": [[int(node), kind.rstrip(")")] for node, _, kind in pairs]}
    return row


def resolve_output_dir(output_dir: str) -> Path:
    """``~`` is expanded; a relative path is taken under the home directory (Flower runs the
    ServerApp from its own working directory, so a relative path would land somewhere
    surprising). Returns an absolute path."""
    path = Path(output_dir).expanduser()
    return path if path.is_absolute() else Path.home() / path


def run_folder(cfg: RunConfig) -> Path:
    """``<output-dir>/<run-name>`` (absolute; default name: UTC time, method, dataset,
    partition, sets, seed). Nothing is created.

    Raises
    ------
    ConfigError
        If ``run-name`` is not one folder name inside ``output-dir``
        (:func:`fedul_flwr.config.check_run_name`).
    """
    check_run_name(cfg.run_name)
    stamp = utc_stamp()
    sets = "-".join(str(m) for m in cfg.num_sets)
    name = cfg.run_name or f"{stamp}-{slug(cfg.method)}-{slug(cfg.dataset)}-{cfg.partition}-M{sets}-s{cfg.seed}"
    base = resolve_output_dir(cfg.output_dir)
    path = base / name
    if os.path.normpath(path.parent) != os.path.normpath(base):  # defensive: check_run_name guarantees it
        raise ConfigError(f"run-name={cfg.run_name!r}: the run folder {path} would lie outside output-dir {base}")
    return path


def slug(text: str) -> str:
    """``text`` as one safe folder-name component: every run of characters other than
    letters, digits, ``.``, ``_`` and ``-`` becomes one ``-`` (``hf:/data/pets`` ->
    ``hf-data-pets``), never empty, never ``.`` or ``..``."""
    out = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-.")
    return out or "x"


@dataclass
class RunOutputs:
    """The run folder's whole life: its exclusive creation (or, with ``resume=true``, its
    takeover), the per-round metric table written as the run goes, the models, and the
    summary of a finished or failed run, after which the folder is released.

    Attributes
    ----------
    path : Path
        The run folder.
    cfg : RunConfig
        The run's settings.
    primary : str
        The model written to ``model.pt``.
    started : float
        Unix time the run's wall time counts from (a resumed run's is moved back by the time
        it had run).
    rows : dict[int, dict[str, Any]]
        The metric table by round.
    writer : Any
        The TensorBoard ``SummaryWriter`` with ``tensorboard=true``.
    lock : FolderLock | None
        The folder's lock while the run is alive.
    owns_lock : bool
        Whether :meth:`finish` releases ``lock`` (False: the caller's, e.g. a grid's cell).
    status, reason : str
        ``ok``, or ``failed`` and why, once :meth:`finish` ran.
    """

    path: Path
    cfg: RunConfig
    primary: str = "f"
    started: float = field(default_factory=time.time)
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    writer: Any = None  # torch.utils.tensorboard.SummaryWriter with tensorboard=true
    lock: FolderLock | None = None
    owns_lock: bool = True
    status: str = "running"
    num_nodes: int = 0
    """The nodes the rounds sample from (set by the server): what the epsilon's ``neighbours=`` names."""
    reason: str = ""
    ended: float | None = None

    @classmethod
    def create(
        cls, cfg: RunConfig, primary: str = "f", resume_round: int | None = None, lock: FolderLock | None = None
    ) -> RunOutputs:
        """Take the run folder (:func:`run_folder`) and write ``config.json``: the first write of
        a run, after every check. The run's settings are checked before (with ``resume=true``
        against the checkpoint, :func:`fedul_flwr.resume.check_resume`); here the folder's lock
        is taken first (or ``lock``, the caller's, is used), then the folder is checked: a new
        run's must hold no file, a resumed run's ``metrics.json`` must be readable (its rows up
        to ``resume_round`` are kept). A refused create changes nothing in the folder.

        Parameters
        ----------
        cfg : RunConfig
            The run's settings (``output-dir``, ``run-name``, ``resume``, ``tensorboard``).
        primary : str
            The model written to ``model.pt``.
        resume_round : int | None
            With ``resume=true``, the checkpoint's round: later rows are dropped.
        lock : FolderLock | None
            The folder's lock, held by the caller (who releases it); ``None``: taken here and
            released by :meth:`finish`.

        Raises
        ------
        RunFolderInUse
            If a live run holds the folder (names its PID and host).
        RunFolderExists
            If the folder holds files and ``resume`` is not set: an earlier run's metrics and
            checkpoint are never overwritten (a ``ConfigError`` and a ``FileExistsError``).
        FileNotFoundError
            With ``resume=true``, if the run folder does not exist (it is not created).
        CheckpointError
            With ``resume=true``, if ``metrics.json`` cannot be read (names the file).
        ConfigError
            If ``run-name`` is not one folder name (:func:`run_folder`).
        NoSpace
            If the device is full (one line naming the file and the free space); a run folder
            this call created is removed again.
        OSError
            If the folder cannot be created (the message names it).
        ImportError
            With ``tensorboard=true``, if the ``tensorboard`` package is missing.
        """
        path = run_folder(cfg)
        writer_class = _tensorboard_writer_class() if cfg.tensorboard else None
        owns_lock = lock is None
        if lock is None:
            lock = FolderLock.acquire(path)
        else:
            lock.check(path)
        created = not cfg.resume and not path.exists()
        try:
            rows: dict[int, dict[str, Any]] = {}
            if cfg.resume:
                if not path.is_dir():
                    raise FileNotFoundError(f"resume=true: run folder {path} does not exist")
                rows = resumed_rows(path, resume_round if resume_round is not None else -1)
                sweep_temporary(path)  # a killed writer's partial files
            else:
                _check_unused(path, cfg)
                try:
                    path.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise OSError(f"cannot create run folder {path}: {exc}") from exc
            outputs = cls(path=path, cfg=cfg, primary=primary, rows=rows, lock=lock, owns_lock=owns_lock)
            outputs.started -= running_time(rows.values())  # wall time goes on from the stopped run's
            write_atomic(path / "config.json", json.dumps(cfg.as_dict(), indent=2, sort_keys=True) + "\n")
            if writer_class is not None:
                outputs.writer = writer_class(log_dir=str(path / "tensorboard"))
        except BaseException:
            if created:  # a refused start leaves no folder behind (e.g. config.json met a full device)
                with contextlib.suppress(OSError):
                    remove_tree(path, lock)
            if owns_lock:
                lock.release()
            raise
        return outputs

    def _row(self, server_round: int) -> dict[str, Any]:
        row = self.rows.setdefault(server_round, {"round": server_round})
        row.setdefault("wall-time", time.time() - self.started)
        return row

    def record(self, server_round: int, **metrics: float | list[float]) -> None:
        """Merge metrics of ``server_round`` (numbers, or lists of numbers such as a K-vector;
        ints such as a count stay ints, the rest become floats) into the table and rewrite
        metrics.json/.csv."""
        self._row(server_round).update(
            {k: [float(x) for x in v] if isinstance(v, list) else v if type(v) is int else float(v) for k, v in metrics.items()}
        )
        self._write_tables()
        self._scalars(server_round, metrics)

    def record_replies(self, replies: RoundReplies) -> None:
        """Record a round's training replies (:class:`fedul_flwr.strategies.RoundReplies`): the
        counts ``failed-replies`` and ``idle-replies``, ``failed-nodes`` (``[node id, error
        type]`` pairs), ``trained-nodes`` (node ids) and ``trained-clients`` (their clients'
        stable ``node-key``, which a resumed simulation keeps while its node ids are new). The
        summary reads them back from the table, so a resumed run's summary counts its earlier
        rounds too."""
        counts = {"failed-replies": len(replies.failed), "idle-replies": len(replies.idle)}
        self._row(replies.server_round).update(
            counts, **{"failed-nodes": [[int(node), str(kind)] for node, kind in replies.failed],
                       "trained-nodes": sorted(int(n) for n in replies.trained),
                       "trained-clients": sorted(int(k) for k in replies.clients)}  # fmt: skip
        )
        self._write_tables()
        self._scalars(replies.server_round, counts)

    def _scalars(self, server_round: int, metrics: Mapping[str, float | list[float]]) -> None:
        if self.writer is None:
            return
        for key, value in metrics.items():
            for tag, x in ([(f"{key}/{i}", v) for i, v in enumerate(value)] if isinstance(value, list) else [(key, value)]):
                self.writer.add_scalar(tag, float(x), global_step=server_round)
        self.writer.flush()

    def _write_tables(self) -> None:
        rows = [self.rows[r] for r in sorted(self.rows)]
        write_atomic(self.path / "metrics.json", json.dumps(rows, indent=1) + "\n")
        table = io.StringIO()
        extra = sorted({k for row in rows for k in row} - set(COLUMNS))
        writer = csv.DictWriter(table, fieldnames=[*COLUMNS, *extra], extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()} for row in rows)
        write_atomic(self.path / "metrics.csv", table.getvalue())

    def finish(self, failure: BaseException | None = None) -> str:
        """End the run's writing: ``summary.txt`` (``status=ok``; ``status=stopped`` when
        ``failure`` is a :class:`RunStopped`, Ctrl-C or SIGTERM, the run resumable from its
        checkpoint; else ``status=failed``; with the reason: ``failure``'s type and message on
        one line), the TensorBoard writer closed, the folder's lock released. Returns the
        summary line."""
        if failure is not None:
            stopped = isinstance(failure, (RunStopped, KeyboardInterrupt, SystemExit))
            self.status = "stopped" if stopped else "failed"
            self.reason = " ".join(f"{type(failure).__name__}: {failure}".split())
        else:
            self.status = "ok"
        self.ended = time.time()
        try:
            line = self.summary()
            write_atomic(self.path / "summary.txt", line + "\n")
        finally:
            if self.writer is not None:
                self.writer.close()
            if self.lock is not None and self.owns_lock:
                self.lock.release()
        return line

    def save_models(self, state_dicts: dict[str, dict[str, torch.Tensor]]) -> list[Path]:
        """Write the primary model's state dict to ``model.pt`` and every other model's to
        ``model-<name>.pt``; returns the paths."""
        paths = []
        for name, state_dict in state_dicts.items():
            out = self.path / ("model.pt" if name == self.primary else f"model-{name}.pt")
            write_atomic(out, lambda fh, sd=state_dict: torch.save(sd, fh))
            paths.append(out)
        return paths

    def plot(self) -> Path:
        """Write ``accuracy.png``: test accuracy (%) per round."""
        import matplotlib  # deferred: import cost of matplotlib (about a second), paid only by the plot

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # deferred: after matplotlib.use("Agg"), which must come first

        rows = [self.rows[r] for r in sorted(self.rows) if "test-accuracy" in self.rows[r]]
        fig, ax = plt.subplots(figsize=(6, 4))
        for key in self._accuracy_keys():
            label = "headline" if key == "test-accuracy" else key.removeprefix("test-accuracy-")
            ax.plot([r["round"] for r in rows if key in r], [100 * r[key] for r in rows if key in r], marker="o", ms=3,
                    label=label)  # fmt: skip
        if len(self._accuracy_keys()) > 1:
            ax.legend(fontsize=8)
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{self.cfg.method} on {self.cfg.dataset} ({self.cfg.partition}, M={','.join(map(str, self.cfg.num_sets))})")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        out = self.path / "accuracy.png"
        write_atomic(out, lambda fh: fig.savefig(fh, format="png", dpi=120))
        plt.close(fig)
        return out

    def _accuracy_keys(self) -> list[str]:
        """``test-accuracy`` (the method's headline predictor) and ``test-accuracy-<name>`` of
        its other predictors."""
        keys = {k for row in self.rows.values() for k in row if k.startswith("test-accuracy-")}
        return ["test-accuracy", *sorted(keys)]

    def _privacy(self, row: Mapping[str, Any]) -> str:
        """``epsilon=... delta=... epsilon-round=... neighbours=... `` of a DP run's row ("" without
        them): the composed bound, its delta, the exact epsilon of one round and the guarantee
        they are for (:func:`fedul_flwr.privacy.accounting.neighbours` of the federation's ``num_nodes``); ``unnoised-train-metrics=published``
        when a server-DP run records its clients' train metrics, which the epsilon does not cover."""
        if wire.PRIVACY_EPSILON not in row:
            return ""

        published = self.cfg.dp_publish_unnoised_train_metrics and self.cfg.differential_privacy.startswith("server")
        return (f"epsilon={row[wire.PRIVACY_EPSILON]:.4g} delta={row[wire.PRIVACY_DELTA]:.3g} "
                f"epsilon-round={row.get(wire.PRIVACY_EPSILON_ROUND, math.nan):.4g} "
                f"neighbours={neighbours(self.cfg, self.num_nodes)} "
                + ("unnoised-train-metrics=published " if published else ""))  # fmt: skip

    def summary(self) -> str:
        """One line: method, preset, dataset, partition, client setting, clients (the distinct
        clients that trained, by their stable ``node-key``; by node id in a run recorded before
        the key was), sets (methods on U sets), ``dpl=true`` (FedDB's debiased pseudo-labels as
        a plug-in), ``server-epochs`` and ``server-labeled`` (where the server trained on its labeled
        images: the epochs, and how many images it held), rounds,
        the training replies (failed ones: their count and, per failed node, its id and error
        types; idle ones: their count), final and best test accuracy (and the final accuracy of
        every other predictor), wall time, run folder, and ``status=ok``, or ``status=failed
        reason=...`` or ``status=stopped reason=...`` (:meth:`finish`; ``status=running``
        before), and ``warning=no-client-trained`` where rounds ran but no client ever sent a
        model (the global model is the initial one, or the server's training alone). Written to
        ``summary.txt`` by :meth:`finish`."""
        acc = {r: row["test-accuracy"] for r, row in self.rows.items() if "test-accuracy" in row}
        last = max(acc) if acc else 0
        best = max(acc, key=lambda r: acc[r]) if acc else 0
        failures: dict[int, set[str]] = {}
        for row in self.rows.values():
            for node, kind in row.get("failed-nodes", []):
                failures.setdefault(int(node), set()).add(kind)
        failed = ",".join(f"{node}({'/'.join(sorted(kinds))})" for node, kinds in sorted(failures.items()))
        keyed = any("trained-clients" in row for row in self.rows.values())
        clients = {int(n) for row in self.rows.values() for n in row.get("trained-clients" if keyed else "trained-nodes", [])}
        total = {key: sum(int(row.get(key, 0)) for row in self.rows.values()) for key in ("failed-replies", "idle-replies")}
        method = _method_class(self.cfg.method)
        server_trained = any(SERVER_TRAIN_LOSS in row for row in self.rows.values())
        server_labeled = [row[SERVER_LABELED_IMAGES] for _, row in sorted(self.rows.items()) if SERVER_LABELED_IMAGES in row]
        line = (
            f"fedul-flwr: method={self.cfg.method} preset={self.cfg.preset or 'none'} dataset={self.cfg.dataset} partition={self.cfg.partition} "
            f"setting={self.cfg.client_setting} clients={len(clients)} "
            + (f"sets={','.join(map(str, self.cfg.num_sets))} " if method is None or "usets" in method.requires else "")
            + ("dpl=true " if dict(self.cfg.extra).get("dpl") is True else "")
            + (f"server-epochs={self.cfg.server_epochs} " if server_trained else "")
            + (f"server-labeled={int(server_labeled[-1])} " if server_labeled else "")
            + f"rounds={last} "
            f"failed-replies={total['failed-replies']} "
            + (f"failed-nodes={failed} " if failed else "")
            + f"final-test-accuracy={100 * acc.get(last, math.nan):.2f}% "
            f"best-test-accuracy={100 * acc.get(best, math.nan):.2f}% (round {best}) "
            + "".join(f"final-{k}={100 * self.rows.get(last, {}).get(k, math.nan):.2f}% " for k in self._accuracy_keys()[1:])
            + f"idle-replies={total['idle-replies']} "
            + self._privacy(self.rows.get(last, {}))
            + f"wall-time={(self.ended or time.time()) - self.started:.1f}s run-dir={self.path} status={self.status}"
            + (f" reason={self.reason}" if self.reason else "")
            + (" warning=no-client-trained" if last > 0 and not clients and self.status != "running" else "")
        )
        return line


def _method_class(name: str) -> type | None:
    """The method class of ``name`` (``None`` where it does not resolve, e.g. a record of a
    method since removed)."""
    try:
        return get_method(name)
    except (ValueError, ImportError, AttributeError):
        return None


class RunFolderExists(ConfigError, FileExistsError):
    """A new run (no ``resume=true``) names a run folder that holds an earlier run's files."""


def check_unused(cfg: RunConfig) -> None:
    """Refuse a new run whose run folder holds files (a no-op with ``resume=true``, which
    :func:`fedul_flwr.resume.check_resume` checks). Reads only.

    Raises
    ------
    RunFolderExists
        Naming the folder and what to do.
    ConfigError
        If ``run-name`` is not one folder name.
    """
    if not cfg.resume:
        _check_unused(run_folder(cfg), cfg)


def _check_unused(path: Path, cfg: RunConfig) -> None:
    if path.is_dir() and any(path.iterdir()):
        raise RunFolderExists(
            f"run folder {path} exists (run-name={cfg.run_name!r}): set resume=true to continue that run, "
            "or choose another run-name (or remove the folder) to start a new one"
        )


def _tensorboard_writer_class() -> type:
    """``torch.utils.tensorboard.SummaryWriter``.

    Raises
    ------
    ImportError
        If the ``tensorboard`` package is missing.
    """
    try:
        from torch.utils.tensorboard import SummaryWriter  # deferred: optional dependency tensorboard
    except ImportError as exc:
        raise ImportError(
            f"tensorboard=true needs the tensorboard package on the server ({exc}): pip install 'fedul-flwr[tensorboard]'"
        ) from exc
    return SummaryWriter


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Load ``metrics.json`` of a finished run folder (:func:`fedul_flwr.store.read_json`).

    Raises
    ------
    FileNotFoundError
        If it does not exist.
    fedul_flwr.store.DamagedFile
        If it is empty, cut short or not a JSON list (names the file).
    """
    return read_json(Path(run_dir) / "metrics.json", list)


def running_time(rows: Iterable[Mapping[str, Any]]) -> float:
    """Seconds a (stopped) run has run: the largest ``wall-time`` of its metric rows (0 if none).
    The largest rather than the last round's: a run stopped between its checkpoint and its
    metric row lacks that row."""
    return max((float(r["wall-time"]) for r in rows if "wall-time" in r), default=0.0)
