"""Supervised FedAvg on a labeled fraction of each client's images: the reference points.

Lu et al. (ICLR 2022), Sec. 4.1: "FedAvg 10%" (after Chen et al., 2020) trains the same model
with ordinary cross-entropy on 10% of the training data *with true labels*
(``label-fraction = 0.1``); with ``label-fraction = 1.0`` it is the fully supervised FL
optimum that Theorem 4 says FedUL reaches ("as if the data had been labeled").

It requires the ``labeled`` part of a client's data: in the U-set setting the true labels of
the client's U-set images (the same images FedUL trains on, which never sees a label), in the
other settings the client's labeled images, on a deployed node its ``labeled/`` folder. An
unlabeled client of the annotation-heterogeneity setting sits the round out (FedAvg and
FedProx "on the labeled data only", HASSLE's baselines). Each client keeps a fixed random subset of ``round(label-fraction * n_c)`` of its images
(at least 1), drawn once from ``seed`` (the same subset every round), so a 10% client also
takes ~10% of the local steps per epoch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import Batch, LocalTask, Method, RoundContext, Stream, register_method
from fedul_flwr.methods.supervised.settings import OPTIONS
from fedul_flwr.rng import torch_generator

__all__ = ["Supervised", "labeled_subset"]


def labeled_subset(num_examples: int, fraction: float, seed: int) -> torch.Tensor:
    """Sorted int64 row indices of the labeled subset: ``max(1, round(fraction * n))`` rows
    drawn without replacement by the ``label-subset`` stream of the run's ``seed``
    (:mod:`fedul_flwr.rng`; all rows if fraction = 1).

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
    generator = torch_generator("label-subset", seed)
    return torch.randperm(num_examples, generator=generator)[:keep].sort().values


@register_method
class Supervised(Method):
    """Supervised FedAvg with true labels on ``label-fraction`` of each client's images."""

    name = "supervised"
    requires = ("labeled",)
    options = OPTIONS

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """(x, y) on the labeled subset; loss = cross-entropy of f."""
        assert client.labeled is not None  # ``requires``
        labeled = client.labeled
        rows = labeled_subset(len(labeled), self.option("label-fraction"), self.cfg.seed)
        full = len(rows) == len(labeled)
        x = labeled.x if full else labeled.x[rows]
        y = labeled.y if full else labeled.y[rows]

        def loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            b = batch["labeled"]
            return F.cross_entropy(models["f"](b["x"]), b["y"])

        return LocalTask({"labeled": Stream({"x": x, "y": y}, self.cfg.batch_size)}, loss)
