"""FedUL: federated learning from unlabeled sets with known class priors.

Lu, Wang, Li, Niu, Dou, Sugiyama, "Federated Learning from Only Unlabeled Data with
Class-Conditional-Sharing Clients", ICLR 2022, Algorithm 1.

Client c labels every image of U set m with the surrogate label ybar = m, wraps the shared
classifier f in its fixed transition layer Q_c (Theorem 1, Eq. 8) and minimises the
cross-entropy of the surrogate posterior (App. C.4):

    J_c(f) = E_(x, ybar) [ -log Q_c(softmax f(x))[ybar] ].

Only f is trained and exchanged; any supervised aggregation works on top (FedAvg by
default). Prediction is argmax f(x). ``loss='ce-prob'`` is the authors' code's variant
(cross-entropy applied to the probabilities Q_c).
"""

from __future__ import annotations

import torch
from torch import nn

from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import LocalTask, Method
from fedul_flwr.transition import TransitionLayer, surrogate_loss


class FedUL(Method):
    """FedUL (Lu et al., ICLR 2022): surrogate labels + fixed transition layer Q_c."""

    name = "fedul"

    def local_task(self, client: ClientData, device: torch.device) -> LocalTask:
        """Surrogate dataset (x, ybar) and the loss -log Q_c(softmax f(x))[ybar].

        Q_c is built from the client's prior matrix Pi_c ``[M_c, K]``, surrogate prior
        pibar_c ``[M_c]`` and test prior pi ``[K]``; it never leaves the client.
        """
        q = TransitionLayer(client.priors, client.surrogate_prior, client.test_prior).to(device)
        kind = self.cfg.loss

        def loss(model: nn.Module, x: torch.Tensor, ybar: torch.Tensor) -> torch.Tensor:
            return surrogate_loss(q(model(x)), ybar, kind)

        return LocalTask(inputs=client.x, targets=client.set_index, loss=loss, modules={"transition": q})
