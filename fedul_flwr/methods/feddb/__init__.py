"""FedDB: debiased pseudo-labels on the clients, debiased model aggregation on the server.

Two methods live here: ``fixmatch-dpl`` (:mod:`.dpl`, FixMatch with the debiased pseudo-labels
alone, Eqs. 8, 14) and ``feddb`` (this module: DPL plus DMA, Eqs. 15-17).

Zhu et al., "Debiasing Federated Semi-Supervised Learning", IJCAI 2024, Alg. 1-3: the clients
run FixMatch with DPL (:mod:`fedul_flwr.methods.feddb.dpl`) and upload their APP-U; the
server aggregates with DMA's weights (:mod:`fedul_flwr.strategies.dma`), composed with the
run's strategy (FedAvg: Eq. 17 as written; ``strategy = "fedavgm"`` with
``server-momentum = 0.5`` and ``server-lr = 1.0``: the authors' code's server update).

Options: ``dma-loss`` (``l2``, the paper's Eq. 16; ``mse``, the authors' code), ``dma-steps``
(E_aggr = 100) and ``dma-lr`` (eta_aggr = 1.0).
"""

from __future__ import annotations

from fedul_flwr.methods.base import register_method
from fedul_flwr.methods.feddb.dpl import APP_U, FixMatchDPL
from fedul_flwr.methods.feddb.settings import DMA_OPTIONS
from fedul_flwr.strategies.dma import DebiasedModelAggregation

__all__ = ["FedDB", "FixMatchDPL"]


@register_method
class FedDB(FixMatchDPL):
    """FixMatch-DPL clients, DMA aggregation (module docstring)."""

    name = "feddb"
    recorded_metrics = FixMatchDPL.recorded_metrics + ("dma-beta", "dma-loss-uniform", "dma-loss")
    options = FixMatchDPL.options + DMA_OPTIONS

    def aggregation(self) -> type | None:
        """:class:`~fedul_flwr.strategies.dma.DebiasedModelAggregation` with this run's options."""
        settings = {"app_u_key": APP_U, "dma_loss": self.option("dma-loss"), "dma_steps": self.option("dma-steps"),
                    "dma_lr": float(self.option("dma-lr"))}  # fmt: skip
        return type("DebiasedModelAggregation", (DebiasedModelAggregation,), settings)
