"""The losses of HASSLE's local procedure (SUMA), Eqs. 7-9 and 11-12.

Notation: f(x; w) the logits of model w; w_S, w_U the supervised and unsupervised dual models
and r_{U-S}, r_{S-U} the residual models, all as received this round (frozen where they are
targets); T the temperature (``hassle-temperature``); lambda the residual alignment weight
(``hassle-lambda``). Losses are means over the batch (the paper writes sums).

Residual update (Eqs. 7-9), on the labeled data for r_{U-S} (teacher difference
f(x; w_U) - f(x; w_S), base model w_S) and on the pseudo-labeled unlabeled data for r_{S-U}
(difference f(u; w_S) - f(u; w_U), base w_U):

    L_res = T^2 KL( softmax(difference / T) || softmax(f(x; r) / T) ),              (Eq. 7)
    L_CE  = CE( f(x; base) + f(x; r), y ),                                            (Eq. 8)
    r <- r - eta grad(L_CE + lambda L_res).                                          (Eq. 9)

Choice: Eq. 7 writes KL(residual || target); we use the distillation direction KL(target ||
residual) (the residual is the student that must cover the target's mass) with Hinton's T^2
scaling, so lambda means the same at every temperature.

Pseudo-labels (Eq. 11): yhat = argmax [f(u; w_S) + f(u; r_{U-S})], kept where the softmax of
that sum reaches ``hassle-threshold`` (0: every image, the paper's default).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["pseudo_labels", "residual_loss"]


def residual_loss(
    residual_logits: torch.Tensor, base_logits: torch.Tensor, other_logits: torch.Tensor, targets: torch.Tensor,
    temperature: float, weight: float, mask: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """L_CE + lambda L_res of Eqs. 7-9 for one batch.

    Parameters
    ----------
    residual_logits : torch.Tensor
        ``[n, K]`` f(x; r), with gradient.
    base_logits, other_logits : torch.Tensor
        ``[n, K]`` f(x; base) and f(x; other) of the frozen dual models; the target of the
        residual is other - base.
    targets : torch.Tensor
        int64 ``[n]`` labels or pseudo-labels.
    temperature : float
        T > 0.
    weight : float
        lambda >= 0.
    mask : torch.Tensor | None
        bool ``[n]``: the rows that count (pseudo-labels over the threshold); None: all.

    Returns
    -------
    torch.Tensor
        Scalar, the mean over the counted rows (0 when none counts).
    """
    ce = F.cross_entropy(base_logits + residual_logits, targets, reduction="none")
    teacher = F.log_softmax((other_logits - base_logits) / temperature, dim=1)
    student = F.log_softmax(residual_logits / temperature, dim=1)
    kl = (teacher.exp() * (teacher - student)).sum(dim=1) * temperature**2
    per_row = ce + weight * kl
    if mask is None:
        return per_row.mean()
    return (per_row * mask.to(per_row.dtype)).sum() / mask.sum().clamp_min(1)


def pseudo_labels(logits: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 11's hard pseudo-labels from ``logits [n, K]`` (f(u; w_S) + f(u; r_{U-S})): argmax,
    and the bool mask of rows whose softmax maximum reaches ``threshold`` (all rows at 0)."""
    confidence, targets = F.softmax(logits, dim=1).max(dim=1)
    return targets, confidence >= threshold
