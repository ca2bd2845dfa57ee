"""Server checkpoints: the global model f, the round it belongs to and the server strategy's
state, written every round, so that a stopped or crashed ServerApp can be resumed (run
setting ``resume=true``).

``<run folder>/checkpoint.pt`` holds ``{"round": r, "state_dict": the global arrays of f
after round r, as the strategy holds them (dtype included),
"config": the run's dashed-key settings, "strategy_state": the strategy's cross-round
arrays, "ema_state", "num_nodes", "node_draws": "rng-streams"}``. No generator state is saved:
who trains and who evaluates in round r + 1 is drawn from streams of (seed, round)
(:mod:`fedul_flwr.strategies.participation`), so a resumed run with ``fraction-train < 1``
picks the clients an uninterrupted one does; ``node_draws`` says the checkpoint's rounds drew
their nodes so. Older checkpoints, whose rounds drew from Python's global ``random``, lack it
(and may hold that generator's state, ``"random_state"``, which is read past and ignored).
The file is replaced atomically and durably (:func:`fedul_flwr.store.write_atomic`), so a
crash or a power cut while writing leaves the previous checkpoint intact.

What a checkpoint restores, and what it cannot: FedUL clients re-create their optimiser
every round (or, with ``local-optimizer-state = "kept"``, get back the state the server keeps
for them, part of the strategy's state here) and derive their randomness from (seed, round,
node); the EMA of the global weights (``ema-decay``) is saved beside them; FedAvg, FedProx and
FedNova servers keep nothing between rounds besides f; FedAvgM keeps its momentum and
FedAdam / FedYogi / FedAdagrad their moments m_t, v_t (Reddi et al., ICLR 2021), which
:func:`strategy_state` saves and :func:`restore_strategy_state` puts back. For these
strategies (:data:`RESUMABLE_STRATEGIES`) a resumed run ends with exactly the weights of an
uninterrupted one (``tests/test_checkpoint.py``). SCAFFOLD is refused: its client control
variates c_i live in the clients' state, which a server checkpoint cannot hold. A method's
aggregation mixin adds its cross-round state through ``checkpoint_attributes`` (FedMatch's
kept psi and embeddings, so a resumed run sends the same helpers). A method's models kept on
the nodes (``ModelSpec.kept``: RSCFed's mean teachers) live in the nodes' states, which a
resumed run (a new Flower run) does not have: they start anew after a resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord

from fedul_flwr.store import DamagedFile, read_with, write_atomic

__all__ = [
    "CHECKPOINT_FILE",
    "NODE_DRAWS",
    "RESUMABLE_STRATEGIES",
    "STRATEGY_STATE_ATTRIBUTES",
    "Checkpoint",
    "CheckpointError",
    "CheckpointMissing",
    "load_checkpoint",
    "restore_strategy_state",
    "save_checkpoint",
    "strategy_state",
]

CHECKPOINT_FILE = "checkpoint.pt"
RESUMABLE_STRATEGIES: tuple[str, ...] = (
    "fedavg", "fedprox", "fednova", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedmedian", "fedtrimmedavg"
)  # fmt: skip
"""Strategies whose whole cross-round state is on the server (see the module doc)."""
NODE_DRAWS = "rng-streams"
"""A checkpoint's ``node_draws`` since the rounds draw their nodes from the run's streams."""
STRATEGY_STATE_ATTRIBUTES: tuple[str, ...] = ("current_arrays", "momentum_vector", "m_t", "v_t", "client_states")
"""Attributes of Flower's FedAvgM (``current_arrays``, ``momentum_vector``) and FedOpt
strategies (``current_arrays``, ``m_t``, ``v_t``) that carry state from round to round, and
the clients' kept optimiser states (``client_states``,
:class:`~fedul_flwr.strategies.kept_state.KeptOptimizerStates`). A method's aggregation mixin
adds its own in ``checkpoint_attributes`` (FedMatch's kept psi and embeddings,
:class:`~fedul_flwr.methods.fedmatch.helpers.FedMatchAggregation`): an ArrayRecord, a dict of
ArrayRecords or of numpy arrays keyed by strings, or a list of numpy arrays."""


class CheckpointError(RuntimeError):
    """No usable checkpoint where ``resume=true`` expects one; the message names the file."""


class CheckpointMissing(CheckpointError):
    """The run folder holds no checkpoint (no round of the run has finished)."""


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint.

    Attributes
    ----------
    round : int
        Last completed server round r (>= 1).
    state_dict : dict[str, torch.Tensor]
        The global arrays of f after round r (CPU tensors, in the dtype the strategy held them).
    config : dict[str, Any]
        The run settings of the run that wrote it.
    strategy_state : dict[str, Any]
        The strategy's cross-round arrays (:func:`strategy_state`); empty for stateless ones.
    ema_state : dict[str, torch.Tensor] | None
        The EMA of the global weights after round r (``ema-decay > 0``,
        :class:`fedul_flwr.ema.WeightEMA`); None without one.
    num_nodes : int | None
        The nodes the run's rounds sampled from (a simulation's ``num-supernodes``); None in
        checkpoints written before it was saved.
    node_draws : str | None
        ``"rng-streams"``: the rounds drew their nodes from the streams of (seed, round)
        (:data:`NODE_DRAWS`); None in older checkpoints, whose rounds drew from Python's
        ``random`` (continued now, they would not train the cohorts of an uninterrupted run).
    server_data : str | None
        The SHA-256 of the server's labeled images the run trained on (the labels-at-server
        setting, :func:`fedul_flwr.resume.server_data_digest`); None without them, or in older
        checkpoints.
    """

    round: int
    state_dict: dict[str, torch.Tensor]
    config: dict[str, Any]
    strategy_state: dict[str, Any] = field(default_factory=dict)
    ema_state: dict[str, torch.Tensor] | None = None
    num_nodes: int | None = None
    node_draws: str | None = None
    server_data: str | None = None


def _tensors(value: Any) -> dict[str, Any]:
    """An ArrayRecord, a dict or a list of numpy arrays as tensors, with its kind."""
    if isinstance(value, ArrayRecord):
        return {"kind": "arrayrecord", "items": dict(value.to_torch_state_dict())}
    if isinstance(value, dict) and value and all(isinstance(v, ArrayRecord) for v in value.values()):
        return {"kind": "arrayrecords", "items": {k: dict(v.to_torch_state_dict()) for k, v in value.items()}}
    if isinstance(value, dict):
        return {"kind": "dict", "items": {k: torch.from_numpy(np.array(v, copy=True)) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {"kind": "list", "items": [torch.from_numpy(np.array(v, copy=True)) for v in value]}
    raise TypeError(f"cannot checkpoint strategy state of type {type(value).__name__}")


def _arrays(saved: dict[str, Any]) -> Any:
    """Inverse of :func:`_tensors`."""
    items = saved["items"]
    if saved["kind"] == "arrayrecord":
        return ArrayRecord(items)
    if saved["kind"] == "arrayrecords":
        return {k: ArrayRecord(v) for k, v in items.items()}
    if saved["kind"] == "dict":
        return {k: v.numpy() for k, v in items.items()}
    return [v.numpy() for v in items]


def strategy_state(strategy: object) -> dict[str, Any]:
    """The strategy's cross-round state (:data:`STRATEGY_STATE_ATTRIBUTES` and the attributes
    a method's aggregation mixin names in its ``checkpoint_attributes``, those that are set) as
    tensors, bit-exact, loadable with ``torch.load(weights_only=True)``."""
    names = (*STRATEGY_STATE_ATTRIBUTES, *getattr(strategy, "checkpoint_attributes", ()))
    return {
        name: _tensors(getattr(strategy, name))
        for name in names
        if getattr(strategy, name, None) is not None and (not isinstance(getattr(strategy, name), dict) or getattr(strategy, name))
    }


def restore_strategy_state(strategy: object, state: dict[str, Any]) -> None:
    """Put a state saved by :func:`strategy_state` back into ``strategy`` (same strategy class).

    Raises
    ------
    CheckpointError
        If the state names an attribute the strategy does not have.
    """
    for name, saved in state.items():
        if not hasattr(strategy, name):
            raise CheckpointError(f"checkpoint holds strategy state {name!r}, which {type(strategy).__name__} does not have")
        setattr(strategy, name, _arrays(saved))


def save_checkpoint(
    run_dir: str | Path,
    server_round: int,
    state_dict: dict[str, torch.Tensor],
    config: dict[str, Any],
    strategy: object | None = None,
    ema_state: dict[str, torch.Tensor] | None = None,
    num_nodes: int | None = None,
    server_data: str | None = None,
) -> Path:
    """Atomically write ``<run_dir>/checkpoint.pt`` for ``server_round`` (f's ``state_dict``,
    the run ``config``, if given ``strategy``'s cross-round state, the EMA of the global
    weights and the digest of the server's labeled images, :attr:`Checkpoint.server_data`);
    returns its path."""
    path = Path(run_dir) / CHECKPOINT_FILE
    payload = {
        "round": int(server_round),
        "state_dict": {k: v.detach().cpu() for k, v in state_dict.items()},
        "config": config,
        "strategy_state": strategy_state(strategy) if strategy is not None else {},
        "ema_state": ema_state,
        "num_nodes": num_nodes,
        "node_draws": NODE_DRAWS,
        "server_data": server_data,
    }
    return write_atomic(path, lambda fh: torch.save(payload, fh))


def load_checkpoint(run_dir: str | Path) -> Checkpoint:
    """Read ``<run_dir>/checkpoint.pt``, every tensor onto the CPU (``map_location``) whatever
    device wrote it: the ServerApp moves the weights to its own device, so a run stopped on a
    GPU continues on a CPU and back (the strategy's state is held as CPU arrays).

    Raises
    ------
    CheckpointMissing
        If the file is missing.
    CheckpointError
        If it is unreadable: empty, cut short, not a checkpoint (one line naming the file;
        read through :func:`fedul_flwr.store.read_with`).
    """
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.is_file():
        raise CheckpointMissing(f"resume=true but {path} does not exist (no round of this run has finished yet?)")
    try:
        payload = read_with(path, lambda fh: torch.load(fh, map_location="cpu", weights_only=True))
        return Checkpoint(
            int(payload["round"]), dict(payload["state_dict"]), dict(payload["config"]), dict(payload.get("strategy_state", {})),
            payload.get("ema_state"), payload.get("num_nodes"), payload.get("node_draws"),  # an older "random_state": unused
            payload.get("server_data"),
        )
    except DamagedFile as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint ({exc.reason})") from exc
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
        reason = " ".join(str(exc).split())
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(exc).__name__}: {reason})") from exc
