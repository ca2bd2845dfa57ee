"""Tests of prior matrices and U-set construction (Lu et al., ICLR 2022, Eq. 5-6, Theorem 1)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from fedul_flwr.data.usets import (
    PRIOR_SCHEMES,
    PriorMatrixError,
    USets,
    build_usets,
    condition_number,
    dominant_class_priors,
    fit_priors_to_class_counts,
    uniform_priors,
    validate_prior_matrix,
)

K = 10


def _iid_pool(n_per_class: int = 960, offset: int = 5000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    labels = np.random.default_rng(seed).permutation(np.repeat(np.arange(K), n_per_class))
    return labels, np.arange(labels.size, dtype=np.int64) + offset  # indices are not 0..n-1


def _noniid_pool() -> tuple[np.ndarray, np.ndarray]:
    sizes = [4500, 4470] + [55 + k for k in range(8)]
    labels = np.random.default_rng(3).permutation(np.repeat(np.arange(K), sizes))
    return labels, np.arange(labels.size, dtype=np.int64) * 3


def _check_consistent(u: USets, labels: np.ndarray, indices: np.ndarray) -> None:
    """Partition of the pool; class_counts match the labels; priors realised up to rounding."""
    lab_of = dict(zip(indices.tolist(), labels.tolist()))
    allidx = np.concatenate(u.indices)
    assert allidx.dtype == np.int64
    assert allidx.size == indices.size and np.array_equal(np.sort(allidx), np.sort(indices))
    assert u.set_sizes.sum() == indices.size
    for m, ix in enumerate(u.indices):
        counts = np.bincount([lab_of[i] for i in ix.tolist()], minlength=u.num_classes)
        assert np.array_equal(counts, u.class_counts[m])
    np.testing.assert_array_equal(u.class_counts.sum(axis=0), np.bincount(labels, minlength=u.num_classes))
    np.testing.assert_allclose(u.priors.sum(axis=1), 1.0, atol=1e-9)
    empirical = u.class_counts / u.set_sizes[:, None]
    bound = u.num_classes / u.set_sizes[:, None]
    assert np.all(np.abs(empirical - u.priors) <= bound)
    idx, ybar = u.surrogate_dataset()
    assert idx.dtype == np.int64 and ybar.dtype == np.int64
    np.testing.assert_array_equal(idx, allidx)
    np.testing.assert_array_equal(np.bincount(ybar, minlength=u.num_sets), u.set_sizes)
    np.testing.assert_allclose(u.surrogate_prior, u.set_sizes / indices.size)


@pytest.mark.parametrize("scheme", sorted(PRIOR_SCHEMES))
@pytest.mark.parametrize("num_sets", [10, 20, 40])
def test_iid_sets_partition_the_pool(scheme: str, num_sets: int) -> None:
    labels, indices = _iid_pool()
    u = build_usets(labels, indices, num_sets, K, scheme, np.random.default_rng(7))
    assert u.num_sets == num_sets and u.num_classes == K
    _check_consistent(u, labels, indices)
    assert np.all(np.abs(u.set_sizes - indices.size / num_sets) <= K)
    assert u.present_classes.all()
    assert np.isclose(u.condition_number, condition_number(u.priors))
    # the bound above is not vacuous: the priors are realised far more precisely than uniform
    assert np.abs(u.class_counts / u.set_sizes[:, None] - u.priors).max() < 0.02


def test_priors_are_far_from_exact_without_rounding_bound() -> None:
    """The consistency check can fail: stating another matrix violates the bound."""
    labels, indices = _iid_pool()
    u = build_usets(labels, indices, 10, K, "dominant", np.random.default_rng(0))
    other = build_usets(labels, indices, 10, K, "dominant", np.random.default_rng(1))
    fake = USets(u.indices, other.priors, u.class_counts, u.condition_number)
    with pytest.raises(AssertionError):
        _check_consistent(fake, labels, indices)


def test_determinism() -> None:
    labels, indices = _iid_pool()
    a = build_usets(labels, indices, 20, K, "uniform", np.random.default_rng(11))
    b = build_usets(labels, indices, 20, K, "uniform", np.random.default_rng(11))
    c = build_usets(labels, indices, 20, K, "uniform", np.random.default_rng(12))
    assert all(np.array_equal(x, y) for x, y in zip(a.indices, b.indices))
    np.testing.assert_array_equal(a.priors, b.priors)
    np.testing.assert_array_equal(a.class_counts, b.class_counts)
    assert not np.array_equal(a.priors, c.priors)
    assert not all(np.array_equal(x, y) for x, y in zip(a.indices, c.indices))


def test_dominant_scheme_argmax() -> None:
    raw = dominant_class_priors(30, K, np.random.default_rng(0))
    assert raw.shape == (30, K) and np.all(raw > 0)
    np.testing.assert_allclose(raw.sum(axis=1), 1.0)
    np.testing.assert_array_equal(raw.argmax(axis=1), np.arange(30) % K)
    labels, indices = _iid_pool()
    for num_sets in (10, 20, 40):
        u = build_usets(labels, indices, num_sets, K, "dominant", np.random.default_rng(num_sets))
        np.testing.assert_array_equal(u.priors.argmax(axis=1), np.arange(num_sets) % K)
        np.testing.assert_array_equal(u.class_counts.argmax(axis=1), np.arange(num_sets) % K)


def test_uniform_scheme_range() -> None:
    raw = uniform_priors(500, K, np.random.default_rng(0))
    np.testing.assert_allclose(raw.sum(axis=1), 1.0)
    ratio = raw.max(axis=1) / raw.min(axis=1)
    assert ratio.max() <= 9.0 + 1e-9 and ratio.max() > 5.0  # entries in [0.1, 0.9] before normalising
    with pytest.raises(ValueError, match="low < high"):
        uniform_priors(10, K, np.random.default_rng(0), low=0.5, high=0.2)
    with pytest.raises(ValueError, match="factor"):
        dominant_class_priors(10, K, np.random.default_rng(0), factor=-1.0)


def test_fit_reproduces_class_counts_and_keeps_cross_ratios() -> None:
    rng = np.random.default_rng(5)
    raw = uniform_priors(12, 4, rng)
    counts = np.array([700, 250, 50, 0])
    sizes = np.full(12, 1000 // 12)
    sizes[: 1000 % 12] += 1
    p = fit_priors_to_class_counts(raw, counts, sizes)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(sizes @ p, counts, rtol=1e-8, atol=1e-8)
    assert np.all(p[:, 3] == 0) and np.all(p[:, :3] > 0)

    def cross(x: np.ndarray) -> np.ndarray:
        return x[:-1, :-1] * x[1:, 1:] / (x[:-1, 1:] * x[1:, :-1])

    np.testing.assert_allclose(cross(p[:, :3]), cross(raw[:, :3]), rtol=1e-8)
    # plain row normalisation would not reproduce the counts
    assert np.abs(sizes @ raw - counts).max() > 50
    with pytest.raises(ValueError, match="sum to"):
        fit_priors_to_class_counts(raw, counts, sizes + 1)


@pytest.mark.parametrize(
    ("matrix", "pattern"),
    [
        (np.full((10, 9), 1 / 9), r"my\.csv: has 9 columns, expected K=10"),
        (np.full(10, 0.1), r"my\.csv: must be a 2-D"),
        (np.where(np.eye(10, dtype=bool), np.nan, 0.1), r"my\.csv: entry \[0, 0\] is nan"),
        (np.eye(10) - np.diag([0] * 7 + [0.2, 0, 0]), r"my\.csv: row 7 sums to 0\.8"),
    ],
)
def test_validation_shape_nan_rowsum(matrix: np.ndarray, pattern: str) -> None:
    with pytest.raises(PriorMatrixError, match=pattern):
        validate_prior_matrix(matrix, K, source="my.csv")


def test_validation_errors_name_the_culprit() -> None:
    good = dominant_class_priors(12, K, np.random.default_rng(0))
    validate_prior_matrix(good, K)  # passes

    bad = good.copy()
    bad[4] *= 1.01
    with pytest.raises(PriorMatrixError, match=r"priors\.csv: row 4 sums to 1\.01"):
        validate_prior_matrix(bad, K, source="priors.csv")

    bad = good.copy()
    bad[2, 3] -= bad[2, 3] + 0.05
    bad[2, 4] += 0.05 + good[2, 3]
    with pytest.raises(PriorMatrixError, match=r"entry \[2, 3\] = -0\.05 is negative"):
        validate_prior_matrix(bad, K)

    bad = np.zeros((12, K))
    bad[:, 0] = 1.0
    bad[5, 0], bad[5, 1] = 1.5, -0.5
    with pytest.raises(PriorMatrixError, match=r"entry \[5, 1\] = -0\.5 is negative"):
        validate_prior_matrix(bad, K)
    bad[5, 1] = 0.0
    bad[5, 0] = 1.2
    with pytest.raises(PriorMatrixError, match=r"entry \[5, 0\] = 1\.2 exceeds 1"):
        validate_prior_matrix(bad, K)

    bad = good.copy()
    bad[3, 7] = np.inf
    with pytest.raises(PriorMatrixError, match=r"entry \[3, 7\] is inf"):
        validate_prior_matrix(bad, K)

    with pytest.raises(PriorMatrixError, match="M_c=3 sets < K=10 classes"):
        validate_prior_matrix(good[:3], K)

    deficient = good.copy()
    deficient[:, 9] = 0.5 * (good[:, 0] + good[:, 1])
    deficient /= deficient.sum(axis=1, keepdims=True)
    with pytest.raises(PriorMatrixError, match=r"rank 9 < 10 classes"):
        validate_prior_matrix(deficient, K, source="deficient")
    assert condition_number(deficient) > 1e10


def test_validation_with_absent_classes() -> None:
    good = dominant_class_priors(12, K, np.random.default_rng(0))
    present = np.ones(K, dtype=bool)
    present[[3, 8]] = False
    sub = good.copy()
    sub[:, ~present] = 0.0
    sub /= sub.sum(axis=1, keepdims=True)
    validate_prior_matrix(sub, K, present_classes=present)  # rank 8 over 8 present classes: fine
    assert np.isfinite(condition_number(sub, present)) and condition_number(sub) == float("inf")
    with pytest.raises(PriorMatrixError, match=r"rank 8 < 10"):
        validate_prior_matrix(sub, K)
    with pytest.raises(PriorMatrixError, match=r"column\(s\) \[3, 8\]"):
        validate_prior_matrix(good, K, present_classes=present)
    collapsed = sub.copy()
    collapsed[:, 9] = collapsed[:, 0]
    collapsed /= collapsed.sum(axis=1, keepdims=True)
    with pytest.raises(PriorMatrixError, match=r"rank 7 < 8 present classes"):
        validate_prior_matrix(collapsed, K, present_classes=present)


def test_build_rejects_too_few_sets_and_bad_scheme() -> None:
    labels, indices = _iid_pool(50)
    with pytest.raises(PriorMatrixError, match="M_c=5 sets < K=10"):
        build_usets(labels, indices, 5, K, "uniform", np.random.default_rng(0))
    with pytest.raises(ValueError, match="prior-scheme=.paper. is not one of"):
        build_usets(labels, indices, 10, K, "paper", np.random.default_rng(0))
    with pytest.raises(ValueError, match="labels must lie in"):
        build_usets(labels + 1, indices, 10, K, "uniform", np.random.default_rng(0))


@pytest.mark.parametrize("scheme", sorted(PRIOR_SCHEMES))
@pytest.mark.parametrize("num_sets", [10, 40])
def test_noniid_pool_builds_and_uses_all_samples(scheme: str, num_sets: int) -> None:
    labels, indices = _noniid_pool()
    u = build_usets(labels, indices, num_sets, K, scheme, np.random.default_rng(2))
    _check_consistent(u, labels, indices)
    assert np.all(np.abs(u.set_sizes - indices.size / num_sets) <= K)
    assert np.isfinite(u.condition_number)
    # the expected class totals of the stated priors are the pool's counts
    np.testing.assert_allclose(
        u.set_sizes @ u.priors, np.bincount(labels, minlength=K), atol=K * num_sets
    )


def test_absent_class_gives_zero_column_and_warning(caplog: pytest.LogCaptureFixture) -> None:
    labels, indices = _iid_pool(200)
    keep = (labels != 4) & (labels != 7)
    labels, indices = labels[keep], indices[keep]
    with caplog.at_level(logging.WARNING, logger="fedul_flwr.data.usets"):
        u = build_usets(labels, indices, 12, K, "dominant", np.random.default_rng(0))
    assert "[4, 7]" in caplog.text
    assert np.all(u.priors[:, [4, 7]] == 0) and np.all(u.class_counts[:, [4, 7]] == 0)
    np.testing.assert_array_equal(u.present_classes, ~np.isin(np.arange(K), [4, 7]))
    _check_consistent(u, labels, indices)
    assert np.isfinite(u.condition_number)


def test_condition_numbers_uniform_much_worse_than_dominant() -> None:
    labels, indices = _iid_pool()
    for num_sets in (10, 20, 40):
        med = {
            scheme: np.median(
                [
                    build_usets(labels, indices, num_sets, K, scheme, np.random.default_rng(s)).condition_number
                    for s in range(20)
                ]
            )
            for scheme in PRIOR_SCHEMES
        }
        # measured medians (9600 samples): dominant 4.8 / 3.1 / 2.6, uniform 123 / 17 / 12
        assert med["dominant"] < 10
        assert med["uniform"] > 3 * med["dominant"], (num_sets, med)
    assert med["uniform"] > 8  # M = 40


def test_usets_are_read_only() -> None:
    labels, indices = _iid_pool(100)
    u = build_usets(labels, indices, 10, K, "dominant", np.random.default_rng(0))
    with pytest.raises(ValueError):
        u.priors[0, 0] = 1.0
    with pytest.raises(ValueError):
        u.indices[0][0] = -1
