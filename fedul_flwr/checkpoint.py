"""Server checkpoints: the global model f and the round it belongs to, written every round,
so that a stopped or crashed ServerApp can be resumed (run setting ``resume=true``).

``<run folder>/checkpoint.pt`` holds ``{"round": r, "state_dict": f after round r,
"config": the run's dashed-key settings}``. It is replaced atomically (write to a temporary
file, then ``os.replace``), so a crash while writing leaves the previous checkpoint intact.

What a checkpoint restores, and what it cannot: FedUL clients re-create their optimiser
every round and derive their randomness from (seed, round, node), and FedAvg-type servers
keep no state between rounds besides f; for those strategies
(:data:`RESUMABLE_STRATEGIES`) a resumed run ends with exactly the weights of an
uninterrupted one (``tests/test_checkpoint.py``). Strategies with server or client state
across rounds (server momentum / adaptive moments, SCAFFOLD's control variates) are refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["CHECKPOINT_FILE", "RESUMABLE_STRATEGIES", "Checkpoint", "CheckpointError", "load_checkpoint", "save_checkpoint"]

CHECKPOINT_FILE = "checkpoint.pt"
RESUMABLE_STRATEGIES: tuple[str, ...] = ("fedavg", "fedprox", "fednova")
"""Strategies whose whole cross-round state is the global model (see the module doc)."""


class CheckpointError(RuntimeError):
    """No usable checkpoint where ``resume=true`` expects one; the message names the file."""


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint.

    Attributes
    ----------
    round : int
        Last completed server round r (>= 1).
    state_dict : dict[str, torch.Tensor]
        f's weights after round r (CPU tensors).
    config : dict[str, Any]
        The run settings of the run that wrote it.
    """

    round: int
    state_dict: dict[str, torch.Tensor]
    config: dict[str, Any]


def save_checkpoint(run_dir: str | Path, server_round: int, state_dict: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    """Atomically write ``<run_dir>/checkpoint.pt`` for ``server_round``; returns its path."""
    path = Path(run_dir) / CHECKPOINT_FILE
    tmp = path.with_suffix(".pt.tmp")
    payload = {"round": int(server_round), "state_dict": {k: v.detach().cpu() for k, v in state_dict.items()}, "config": config}
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(run_dir: str | Path) -> Checkpoint:
    """Read ``<run_dir>/checkpoint.pt``.

    Raises
    ------
    CheckpointError
        If the file is missing or unreadable.
    """
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.is_file():
        raise CheckpointError(f"resume=true but {path} does not exist (no round of this run has finished yet?)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        return Checkpoint(int(payload["round"]), dict(payload["state_dict"]), dict(payload["config"]))
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint ({exc})") from exc
