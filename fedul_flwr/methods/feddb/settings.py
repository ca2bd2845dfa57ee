"""The run-config keys of this folder's methods: FixMatch-DPL's APP-U (``dpl-*``) and FedDB's DMA
(``dma-*``), with their defaults, rules and meaning; both read FixMatch's keys too."""

from __future__ import annotations

from fedul_flwr.config import Option
from fedul_flwr.strategies.dma import DMA_LOSSES

__all__ = ["DMA_OPTIONS", "DPL_OPTIONS", "DPL_PLUGIN_OPTIONS", "DPL_SWITCH", "OPTIONS"]


DPL_OPTIONS: tuple[Option, ...] = (
    Option("dpl-ema", 0.5, "gamma of APP-U's moving average (the authors' code's value; the paper gives none)",
           check=lambda v: 0.0 <= v < 1.0, rule="in [0, 1)"),
    Option("dpl-app-u-update", "epoch", "APP-U update: `epoch` (paper, Alg. 3: over all unlabeled images before each "
           "local epoch's update) or `step` (authors' code: per step, confident images of the batch)",
           choices=("epoch", "step"), rule="'epoch' (paper) or 'step' (authors' code)"),
)
"""FixMatch-DPL's own keys (FedDB reads them too)."""
DPL_SWITCH = Option("dpl", False, "FedDB's debiased pseudo-labels on this method's own pseudo-labels (the X-FedDPL rows of "
           "FedDB's Tables 1-3): APP-U from the received model, updated before each local epoch (`dpl-ema`), the "
           "threshold on the debiased posterior, `app-u` uploaded",
           check=lambda v: isinstance(v, bool), rule="true or false")
"""The plug-in's switch, declared here (the plug-in is FedDB's), read by every method that lists it."""
DPL_PLUGIN_OPTIONS: tuple[Option, ...] = (DPL_SWITCH, DPL_OPTIONS[0])
"""The plug-in's keys (:class:`fedul_flwr.methods.feddb.debias.DebiasedPseudoLabels`), in the options
of every method that pseudo-labels."""
DMA_OPTIONS: tuple[Option, ...] = (
    Option("dma-loss", "l2", "DMA's loss, `l2` (paper, Eq. 16) or `mse` (authors' code)",
           choices=DMA_LOSSES),
    Option("dma-steps", 100, "DMA's gradient steps E_aggr",
           check=lambda v: isinstance(v, int) and v >= 0, rule="an integer >= 0"),
    Option("dma-lr", 1.0, "DMA's step size eta_aggr",
           check=lambda v: v > 0, rule="> 0"),
)
"""FedDB's own keys (its debiased model aggregation)."""
OPTIONS = DPL_OPTIONS + DMA_OPTIONS + (DPL_SWITCH,)
