"""Debiased model aggregation (DMA) of FedDB.

Zhu et al., "Debiasing Federated Semi-Supervised Learning", IJCAI 2024, Sec. 4.2, Alg. 2,
Eqs. 15-17. Each sampled client m uploads its average prediction on unlabeled data (APP-U,
pbar_m, a K-vector; :mod:`fedul_flwr.methods.feddb.dpl`); the server looks for aggregation
weights beta whose mixture of the APP-Us is closest to the uniform class distribution and
averages the models with them, instead of FedAvg's data-size weights.

:class:`DebiasedModelAggregation` is a mixin for any Flower strategy (it only replaces each
reply's weight by beta_m, so the strategy still does the arithmetic: FedAvg gives Eq. 17,
FedAvgM with ``server-momentum = 0.5`` the authors' code's server update);
:class:`FedDMA` is it on FedAvg. APP-U travels as a metric list, never the data.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from logging import INFO
from typing import ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import FedAvg

from fedul_flwr import wire
from fedul_flwr.strategies.contract import Combining, Contract

__all__ = ["DMA_LOSSES", "DebiasedModelAggregation", "FedDMA", "dma_weights"]

DMA_LOSSES = ("l2", "mse")
"""``l2``: ||p_aggr - u||_2 (the paper, Eq. 16); ``mse``: mean_k (p_aggr[k] - 1/K)^2 (the authors' code)."""


def dma_weights(app_u: np.ndarray, *, loss: str = "l2", steps: int = 100, lr: float = 1.0) -> tuple[np.ndarray, float, float]:
    """The aggregation weights beta of DMA (Alg. 2).

    Starting from beta_m = 1/S, ``steps`` times:

        p_aggr = sum_m beta_m pbar_m,                                  (Eq. 15)
        L_aggr = || p_aggr - (1/K) 1 ||_2        (``l2``; ``mse``: mean of squares), (Eq. 16)
        beta <- softmax(beta - lr * dL_aggr / dbeta).

    Parameters
    ----------
    app_u : np.ndarray
        ``[S, K]``: the APP-U of each of the S sampled clients (rows are distributions).
    loss : str
        One of :data:`DMA_LOSSES`.
    steps : int
        E_aggr >= 0 (paper: 100).
    lr : float
        eta_aggr > 0 (paper: 1.0).

    Returns
    -------
    (np.ndarray, float, float)
        beta ``[S]`` (sums to 1), and L_aggr at uniform weights and at beta.

    Raises
    ------
    ValueError
        On a malformed ``app_u`` (not 2-D, non-finite, negative) or an unknown loss.
    """
    p = np.asarray(app_u, dtype=np.float64)
    if p.ndim != 2 or not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError(f"APP-U must be an [S, K] array of non-negative numbers, got shape {p.shape}")
    if loss not in DMA_LOSSES:
        raise ValueError(f"dma-loss={loss!r} is not one of {DMA_LOSSES}")
    target = torch.full((p.shape[1],), 1.0 / p.shape[1], dtype=torch.float64)
    vectors = torch.from_numpy(p)

    def objective(beta: torch.Tensor) -> torch.Tensor:
        gap = beta @ vectors - target
        return torch.sqrt((gap**2).sum()) if loss == "l2" else (gap**2).mean()

    beta = torch.full((p.shape[0],), 1.0 / p.shape[0], dtype=torch.float64)
    start = float(objective(beta))
    for _ in range(steps):
        beta.requires_grad_(True)
        value = objective(beta)
        if float(value.detach()) == 0.0:  # exactly uniform already: the L2 norm has no gradient here
            beta = beta.detach()
            break
        (grad,) = torch.autograd.grad(value, beta)
        beta = torch.softmax(beta.detach() - lr * grad, dim=0)
    return beta.detach().numpy(), start, float(objective(beta.detach()))


class DebiasedModelAggregation:
    """Mixin for Flower strategies: DMA's weights beta for the replies (module docstring).

    Attributes
    ----------
    app_u_key : str
        The reply metric holding APP-U.
    dma_loss : str
        One of :data:`DMA_LOSSES`.
    dma_steps : int
        E_aggr.
    dma_lr : float
        eta_aggr.
    """

    app_u_key: ClassVar[str] = "app-u"
    dma_loss: ClassVar[str] = "l2"
    dma_steps: ClassVar[int] = 100
    dma_lr: ClassVar[float] = 1.0
    contract: ClassVar[Contract] = Contract(
        Combining.REWEIGHTED, "feddb's debiased model aggregation replaces each client's weight by its beta_m",
        refuses=(Combining.ROBUST_SELECTION,),
    )
    """Reweighted (:mod:`fedul_flwr.strategies.contract`): beta_m depends on every client's APP-U.
    The robust strategies, which ignore the replies' weights and would drop DMA silently, are
    refused."""

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The strategy's aggregation with each reply weighted by beta_m; the metrics gain
        ``dma-beta`` (beta in reply order), ``dma-loss-uniform`` and ``dma-loss``. Replies
        without a model (clients that sat the round out) are left out.

        Raises
        ------
        InconsistentMessageReplies
            If a successful reply lacks APP-U or the APP-Us differ in length.
        """
        ok = [r for r in replies if not r.has_error() and len(r.content[wire.ARRAYS])]  # not clients that sat out
        if not ok:
            return None, None  # the global model stays
        vectors = []
        for reply in ok:
            value = reply.content[wire.METRICS].get(self.app_u_key)
            if not isinstance(value, list):
                raise InconsistentMessageReplies(reason=f"node {reply.metadata.src_node_id} sent no '{self.app_u_key}'")
            vectors.append(value)
        if len({len(v) for v in vectors}) != 1:
            raise InconsistentMessageReplies(reason=f"'{self.app_u_key}' vectors differ in length: {[len(v) for v in vectors]}")
        beta, start, end = dma_weights(np.array(vectors), loss=self.dma_loss, steps=self.dma_steps, lr=self.dma_lr)
        log(INFO, "DMA round %d: beta = %s (L_aggr %.4f at uniform weights, %.4f at beta)", server_round,
            np.round(beta, 4).tolist(), start, end)  # fmt: skip
        key = self.weighted_by_key  # type: ignore[attr-defined]
        views = []
        for reply, weight in zip(ok, beta, strict=True):
            records = RecordDict({name: record for name, record in reply.content.items()})
            records[wire.METRICS] = MetricRecord({**reply.content[wire.METRICS], key: float(weight)})
            view = copy.copy(reply)
            view.content = records
            views.append(view)
        arrays, metrics = super().aggregate_train(server_round, views)  # type: ignore[misc]
        if metrics is not None:
            metrics["dma-beta"] = [float(b) for b in beta]
            metrics["dma-loss-uniform"], metrics["dma-loss"] = start, end
        return arrays, metrics


class FedDMA(DebiasedModelAggregation, FedAvg):
    """FedAvg with DMA's weights (Zhu et al., IJCAI 2024, Alg. 2):

    .. math::

        p_{aggr} = \\sum_{m \\in S_t} \\beta_m \\bar p_m, \\qquad                 (15)
        L_{aggr} = \\lVert p_{aggr} - \\tfrac{1}{K}\\mathbf{1} \\rVert_2, \\qquad (16)
        w^{t+1} = \\sum_{m \\in S_t} \\beta_m w_m^t,                             (17)

    with beta found by ``dma_steps`` gradient steps of size ``dma_lr`` on L_aggr from
    uniform weights, each followed by a softmax. The replies' metrics must carry APP-U under
    ``app-u`` (:data:`DebiasedModelAggregation.app_u_key`).
    """
