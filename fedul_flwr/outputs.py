"""What a run writes: one folder per run under an absolute ``output-dir``.

    <output-dir>/<run-name>/
        config.json     the resolved configuration (every key, after preset and overrides)
        metrics.json    one record per round: round, train-loss, test-loss, test-accuracy,
                        test-error, wall-time (s from the start to the round's evaluation);
                        val-accuracy, val-error on the labeled validation split when
                        val-fraction > 0; for a method with several predictors, the others
                        as test-accuracy-<name> etc.; the train metrics a method records
                        (``Method.recorded_metrics``, e.g. FedDB's APP-U and DMA weights)
                        failed-replies: the training replies of the round that were errors
                        (their nodes and error types are named in summary.txt)
        metrics.csv     the same table as CSV
        model.pt        the method's first exchanged model, the classifier f of FedUL and its
                        baselines (``torch.save`` of its state dict; no Q_c)
        model-<name>.pt every other exchanged model of the method (several models in flight)
        accuracy.png    test accuracy per round
        summary.txt     the one-line summary printed at the end
        tensorboard/    with tensorboard=true: the same metrics as TensorBoard event files
                        (one scalar per metric and round; a vector metric as <name>/<i>)
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from fedul_flwr import wire
from fedul_flwr.config import ConfigError, RunConfig, check_run_name

COLUMNS = ("round", "train-loss", "test-loss", "test-accuracy", "test-error", "val-accuracy", "val-error", "failed-replies",
           "wall-time")  # fmt: skip


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
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    sets = "-".join(str(m) for m in cfg.num_sets)
    name = cfg.run_name or f"{stamp}-{cfg.method}-{cfg.dataset}-{cfg.partition}-M{sets}-s{cfg.seed}"
    base = resolve_output_dir(cfg.output_dir)
    path = base / name
    if os.path.normpath(path.parent) != os.path.normpath(base):  # defensive: check_run_name guarantees it
        raise ConfigError(f"run-name={cfg.run_name!r}: the run folder {path} would lie outside output-dir {base}")
    return path


@dataclass
class RunOutputs:
    """The run folder and the per-round metric table, written as the run goes."""

    path: Path
    cfg: RunConfig
    primary: str = "f"
    started: float = field(default_factory=time.time)
    rows: dict[int, dict[str, float]] = field(default_factory=dict)
    writer: Any = None  # torch.utils.tensorboard.SummaryWriter with tensorboard=true
    failures: dict[int, set[str]] = field(default_factory=dict)  # node id -> error types of its failed replies

    @classmethod
    def create(cls, cfg: RunConfig, primary: str = "f") -> RunOutputs:
        """Make the run folder (:func:`run_folder`) and write ``config.json``. The run's
        settings are all checked before (with ``resume=true`` against the checkpoint,
        :func:`fedul_flwr.checks.check_resume`): this is the first write of a run.

        Raises
        ------
        FileExistsError
            If ``run-name`` names a folder that holds files and ``resume`` is not set: an
            earlier run's metrics and checkpoint are never overwritten.
        FileNotFoundError
            With ``resume=true``, if the run folder does not exist (it is not created).
        ConfigError
            If ``run-name`` is not one folder name (:func:`run_folder`).
        OSError
            If the folder cannot be created (the message names it).
        ImportError
            With ``tensorboard=true``, if the ``tensorboard`` package is missing.
        """
        path = run_folder(cfg)
        if cfg.resume and not path.is_dir():
            raise FileNotFoundError(f"resume=true: run folder {path} does not exist")
        if cfg.run_name and not cfg.resume and path.is_dir() and any(path.iterdir()):
            raise FileExistsError(
                f"run folder {path} exists (run-name={cfg.run_name!r}): set resume=true to continue that run, "
                "or choose another run-name (or remove the folder) to start a new one"
            )
        try:
            path.mkdir(parents=True, exist_ok=bool(cfg.run_name))
        except OSError as exc:
            raise OSError(f"cannot create run folder {path}: {exc}") from exc
        (path / "config.json").write_text(json.dumps(cfg.as_dict(), indent=2, sort_keys=True) + "\n")
        return cls(path=path, cfg=cfg, primary=primary, writer=_tensorboard_writer(path) if cfg.tensorboard else None)

    def record(self, server_round: int, **metrics: float | list[float]) -> None:
        """Merge metrics of ``server_round`` (numbers, or lists of numbers such as a K-vector;
        ints such as a count stay ints, the rest become floats) into the table and rewrite
        metrics.json/.csv."""
        row = self.rows.setdefault(server_round, {"round": server_round})
        row.update({k: [float(x) for x in v] if isinstance(v, list) else v if type(v) is int else float(v)
                    for k, v in metrics.items()})  # fmt: skip
        row.setdefault("wall-time", time.time() - self.started)
        self._write_tables()
        if self.writer is not None:
            for key, value in metrics.items():
                for tag, x in ([(f"{key}/{i}", v) for i, v in enumerate(value)] if isinstance(value, list) else [(key, value)]):
                    self.writer.add_scalar(tag, float(x), global_step=server_round)
            self.writer.flush()

    def record_failures(self, server_round: int, failures: list[tuple[int, str]]) -> None:
        """Record the failed training replies of ``server_round`` (node id, error type): their
        count in the round's ``failed-replies`` column, the nodes and types for the summary."""
        for node, kind in failures:
            self.failures.setdefault(node, set()).add(kind)
        self.record(server_round, **{"failed-replies": len(failures)})

    def close(self) -> None:
        """Close the TensorBoard writer, if any (the tables are complete after every record)."""
        if self.writer is not None:
            self.writer.close()

    def _write_tables(self) -> None:
        rows = [self.rows[r] for r in sorted(self.rows)]
        (self.path / "metrics.json").write_text(json.dumps(rows, indent=1) + "\n")
        with (self.path / "metrics.csv").open("w", newline="") as fh:
            extra = sorted({k for row in rows for k in row} - set(COLUMNS))
            writer = csv.DictWriter(fh, fieldnames=[*COLUMNS, *extra], extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)

    def save_models(self, state_dicts: dict[str, dict[str, torch.Tensor]]) -> list[Path]:
        """Write the primary model's state dict to ``model.pt`` and every other model's to
        ``model-<name>.pt``; returns the paths."""
        paths = []
        for name, state_dict in state_dicts.items():
            out = self.path / ("model.pt" if name == self.primary else f"model-{name}.pt")
            torch.save(state_dict, out)
            paths.append(out)
        return paths

    def plot(self) -> Path:
        """Write ``accuracy.png``: test accuracy (%) per round."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

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
        fig.savefig(out, dpi=120)
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
        they are for (:data:`fedul_flwr.privacy.NEIGHBOURS`)."""
        if wire.PRIVACY_EPSILON not in row:
            return ""
        from fedul_flwr.privacy import NEIGHBOURS

        return (f"epsilon={row[wire.PRIVACY_EPSILON]:.4g} delta={row[wire.PRIVACY_DELTA]:.3g} "
                f"epsilon-round={row.get(wire.PRIVACY_EPSILON_ROUND, math.nan):.4g} "
                f"neighbours={NEIGHBOURS[self.cfg.differential_privacy]} ")  # fmt: skip

    def summary(self, num_clients: int) -> str:
        """One line: method, dataset, clients, sets, rounds, the failed training replies (their
        count and, per failed node, its id and error types), final and best test accuracy (and
        the final accuracy of every other predictor), wall time. Also written to ``summary.txt``."""
        acc = {r: row["test-accuracy"] for r, row in self.rows.items() if "test-accuracy" in row}
        last = max(acc) if acc else 0
        best = max(acc, key=lambda r: acc[r]) if acc else 0
        failed = ",".join(f"{node}({'/'.join(sorted(kinds))})" for node, kinds in sorted(self.failures.items()))
        line = (
            f"fedul-flwr: method={self.cfg.method} preset={self.cfg.preset or 'none'} dataset={self.cfg.dataset} partition={self.cfg.partition} "
            f"clients={num_clients} sets={','.join(map(str, self.cfg.num_sets))} rounds={last} "
            f"failed-replies={sum(int(row.get('failed-replies', 0)) for row in self.rows.values())} "
            + (f"failed-nodes={failed} " if failed else "")
            + f"final-test-accuracy={100 * acc.get(last, math.nan):.2f}% "
            f"best-test-accuracy={100 * acc.get(best, math.nan):.2f}% (round {best}) "
            + "".join(f"final-{k}={100 * self.rows.get(last, {}).get(k, math.nan):.2f}% " for k in self._accuracy_keys()[1:])
            + self._privacy(self.rows.get(last, {}))
            + f"wall-time={time.time() - self.started:.1f}s run-dir={self.path}"
        )
        (self.path / "summary.txt").write_text(line + "\n")
        return line


def _tensorboard_writer(path: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ImportError(
            f"tensorboard=true needs the tensorboard package on the server ({exc}): pip install 'fedul-flwr[tensorboard]'"
        ) from exc
    return SummaryWriter(log_dir=str(path / "tensorboard"))


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Load ``metrics.json`` of a finished run folder."""
    return json.loads((Path(run_dir) / "metrics.json").read_text())


def running_time(rows: Iterable[Mapping[str, Any]]) -> float:
    """Seconds a (stopped) run has run: the largest ``wall-time`` of its metric rows (0 if none).
    The largest rather than the last round's: a run stopped between its checkpoint and its
    metric row lacks that row."""
    return max((float(r["wall-time"]) for r in rows if "wall-time" in r), default=0.0)
