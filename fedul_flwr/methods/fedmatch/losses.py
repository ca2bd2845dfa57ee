"""FedMatch's parameter decomposition and its losses (Jeong et al., ICLR 2021, Sec. 3.2-3.3).

The classifier's parameters are theta = sigma + psi, per parameter tensor of one architecture:
sigma (*supervised* parameters) learn from labels with psi frozen, psi (*unsupervised*
parameters) from unlabeled images with sigma frozen (disjoint learning):

    L_s(sigma)  = lambda_s CE(y, p_{sigma + psi*}(x)),
    L_u(psi)    = lambda_ICCS Phi + lambda_L1 ||psi||_1 + lambda_L2 ||sigma* - psi||_2^2,
    Phi         = CE(y_hat, p_{sigma* + psi}(A(u))) + 1/H sum_j KL(p_{rho_j}(u) || p_{sigma* + psi}(u)),

with * a frozen part, A the strong augmentation, rho_j the helpers (sigma* plus another
client's psi) and y_hat the agreement pseudo-label (:func:`agreement_pseudo_labels`). Here:
:class:`Decomposed` (the forward of sigma + psi with one part frozen), :func:`sparsity_and_distance`
(the two regularisers), :func:`consistency` (the KL term), :func:`agreement_pseudo_labels`,
:func:`masked_mean` and :func:`sparsify` (psi's cut before sending). Batch-level terms are means
over the confident rows of the batch, as the authors' code takes them; the regularisers are
sums over every parameter entry (the code's ``reduce_sum``), once per step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

__all__ = ["Decomposed", "agreement_pseudo_labels", "consistency", "masked_mean", "sparsify", "sparsity_and_distance",
           "theta_state"]  # fmt: skip

FROZEN = ("sigma", "psi")
"""What :meth:`Decomposed.forward` may freeze."""


class Decomposed(nn.Module):
    """The model theta = sigma + psi of two modules of one architecture.

    Holds references to ``sigma`` and ``psi`` without registering them (it has no parameters of
    its own: whoever trains them names the two modules, and switching this module between
    train and eval leaves theirs alone). The forward runs ``sigma``'s module with every
    parameter replaced by the sum of the two; buffers (batch-norm statistics) are sigma's, and
    a training-mode forward updates them. The forward runs sigma in this module's mode
    (``train()`` / ``eval()`` of the ``Decomposed``, which the loop sets as a trained model's),
    whatever sigma's own mode is: a client that trains psi alone still trains in training mode
    (batch statistics, dropout), and an evaluation pass leaves sigma's statistics alone.

    Parameters
    ----------
    sigma, psi : nn.Module
        Two modules of one architecture (the same parameter names and shapes).

    Raises
    ------
    ValueError
        If their parameters differ in names or shapes.
    """

    def __init__(self, sigma: nn.Module, psi: nn.Module) -> None:
        super().__init__()
        shapes = [{k: tuple(p.shape) for k, p in m.named_parameters()} for m in (sigma, psi)]
        if shapes[0] != shapes[1]:
            raise ValueError("sigma and psi must be modules of one architecture (the same parameters)")
        self._parts = (sigma, psi)  # a tuple: not registered as children

    def forward(self, x: torch.Tensor, frozen: str | None = None) -> torch.Tensor:
        """Logits ``[B, K]`` of sigma + psi on ``x`` ``[B, C, H, W]``; ``frozen`` (``"sigma"`` or
        ``"psi"``) takes no gradient.

        Raises
        ------
        ValueError
            On another ``frozen``.
        """
        if frozen is not None and frozen not in FROZEN:
            raise ValueError(f"frozen={frozen!r} must be one of {FROZEN} or None")
        sigma, psi = self._parts
        psis = dict(psi.named_parameters())
        params = {}
        for name, s in sigma.named_parameters():
            p = psis[name]
            params[name] = (s.detach() if frozen == "sigma" else s) + (p.detach() if frozen == "psi" else p)
        was = sigma.training  # sigma is no child of this module: its mode follows this one's for the call
        sigma.train(self.training)
        try:
            return functional_call(sigma, params, (x,))
        finally:
            sigma.train(was)


def theta_state(sigma: dict[str, torch.Tensor], psi: dict[str, torch.Tensor], parameters: set[str],
                threshold: float = 0.0) -> dict[str, torch.Tensor]:  # fmt: skip
    """The state dict of theta: sigma + psi for the keys in ``parameters``, psi's entries with
    |value| <= ``threshold`` left out (the hard threshold of the authors' decomposed layers at
    inference), and sigma's tensor for the others (buffers).

    Parameters
    ----------
    sigma, psi : dict[str, torch.Tensor]
        State dicts of one architecture.
    parameters : set[str]
        The keys that are parameters (``named_parameters`` of the architecture).
    threshold : float
        >= 0; 0 keeps every entry of psi.
    """
    def cut(p: torch.Tensor) -> torch.Tensor:
        return p * (p.abs() > threshold) if threshold > 0 else p

    return {k: sigma[k] + cut(psi[k]) if k in parameters else sigma[k] for k in sigma}


def sparsity_and_distance(sigma: nn.Module, psi: nn.Module, lambda_l1: float, lambda_l2: float) -> torch.Tensor:
    """lambda_L1 sum |psi| + lambda_L2 sum (sigma - psi)^2 over every parameter entry, sigma
    frozen (scalar; the gradient reaches psi only)."""
    sigmas = dict(sigma.named_parameters())
    total = torch.zeros((), device=next(psi.parameters()).device)
    for name, p in psi.named_parameters():
        if lambda_l1:
            total = total + lambda_l1 * p.abs().sum()
        if lambda_l2:
            total = total + lambda_l2 * (sigmas[name].detach() - p).square().sum()
    return total


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` ``[n]`` over the rows where ``mask`` ``[n]`` is true; 0 (with the
    graph) when none is (no host synchronisation)."""
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp(min=1)


def consistency(log_probs: torch.Tensor, helper_probs: torch.Tensor) -> torch.Tensor:
    """Per row, 1/H sum_j KL(q_j || p): the helpers' predictions q_j against the local one p.

    Parameters
    ----------
    log_probs : torch.Tensor
        ``[n, K]`` log-softmax of the local model (with gradient).
    helper_probs : torch.Tensor
        ``[H, n, K]`` softmax of the H >= 1 helpers (no gradient).

    Returns
    -------
    torch.Tensor
        ``[n]`` (sum over classes, mean over helpers).
    """
    q = helper_probs
    kl = (q * (q.clamp(min=1e-12).log() - log_probs.unsqueeze(0))).sum(dim=2)
    return kl.mean(dim=0)


def agreement_pseudo_labels(probs: torch.Tensor, helper_probs: torch.Tensor | None, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """FedMatch's agreement-based pseudo-labels: the class with most votes among the one-hot
    argmax of the local prediction and of each helper's, kept where the local confidence
    reaches tau (ties go to the lowest class index, as the code's argmax).

    Parameters
    ----------
    probs : torch.Tensor
        ``[n, K]`` softmax of the local model.
    helper_probs : torch.Tensor | None
        ``[H, n, K]`` softmax of the helpers; ``None`` or H = 0: the local argmax.
    tau : float
        Confidence threshold.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        int64 ``[n]`` pseudo-labels and bool ``[n]`` mask (max probs >= tau).
    """
    k = probs.shape[1]
    votes = F.one_hot(probs.argmax(dim=1), k)
    if helper_probs is not None and len(helper_probs):
        votes = votes + F.one_hot(helper_probs.argmax(dim=2), k).sum(dim=0)
    return votes.argmax(dim=1), probs.max(dim=1).values >= tau


@torch.no_grad()
def sparsify(module: nn.Module, threshold: float) -> float:
    """Set to 0, in place, every parameter entry of ``module`` with |value| <= threshold (the
    authors' ``sparsify`` of psi before sending); returns the share of entries left non-zero."""
    kept = total = 0
    for p in module.parameters():
        if threshold > 0:
            p.mul_(p.abs() > threshold)
        kept += int((p != 0).sum())
        total += p.numel()
    return kept / max(total, 1)
