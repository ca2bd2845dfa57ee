"""Client partitions: IID, the paper's non-IID (no class exhaustion), Dirichlet, hold-out."""

from __future__ import annotations

import numpy as np
import pytest

from fedul_flwr.data.partition import holdout_split, majority_classes_of, partition_pool


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    rng = np.random.default_rng(1)
    return rng.permutation(np.repeat(np.arange(10), 600))  # 6000 samples, 600 per class


def _check_disjoint_cover(parts: list[np.ndarray], n: int, cover: bool = True) -> None:
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "partitions overlap"
    assert allidx.min() >= 0 and allidx.max() < n
    if cover:
        assert len(allidx) == n


@pytest.mark.parametrize("scheme", ["iid", "noniid", "dirichlet"])
def test_partitions_are_disjoint_and_deterministic(labels: np.ndarray, scheme: str) -> None:
    parts = partition_pool(labels, 5, 10, scheme, seed=3, dirichlet_alpha=0.5)
    assert len(parts) == 5
    _check_disjoint_cover(parts, len(labels))
    again = partition_pool(labels, 5, 10, scheme, seed=3, dirichlet_alpha=0.5)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = partition_pool(labels, 5, 10, scheme, seed=4, dirichlet_alpha=0.5)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other))


def test_iid_sizes_and_class_mix(labels: np.ndarray) -> None:
    parts = partition_pool(labels, 5, 10, "iid", seed=0)
    assert {len(p) for p in parts} == {1200}
    for p in parts:
        counts = np.bincount(labels[p], minlength=10)
        assert counts.min() > 80 and counts.max() < 170  # ~120 each


def test_noniid_matches_table_d5_shape(labels: np.ndarray) -> None:
    parts = partition_pool(labels, 5, 10, "noniid", seed=0, noniid_minority_fraction=0.012)
    for c, p in enumerate(parts):
        counts = np.bincount(labels[p], minlength=10)
        major = majority_classes_of(c, 10, 2)
        assert major == [2 * c, 2 * c + 1]
        minor = [k for k in range(10) if k not in major]
        # every minority class present with ~1.2% of the class (no exhaustion: never zero)
        assert all(counts[k] == round(0.012 * 600) for k in minor)
        # majority classes get the rest: 600 - 4 minority clients x 7
        assert all(counts[k] == 600 - 4 * 7 for k in major)


def test_noniid_never_exhausts_classes_with_many_clients(labels: np.ndarray) -> None:
    parts = partition_pool(labels, 10, 10, "noniid", seed=0)
    for p in parts:
        assert np.all(np.bincount(labels[p], minlength=10) > 0)
    _check_disjoint_cover(parts, len(labels))


def test_noniid_rejects_impossible_fraction(labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match="noniid-minority-fraction"):
        partition_pool(labels, 5, 10, "noniid", seed=0, noniid_minority_fraction=1.5)
    with pytest.raises(ValueError, match="class 0"):
        partition_pool(labels, 50, 10, "noniid", seed=0, noniid_minority_fraction=0.05)


def test_dirichlet_skews_with_small_alpha(labels: np.ndarray) -> None:
    def skew(alpha: float) -> float:
        parts = partition_pool(labels, 5, 10, "dirichlet", seed=0, dirichlet_alpha=alpha)
        return float(np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in parts]))

    assert skew(0.1) > skew(100.0) + 0.2


def test_unknown_scheme_and_bad_alpha(labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match="partition='stripes'"):
        partition_pool(labels, 5, 10, "stripes", seed=0)
    with pytest.raises(ValueError, match="dirichlet-alpha"):
        partition_pool(labels, 5, 10, "dirichlet", seed=0, dirichlet_alpha=0.0)


def test_holdout_is_stratified(labels: np.ndarray) -> None:
    kept, held = holdout_split(labels, 0.2, seed=0)
    assert len(np.intersect1d(kept, held)) == 0 and len(kept) + len(held) == len(labels)
    assert np.all(np.bincount(labels[held], minlength=10) == 120)
    kept0, held0 = holdout_split(labels, 0.0, seed=0)
    assert len(held0) == 0 and len(kept0) == len(labels)


def test_dirichlet_on_a_small_pool_scales_its_minimum_and_names_a_failed_draw() -> None:
    """A 1000-image labeled pool over 20 clients at alpha = 0.1 (the FedDB setting): the
    default minimum (N // (10 C) = 5 here) lets every seed draw; an unreachable minimum
    stops with an error naming alpha, the pool, the clients and the seed."""
    from fedul_flwr.data.partition import dirichlet_partition

    labels = np.repeat(np.arange(10), 100)
    for seed in range(5):
        parts = dirichlet_partition(labels, 20, 0.1, seed)
        assert min(len(p) for p in parts) >= 5
        assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
    with pytest.raises(ValueError, match=r"dirichlet-alpha=0.1: .*1000 samples over 20 clients .*at least 40 \(seed 0\)"):
        dirichlet_partition(labels, 20, 0.1, 0, min_partition_size=40)


def test_inner_dirichlet_gives_equal_clients_skewed_by_alpha_and_names_a_failed_draw(labels: np.ndarray) -> None:
    """``inner-dirichlet``: every client holds an equal share (N mod C spread over the first
    clients), the shares cover the pool, small alpha concentrates each client on fewer
    classes, and a failing draw (alpha = 0.01, where every class a client favours runs out)
    is reported with the scheme, alpha, the pool, the clients and the seed."""
    parts = partition_pool(labels[:-3], 5, 10, "inner-dirichlet", seed=0, dirichlet_alpha=0.5)
    n = len(labels) - 3
    assert [len(p) for p in parts] == [n // 5 + (i < n % 5) for i in range(5)]
    _check_disjoint_cover(parts, n)

    def skew(alpha: float) -> float:
        parts = partition_pool(labels, 5, 10, "inner-dirichlet", seed=0, dirichlet_alpha=alpha)
        return float(np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in parts]))

    assert skew(0.1) > skew(100.0) + 0.2
    with pytest.raises(ValueError, match="dirichlet-alpha"):
        partition_pool(labels, 5, 10, "inner-dirichlet", seed=0, dirichlet_alpha=-1.0)
    pool = np.repeat(np.arange(10), 300)
    with pytest.raises(ValueError, match=r"partition=inner-dirichlet, dirichlet-alpha=0.01: .*3000 samples over 20 clients .*\(seed 0\)"):
        partition_pool(pool, 20, 10, "inner-dirichlet", seed=0, dirichlet_alpha=0.01)
