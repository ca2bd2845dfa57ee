"""The fixed transition layer Q_c of FedUL (Lu et al., ICLR 2022, Theorem 1, Eq. 8).

Client c knows its prior matrix Pi_c [M, K], its surrogate prior pibar_c [M] (set sizes
n_{c,m} / n_c) and the test class prior pi [K]. Theorem 1 links the original class posterior
eta(x) = p(y | x) [K] to the surrogate posterior etabar_c(x) = p(ybar | x) [M]:

    Qtilde_c(eta) = D(pibar_c) Pi_c D(pi)^-1 eta,      Q_c(eta) = Qtilde_c(eta) / sum_m Qtilde_c(eta)_m.

FedUL trains f (logits [B, K]) through g_c = Q_c(softmax f) on the surrogate labels with the
negative log-likelihood (App. C.4); Q_c has no parameters and never leaves the client. Lemma 2:
Q_c is injective when Pi_c has full column rank.

Everything is computed in log space (log_softmax, logsumexp), so zero priors and tiny
probabilities give no NaN/inf.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fedul_flwr.registry import Registry

__all__ = ["LOSSES", "TransitionLayer", "surrogate_loss"]

LOSSES: Registry[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = Registry("loss")
"""Surrogate losses ``(log_q [B, M], ybar [B]) -> scalar`` by name (FedUL's ``loss`` option)."""
LOSSES.add("nll", F.nll_loss)  # the paper, App. C.4: mean of -log Q[ybar]
LOSSES.add("ce-prob", lambda log_q, ybar: F.cross_entropy(log_q.exp(), ybar))  # the authors' code


def _as_float_array(value: object, name: str, ndim: int) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numeric, got {value!r}") from exc
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got non-finite entries")
    if np.any(arr < 0):
        raise ValueError(f"{name} must be non-negative, got min {arr.min():.6g}")
    return arr


class TransitionLayer(torch.nn.Module):
    """Q_c: maps f's logits [B, K] to log surrogate posteriors log Q_c(softmax f(x)) [B, M].

    Qtilde = D(pibar) Pi D(pi)^-1 eta; Q = Qtilde / sum(Qtilde). Computed in log space::

        log Qtilde[m] = log pibar[m] + logsumexp_k(log Pi[m,k] - log pi[k] + log_softmax(logits)_k)
        log Q[m]      = log Qtilde[m] - logsumexp_m' log Qtilde[m']

    Buffers only, no parameters: ``log_coef`` [M, K] = log pibar[m] + log Pi[m,k] - log pi[k]
    (float32, non-persistent: it is not part of any ``state_dict``, so the client's priors are
    never exchanged with the model's weights). Zero entries of Pi give -inf coefficients; a
    set with pibar[m] = 0 (or an all-zero row of Pi, e.g. a padded set) gives log Q[m] = -inf
    and zero gradient. Outputs of finite logits rows contain no NaN, gradients no NaN.

    Parameters
    ----------
    priors : array-like
        [M, K] non-negative prior matrix Pi_c (rows need not be re-checked to sum to 1 here;
        see :func:`fedul_flwr.data.usets.validate_prior_matrix`).
    surrogate_prior : array-like
        [M] non-negative surrogate prior pibar_c (any positive scale; it cancels in Q).
    test_prior : array-like
        [K] strictly positive test class prior pi.

    Raises
    ------
    ValueError
        Naming the argument: wrong dimensionality or mismatched sizes, non-finite or
        negative entries, a non-positive test prior entry, or no set with positive weight.
    """

    log_coef: torch.Tensor

    def __init__(self, priors: object, surrogate_prior: object, test_prior: object) -> None:
        super().__init__()
        pi_mat = _as_float_array(priors, "priors", 2)
        pibar = _as_float_array(surrogate_prior, "surrogate_prior", 1)
        pi = _as_float_array(test_prior, "test_prior", 1)
        num_sets, num_classes = pi_mat.shape
        if pibar.shape != (num_sets,):
            raise ValueError(
                f"surrogate_prior must have shape ({num_sets},) to match priors [M={num_sets}, K], "
                f"got {pibar.shape}"
            )
        if pi.shape != (num_classes,):
            raise ValueError(
                f"test_prior must have shape ({num_classes},) to match priors [M, K={num_classes}], "
                f"got {pi.shape}"
            )
        if np.any(pi <= 0):
            raise ValueError(f"test_prior must be strictly positive, got {pi.tolist()}")
        with np.errstate(divide="ignore"):
            log_coef = np.log(pibar)[:, None] + np.log(pi_mat) - np.log(pi)[None, :]
        valid = np.isfinite(log_coef).any(axis=1)
        if not valid.any():
            raise ValueError("transition layer has no set with positive surrogate prior and prior row")
        self.register_buffer("log_coef", torch.as_tensor(log_coef, dtype=torch.float32), persistent=False)

    @property
    def num_sets(self) -> int:
        """M (output width)."""
        return int(self.log_coef.shape[0])

    @property
    def num_classes(self) -> int:
        """K (input width)."""
        return int(self.log_coef.shape[1])

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """Log surrogate posteriors of a batch.

        Parameters
        ----------
        logits : torch.Tensor
            float [B, K] output of f (unnormalised log class posteriors).

        Returns
        -------
        torch.Tensor
            [B, M] log Q_c(softmax(logits)); each row's exp sums to 1. Dtype: the input's,
            promoted to at least float32.

        Raises
        ------
        ValueError
            If ``logits`` is not [B, K].
        """
        if logits.ndim != 2 or logits.shape[1] != self.num_classes:
            raise ValueError(f"logits must have shape [B, {self.num_classes}], got {tuple(logits.shape)}")
        dtype = torch.promote_types(logits.dtype, torch.float32)
        log_eta = F.log_softmax(logits.to(dtype), dim=1)  # [B, K]
        valid = torch.isfinite(self.log_coef).any(dim=1)  # [M]
        # rows with no finite coefficient would give logsumexp(-inf...) = -inf with NaN grads:
        # compute them on a dummy finite row and mask the result to -inf afterwards
        zero = torch.zeros((), dtype=dtype, device=logits.device)
        coef = torch.where(valid[:, None], self.log_coef.to(dtype), zero)
        log_qt = torch.logsumexp(coef.unsqueeze(0) + log_eta.unsqueeze(1), dim=2)  # [B, M]
        log_qt = torch.where(valid.unsqueeze(0), log_qt, torch.full_like(zero, -math.inf))
        return log_qt - torch.logsumexp(log_qt, dim=1, keepdim=True)

    def extra_repr(self) -> str:
        return f"num_sets={self.num_sets}, num_classes={self.num_classes}"


def surrogate_loss(log_q: torch.Tensor, ybar: torch.Tensor, kind: str = "nll") -> torch.Tensor:
    """Loss on the surrogate labels, averaged over the batch.

    - ``'nll'`` (paper, App. C.4): mean of -log Q[ybar].
    - ``'ce-prob'`` (authors' code switch): ``cross_entropy`` applied to the probabilities Q
      (i.e. log_softmax of Q again): mean of -Q[ybar] + log sum_j exp Q[j]. Bounded, MAE-like.

    Parameters
    ----------
    log_q : torch.Tensor
        float [B, M] log surrogate posteriors (output of :class:`TransitionLayer`).
    ybar : torch.Tensor
        int64 [B] surrogate labels (set indices) in [0, M).
    kind : str
        A name registered in :data:`LOSSES`.

    Returns
    -------
    torch.Tensor
        Scalar.

    Raises
    ------
    ValueError
        On an unknown ``kind`` (listing the valid ones) or mismatched shapes.
    """
    loss = LOSSES.get(kind)
    if log_q.ndim != 2 or ybar.ndim != 1 or ybar.shape[0] != log_q.shape[0]:
        raise ValueError(
            f"expected log_q [B, M] and ybar [B], got {tuple(log_q.shape)} and {tuple(ybar.shape)}"
        )
    return loss(log_q, ybar)

