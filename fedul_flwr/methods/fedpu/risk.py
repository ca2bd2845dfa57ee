"""The local PU risks of FedPU (Lin et al., "Federated Learning with Positive and Unlabeled
Data", ICML 2022, Sec. 3.2), as differentiable losses.

Notation: client k with positive classes CP (labeled data P_i of each i in CP) and unlabeled
data U (every class); C = all K classes, CN = C \\ CP; pi [K] the class prior; s = softmax(f(x)).
Eq. 10 (without its cross-client term) writes the client's risk with the 0-1 quantities
P(f(x) != m):

    R_k = sum_{i in CP} pi_i E_i[ P(f != i) - sum_{m in CN} P(f != m) ] + sum_{m in CN} E_U[ P(f != m) ].

The paper never says which differentiable surrogate replaces P(f != m), and the risk
*subtracts* terms, so with cross-entropy it is unbounded below (a model can drive the
subtracted terms to +inf). The losses, by name in :data:`PU_LOSSES`:

``eq10-nn``
    Eq. 10 itself with the cross-entropy surrogate P(f(x) != m) ~ -log s_m, regrouped by class
    and made non-negative as in nnPU (Kiryo et al., NeurIPS 2017). Eq. 10 is, exactly,

        R_k = sum_{i in CP} pi_i E_i[-log s_i]
            + sum_{m in CN} ( E_U[-log s_m] - sum_{i in CP} pi_i E_i[-log s_m] ),

    and each bracket estimates sum_{j in CN} pi_j E_j[-log s_m] >= 0 (the unlabeled data of
    the negative classes, Eq. 7's decomposition), so each is clamped at 0 when a mini-batch
    estimate goes negative:

        L = sum_{i in CP} pi_i E_i[-log s_i]
          + sum_{m in CN} max(0, E_U[-log s_m] - sum_{i in CP} pi_i E_i[-log s_m]).

    Where no clamp acts, L is Eq. 10 with this surrogate, term for term. Bounded below by 0.
``nnpu`` (default: it measures better than ``eq10-nn``, docs/fedpu.md)
    A sum over the positive classes of one-vs-rest binary non-negative PU risks ("i" against
    "not i", class prior pi_i), with the nnPU clamp:

        L = sum_{i in CP} [ pi_i E_i[-log s_i] + max(0, E_U[-log(1 - s_i)] - pi_i E_i[-log(1 - s_i)]) ].

    This is *not* Eq. 10. Under the 0-1 loss (-log s_i -> P(f != i), -log(1 - s_i) ->
    P(f = i)) and without the clamp, using sum_{m in CN} P(f != m) = |CN| - 1 +
    sum_{j in CP} P(f = j),

        L = Eq. 10 + sum_{i in CP} pi_i E_i[ sum_{j in CP, j != i} P(f = j) ] + constant:

    it also penalises a labeled image of positive class i predicted as another positive
    class j, a term Eq. 10 lacks (Eq. 10 rewards it: its labeled part subtracts
    sum_{m in CN} P(f != m)). The extra term is not a constant; it vanishes only with one
    positive class per client, where the two risks agree up to a constant. Bounded below
    by 0.
``upu``
    The same sum of binary PU risks without the clamp: the unbiased PU risk of du Plessis et
    al. (ICML 2015), i.e. conventional PU learning on each client -- the paper's
    "conventional PU + FedAvg" baseline as read here. Unbounded below with cross-entropy:
    the baseline shows what the non-negative correction buys.
``eq10``
    Eq. 10 literally with the bounded surrogate P(f(x) != m) ~ 1 - s_m(x) in [0, 1]:
    bounded below by -sum_{i in CP} pi_i |CN|. Mean-absolute-error-like, it trains slowly;
    here for fidelity and as the reference of the tests.
``authors``
    The authors' code (``MPULoss_V2`` in ``modules/loss.py``, eps = 1e-6): cross-entropy on P
    plus a uPU-style "not a positive class" term on U and P (no clamp, no cross-client term):

        CE(P) + mean_{x in U, i in CP} -log(1 - s_i + eps)
              + 1[K > |CP|] pi_{CP[0]} / (|P| (K - |CP|)) sum_{x in P, i in CP} -log(1 - s_i + eps)
              - mean_{x in P} pi_{y(x)} (-log(1 - s_{y(x)} + eps)).

Eq. 10's third, cross-client term (``fedpu-cross-client``; :func:`cross_client_term`):

    - sum_{q != k} sum_{i in CP_k, i not in CP_q, m not in CP_q, m != i} pi_i E_i[ P(f != m) ].

With W[i, m] = #{q != k : i, m not in CP_q} (i in CP_k, m != i) it is
-sum_i pi_i E_i[sum_m W[i, m] P(f != m)]. Under the 0-1 loss P(f != m) = 1 - P(f = m), so
up to a constant it *adds* sum_i pi_i E_i[sum_m W[i, m] P(f = m)]: client k's labeled
images of i are kept from being predicted as the classes m that the clients lacking i also
lack. With ``eq10`` the literal form with 1 - s_m is used; with the cross-entropy losses the
surrogate of P(f = m) is -log(1 - s_m) (as in their negative risks): a non-negative term that
needs no clamp.

Batches: E_i is the mean over the rows of the labeled batch with label i (a positive class
without rows in the batch contributes no labeled term); E_U the mean over the unlabeled batch.
log(1 - s_i) is computed as logsumexp_{j != i} z_j - logsumexp_j z_j: finite, with finite
gradients, even where s_i rounds to 0 or 1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from fedul_flwr.registry import Registry

__all__ = ["PU_LOSSES", "cross_client_term", "cross_client_weights", "log_not", "pu_loss"]

PULoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
PU_LOSSES: Registry[PULoss] = Registry("fedpu loss")
"""PU losses ``(logits_p [n_p, K], y_p [n_p], logits_u [n_u, K], positives [|CP|], prior [K])
-> scalar`` by name (FedPU's ``fedpu-loss`` option)."""


def log_not(logits: torch.Tensor) -> torch.Tensor:
    """log(1 - softmax(logits)_i) for every class i: ``[n, K]`` -> ``[n, K]``, as
    logsumexp over the other classes minus logsumexp over all (no 1 - s cancellation)."""
    k = logits.shape[1]
    others = logits.unsqueeze(1).expand(-1, k, -1).masked_fill(torch.eye(k, dtype=torch.bool, device=logits.device), float("-inf"))
    return torch.logsumexp(others, dim=2) - torch.logsumexp(logits, dim=1, keepdim=True)


def _class_means(values: torch.Tensor, labels: torch.Tensor, classes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per class c of ``classes``: the mean of ``values[rows with label c]`` ([|CP|, ...]) and
    whether the batch has such rows ([|CP|] bool)."""
    onehot = (labels.unsqueeze(0) == classes.unsqueeze(1)).to(values.dtype)  # [|CP|, n]
    counts = onehot.sum(dim=1)
    means = (onehot @ values.reshape(len(labels), -1)) / counts.clamp_min(1).unsqueeze(1)
    return means.reshape(len(classes), *values.shape[1:]), counts > 0


def _binary_pu_risks(
    logits_p: torch.Tensor, y_p: torch.Tensor, logits_u: torch.Tensor, positives: torch.Tensor, prior: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per positive class i: the labeled risk pi_i E_i[-log s_i] and the corrected negative
    risk E_U[-log(1 - s_i)] - pi_i E_i[-log(1 - s_i)], each ``[|CP|]``."""
    pi = prior[positives]  # [|CP|]
    ce_p = -F.log_softmax(logits_p, dim=1)  # [n_p, K]
    not_p = -log_not(logits_p)  # [n_p, K]: -log(1 - s)
    not_u = -log_not(logits_u)[:, positives].mean(dim=0)  # [|CP|]: E_U[-log(1 - s_i)]
    means, present = _class_means(torch.stack([ce_p[:, positives], not_p[:, positives]], dim=2), y_p, positives)
    idx = torch.arange(len(positives), device=logits_p.device)
    ce_i, not_i = means[idx, idx, 0], means[idx, idx, 1]  # E_i[-log s_i], E_i[-log(1 - s_i)]
    labeled = torch.where(present, pi * ce_i, torch.zeros_like(pi))
    negative = not_u - torch.where(present, pi * not_i, torch.zeros_like(pi))
    return labeled, negative


@PU_LOSSES.register("eq10-nn")
def eq10_nn_loss(logits_p: torch.Tensor, y_p: torch.Tensor, logits_u: torch.Tensor, positives: torch.Tensor,
                 prior: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Eq. 10 without the cross-client term, surrogate P(f != m) ~ -log s_m, each negative
    class's corrected risk clamped at 0 (module docstring).

    Parameters
    ----------
    logits_p : torch.Tensor
        ``[n_p, K]`` logits of the labeled positives.
    y_p : torch.Tensor
        int64 ``[n_p]`` their classes (in ``positives``).
    logits_u : torch.Tensor
        ``[n_u, K]`` logits of the unlabeled images.
    positives : torch.Tensor
        int64 ``[|CP|]`` the client's positive classes CP.
    prior : torch.Tensor
        ``[K]`` class prior pi.

    Returns
    -------
    torch.Tensor
        Scalar >= 0; a positive class without rows in the batch contributes no labeled term.
    """
    k = logits_p.shape[1]
    negative = torch.ones(k, dtype=torch.bool, device=logits_p.device)
    negative[positives] = False
    ce_p = -F.log_softmax(logits_p, dim=1)  # [n_p, K]: -log s_m
    ce_u = -F.log_softmax(logits_u, dim=1)[:, negative].mean(dim=0)  # [|CN|]: E_U[-log s_m]
    means, present = _class_means(ce_p, y_p, positives)  # [|CP|, K]: E_i[-log s_m]
    weights = torch.where(present, prior[positives], torch.zeros_like(prior[positives]))  # pi_i, 0 if absent
    idx = torch.arange(len(positives), device=logits_p.device)
    labeled = (weights * means[idx, positives]).sum()  # sum_i pi_i E_i[-log s_i]
    corrected = ce_u - weights @ means[:, negative]  # [|CN|]: E_U[-log s_m] - sum_i pi_i E_i[-log s_m]
    return labeled + corrected.clamp_min(0).sum()


@PU_LOSSES.register("nnpu")
def nnpu_loss(logits_p: torch.Tensor, y_p: torch.Tensor, logits_u: torch.Tensor, positives: torch.Tensor,
              prior: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Sum over positive classes of non-negative one-vs-rest binary PU risks (module
    docstring: not Eq. 10 once a client has two or more positive classes)."""
    labeled, negative = _binary_pu_risks(logits_p, y_p, logits_u, positives, prior)
    return (labeled + negative.clamp_min(0)).sum()


@PU_LOSSES.register("upu")
def upu_loss(logits_p: torch.Tensor, y_p: torch.Tensor, logits_u: torch.Tensor, positives: torch.Tensor,
             prior: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Sum over positive classes of unbiased (unclamped) binary PU risks (module docstring)."""
    labeled, negative = _binary_pu_risks(logits_p, y_p, logits_u, positives, prior)
    return (labeled + negative).sum()


@PU_LOSSES.register("eq10")
def eq10_loss(logits_p: torch.Tensor, y_p: torch.Tensor, logits_u: torch.Tensor, positives: torch.Tensor,
              prior: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Eq. 10 without the cross-client term, surrogate P(f != m) ~ 1 - s_m (module docstring)."""
    k = logits_p.shape[1]
    negative = torch.ones(k, dtype=torch.bool, device=logits_p.device)
    negative[positives] = False
    miss_p = 1 - F.softmax(logits_p, dim=1)  # [n_p, K]: 1 - s_m
    miss_u = 1 - F.softmax(logits_u, dim=1)
    means, present = _class_means(miss_p, y_p, positives)  # [|CP|, K]
    idx = torch.arange(len(positives), device=logits_p.device)
    per_class = means[idx, positives] - means[:, negative].sum(dim=1)  # E_i[(1 - s_i) - sum_{m in CN}(1 - s_m)]
    labeled = torch.where(present, prior[positives] * per_class, torch.zeros_like(per_class)).sum()
    return labeled + miss_u[:, negative].mean(dim=0).sum()


@PU_LOSSES.register("authors")
def authors_loss(logits_p: torch.Tensor, y_p: torch.Tensor, logits_u: torch.Tensor, positives: torch.Tensor,
                 prior: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:  # fmt: skip
    """The authors' ``MPULoss_V2`` (module docstring)."""
    k, cp = logits_p.shape[1], len(positives)
    s_p, s_u = F.softmax(logits_p, dim=1), F.softmax(logits_u, dim=1)
    not_u = -torch.log(1 - s_u[:, positives] + eps)  # [n_u, |CP|]
    not_p = -torch.log(1 - s_p[:, positives] + eps)  # [n_p, |CP|]
    own = -torch.log(1 - s_p.gather(1, y_p.unsqueeze(1)).squeeze(1) + eps)  # [n_p]
    loss = F.cross_entropy(logits_p, y_p) + not_u.mean()
    if k > cp:
        loss = loss + prior[positives[0]] / (len(y_p) * (k - cp)) * not_p.sum()
    return loss - (prior[y_p] * own).mean()


def cross_client_weights(own: tuple[int, ...], others: list[tuple[int, ...]], num_classes: int) -> torch.Tensor:
    """W [K, K] of Eq. 10's cross-client term for client k (module docstring).

    Parameters
    ----------
    own : tuple[int, ...]
        CP_k.
    others : list[tuple[int, ...]]
        CP_q of every other client q.
    num_classes : int
        K.

    Returns
    -------
    torch.Tensor
        float32 ``[K, K]``: W[i, m] = #{q : i not in CP_q and m not in CP_q} for i in CP_k and
        m != i; 0 elsewhere.
    """
    lacks = torch.ones(len(others), num_classes)  # [Q, K]: 1 where client q does not label the class
    for q, classes in enumerate(others):
        lacks[q, list(classes)] = 0
    weights = lacks.T @ lacks  # [K, K]: clients lacking both i and m
    weights.fill_diagonal_(0)
    rows = torch.zeros(num_classes, 1)
    rows[list(own)] = 1
    return weights * rows


def cross_client_term(
    logits_p: torch.Tensor, y_p: torch.Tensor, weights: torch.Tensor, prior: torch.Tensor, literal: bool = False
) -> torch.Tensor:
    """Eq. 10's cross-client term on a labeled batch (module docstring).

    Parameters
    ----------
    logits_p : torch.Tensor
        ``[n_p, K]`` logits of the labeled positives.
    y_p : torch.Tensor
        int64 ``[n_p]`` their classes.
    weights : torch.Tensor
        ``[K, K]`` from :func:`cross_client_weights`.
    prior : torch.Tensor
        ``[K]`` class prior pi.
    literal : bool
        True: -sum_i pi_i E_i[sum_m W[i, m] (1 - s_m)] (``eq10``); False: the cross-entropy
        surrogate sum_i pi_i E_i[sum_m W[i, m] (-log(1 - s_m))] >= 0.

    Returns
    -------
    torch.Tensor
        Scalar; a class without rows in the batch contributes nothing.
    """
    per_class = (1 - F.softmax(logits_p, dim=1)) if literal else -log_not(logits_p)  # [n_p, K]
    per_row = (per_class * weights[y_p]).sum(dim=1)  # [n_p]: sum_m W[y, m] loss_m
    classes = torch.unique(y_p)
    means, _ = _class_means(per_row, y_p, classes)  # [c]: E_i
    term = (prior[classes] * means).sum()
    return -term if literal else term


def pu_loss(name: str) -> PULoss:
    """The PU loss ``name`` of :data:`PU_LOSSES`.

    Raises
    ------
    UnknownChoiceError
        On an unknown name (lists the valid ones).
    """
    return PU_LOSSES.get(name)
