"""FedUL: federated learning from unlabeled sets with known class priors.

Lu, Wang, Li, Niu, Dou, Sugiyama, "Federated Learning from Only Unlabeled Data with
Class-Conditional-Sharing Clients", ICLR 2022, Algorithm 1.

Client c labels every image of U set m with the surrogate label ybar = m, wraps the shared
classifier f in its fixed transition layer Q_c (Theorem 1, Eq. 8) and minimises the
cross-entropy of the surrogate posterior (App. C.4):

    J_c(f) = E_(x, ybar) [ -log Q_c(softmax f(x))[ybar] ].

Only f is trained and exchanged; any supervised aggregation works on top (FedAvg by
default). Prediction is argmax f(x). Options: ``loss`` (a name of
:data:`fedul_flwr.methods.fedul.transition.LOSSES`): ``nll`` (the paper) or ``ce-prob`` (the authors'
code: cross-entropy applied to the probabilities Q_c); ``test-prior`` (pi of Q_c) is a run
setting parsed with the configuration.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import Batch, LocalTask, Method, RoundContext, Stream, register_method
from fedul_flwr.methods.fedul.settings import OPTIONS
from fedul_flwr.methods.fedul.transition import TransitionLayer, surrogate_loss


@register_method
class FedUL(Method):
    """FedUL (Lu et al., ICLR 2022): surrogate labels + fixed transition layer Q_c."""

    name = "fedul"
    requires = ("unlabeled", "usets")
    options = OPTIONS

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """Surrogate dataset (x, ybar) and the loss -log Q_c(softmax f(x))[ybar].

        Q_c is built from the client's prior matrix Pi_c ``[M_c, K]``, surrogate prior
        pibar_c ``[M_c]`` and the test prior pi ``[K]``; it never leaves the client.
        """
        assert client.usets is not None and client.unlabeled is not None  # ``requires``
        k = client.usets.priors.shape[1]
        test_prior = np.asarray(self.cfg.test_prior) if self.cfg.test_prior else np.full(k, 1.0 / k)  # () = uniform
        q = TransitionLayer(client.usets.priors, client.usets.surrogate_prior, test_prior)
        q = q.to(ctx.device)
        kind = self.option("loss")

        def loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            b = batch["usets"]
            return surrogate_loss(q(models["f"](b["x"])), b["ybar"], kind)

        stream = Stream({"x": client.unlabeled, "ybar": client.usets.set_index}, self.cfg.batch_size)
        return LocalTask({"usets": stream}, loss)
