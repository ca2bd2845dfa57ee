"""Prior matrices and U-set construction for FedUL (Lu et al., ICLR 2022).

Step 3 of the data path (dataset -> partition -> **U sets** -> surrogate dataset -> train).
Client c splits its pool of n_c samples into M_c unlabeled sets U_c^m, each drawn from the
mixture of Eq. (5),

    p_c^m(x) = sum_k Pi_c[m, k] p(x | y = k),

and gives every sample of U_c^m the surrogate label ybar = m (Eq. 6). The method is told the
prior matrix Pi_c (M_c x K, rows sum to 1) and the surrogate prior pibar_c[m] = n_{c,m} / n_c
(Theorem 1). Lemma 2 / Theorem 1 need Pi_c to have full column rank K, hence M_c >= K.

Two schemes draw the *shape* of Pi_c:

- ``"dominant"`` (the authors' public code): row m ~ U(0.1, 1)^K, entry (m mod K) multiplied
  by ``factor`` (10), row normalised -- every set is dominated by one class; well conditioned.
- ``"uniform"`` (the paper's text, Sec. 4.1): entries ~ U[0.1, 0.9], rows normalised -- all
  rows close to uniform, so Pi_c is badly conditioned.

Labels are used here only to *simulate* the sets; they are forgotten afterwards and the model
never sees them. Unlike the authors' code, the sets are disjoint and partition the client's
pool exactly, and the stated priors are realised by the data up to integer rounding (see
:func:`build_usets`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedul_flwr import get_logger
from fedul_flwr.registry import Registry

log = get_logger(__name__)

__all__ = [
    "PRIOR_SCHEMES",
    "PriorMatrixError",
    "USets",
    "build_usets",
    "condition_number",
    "dominant_class_priors",
    "fit_priors_to_class_counts",
    "uniform_priors",
    "validate_prior_matrix",
]


class PriorMatrixError(ValueError):
    """A prior matrix Pi_c violates the conditions of Theorem 1 / Lemma 2 (or is malformed)."""


# --------------------------------------------------------------------------- prior schemes


def _check_sizes(num_sets: int, num_classes: int) -> None:
    if int(num_sets) < 1:
        raise ValueError(f"num_sets must be >= 1, got {num_sets}")
    if int(num_classes) < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")


def dominant_class_priors(
    num_sets: int, num_classes: int, rng: np.random.Generator, factor: float = 10.0
) -> np.ndarray:
    """Authors' code scheme: row m ~ U(0.1, 1)^K, entry (m mod K) multiplied by ``factor``,
    row normalised.

    With K=10 and factor 10 the dominant class holds ~53% of a set on average.

    Parameters
    ----------
    num_sets : int
        Number of sets M >= 1.
    num_classes : int
        Number of classes K >= 1.
    rng : np.random.Generator
        Source of randomness (consumes M*K uniforms).
    factor : float
        Multiplier (> 0) of the dominant entry.

    Returns
    -------
    np.ndarray
        float64 [M, K], strictly positive, rows sum to 1.

    Raises
    ------
    ValueError
        If a size is < 1 or ``factor`` is not a positive finite number.
    """
    _check_sizes(num_sets, num_classes)
    if not (np.isfinite(factor) and factor > 0):
        raise ValueError(f"dominant factor must be a positive finite number, got {factor!r}")
    raw = rng.uniform(0.1, 1.0, size=(num_sets, num_classes))
    rows = np.arange(num_sets)
    raw[rows, rows % num_classes] *= factor
    return raw / raw.sum(axis=1, keepdims=True)


def uniform_priors(
    num_sets: int, num_classes: int, rng: np.random.Generator, low: float = 0.1, high: float = 0.9
) -> np.ndarray:
    """Paper text scheme (Sec. 4.1): entries ~ U[low, high], rows normalised.

    Parameters
    ----------
    num_sets : int
        Number of sets M >= 1.
    num_classes : int
        Number of classes K >= 1.
    rng : np.random.Generator
        Source of randomness (consumes M*K uniforms).
    low, high : float
        Range of the raw entries, 0 < low < high.

    Returns
    -------
    np.ndarray
        float64 [M, K], strictly positive, rows sum to 1.

    Raises
    ------
    ValueError
        If a size is < 1 or not ``0 < low < high``.
    """
    _check_sizes(num_sets, num_classes)
    if not (np.isfinite(low) and np.isfinite(high) and 0 < low < high):
        raise ValueError(f"uniform prior range must satisfy 0 < low < high, got low={low!r}, high={high!r}")
    raw = rng.uniform(low, high, size=(num_sets, num_classes))
    return raw / raw.sum(axis=1, keepdims=True)


PRIOR_SCHEMES: Registry[Callable[..., np.ndarray]] = Registry("prior-scheme")
"""Prior-matrix shapes by name: ``scheme(num_sets, num_classes, rng, **options) -> [M, K]``."""
PRIOR_SCHEMES.add("dominant", dominant_class_priors)
PRIOR_SCHEMES.add("uniform", uniform_priors)


# --------------------------------------------------------------------------- fitting


def fit_priors_to_class_counts(
    raw: np.ndarray,
    class_counts: np.ndarray,
    set_sizes: np.ndarray,
    *,
    max_iter: int = 1000,
    tol: float = 1e-10,
) -> np.ndarray:
    """Sinkhorn / iterative proportional fitting of a prior matrix to a client's class counts.

    Finds P = diag(a) raw diag(b) whose rows sum to 1 and whose expected class totals
    ``sum_m set_sizes[m] * P[m, k]`` equal ``class_counts[k]``. This keeps the scheme's shape
    (all cross-ratios P[m,k] P[m',k'] / (P[m,k'] P[m',k]) of ``raw``) while making the sets an
    exact partition of the client's data. Columns of classes with zero count become zero.

    Parameters
    ----------
    raw : np.ndarray
        float [M, K] non-negative raw prior matrix (e.g. from a scheme in ``PRIOR_SCHEMES``).
    class_counts : np.ndarray
        [K] non-negative number of samples of each class in the client's pool.
    set_sizes : np.ndarray
        [M] positive target set sizes; must sum to ``class_counts.sum()``.
    max_iter : int
        Maximum number of Sinkhorn sweeps.
    tol : float
        Stop when the largest relative column-total error is below ``tol``.

    Returns
    -------
    np.ndarray
        float64 [M, K]; rows sum to 1; ``set_sizes @ P == class_counts`` (relative error
        below ``tol``, or 1e-6 at worst); zero columns where ``class_counts == 0``.

    Raises
    ------
    ValueError
        On shape mismatch, negative/non-finite inputs, or totals that differ.
    PriorMatrixError
        If no such matrix exists for the zero pattern of ``raw`` (e.g. a row that is zero on
        every present class), detected as non-convergence to 1e-6.
    """
    raw = np.asarray(raw, dtype=np.float64)
    counts = np.asarray(class_counts, dtype=np.float64)
    sizes = np.asarray(set_sizes, dtype=np.float64)
    if raw.ndim != 2:
        raise ValueError(f"raw prior matrix must be 2-D [M, K], got shape {raw.shape}")
    num_sets, num_classes = raw.shape
    if counts.shape != (num_classes,):
        raise ValueError(f"class_counts must have shape ({num_classes},), got {counts.shape}")
    if sizes.shape != (num_sets,):
        raise ValueError(f"set_sizes must have shape ({num_sets},), got {sizes.shape}")
    for name, arr in (("raw", raw), ("class_counts", counts), ("set_sizes", sizes)):
        if not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise ValueError(f"{name} must be finite and non-negative")
    if np.any(sizes <= 0):
        raise ValueError(f"set_sizes must be positive, got {sizes.tolist()}")
    total = counts.sum()
    if not np.isclose(sizes.sum(), total, rtol=1e-12, atol=0.0):
        raise ValueError(f"set sizes sum to {sizes.sum():g} but class counts sum to {total:g}")

    present = counts > 0
    kernel = raw * present[None, :]
    a = np.ones(num_sets)
    b = np.zeros(num_classes)
    err = np.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(max_iter):
            # column step: sum_m sizes[m] a[m] raw[m,k] b[k] = counts[k]
            col = (sizes * a) @ kernel
            b = np.where(present, counts / col, 0.0)
            # row step: sum_k a[m] raw[m,k] b[k] = 1
            a = 1.0 / (kernel @ b)
            if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
                break
            fitted = (sizes * a) @ kernel * b
            err = float(np.max(np.abs(fitted[present] - counts[present]) / counts[present]))
            if err < tol:
                break
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))) or err > 1e-6:
        raise PriorMatrixError(
            f"cannot fit the prior matrix to class counts {counts.astype(np.int64).tolist()} and "
            f"set sizes {sizes.astype(np.int64).tolist()} (relative column error {err:.3g}); "
            "the raw matrix's zero pattern admits no such fit"
        )
    priors = a[:, None] * kernel * b[None, :]
    return priors / priors.sum(axis=1, keepdims=True)


# --------------------------------------------------------------------------- validation


def _as_present_mask(present_classes: np.ndarray | None, num_classes: int) -> np.ndarray:
    if present_classes is None:
        return np.ones(num_classes, dtype=bool)
    mask = np.asarray(present_classes)
    if mask.shape != (num_classes,):
        raise ValueError(f"present_classes must have shape ({num_classes},), got {mask.shape}")
    return mask.astype(bool)


def validate_prior_matrix(
    priors: np.ndarray,
    num_classes: int,
    *,
    source: str = "prior matrix",
    atol: float = 1e-6,
    present_classes: np.ndarray | None = None,
) -> None:
    """Check that ``priors`` is a valid Pi_c for Theorem 1 / Lemma 2.

    Checks, in order: 2-D with K columns; finite; entries in [0, 1]; every row sums to 1
    within ``atol``; M >= K; full column rank. If ``present_classes`` is given, the rank
    condition is checked on those columns only and the other columns must be all zero
    (classes the client does not hold; their posterior cannot be learnt from it).

    Parameters
    ----------
    priors : np.ndarray
        float [M, K] prior matrix, row m = class priors of set m.
    num_classes : int
        Expected number of classes K.
    source : str
        Name of the matrix's origin, used in every error message (e.g. a file name).
    atol : float
        Tolerance of the row sums, and of "zero" for absent columns.
    present_classes : np.ndarray or None
        bool [K]: classes present in the client's data.

    Raises
    ------
    PriorMatrixError
        Naming ``source`` and the offending row, column or value.
    """
    arr = np.asarray(priors)
    if arr.ndim != 2:
        raise PriorMatrixError(f"{source}: must be a 2-D [M, K] matrix, got shape {arr.shape}")
    num_sets, cols = arr.shape
    if cols != num_classes:
        raise PriorMatrixError(f"{source}: has {cols} columns, expected K={num_classes} classes")
    try:
        arr = arr.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise PriorMatrixError(f"{source}: entries must be numbers ({exc})") from exc
    bad = np.argwhere(~np.isfinite(arr))
    if bad.size:
        m, k = bad[0]
        raise PriorMatrixError(
            f"{source}: entry [{m}, {k}] is {arr[m, k]} (NaN/inf); {len(bad)} non-finite entries"
        )
    bad = np.argwhere(arr < 0)
    if bad.size:
        m, k = bad[0]
        raise PriorMatrixError(
            f"{source}: entry [{m}, {k}] = {arr[m, k]:.6g} is negative; priors must be in [0, 1]"
        )
    bad = np.argwhere(arr > 1)
    if bad.size:
        m, k = bad[0]
        raise PriorMatrixError(
            f"{source}: entry [{m}, {k}] = {arr[m, k]:.6g} exceeds 1; priors must be in [0, 1]"
        )
    sums = arr.sum(axis=1)
    bad_rows = np.flatnonzero(np.abs(sums - 1.0) > atol)
    if bad_rows.size:
        m = bad_rows[0]
        raise PriorMatrixError(
            f"{source}: row {m} sums to {sums[m]:.8g}, not 1 (atol {atol:g}); "
            f"{bad_rows.size} row(s) off: {bad_rows[:10].tolist()}"
        )
    if num_sets < num_classes:
        raise PriorMatrixError(
            f"{source}: M_c={num_sets} sets < K={num_classes} classes; Theorem 1 needs M_c >= K "
            "(full column rank)"
        )
    mask = _as_present_mask(present_classes, num_classes)
    absent = np.flatnonzero(~mask)
    nonzero_absent = [int(k) for k in absent if np.any(np.abs(arr[:, k]) > atol)]
    if nonzero_absent:
        raise PriorMatrixError(
            f"{source}: column(s) {nonzero_absent} belong to classes absent from the client "
            "but are not all zero"
        )
    sub = arr[:, mask]
    if sub.shape[1] == 0:
        raise PriorMatrixError(f"{source}: no class is present")
    rank = int(np.linalg.matrix_rank(sub))
    if rank < sub.shape[1]:
        sv = np.linalg.svd(sub, compute_uv=False)
        what = "present classes" if absent.size else "classes"
        raise PriorMatrixError(
            f"{source}: rank {rank} < {sub.shape[1]} {what} (smallest singular value {sv[-1]:.3g}); "
            "Pi_c must have full column rank (Lemma 2 / Theorem 1)"
        )


def condition_number(priors: np.ndarray, present_classes: np.ndarray | None = None) -> float:
    """2-norm condition number sigma_max / sigma_min of Pi (over the present columns).

    Parameters
    ----------
    priors : np.ndarray
        float [M, K] prior matrix.
    present_classes : np.ndarray or None
        bool [K]; if given, only these columns are used.

    Returns
    -------
    float
        >= 1; ``inf`` if the (restricted) matrix is column-rank deficient.
    """
    arr = np.asarray(priors, dtype=np.float64)
    sub = arr[:, _as_present_mask(present_classes, arr.shape[1])]
    if sub.size == 0:
        return float("inf")
    sv = np.linalg.svd(sub, compute_uv=False)
    if sv[-1] <= sv[0] * np.finfo(np.float64).eps * max(sub.shape):
        return float("inf")
    return float(sv[0] / sv[-1])


# --------------------------------------------------------------------------- U sets


@dataclass(frozen=True, eq=False)
class USets:
    """A client's M_c disjoint unlabeled sets and what the method is told about them.

    Attributes
    ----------
    indices : tuple[np.ndarray, ...]
        Per set: int64 indices (into whatever index space the caller passed), disjoint
        across sets, together covering the client's pool.
    priors : np.ndarray
        float64 [M_c, K] stated class priors Pi_c (rows sum to 1) -- what the method is told.
    class_counts : np.ndarray
        int64 [M_c, K] exact number of samples of class k in set m (simulation bookkeeping;
        never given to the model).
    condition_number : float
        2-norm condition number of ``priors`` over the present classes.
    """

    indices: tuple[np.ndarray, ...]
    priors: np.ndarray
    class_counts: np.ndarray
    condition_number: float

    @property
    def num_sets(self) -> int:
        """M_c."""
        return int(self.priors.shape[0])

    @property
    def num_classes(self) -> int:
        """K."""
        return int(self.priors.shape[1])

    @property
    def present_classes(self) -> np.ndarray:
        """bool [K]: the classes with at least one sample in the client's sets (the columns
        ``condition_number`` is taken over)."""
        return self.class_counts.sum(axis=0) > 0

    @property
    def set_sizes(self) -> np.ndarray:
        """int64 [M_c]: n_{c,m}, the realised set sizes."""
        return np.array([len(ix) for ix in self.indices], dtype=np.int64)

    @property
    def surrogate_prior(self) -> np.ndarray:
        """float64 [M_c]: pibar_c[m] = n_{c,m} / n_c (Theorem 1)."""
        sizes = self.set_sizes.astype(np.float64)
        return sizes / sizes.sum()

    def surrogate_dataset(self) -> tuple[np.ndarray, np.ndarray]:
        """The surrogate labeled dataset of Eq. (6).

        Returns
        -------
        tuple[np.ndarray, np.ndarray]
            (indices [n_c] int64, surrogate labels ybar [n_c] int64 = set index),
            concatenated over sets in set order.
        """
        idx = np.concatenate(self.indices).astype(np.int64, copy=False)
        ybar = np.repeat(np.arange(self.num_sets, dtype=np.int64), self.set_sizes)
        return idx, ybar


def _largest_remainder(targets: np.ndarray, total: int) -> np.ndarray:
    """Integers >= 0 summing to ``total``, proportional to ``targets`` [M] (Hamilton's method).

    Ties in the fractional parts go to the lower index (stable sort), so the result is
    deterministic.
    """
    weight = targets.sum()
    if total == 0 or weight <= 0:
        return np.zeros_like(targets, dtype=np.int64)
    quota = targets * (total / weight)
    base = np.floor(quota).astype(np.int64)
    short = int(total - base.sum())
    if short > 0:
        order = np.argsort(-(quota - base), kind="stable")
        base[order[:short]] += 1
    return base


def build_usets(
    labels: np.ndarray,
    indices: np.ndarray,
    num_sets: int,
    num_classes: int,
    scheme: str,
    rng: np.random.Generator,
    *,
    dominant_factor: float = 10.0,
) -> USets:
    """Split a client's pool into ``num_sets`` disjoint U sets with known class priors.

    Simulation only: the true labels are used to build the sets and are then forgotten.

    1. Draw a raw prior matrix [M, K] from ``PRIOR_SCHEMES[scheme]`` with ``rng``.
    2. Target set sizes: n_c // M each, the remainder spread over the first sets (the paper's
       equal sizes n_c / M).
    3. Fit the raw matrix to the client's class counts with
       :func:`fit_priors_to_class_counts` (Sinkhorn), so that the expected class totals of
       the sets equal the counts the client actually holds. This is the honest fix for the
       paper's protocol: its non-IID clients hold ~55 samples of each minority class, and a
       uniform-[0.1, 0.9] matrix (which asks ~10% of every set to be of each class) cannot be
       realised by disjoint sets of equal size from such a pool. The authors' code instead
       samples sets independently with replacement (sets overlap) and reports the empirical
       proportions. The fit keeps the scheme's shape (cross-ratios) but, for skewed pools,
       moves the priors towards the pool's class distribution.
    4. Integer per-set class counts: for each class k, its n_k samples are split over sets
       proportionally to ``target_size[m] * P[m, k]`` by the largest-remainder method, so
       every sample is used exactly once; a set's realised size may differ from its target by
       fewer than K samples. The class's indices are shuffled with ``rng`` and dealt out,
       and each set is shuffled again so its order carries no trace of the labels.
    5. Stated priors = the fitted P; |class_counts[m, k] / n_m - P[m, k]| is of order K / n_m
       (integer rounding).

    Parameters
    ----------
    labels : np.ndarray
        int [n_c] true labels of the client's samples, in [0, K).
    indices : np.ndarray
        int [n_c] the samples' indices (any index space; returned as given).
    num_sets : int
        M_c >= K.
    num_classes : int
        K.
    scheme : str
        A key of ``PRIOR_SCHEMES``: ``"dominant"`` or ``"uniform"``.
    rng : np.random.Generator
        Sole source of randomness: same generator state -> identical result.
    dominant_factor : float
        Multiplier of the dominant entry for ``scheme="dominant"``.

    Returns
    -------
    USets
        With ``set_sizes.sum() == n_c`` and every index used exactly once.

    Raises
    ------
    PriorMatrixError
        If M_c < K, or the fitted matrix fails :func:`validate_prior_matrix` (e.g. rank
        deficient over the present classes).
    ValueError
        On an unknown scheme, mismatched/malformed inputs, fewer samples than sets, or a
        realised set that ends up empty.

    Notes
    -----
    Classes absent from the pool get zero columns; the rank condition is then checked over
    the present classes only, and a warning names the absent classes.
    """
    PRIOR_SCHEMES.get(scheme)  # raises on an unknown scheme, naming the valid ones
    labels = np.asarray(labels)
    indices = np.asarray(indices)
    if labels.ndim != 1 or indices.ndim != 1 or labels.shape != indices.shape:
        raise ValueError(
            f"labels and indices must be 1-D of equal length, got shapes {labels.shape} and {indices.shape}"
        )
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
    _check_sizes(num_sets, num_classes)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got range [{labels.min()}, {labels.max()}]")
    if num_sets < num_classes:
        raise PriorMatrixError(
            f"num-sets: M_c={num_sets} sets < K={num_classes} classes; Theorem 1 needs M_c >= K"
        )
    n_c = labels.size
    if n_c < num_sets:
        raise ValueError(f"client pool of {n_c} samples cannot be split into {num_sets} non-empty sets")

    if scheme == "dominant":
        raw = dominant_class_priors(num_sets, num_classes, rng, factor=dominant_factor)
    else:
        raw = PRIOR_SCHEMES.get(scheme)(num_sets, num_classes, rng)

    target = np.full(num_sets, n_c // num_sets, dtype=np.int64)
    target[: n_c % num_sets] += 1
    pool_counts = np.bincount(labels, minlength=num_classes).astype(np.int64)
    present = pool_counts > 0
    if not present.all():
        log.warning(
            "client pool has no samples of class(es) %s: zero prior columns, "
            "rank checked over the %d present classes",
            np.flatnonzero(~present).tolist(),
            int(present.sum()),
        )
    priors = fit_priors_to_class_counts(raw, pool_counts, target)
    validate_prior_matrix(priors, num_classes, source=f"{scheme} prior matrix", present_classes=present)

    counts = np.zeros((num_sets, num_classes), dtype=np.int64)
    per_set: list[list[np.ndarray]] = [[] for _ in range(num_sets)]
    for k in range(num_classes):
        if not present[k]:
            continue
        counts[:, k] = _largest_remainder(target * priors[:, k], int(pool_counts[k]))
        members = indices[labels == k]
        members = members[rng.permutation(members.size)]
        for m, chunk in enumerate(np.split(members, np.cumsum(counts[:-1, k]))):
            per_set[m].append(chunk)
    # shuffle within each set so that its order carries no trace of the labels
    sets = tuple(rng.permutation(np.concatenate(chunks).astype(np.int64)) for chunks in per_set)
    empty = [m for m, s in enumerate(sets) if s.size == 0]
    if empty:
        raise ValueError(f"set(s) {empty} received no samples; use fewer sets for a pool of {n_c} samples")
    for s in sets:
        s.setflags(write=False)
    priors.setflags(write=False)
    counts.setflags(write=False)
    return USets(
        indices=sets,
        priors=priors,
        class_counts=counts,
        condition_number=condition_number(priors, present),
    )
