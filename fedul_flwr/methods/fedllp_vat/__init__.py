"""FedLLP-VAT: FedLLP plus virtual adversarial consistency, a baseline of FedUL.

Lu et al. (ICLR 2022), App. D, Eq. (19)-(20), after Tsai & Lin (2020, LLP-VAT): the
proportion loss of :mod:`fedul_flwr.methods.fedllp` plus alpha times a consistency loss

    l_cons(f) = KL( softmax f(x) || softmax f(x + r_adv) ),
    r_adv = mu * g / ||g||_2,   g = grad_d KL( softmax f(x) || softmax f(x + xi d) ) at a
                                random unit direction d (one power iteration),

i.e. Virtual Adversarial Training (Miyato et al., 2018) with the clean prediction held
fixed. App. D: alpha = 5e-4 and perturbation size mu = 1e-2 on MNIST (alpha = 0.05,
mu = 6.0 on CIFAR-10) -- knobs ``vat-weight``, ``vat-epsilon``; ``vat-xi`` is the
finite-difference step of the power iteration (1e-6, VAT's default). Norms are per sample
over all pixels (of the normalised image). The perturbed passes use batch statistics but
do not update batch-norm running statistics. The random direction d is drawn from the
client's round generator (``RoundContext.generator``: run seed, round, node), so a run
repeats itself wherever its clients run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.methods.base import RoundContext, register_method
from fedul_flwr.methods.fedllp import FedLLP
from fedul_flwr.methods.fedllp_vat.settings import OPTIONS

__all__ = ["FedLLPVAT", "vat_loss"]


@contextmanager
def _frozen_bn_stats(model: nn.Module) -> Iterator[None]:
    """Forward passes inside use batch statistics but leave BN running statistics alone."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    for m in bns:
        m.track_running_stats = False
    try:
        yield
    finally:
        for m in bns:
            m.track_running_stats = True


def _unit(d: torch.Tensor) -> torch.Tensor:
    """Scale each sample of ``[B, ...]`` to unit L2 norm."""
    norm = d.flatten(1).norm(dim=1).clamp_min(1e-12)
    return d / norm.view(-1, *([1] * (d.ndim - 1)))


def vat_loss(
    model: nn.Module,
    x: torch.Tensor,
    logits: torch.Tensor,
    epsilon: float,
    xi: float = 1e-6,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Virtual adversarial consistency loss (local distributional smoothness).

    Parameters
    ----------
    model : nn.Module
        f.
    x : torch.Tensor
        float ``[B, C, H, W]`` inputs.
    logits : torch.Tensor
        ``[B, K]`` f(x) of the clean inputs (detached inside: the target is fixed).
    epsilon : float
        Radius mu of the adversarial perturbation (L2 per sample).
    xi : float
        Step of the finite-difference power iteration.
    generator : torch.Generator | None
        CPU generator of the random direction d (``None``: torch's global RNG).

    Returns
    -------
    torch.Tensor
        Scalar ``KL(p || p_adv)`` averaged over the batch (>= 0; 0 when epsilon = 0).
    """
    p = F.softmax(logits.detach(), dim=1)
    log_p = F.log_softmax(logits.detach(), dim=1)
    with _frozen_bn_stats(model):
        d = (xi * _unit(torch.randn(x.shape, generator=generator).to(x))).requires_grad_()
        log_q = F.log_softmax(model(x + d), dim=1)
        distance = (p * (log_p - log_q)).sum(dim=1).mean()
        (grad,) = torch.autograd.grad(distance, d)
        r_adv = epsilon * _unit(grad.detach())
        log_q = F.log_softmax(model(x + r_adv), dim=1)
    return (p * (log_p - log_q)).sum(dim=1).mean()


@register_method
class FedLLPVAT(FedLLP):
    """FedLLP-VAT (Tsai & Lin, 2020, federated as in Lu et al., App. D): proportion loss +
    ``vat-weight`` * VAT consistency of radius ``vat-epsilon``."""

    name = "fedllp-vat"
    batched_cohort = False  # the VAT direction is a gradient of the client's own forward: its graph cannot be the cohort's
    options = FedLLP.options + OPTIONS

    def regulariser(
        self, model: nn.Module, x: torch.Tensor, logits: torch.Tensor, ctx: RoundContext
    ) -> torch.Tensor | None:
        """alpha * l_cons(f) of Eq. (19), with d drawn from the round's generator."""
        weight = self.option("vat-weight")
        if weight == 0:
            return None
        return weight * vat_loss(model, x, logits, self.option("vat-epsilon"), self.option("vat-xi"), ctx.generator)
