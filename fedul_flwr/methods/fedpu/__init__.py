"""FedPU: federated learning with positive and unlabeled data.

Lin et al., "Federated Learning with Positive and Unlabeled Data", ICML 2022, Eq. 10 and
Algorithm 1.

Client k labels only part of its positive classes CP_k (the ``pu`` client setting,
:mod:`fedul_flwr.data.pu`); all its other images are unlabeled; the class prior pi is known.
It minimises a multi-class PU risk (:mod:`fedul_flwr.methods.fedpu.risk`) on one batch of its
labeled positives and one of its unlabeled images per step (Alg. 1); the server runs any
strategy (FedAvg in the paper). Only the classifier f is trained and exchanged; prediction is
argmax f(x).

**Aggregation weights**: a client's reply counts n_k = |P_k| + |U_k|, all its images (Alg. 1,
line 7: w <- sum_k (n_k / n) w^k), where the shared loop would count the unlabeled stream
that drives the epoch (|U_k|) alone. The authors' code averages uniformly (every client
weighs the same 500 in ``roles/aggregator.py``): ``aggregation-weights = "uniform"``.

Choices the paper leaves open (see :mod:`fedul_flwr.methods.fedpu.risk` for the loss):

- ``fedpu-loss`` = ``nnpu`` (default): a sum of one-vs-rest binary nnPU risks. It is not
  Eq. 10: under the 0-1 loss it is Eq. 10 plus a term that penalises predicting another
  positive class for a labeled image (not a constant once a client has two or more positive
  classes). ``eq10-nn``: Eq. 10 itself with the cross-entropy surrogate, each negative class's
  corrected risk clamped at 0 (nnPU-style); it measured lower than ``nnpu`` here
  (docs/fedpu.md), hence the default. ``upu``: ``nnpu`` unclamped; ``eq10``: Eq. 10 with the
  bounded surrogate 1 - s_m; ``authors``: the authors' code (``MPULoss_V2``; their class
  prior is the client's unlabeled class mix: ``class-prior = "client"``).
- The unlabeled stream drives the local epoch (it is the larger part on every client of the
  paper's settings); the labeled positives are cycled in batches of the same size.
- Eq. 10's third, cross-client term needs each client to know the other clients' positive
  classes. Off by default (as in the authors' code); ``fedpu-cross-client = true`` has the
  server ask every node for its positive classes and broadcast them
  (:mod:`fedul_flwr.methods.fedpu.broadcast`, which says what that reveals), and each client
  adds the term (:func:`~fedul_flwr.methods.fedpu.risk.cross_client_term`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import Batch, LocalTask, Method, RoundContext, Stream, register_method
from fedul_flwr.methods.fedpu.broadcast import ANNOUNCED, BROADCAST, PositiveClassBroadcast, parse_sets
from fedul_flwr.methods.fedpu.risk import cross_client_term, cross_client_weights, pu_loss
from fedul_flwr.methods.fedpu.settings import OPTIONS

if TYPE_CHECKING:  # pragma: no cover
    from fedul_flwr.training import LocalLoop, TrainResult

__all__ = ["FedPU", "aggregation_weight"]


def aggregation_weight(client: ClientData) -> int:
    """n_k = |P_k| + |U_k| of Alg. 1, line 7: the client's labeled positives and unlabeled
    images (0 for a part it lacks)."""
    return sum(len(part) for part in (client.labeled, client.unlabeled) if part is not None)


@register_method
class FedPU(Method):
    """FedPU (Lin et al., ICML 2022): a multi-class PU risk per client, any aggregation."""

    name = "fedpu"
    requires = ("labeled", "unlabeled", "positive-classes", "class-prior")
    setting = "pu"
    options = OPTIONS

    def announce(self, client: ClientData) -> dict[str, float | list[float]]:
        """The client's positive classes as a K-vector indicator (asked for only under
        ``fedpu-cross-client``)."""
        assert client.positive_classes is not None  # ``requires``
        return {ANNOUNCED: [float(c in client.positive_classes) for c in range(client.num_classes)]}

    def aggregation(self) -> type | None:
        """The positive-class broadcast under ``fedpu-cross-client``; else the strategy as it is."""
        return PositiveClassBroadcast if self.option("fedpu-cross-client") else None

    def local_update(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext, loop: LocalLoop) -> TrainResult:
        """The shared loop on :meth:`local_task`; the reply counts n_k = |P_k| + |U_k|
        (:func:`aggregation_weight`), not the rows of the stream that drives the epoch."""
        result = super().local_update(client, models, ctx, loop)
        return dataclasses.replace(result, num_examples=aggregation_weight(client))

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """Streams ``unlabeled`` (x) and ``positive`` (x, y); loss = the ``fedpu-loss`` risk of
        f's logits on both batches."""
        assert client.labeled is not None and client.unlabeled is not None  # ``requires``
        assert client.positive_classes is not None and client.class_prior is not None
        positives = torch.tensor(client.positive_classes, dtype=torch.int64, device=ctx.device)
        prior = torch.as_tensor(client.class_prior, dtype=torch.float32, device=ctx.device)
        name = self.option("fedpu-loss")
        risk = pu_loss(name)
        weights = self._cross_client_weights(client, ctx)

        def loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            p, u = batch["positive"], batch["unlabeled"]
            logits = models["f"](torch.cat([p["x"], u["x"]]))  # one forward: batch-norm sees both
            n_p = len(p["y"])
            value = risk(logits[:n_p], p["y"], logits[n_p:], positives, prior)
            if weights is not None:
                value = value + cross_client_term(logits[:n_p], p["y"], weights, prior, literal=name == "eq10")
            return value

        streams = {
            "unlabeled": Stream({"x": client.unlabeled}, self.cfg.batch_size),
            "positive": Stream({"x": client.labeled.x, "y": client.labeled.y}, self.cfg.batch_size),
        }
        return LocalTask(streams, loss)

    def _cross_client_weights(self, client: ClientData, ctx: RoundContext) -> torch.Tensor | None:
        """W [K, K] of the cross-client term from the broadcast sets (own set removed once),
        on the device; None when the switch is off.

        Raises
        ------
        ValueError
            If the switch is on but the train config carries no broadcast sets, or not this
            client's own set (a strategy that does not compose the broadcast).
        """
        if not self.option("fedpu-cross-client"):
            return None
        if BROADCAST not in ctx.broadcast:
            raise ValueError(f"fedpu-cross-client=true but the train config carries no '{BROADCAST}'")
        sets = parse_sets(ctx.broadcast[BROADCAST])
        own = tuple(sorted(client.positive_classes or ()))
        if own not in sets:
            raise ValueError(f"'{BROADCAST}' lacks this client's own positive classes {list(own)}")
        sets.remove(own)
        return cross_client_weights(own, sets, client.num_classes).to(ctx.device)
