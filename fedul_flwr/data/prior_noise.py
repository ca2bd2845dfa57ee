"""Inaccurate class priors: what the method is told when Pi_c is known only approximately.

Lu et al. (ICLR 2022), Sec. 4.1 "Robustness to noisy class priors" / Fig. 3 / App. E.1
(Table E.9: MNIST non-IID, 5 clients, 10 sets, eps in {0, 0.2, 0.4, 0.8, 1.6}). The paper
prints the perturbation as ``Pi~ = Pi * ((2 eps - 1) gamma + 1)`` with gamma ~ U[0, 1],
which is *not* clean at eps = 0 although the table calls eps = 0 "clean". We implement the
evident intent, a multiplicative noise of relative size eps:

    Pi~[m, k] = clip(Pi[m, k] * (1 + eps * (2 gamma[m, k] - 1)), 0, 1),   gamma ~ U[0, 1],

then each row renormalised to sum to 1. The U sets themselves (which images, their true
class mix) are unchanged; only the matrix handed to the method is perturbed.
"""

from __future__ import annotations

import numpy as np

__all__ = ["noisy_priors"]


def noisy_priors(priors: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray:
    """Perturb a prior matrix multiplicatively by relative noise of size ``eps``.

    Parameters
    ----------
    priors : np.ndarray
        float ``[M, K]`` true class priors Pi_c (rows sum to 1).
    eps : float
        Noise level >= 0; ``0`` returns an unchanged copy (and draws nothing from ``rng``).
    rng : np.random.Generator
        Source of gamma ``[M, K]`` (make it a function of seed and partition id).

    Returns
    -------
    np.ndarray
        float64 ``[M, K]`` Pi~, entries in [0, 1], rows sum to 1. A row that the clip would
        zero out entirely (possible only for eps > 1) keeps its true values.

    Raises
    ------
    ValueError
        If ``eps`` is negative or ``priors`` is not a 2-D array.
    """
    pi = np.asarray(priors, dtype=np.float64)
    if pi.ndim != 2:
        raise ValueError(f"priors must be [M, K], got shape {pi.shape}")
    if not eps >= 0:
        raise ValueError(f"prior noise eps must be >= 0, got {eps!r}")
    if eps == 0:
        return pi.copy()
    gamma = rng.uniform(0.0, 1.0, size=pi.shape)
    noisy = np.clip(pi * (1.0 + eps * (2.0 * gamma - 1.0)), 0.0, 1.0)
    sums = noisy.sum(axis=1, keepdims=True)
    empty = sums[:, 0] <= 0
    noisy[empty], sums[empty] = pi[empty], pi[empty].sum(axis=1, keepdims=True)
    return noisy / sums
