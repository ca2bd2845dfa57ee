"""Supervised FedAvg on a labeled fraction of each client's images: the reference points.

Lu et al. (ICLR 2022), Sec. 4.1: "FedAvg 10%" (after Chen et al., 2020) trains the same model
with ordinary cross-entropy on 10% of the training data *with true labels*
(``label-fraction = 0.1``); with ``label-fraction = 1.0`` it is the fully supervised FL
optimum that Theorem 4 says FedUL reaches ("as if the data had been labeled").

This is the only method with ``needs_labels = True``: the client data it receives carries the
true labels of the U-set images (``ClientData.labels``); every other method gets ``None``.
Each client keeps a fixed random subset of ``round(label-fraction * n_c)`` of its images
(at least 1), drawn once from ``seed`` (the same subset every round), so a 10% client also
takes ~10% of the local steps per epoch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import LocalTask, Method

__all__ = ["Supervised", "labeled_subset"]


def labeled_subset(num_examples: int, fraction: float, seed: int) -> torch.Tensor:
    """Sorted int64 row indices of the labeled subset: ``max(1, round(fraction * n))`` rows
    drawn without replacement by a generator seeded with ``seed`` (all rows if fraction = 1).

    Raises
    ------
    ValueError
        If ``fraction`` is not in (0, 1] or ``num_examples < 1``.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"label fraction must be in (0, 1], got {fraction}")
    if num_examples < 1:
        raise ValueError("client has no training examples")
    keep = max(1, round(fraction * num_examples))
    if keep >= num_examples:
        return torch.arange(num_examples)
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(num_examples, generator=generator)[:keep].sort().values


class Supervised(Method):
    """Supervised FedAvg with true labels on ``label-fraction`` of each client's images."""

    name = "supervised"
    needs_labels = True

    def local_task(self, client: ClientData, device: torch.device) -> LocalTask:
        """(x, y) on the labeled subset; loss = cross-entropy of f.

        Raises
        ------
        ValueError
            If the client data was loaded without labels (``with_labels=False``).
        """
        if client.labels is None:
            raise ValueError("method 'supervised' needs ClientData.labels; load the client with with_labels=True")
        rows = labeled_subset(client.num_examples, self.cfg.label_fraction, self.cfg.seed)
        full = len(rows) == client.num_examples
        inputs = client.x if full else client.x[rows]
        targets = client.labels if full else client.labels[rows]

        def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(model(x), y)

        return LocalTask(inputs=inputs, targets=targets, loss=loss)
