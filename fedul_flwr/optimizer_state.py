"""Local optimiser state that a client keeps from one of its rounds to the next
(``local-optimizer-state = "kept"``).

FedDB's code (Zhu et al., IJCAI 2024) keeps each client's SGD optimiser -- its momentum
buffers -- between the rounds the client trains in, where this project (and the FedUL and
FedPU papers' code) creates a fresh optimiser every round. A Flower ClientApp is stateless:
a deployed SuperNode may start a new process for every message, and a killed node loses its
``context.state``. So the state travels with the messages: the server keeps each client's
state, keyed by its stable node key, sends it in that client's next train message (record
``"optimizer-state"``), and the client loads it into its fresh optimiser, trains, and replies
with the new state (:mod:`fedul_flwr.strategies.kept_state`). The server's checkpoint holds
every client's state, so a run resumed after a kill continues each client's optimiser exactly
where the uninterrupted run would have.

The state of one optimiser is keyed by the models it trains (a method such as HASSLE trains
several optimisers a round, one per phase, each with its own state): array
``"<models>/<parameter index>/<state name>"``, e.g. ``"f/0/momentum_buffer"`` for SGD's
buffer of f's first parameter, ``"w_S+w_U/3/exp_avg"`` for Adam's. Tensors travel
contiguous, in the parameters' dtype; a parameter with no state (a first round) has no entry.
The step size and the other settings come from the run configuration every round, never
from the record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from flwr.app import ArrayRecord
from torch import nn

from fedul_flwr import wire

__all__ = ["OptimizerStates"]


class OptimizerStates:
    """The local optimiser states of one client, by the models each optimiser trains.

    Parameters
    ----------
    tensors : Mapping[str, torch.Tensor] | None
        Flat state, keyed ``"<models>/<parameter index>/<state name>"`` (module doc); ``None``
        or empty: no state yet (every optimiser starts fresh).
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor] | None = None) -> None:
        self.tensors: dict[str, torch.Tensor] = dict(tensors or {})

    @classmethod
    def from_record(cls, record: ArrayRecord | None) -> OptimizerStates:
        """The states a train message carries (``None``: none)."""
        with wire.decoding():
            return cls(record.to_torch_state_dict() if record is not None and len(record) else None)

    def to_record(self) -> ArrayRecord:
        """The states as the reply's ArrayRecord (CPU tensors)."""
        return ArrayRecord({k: v.detach().cpu().contiguous() for k, v in sorted(self.tensors.items())})

    def load(self, group: Sequence[str], optimizer: torch.optim.Optimizer, params: Sequence[nn.Parameter]) -> int:
        """Put the saved state of the optimiser of models ``group`` into ``optimizer`` (fresh,
        over ``params`` in the same order as when it was saved); returns how many parameters
        got a state. Buffers shaped like their parameter take its memory format (the loop may
        train channels-last).

        Raises
        ------
        ValueError
            If a saved tensor names a parameter index beyond ``params`` or has another shape
            than its parameter's state would (a state of another model).
        """
        prefix = "+".join(group) + "/"
        fused = any(g.get("fused") for g in optimizer.param_groups)  # fused kernels keep Adam's step on the device
        per_param: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in self.tensors.items():
            if not key.startswith(prefix):
                continue
            index, name = key[len(prefix) :].split("/", 1)
            per_param.setdefault(int(index), {})[name] = value
        for index, state in per_param.items():
            if index >= len(params):
                raise ValueError(f"optimizer state {prefix}{index}: the models {list(group)} have {len(params)} parameters")
            p = params[index]
            loaded = {}
            for name, value in state.items():
                if value.dim() and value.shape != p.shape:
                    raise ValueError(f"optimizer state {prefix}{index}/{name} has shape {tuple(value.shape)}, its "
                                     f"parameter {tuple(p.shape)}")  # fmt: skip
                if value.dim():
                    loaded[name] = torch.empty_like(p).copy_(value)
                else:  # Adam's step: where the optimiser keeps it
                    loaded[name] = value.to(p.device if fused else "cpu", torch.float32)
            optimizer.state[p] = loaded
        return len(per_param)

    def save(self, group: Sequence[str], optimizer: torch.optim.Optimizer, params: Sequence[nn.Parameter]) -> None:
        """Replace the state of models ``group`` with ``optimizer``'s (after training)."""
        prefix = "+".join(group) + "/"
        self.tensors = {k: v for k, v in self.tensors.items() if not k.startswith(prefix)}
        for index, p in enumerate(params):
            for name, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    self.tensors[f"{prefix}{index}/{name}"] = value.detach().cpu().contiguous()
