"""Static batch normalization (sBN) of SemiFL: the global model's batch-norm statistics
recomputed on the server's data rather than averaged over the clients.

Diao et al., "SemiFL: Semi-Supervised Federated Learning for Unlabeled Clients with Alternate
Training", NeurIPS 2022, Sec. 3 ("Static Batch Normalization"). FedAvg averages each client's
running mean and variance, statistics of other weights and other data than the global model's.
sBN instead resets every batch-norm layer's running statistics and recomputes them with the
global weights in one pass over the server's images, as a cumulative (equal-weight) average
over the batches (PyTorch's ``momentum=None``), in train mode and without gradient. The images
are the plain ones, without augmentation (the authors' code's ``make_batchnorm_stats`` over an
unaugmented copy of the data). A model without batch norm (e.g. ``small-cnn``) is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["batch_norm_layers", "static_batch_norm"]


def batch_norm_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """The batch-norm layers of ``model`` that keep running statistics (empty: none)."""
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]


@torch.no_grad()
def static_batch_norm(
    model: nn.Module, images: torch.Tensor, to_input: Callable[[torch.Tensor], torch.Tensor], device: torch.device,
    batch_size: int,
) -> int:  # fmt: skip
    """Recompute the running statistics of every batch-norm layer of ``model`` on ``images``
    (module docstring); the weights are untouched, the layers' momentum and the model's mode
    restored afterwards.

    Parameters
    ----------
    model : nn.Module
        On ``device``; changed in place.
    images : torch.Tensor
        uint8 ``[n, C, H, W]`` (CPU), n >= 1.
    to_input : Callable
        uint8 -> float model inputs.
    device : torch.device
        Where the forward passes run.
    batch_size : int
        Images per pass (>= 1).

    Returns
    -------
    int
        The number of batch-norm layers recomputed (0: the model has none, nothing ran).

    Raises
    ------
    ValueError
        If ``images`` is empty while the model has batch norm.
    """
    layers = batch_norm_layers(model)
    if not layers:
        return 0
    if len(images) == 0:
        raise ValueError("static batch normalization needs at least one image")
    momenta = [m.momentum for m in layers]
    was_training = model.training
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # cumulative average: every batch weighs the same
    model.train()
    try:
        for i in range(0, len(images), batch_size):
            model(to_input(images[i : i + batch_size].to(device)))
    finally:
        for m, momentum in zip(layers, momenta, strict=True):
            m.momentum = momentum
        model.train(was_training)
    return len(layers)
