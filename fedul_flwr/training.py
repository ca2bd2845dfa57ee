"""The one local training loop and the evaluation of f, shared by every method.

Local update of Eq. (3) in Lu et al. (ICLR 2022): E local epochs of Adam (lr, batch B) on
the method's loss, plus an optional L1 penalty ``l1_weight * sum_p |p|_1`` (App. D.2,
Table D.4). The optimiser is created afresh every round, as in the paper's code; plain
SGD (``local-optimizer = "sgd"``) is the alternative SCAFFOLD's and FedNova's rules assume.

Strategies that change the client update (FedProx's proximal term, SCAFFOLD's control
variates, FedNova's step counts) plug in through :class:`StepHook` instead of copying the
loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from fedul_flwr.methods.base import LocalTask


class StepHook(Protocol):
    """Called around each optimiser step of :func:`train_local`."""

    def after_backward(self, model: nn.Module) -> None:
        """Edit gradients (e.g. add a proximal or control-variate term) before the step."""


@dataclass(frozen=True)
class TrainResult:
    """Outcome of one client's local training.

    Attributes
    ----------
    loss : float
        Mean training loss (method loss, without the L1 term) over all steps.
    num_examples : int
        Training rows n (per epoch).
    num_steps : int
        Optimiser steps taken (E * ceil(n / B)).
    """

    loss: float
    num_examples: int
    num_steps: int


def train_local(
    model: nn.Module,
    task: LocalTask,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    l1_weight: float = 0.0,
    seed: int = 0,
    device: torch.device | str = "cpu",
    hooks: tuple[StepHook, ...] = (),
    optimizer: str = "adam",
) -> TrainResult:
    """Train ``model`` in place on ``task`` for ``epochs`` epochs.

    Parameters
    ----------
    model : nn.Module
        f, already on ``device``.
    task : LocalTask
        Inputs ``[n, ...]``, targets ``[n]`` and the loss of the method.
    epochs, batch_size : int
        E >= 1 and B >= 1.
    lr : float
        Learning rate of the local optimiser.
    l1_weight : float
        Weight of the L1 penalty on all parameters (0 disables it).
    seed : int
        Seed of the batch order (use a different one per round and client).
    device : torch.device | str
        Where batches are moved (non-blocking from pinned memory on CUDA).
    hooks : tuple[StepHook, ...]
        Gradient editors called after ``backward`` and before ``step``.
    optimizer : str
        ``"adam"`` (the paper's local optimiser) or ``"sgd"`` (plain SGD, the form in which
        SCAFFOLD's and FedNova's update rules are derived).

    Returns
    -------
    TrainResult

    Raises
    ------
    ValueError
        If the task has no rows, the optimiser is unknown, or the loss becomes NaN/inf
        (names the step).
    """
    n = task.num_examples
    if n == 0:
        raise ValueError("local task has no training examples")
    device = torch.device(device)
    generator = torch.Generator().manual_seed(seed)
    optimizers = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}
    if optimizer not in optimizers:
        raise ValueError(f"optimizer={optimizer!r} is not one of {sorted(optimizers)}")
    opt = optimizers[optimizer](model.parameters(), lr=lr)
    params = [p for p in model.parameters() if p.requires_grad]
    inputs, targets = task.inputs, task.targets
    if device.type == "cuda":
        inputs, targets = inputs.pin_memory(), targets.pin_memory()
    model.train()
    total, steps = 0.0, 0
    for _ in range(epochs):
        if task.batches is not None:
            epoch_batches = task.batches(generator)
        else:
            order = torch.randperm(n, generator=generator)
            epoch_batches = (order[start : start + batch_size] for start in range(0, n, batch_size))
        for idx in epoch_batches:
            xb = inputs[idx].to(device, non_blocking=True)
            yb = targets[idx].to(device, non_blocking=True)
            loss = task.loss(model, xb, yb)
            objective = loss + l1_weight * sum(p.abs().sum() for p in params) if l1_weight else loss
            opt.zero_grad(set_to_none=True)
            objective.backward()
            for hook in hooks:
                hook.after_backward(model)
            opt.step()
            value = float(loss.detach())
            if not math.isfinite(value):
                raise ValueError(f"training loss became {value} at step {steps}")
            total += value
            steps += 1
    return TrainResult(loss=total / steps, num_examples=n, num_steps=steps)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int = 1000,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """Test f on labeled data: prediction = argmax f(x) (no transition layer).

    Parameters
    ----------
    x : torch.Tensor
        float32 ``[n, C, H, W]`` normalised images.
    y : torch.Tensor
        int64 ``[n]`` true labels.

    Returns
    -------
    dict[str, float]
        ``test-loss`` (mean cross-entropy of f), ``test-accuracy`` and ``test-error``
        (fractions in [0, 1]), ``num-examples``.
    """
    device = torch.device(device)
    model.eval()
    loss_sum, correct = 0.0, 0
    for start in range(0, len(x), batch_size):
        xb = x[start : start + batch_size].to(device, non_blocking=True)
        yb = y[start : start + batch_size].to(device, non_blocking=True)
        logits = model(xb)
        loss_sum += float(nn.functional.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(dim=1) == yb).sum())
    n = max(1, len(x))
    accuracy = correct / n
    return {"test-loss": loss_sum / n, "test-accuracy": accuracy, "test-error": 1.0 - accuracy, "num-examples": float(len(x))}
