"""An exponential moving average (EMA) of the global weights, for evaluation (``ema-decay``).

FixMatch (Sohn et al., NeurIPS 2020, Sec. 4 and App. B.1) and its reference code (USB,
kekmodel's FixMatch-pytorch) evaluate an EMA of the model's weights with decay 0.999 per
optimiser step, not the trained weights themselves. In federated learning the server only sees
the global weights once per round, so this average runs per server round:

    EMA_0 = w_0,    EMA_r = d * EMA_{r-1} + (1 - d) * w_r,

with w_r the global weights after round r and d = ``ema-decay``
(:func:`torch.optim.swa_utils.get_ema_multi_avg_fn` inside
:class:`torch.optim.swa_utils.AveragedModel`). Buffers (batch-norm statistics) are copied
from w_r, as kekmodel's ``ModelEMA`` does. The clients always train from w_r; only the
central evaluation (and the saved final models) use the EMA. A per-step decay d_s of a run
whose clients take S steps a round corresponds to d = d_s ** S (the ``fixmatch`` preset's
0.999 ** 16 for its 16 steps a round); the server cannot weight the steps inside a round.
The average is part of the run's checkpoint, so a resumed run continues it exactly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

__all__ = ["WeightEMA"]


class WeightEMA:
    """The per-round EMA of a method's global models (module doc).

    Parameters
    ----------
    models : nn.ModuleDict
        The global models (copied: the EMA lives beside them, on their device).
    decay : float
        d in [0, 1).
    """

    def __init__(self, models: nn.ModuleDict, decay: float) -> None:
        self.decay = decay
        self.averaged = AveragedModel(models, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=False)

    @property
    def models(self) -> nn.ModuleDict:
        """The averaged models (evaluate these)."""
        return self.averaged.module  # type: ignore[return-value]

    @property
    def rounds(self) -> int:
        """How many global weights the average has seen (w_0 included)."""
        return int(self.averaged.n_averaged)

    @torch.no_grad()
    def update(self, models: nn.ModuleDict) -> None:
        """Fold the global weights ``models`` (w_r) in; the first call copies them (EMA_0 = w_0)."""
        self.averaged.update_parameters(models)
        for mine, theirs in zip(self.averaged.module.buffers(), models.buffers(), strict=True):
            mine.copy_(theirs)

    def state_dict(self) -> dict[str, Any]:
        """The average and its count, for the checkpoint (CPU tensors)."""
        return {k: v.detach().cpu() for k, v in self.averaged.state_dict().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`."""
        self.averaged.load_state_dict(state)
