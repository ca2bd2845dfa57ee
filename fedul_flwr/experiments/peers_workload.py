"""The peer benchmark's workload: what pfl-research, the engine and Ray each train.

The default is pfl-research's CIFAR-10 benchmark (``benchmarks/image_classification/configs/
baseline.yaml`` of its repository): ``simple-cnn``, 1000 users x 50 images, a cohort of 50
users per central iteration, local SGD (lr 0.1, batch 10, 1 local epoch, no momentum), FedAvg
with uniform weights and central lr 1.0, float32, on ``synthetic-cifar``. A user times their
own workload with the ``--peers-*`` flags of ``fedul benchmark --only peers`` or a YAML file
(``--peers-workload FILE``) holding any of the keys of :data:`WORKLOAD_KEYS`::

    model: small-cnn
    users: 200
    cohort: 20
    images-per-user: 100   # 0: each user's whole IID share
    batch-size: 32
    local-epochs: 2
    lr: 0.05

A flag the user typed wins over the file, the file over the default (:func:`resolve_workload`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["WORKLOAD_KEYS", "PeersWorkload", "add_workload_arguments", "engine_settings", "resolve_workload"]


@dataclass(frozen=True)
class PeersWorkload:
    """One workload of the peer benchmark (module docstring); the defaults are pfl-research's.

    Attributes
    ----------
    dataset : str
        The images (``synthetic-cifar``; ``cifar10`` with ``--data-dir``).
    model : str
        A model of this project's registry (``simple-cnn`` is pfl's ``simple_cnn``).
    users : int
        Users of the population.
    cohort : int
        Users per central iteration (round).
    images_per_user : int
        Training images of each user: its IID share of the training set capped at this many
        (``samples-per-client``); 0: the whole share (50 for 1000 users of CIFAR-10's 50000).
    batch_size, local_epochs : int
        Local SGD's batch and epochs.
    lr : float
        Local SGD's learning rate (no momentum; the central step is plain FedAvg, lr 1.0).
    """

    dataset: str = "synthetic-cifar"
    model: str = "simple-cnn"
    users: int = 1000
    cohort: int = 50
    images_per_user: int = 0
    batch_size: int = 10
    local_epochs: int = 1
    lr: float = 0.1

    def as_dict(self) -> dict[str, Any]:
        """The workload under its YAML keys (:data:`WORKLOAD_KEYS`)."""
        return {key: getattr(self, field) for key, field in WORKLOAD_KEYS.items()}


WORKLOAD_KEYS: dict[str, str] = {f.name.replace("_", "-"): f.name for f in dataclasses.fields(PeersWorkload)}
"""The keys of a workload file (and the ``--peers-<key>`` flags) -> :class:`PeersWorkload` fields."""


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """``--peers-workload FILE`` and one ``--peers-<key>`` flag per key of :data:`WORKLOAD_KEYS`
    (absent unless typed: then the file's value, else :class:`PeersWorkload`'s)."""
    p.add_argument("--peers-workload", default="", metavar="FILE",
                   help="peers: a YAML file with the workload's keys (" + ", ".join(WORKLOAD_KEYS) + ")")  # fmt: skip
    default = PeersWorkload()
    for key, name in WORKLOAD_KEYS.items():
        kind = type(getattr(default, name))
        help_text = {"dataset": "synthetic-cifar, or cifar10 with --data-dir", "users": "users of the population",
                     "cohort": "users per central iteration",
                     "images-per-user": "images of each user, its IID share capped (0: the whole share)"}.get(key, key.replace("-", " "))  # fmt: skip
        p.add_argument(f"--peers-{key}", type=kind, default=argparse.SUPPRESS,
                       help=f"peers: {help_text} (default {getattr(default, name)})")  # fmt: skip


def _typed(key: str, value: Any, kind: type, where: str) -> Any:
    """``value`` as ``kind`` (an int for int keys, a number for float keys, text for str keys)."""
    ok = (isinstance(value, int) and not isinstance(value, bool)) if kind is int else (
        isinstance(value, (int, float)) and not isinstance(value, bool)) if kind is float else isinstance(value, str)  # fmt: skip
    if not ok:
        raise SystemExit(f"{where}: {key}={value!r}: expected {'an integer' if kind is int else 'a number' if kind is float else 'text'}")
    return kind(value)


def resolve_workload(args: argparse.Namespace) -> PeersWorkload:
    """The workload of ``args``: each ``--peers-<key>`` flag given, else the ``--peers-workload``
    file's value, else the default.

    Raises
    ------
    SystemExit
        One line naming the file, key or flag and the value: an unreadable or non-mapping file,
        an unknown key, a value of the wrong type, or a workload no system can run (fewer than
        2 users per cohort, a cohort above the users, a non-positive count or learning rate).
    """
    default = PeersWorkload()
    values: dict[str, Any] = {}
    path = getattr(args, "peers_workload", "")
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise SystemExit(f"--peers-workload {path}: cannot read it ({' '.join(str(exc).split())})") from None
        if not isinstance(loaded, dict):
            raise SystemExit(f"--peers-workload {path}: expected a mapping of {', '.join(WORKLOAD_KEYS)}")
        for key, value in loaded.items():
            if key not in WORKLOAD_KEYS:
                raise SystemExit(f"--peers-workload {path}: unknown key {key!r}; valid: {', '.join(WORKLOAD_KEYS)}")
            name = WORKLOAD_KEYS[key]
            values[name] = _typed(key, value, type(getattr(default, name)), f"--peers-workload {path}")
    for key, name in WORKLOAD_KEYS.items():
        typed = getattr(args, f"peers_{name}", None)
        if typed is not None:  # what the user typed wins over the file
            values[name] = typed
    workload = dataclasses.replace(default, **values)
    _check(workload, "the peers workload" + (f" ({path} and flags)" if path else ""))
    return workload


def _check(w: PeersWorkload, where: str) -> None:
    if w.images_per_user < 0:
        raise SystemExit(f"{where}: images-per-user={w.images_per_user}: expected >= 1 (0: each user's whole share)")
    for key in ("users", "cohort", "batch-size", "local-epochs"):
        if getattr(w, WORKLOAD_KEYS[key]) < 1:
            raise SystemExit(f"{where}: {key}={getattr(w, WORKLOAD_KEYS[key])}: expected >= 1")
    if w.cohort < 2:
        raise SystemExit(f"{where}: cohort={w.cohort}: expected >= 2 (FedAvg's min-train-nodes)")
    if w.cohort > w.users:
        raise SystemExit(f"{where}: cohort={w.cohort} above users={w.users}")
    if not (w.lr > 0 and math.isfinite(w.lr)):
        raise SystemExit(f"{where}: lr={w.lr}: expected a positive number")


def fraction_for(cohort: int, users: int) -> float:
    """``fraction-train`` whose FedAvg sample (``int(users * fraction)``) is exactly ``cohort``."""
    fraction = cohort / users
    return fraction if int(users * fraction) == cohort else (cohort + 0.5) / users


def engine_settings(w: PeersWorkload, data_dir: str, seed: int = 0) -> dict[str, Any]:
    """The engine's run settings of workload ``w`` (typed values, as a user would give them to
    ``fedul reproduce`` or ``flwr run``); ``samples-per-client`` caps each user's IID share at
    ``images-per-user`` (0: no cap)."""
    return {
        "dataset": w.dataset, "data-dir": data_dir, "model": w.model, "method": "supervised", "label-fraction": 1.0,
        "partition": "iid", "val-fraction": 0.0, "num-sets": 10, "local-optimizer": "sgd", "local-momentum": 0.0,
        "lr": w.lr, "batch-size": w.batch_size, "local-epochs": w.local_epochs, "aggregation-weights": "uniform",
        "strategy": "fedavg", "fraction-train": fraction_for(w.cohort, w.users), "min-available-nodes": w.users,
        "min-train-nodes": 2, "precision": "fp32", "seed": seed,
        **({"samples-per-client": w.images_per_user} if w.images_per_user else {}),
    }  # fmt: skip
