"""FedPU: federated learning with positive and unlabeled data.

Lin et al., "Federated Learning with Positive and Unlabeled Data", ICML 2022, Eq. 10 and
Algorithm 1.

Client k labels only part of its positive classes CP_k (the ``pu`` client setting,
:mod:`fedul_flwr.data.pu`); all its other images are unlabeled; the class prior pi is known.
It minimises a multi-class PU risk (:mod:`fedul_flwr.methods.fedpu.risk`) on one batch of its
labeled positives and one of its unlabeled images per step (Alg. 1); the server runs any
strategy (FedAvg in the paper). Only the classifier f is trained and exchanged; prediction is
argmax f(x).

Choices the paper leaves open (see :mod:`fedul_flwr.methods.fedpu.risk` for the loss):

- ``fedpu-loss`` = ``nnpu`` (default): a bounded, non-negative surrogate of Eq. 10;
  ``eq10``: Eq. 10 with the bounded surrogate 1 - s_m; ``authors``: the authors' code
  (``MPULoss_V2``; their class prior is the client's unlabeled class mix:
  ``class-prior = "client"``).
- The unlabeled stream drives the local epoch (it is the larger part on every client of the
  paper's settings); the labeled positives are cycled in batches of the same size.
- Eq. 10's third, cross-client term needs each client to know the other clients' positive
  classes; it is not computed (as in the authors' code).
"""

from __future__ import annotations

import torch
from torch import nn

from fedul_flwr.config import Option
from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import Batch, LocalTask, Method, RoundContext, Stream, register_method
from fedul_flwr.methods.fedpu.risk import PU_LOSSES, pu_loss

__all__ = ["FedPU"]


@register_method
class FedPU(Method):
    """FedPU (Lin et al., ICML 2022): a multi-class PU risk per client, any aggregation."""

    name = "fedpu"
    requires = ("labeled", "unlabeled", "positive-classes", "class-prior")
    setting = "pu"
    options = (Option("fedpu-loss", lambda v: v in PU_LOSSES, f"one of {PU_LOSSES.names()}"),)

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """Streams ``unlabeled`` (x) and ``positive`` (x, y); loss = the ``fedpu-loss`` risk of
        f's logits on both batches."""
        assert client.labeled is not None and client.unlabeled is not None  # ``requires``
        assert client.positive_classes is not None and client.class_prior is not None
        positives = torch.tensor(client.positive_classes, dtype=torch.int64, device=ctx.device)
        prior = torch.as_tensor(client.class_prior, dtype=torch.float32, device=ctx.device)
        risk = pu_loss(self.option("fedpu-loss"))

        def loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            p, u = batch["positive"], batch["unlabeled"]
            logits = models["f"](torch.cat([p["x"], u["x"]]))  # one forward: batch-norm sees both
            n_p = len(p["y"])
            return risk(logits[:n_p], p["y"], logits[n_p:], positives, prior)

        streams = {
            "unlabeled": Stream({"x": client.unlabeled}, self.cfg.batch_size),
            "positive": Stream({"x": client.labeled.x, "y": client.labeled.y}, self.cfg.batch_size),
        }
        return LocalTask(streams, loss)
