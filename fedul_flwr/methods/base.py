"""The method interface: what a learning method brings to the shared client loop.

A *method* (FedUL, later its baselines and FedPU / FedDB / HASSLE) decides

- how a client's data becomes training batches (``local_task``: inputs and targets),
- the loss of a batch (``LocalTask.loss``), possibly through fixed modules of its own
  (FedUL's transition layer Q_c) or extra models,
- which arrays leave the client (``exchanged_state``; default: f's whole state dict),
- per-client state kept across rounds (``context.state``, via ``LocalTask.state``),
- and, if it needs one, its own aggregation (``server_strategy_class``).

The local optimisation loop itself lives once, in :mod:`fedul_flwr.training`; methods
never copy it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from fedul_flwr.config import RunConfig
from fedul_flwr.data.client_data import ClientData


@dataclass
class LocalTask:
    """The training problem of one client in one round.

    Attributes
    ----------
    inputs : torch.Tensor
        ``[n, ...]`` model inputs batches are drawn from (rows).
    targets : torch.Tensor
        ``[n]`` training targets (FedUL: surrogate labels = set indices).
    loss : Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
        ``loss(model, x_batch [B, ...], y_batch [B]) -> scalar`` (mean over the batch).
    modules : dict[str, nn.Module]
        Fixed or auxiliary modules the loss uses (moved to the training device).
    state : dict[str, torch.Tensor]
        Extra per-client tensors the method keeps between rounds.
    batches : Callable[[torch.Generator], Iterable[torch.Tensor]] | None
        Optional batch order of one epoch: ``batches(generator)`` yields int64 row-index
        tensors into ``inputs`` (e.g. set-stratified batches for label-proportion losses).
        ``None`` (default): a uniform random permutation cut into batches of ``batch_size``.
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
    modules: dict[str, nn.Module] = field(default_factory=dict)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    batches: Callable[[torch.Generator], Iterable[torch.Tensor]] | None = None

    @property
    def num_examples(self) -> int:
        """n, the number of training rows."""
        return int(self.inputs.shape[0])


class Method(ABC):
    """Base class of learning methods; subclasses register a ``name``.

    ``needs_labels``: a method that trains on true labels (the supervised reference) sets it
    to True; only then does :func:`~fedul_flwr.data.client_data.load_client` fill
    ``ClientData.labels``. FedUL and the weakly supervised baselines never see labels.
    """

    name: ClassVar[str]
    needs_labels: ClassVar[bool] = False

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    @abstractmethod
    def local_task(self, client: ClientData, device: torch.device) -> LocalTask:
        """Turn a client's data into its :class:`LocalTask` (tensors stay on the CPU;
        the training loop moves batches)."""

    def exchanged_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Arrays sent to the server after local training: f's state dict (no Q_c)."""
        return model.state_dict()
