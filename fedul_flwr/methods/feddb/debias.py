"""FedDB's debiasing of pseudo-labels, the parts every method shares: Eq. 14's debiased posterior
(:func:`debias`), APP-U's predictions (:func:`predict_weak`) and the ``dpl`` plug-in for any
method that pseudo-labels (:class:`DebiasedPseudoLabels`, :class:`FedDPL`).

Zhu et al., "Debiasing Federated Semi-Supervised Learning" (FedDB), IJCAI 2024, Sec. 4.1, Alg. 1
and 3; FixMatch with DPL is :mod:`fedul_flwr.methods.feddb.dpl`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.augment import Augmentation
from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import LocalTask, Method, RoundContext

__all__ = ["APP_U", "DebiasedPseudoLabels", "FedDPL", "debias", "debiased_pseudo_labels", "predict_weak"]

APP_U = "app-u"
"""Reply metric: the client's APP-U pbar, K floats."""


def debias(probs: torch.Tensor, app_u: torch.Tensor) -> torch.Tensor:
    """Eq. 14: ``probs [n, K]`` divided by ``app_u [K]`` per class, renormalised per row.

    Raises
    ------
    ValueError
        If an entry of ``app_u`` is not > 0 (a class the model never predicts at all).
    """
    if not bool((app_u > 0).all()):
        raise ValueError(f"APP-U must be > 0 in every class, got {app_u.tolist()}")
    ratio = probs / app_u
    return ratio / ratio.sum(dim=1, keepdim=True)


def debiased_pseudo_labels(probs: torch.Tensor, app_u: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """argmax and mask (max > tau) of the debiased posteriors (Eq. 14).

    Parameters
    ----------
    probs : torch.Tensor
        ``[n, K]`` softmax predictions p_n.
    app_u : torch.Tensor
        ``[K]`` pbar.
    tau : float
        Threshold in [0, 1].

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        int64 ``[n]`` pseudo-labels and bool ``[n]`` mask.
    """
    confidence, targets = debias(probs, app_u).max(dim=1)
    return targets, confidence > tau


@torch.no_grad()
def predict_weak(
    f: Callable[[torch.Tensor], torch.Tensor], module: nn.Module, images: torch.Tensor, weak: Augmentation,
    generator: torch.Generator, to_input: Callable[[torch.Tensor], torch.Tensor], device: torch.device,
    batch_size: int,
) -> torch.Tensor:  # fmt: skip
    """softmax(f(alpha(u))) for every image, in eval mode (restored afterwards).

    Parameters
    ----------
    f : Callable
        The classifier's forward (float inputs -> ``[B, K]`` logits).
    module : nn.Module
        The module whose train/eval mode to switch.
    images : torch.Tensor
        uint8 ``[n, C, H, W]`` (CPU).
    weak : Augmentation
        The weak view.
    generator : torch.Generator
        Source of the views.
    to_input : Callable
        uint8 -> float model inputs.
    device : torch.device
        Where the forward passes run.
    batch_size : int
        Images per pass.

    Returns
    -------
    torch.Tensor
        float32 ``[n, K]`` on ``device``.
    """
    was_training = module.training
    module.eval()
    try:
        out = [
            F.softmax(f(to_input(weak(images[i : i + batch_size].to(device), generator))).float(), dim=1)
            for i in range(0, len(images), batch_size)
        ]
    finally:
        module.train(was_training)
    return torch.cat(out)


class DebiasedPseudoLabels:
    """FedDB's debiased pseudo-labels as a plug-in (``dpl = true``) for any method that
    pseudo-labels: the X-FedDPL rows of Zhu et al., IJCAI 2024, Tables 1-3 (FedMatch-FedDPL,
    FedRGD-FedDPL, SemiFL-FedDPL), where "DPL is a plug-in for any method that pseudo-labels".

    Per client and round (Alg. 1 and 3, as :class:`FixMatchDPL` with
    ``dpl-app-u-update = "epoch"``): APP-U pbar starts as the received global model's average
    prediction on the weak views of all of D_u (Eq. 8, eval mode), and is updated by the moving
    average ``pbar <- gamma pbar + (1 - gamma) pbar^e`` before every local epoch with the weights
    that epoch starts from (``dpl-ema`` = gamma). The method hands every probability vector it
    would threshold to :meth:`__call__`, which returns Eq. 14's debiased posterior (the
    threshold then applies to it, as in FedDB); the client uploads the final pbar (``app-u``).
    Without ``dpl`` (and without ``always``) the plug-in is the identity and uploads nothing.

    Parameters
    ----------
    method : Method
        The method; reads its options ``dpl`` and ``dpl-ema``.
    client : ClientData
        The client (its unlabeled images, ``[n_U, C, H, W]`` uint8).
    models : nn.ModuleDict
        The round's received models, on ``ctx.device``.
    ctx : RoundContext
        The round; the weak views draw from ``ctx.generator``.
    forward : Callable[[nn.ModuleDict], nn.Module]
        The classifier whose predictions are debiased, from the models (default ``models["f"]``).
    probs : torch.Tensor | None
        ``[n_U, K]``: the received model's predictions on the weak views of all of D_u that the
        method already made to pseudo-label (SemiFL labels once per round): APP-U is their mean,
        the mean of the very predictions it debiases (Eq. 8), with no second pass and no draw of
        its own. ``None``: the plug-in makes that pass.
    per_epoch : bool
        Whether APP-U's moving average runs before every local epoch. With pseudo-labels made once
        per round the updates change only the uploaded APP-U: SemiFL's plug-in sets ``False``;
        FixMatch-DPL and FedDB keep them under ``dpl-app-u-update = "epoch"`` (Alg. 3), since
        FedDB's DMA reads the uploaded APP-U.
    always : bool
        On whatever the ``dpl`` option (FixMatch-DPL and FedDB, whose DPL is the method itself).
    """

    def __init__(self, method: Method, client: ClientData, models: nn.ModuleDict, ctx: RoundContext,
                 forward: Callable[[nn.ModuleDict], nn.Module] = lambda models: models["f"],
                 probs: torch.Tensor | None = None, per_epoch: bool = True, always: bool = False) -> None:  # fmt: skip
        switched = always or bool(method.option("dpl"))
        self.active = switched and client.unlabeled is not None and len(client.unlabeled) > 0
        self.gamma = float(method.option("dpl-ema"))
        self.forward = forward
        self.per_epoch = per_epoch
        if not self.active:
            return
        weak = Augmentation("weak", client.image_shape[1], client.flip)
        images = client.unlabeled
        self._predict = lambda f, module: predict_weak(
            f, module, images, weak, ctx.generator, client.to_input, ctx.device, method.cfg.eval_batch_size
        )
        if probs is not None:
            self.app_u = probs.mean(dim=0)  # Eq. 8, of the method's own pass
            return
        f = forward(models)
        self.app_u = self._predict(f, f).mean(dim=0)  # Eq. 8, the received model

    def __call__(self, probs: torch.Tensor) -> torch.Tensor:
        """Eq. 14: ``probs [n, K]`` debiased by this round's APP-U (unchanged without ``dpl``)."""
        return debias(probs, self.app_u.to(probs.device)) if self.active else probs

    def before_epoch(self, forwards: nn.ModuleDict) -> None:
        """APP-U's moving average before a local epoch, with the weights it starts from."""
        if self.active:
            f = self.forward(forwards)
            self.update(self._predict(f, f).mean(dim=0))

    def update(self, fresh: torch.Tensor) -> None:
        """``pbar <- gamma pbar + (1 - gamma) fresh`` for a ``[K]`` mean prediction ``fresh``."""
        self.app_u = self.gamma * self.app_u + (1 - self.gamma) * fresh

    def chained(self, task: LocalTask) -> LocalTask:
        """``task`` with APP-U's update added before each local epoch (after the task's own)."""
        if not self.active or not self.per_epoch:
            return task
        own = task.before_epoch

        def before_epoch(forwards: nn.ModuleDict) -> None:
            if own is not None:
                own(forwards)
            self.before_epoch(forwards)

        return dataclasses.replace(task, before_epoch=before_epoch)

    def uploads(self) -> dict[str, float | list[float]]:
        """``{"app-u": pbar}`` (K floats) with ``dpl``, else ``{}``."""
        return {APP_U: [float(v) for v in self.app_u.cpu()]} if self.active else {}


class FedDPL:
    """Mixin for a :class:`~fedul_flwr.methods.base.Method` that pseudo-labels: the ``dpl`` plug-in
    (:class:`DebiasedPseudoLabels`). The method lists
    :data:`~fedul_flwr.methods.feddb.settings.DPL_PLUGIN_OPTIONS` in its options, and

    - calls :meth:`begin_dpl` first in its ``local_task`` (APP-U from the received models) and
      returns :meth:`with_dpl` of its task (APP-U's update before each local epoch);
    - passes every probability vector it thresholds through :meth:`debiased`;
    - adds :meth:`dpl_uploads` to its uploads (``app-u``);
    - names its classifier in :meth:`dpl_forward` (default ``models["f"]``).

    With ``dpl = false`` (the default) nothing changes: no extra forward pass, no draw from the
    round's generators, no upload."""

    dpl: DebiasedPseudoLabels | None = None

    def dpl_forward(self, models: nn.ModuleDict) -> nn.Module:
        """The classifier whose pseudo-labels are debiased (default ``models["f"]``)."""
        return models["f"]

    def begin_dpl(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext,
                  probs: torch.Tensor | None = None, per_epoch: bool = True) -> None:  # fmt: skip
        """Start the round's plug-in: APP-U of the received models (with ``dpl``), from the
        method's own predictions ``probs`` where given (:class:`DebiasedPseudoLabels`)."""
        self.dpl = DebiasedPseudoLabels(self, client, models, ctx, self.dpl_forward, probs, per_epoch)  # type: ignore[arg-type]

    def with_dpl(self, task: LocalTask) -> LocalTask:
        """``task`` with APP-U's update before each local epoch (with ``dpl``)."""
        return task if self.dpl is None else self.dpl.chained(task)

    def debiased(self, probs: torch.Tensor) -> torch.Tensor:
        """``probs [n, K]`` debiased by the round's APP-U (Eq. 14), or unchanged without ``dpl``."""
        return probs if self.dpl is None else self.dpl(probs)

    def dpl_uploads(self) -> dict[str, Any]:
        """``{"app-u": pbar}`` with ``dpl``, else ``{}``."""
        return {} if self.dpl is None else self.dpl.uploads()
