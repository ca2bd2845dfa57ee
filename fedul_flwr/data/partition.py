"""Client partitions of a labeled training pool: IID, shards, the paper's non-IID, Dirichlet.

Step 2 of the data path (dataset -> **partition** -> U sets -> surrogate dataset -> train).
A partition is a list of index arrays, one per client, into the training pool. Labels are
used here only to *simulate* clients; in FedUL no client ever sees them.

- ``iid``: a seeded shuffle cut into equal shards (the same shards as Flower Datasets'
  :class:`IidPartitioner`, computed in numpy).
- ``dirichlet``: Flower Datasets' :class:`DirichletPartitioner` (per-class proportions
  ~ Dir(alpha) over clients; Hsu et al., 2019). Client sizes vary; at small alpha most
  clients hold one or two classes and some almost nothing.
- ``inner-dirichlet``: Flower Datasets' :class:`InnerDirichletPartitioner` (per-client class
  proportions ~ Dir(alpha); every client holds an equal share of the pool). A client whose
  drawn class has run out draws from the classes left, so at alpha = 0.1 a Fashion-MNIST
  client of 20 holds 3-8 classes with more than 30 images (seeds 0-2), more than under
  ``dirichlet``.
- ``shards``: the shard split of FedAvg / FedProx (McMahan et al., 2017; Li et al., 2020)
  through Flower Datasets' :class:`ShardPartitioner`: the pool sorted by class, cut into
  equal shards, ``shards-per-client`` shards dealt to each client at random (FedPU's
  "5-class" and "2-class" non-IID splits: 5 or 2 shards per client). A client can draw two
  shards of one class and then holds fewer distinct classes than shards.
- ``noniid``: the class-prior shift of Lu et al. (ICLR 2022), Sec. 4.1 and App. D,
  Table D.5: every client holds ``majority`` majority classes (almost all samples of those
  classes) and a small ``minority_fraction`` of every other class. Unlike the authors'
  code, minority shares are reserved *before* majority shares are dealt, so no client runs
  out of a class (their split leaves the last clients with zero samples of some classes
  and a rank-deficient prior matrix).

Everything is deterministic from ``seed``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fedul_flwr import get_logger
from fedul_flwr.registry import Registry
from fedul_flwr.rng import numpy_generator

Partitioner = Callable[..., list[np.ndarray]]
PARTITIONS: Registry[Partitioner] = Registry("partition")
"""Partition schemes by name: ``scheme(labels, num_partitions, num_classes, seed, *, dirichlet_alpha,
noniid_majority, noniid_minority_fraction, shards_per_client) -> list of index arrays`` (each uses
what it needs)."""

log = get_logger(__name__)


def named_classes(classes: int | Sequence[int], class_names: Sequence[str] | None) -> str:
    """Classes as messages name them: by name (``'four'``, ``['four', 'nine']``) when the
    names are known, else by index."""
    if isinstance(classes, (int, np.integer)):
        return repr(class_names[int(classes)]) if class_names else str(int(classes))
    return str([class_names[int(c)] for c in classes] if class_names else [int(c) for c in classes])


def _label_dataset(labels: np.ndarray):  # -> datasets.Dataset
    from datasets import Dataset  # deferred: import cost of datasets and pyarrow (seconds), paid only by these partitions

    return Dataset.from_dict(
        {"idx": np.arange(len(labels), dtype=np.int64), "label": np.asarray(labels, dtype=np.int64)}
    )


def _flower_partitions(partitioner: object, labels: np.ndarray, num_partitions: int) -> list[np.ndarray]:
    """The pool indices of every partition of a Flower Datasets partitioner over ``labels``."""
    partitioner.dataset = _label_dataset(labels)  # type: ignore[attr-defined]
    return [np.asarray(partitioner.load_partition(i)["idx"], dtype=np.int64) for i in range(num_partitions)]  # type: ignore[attr-defined]


def iid_partition(labels: np.ndarray, num_partitions: int, seed: int) -> list[np.ndarray]:
    """Split the pool uniformly at random into ``num_partitions`` equal shards.

    Parameters
    ----------
    labels : np.ndarray
        int [N] class labels of the pool (only their count matters here).
    num_partitions : int
        Number of clients C >= 1.
    seed : int
        Seed of the shuffle.

    Returns
    -------
    list[np.ndarray]
        C int64 index arrays into the pool, disjoint, sizes differing by at most one.
    """
    _check_num_partitions(num_partitions, len(labels))
    # The shards of Flower Datasets' IidPartitioner on the pool shuffled with
    # ``datasets.Dataset.shuffle(seed)`` (= np.random.default_rng(seed).permutation), cut
    # like ``Dataset.shard(contiguous=True)``: identical indices (tests/test_performance.py),
    # computed in numpy -- the Arrow round trip cost 5-50 s and ~150 MB per Ray actor at
    # 1000 clients (docs/performance.md).
    order = numpy_generator("partition", seed).permutation(len(labels)).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(_equal_sizes(len(labels), num_partitions))])
    return [order[starts[i] : starts[i + 1]].copy() for i in range(num_partitions)]


def dirichlet_partition(
    labels: np.ndarray, num_partitions: int, alpha: float, seed: int, min_partition_size: int | None = None
) -> list[np.ndarray]:
    """Dirichlet label skew through Flower Datasets' ``DirichletPartitioner``.

    Parameters
    ----------
    labels : np.ndarray
        int [N] class labels of the pool.
    num_partitions : int
        Number of clients C.
    alpha : float
        Concentration > 0; small alpha = strong skew (clients may lack whole classes).
    seed : int
        Seed of the partitioner.
    min_partition_size : int, optional
        Resample (Flower allows 10 draws) until every client holds at least this many
        samples. Default: ``min(10, max(1, N // (10 C)))``, i.e. 10 for the usual pools, a
        tenth of an even share for small ones. Choice: a fixed 10 fails on small pools
        with strong skew -- measured on the FedDB labeled pool (N = 1000, C = 20,
        alpha = 0.1), 16 of 20 seeds found no draw within Flower's 10 attempts, while with
        N // (10 C) = 5 all 20 did.

    Returns
    -------
    list[np.ndarray]
        C disjoint int64 index arrays into the pool.

    Raises
    ------
    ValueError
        If ``alpha <= 0``, C is out of range, or no draw gives every client
        ``min_partition_size`` samples (names alpha, N, C and the seed).
    """
    from flwr_datasets.partitioner import DirichletPartitioner  # deferred: import cost of flwr_datasets and datasets (seconds), paid only by this partition

    _check_dirichlet(num_partitions, len(labels), alpha)
    if min_partition_size is None:
        min_partition_size = min(10, max(1, len(labels) // (10 * num_partitions)))
    partitioner = DirichletPartitioner(
        num_partitions=num_partitions,
        partition_by="label",
        alpha=float(alpha),
        min_partition_size=min_partition_size,
        seed=seed,
    )
    try:
        return _flower_partitions(partitioner, labels, num_partitions)
    except ValueError as exc:
        raise ValueError(
            f"dirichlet-alpha={alpha}: no Dirichlet draw of {len(labels)} samples over {num_partitions} clients gives "
            f"each at least {min_partition_size} (seed {seed}); raise dirichlet-alpha or use fewer clients ({exc})"
        ) from exc


def inner_dirichlet_partition(labels: np.ndarray, num_partitions: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Per-client Dirichlet class mixtures through Flower Datasets' ``InnerDirichletPartitioner``.

    Every client receives an equal share of the pool (the first ``N mod C`` clients one
    sample more); its class proportions are drawn from Dir(alpha) over the K classes, and
    a class that has run out is removed from the later draws.

    Parameters
    ----------
    labels : np.ndarray
        int [N] class labels of the pool.
    num_partitions : int
        Number of clients C.
    alpha : float
        Concentration > 0; as alpha goes to 0 each client's proportions put all mass on one
        class (while classes last).
    seed : int
        Seed of the partitioner.

    Returns
    -------
    list[np.ndarray]
        C disjoint int64 index arrays into the pool, of sizes ``N // C`` or ``N // C + 1``.

    Raises
    ------
    ValueError
        If ``alpha <= 0``, C is out of range, or the draw fails (Flower's partitioner stops
        on NaN proportions when every class a client's proportions favour has run out; seen
        at alpha = 0.01 with 20 Fashion-MNIST clients); the message names alpha, N, C and the
        seed.
    """
    from flwr_datasets.partitioner import InnerDirichletPartitioner  # deferred: import cost of flwr_datasets and datasets (seconds), paid only by this partition

    _check_dirichlet(num_partitions, len(labels), alpha)
    sizes = _equal_sizes(len(labels), num_partitions)
    partitioner = InnerDirichletPartitioner(partition_sizes=sizes, partition_by="label", alpha=float(alpha), seed=seed)
    try:
        return _flower_partitions(partitioner, labels, num_partitions)
    except ValueError as exc:
        raise ValueError(
            f"partition=inner-dirichlet, dirichlet-alpha={alpha}: the per-client Dirichlet draw of {len(labels)} "
            f"samples over {num_partitions} clients failed (seed {seed}); raise dirichlet-alpha or try another seed ({exc})"
        ) from exc


def majority_classes_of(client: int, num_classes: int, majority: int) -> list[int]:
    """Majority classes of ``client`` in the paper's non-IID split: ``majority`` consecutive
    classes starting at ``client * majority`` (mod K). With C=5, K=10, majority=2 this is
    Table D.5: client 0 -> {0,1}, client 1 -> {2,3}, ..."""
    return [(client * majority + j) % num_classes for j in range(majority)]


def noniid_partition(
    labels: np.ndarray,
    num_partitions: int,
    num_classes: int,
    seed: int,
    majority: int = 2,
    minority_fraction: float = 0.012,
    class_names: Sequence[str] | None = None,
) -> list[np.ndarray]:
    """The paper's non-IID split (Sec. 4.1, App. D, Table D.5), without class exhaustion.

    For each class k with n_k samples: every client for which k is a *minority* class gets
    ``round(minority_fraction * n_k)`` samples of k (at least 1); the rest of class k is split
    equally among the clients for which k is a *majority* class. With C=5, K=10,
    majority=2 and ``minority_fraction=0.012`` on MNIST this gives ~4.6k samples of each
    majority class and ~57 of each minority class per client, as in Table D.5.

    Parameters
    ----------
    labels : np.ndarray
        int [N] class labels of the pool.
    num_partitions : int
        Number of clients C.
    num_classes : int
        Number of classes K.
    seed : int
        Seed of the per-class shuffles.
    majority : int
        Majority classes per client (paper: 2).
    minority_fraction : float
        Fraction of a class's samples that each minority client receives, in (0, 1).

    Returns
    -------
    list[np.ndarray]
        C disjoint int64 index arrays into the pool.

    Raises
    ------
    ValueError
        If the fractions cannot be honoured (minority shares would exhaust a class) or
        the arguments are out of range.
    """
    _check_num_partitions(num_partitions, len(labels))
    if not 1 <= majority <= num_classes:
        raise ValueError(f"noniid-majority-classes must be in [1, {num_classes}], got {majority}")
    if not 0.0 < minority_fraction < 1.0:
        raise ValueError(f"noniid-minority-fraction must be in (0, 1), got {minority_fraction}")
    labels = np.asarray(labels)
    draw = numpy_generator("partition", seed)
    owners: dict[int, list[int]] = {k: [] for k in range(num_classes)}
    for c in range(num_partitions):
        for k in majority_classes_of(c, num_classes, majority):
            owners[k].append(c)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_partitions)]
    for k in range(num_classes):
        idx = draw.permutation(np.flatnonzero(labels == k))
        minority_clients = [c for c in range(num_partitions) if c not in owners[k]]
        n_minor = max(1, int(round(minority_fraction * len(idx))))
        if owners[k]:
            need = n_minor * len(minority_clients) + len(owners[k])
        else:  # nobody owns k (C * majority < K): share k equally
            n_minor, minority_clients = len(idx) // num_partitions, list(range(num_partitions))
            need = n_minor * num_partitions
        if need > len(idx) or n_minor == 0:
            raise ValueError(
                f"class {named_classes(k, class_names)} has {len(idx)} samples, too few for {len(minority_clients)} minority "
                f"clients x {n_minor} + {len(owners[k])} majority clients; lower "
                f"noniid-minority-fraction={minority_fraction} or the number of clients"
            )
        start = 0
        for c in minority_clients:
            parts[c].append(idx[start : start + n_minor])
            start += n_minor
        for c, chunk in zip(owners[k], np.array_split(idx[start:], max(1, len(owners[k])))):
            parts[c].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def shard_partition(labels: np.ndarray, num_partitions: int, shards_per_client: int, seed: int) -> list[np.ndarray]:
    """FedAvg/FedProx shards through Flower Datasets' ``ShardPartitioner`` (module docstring).

    Parameters
    ----------
    labels : np.ndarray
        int [N] class labels of the pool.
    num_partitions : int
        Number of clients C.
    shards_per_client : int
        Shards per client (>= 1); the shard size is N / (C * shards_per_client), the rest of
        the pool is left out.
    seed : int
        Seed of the shard order.

    Returns
    -------
    list[np.ndarray]
        C disjoint int64 index arrays into the pool.

    Raises
    ------
    ValueError
        If ``shards_per_client < 1`` or C is out of range.
    """
    from flwr_datasets.partitioner import ShardPartitioner  # deferred: import cost of flwr_datasets and datasets (seconds), paid only by this partition

    _check_num_partitions(num_partitions, len(labels))
    if shards_per_client < 1:
        raise ValueError(f"shards-per-client must be >= 1, got {shards_per_client!r}")
    partitioner = ShardPartitioner(
        num_partitions=num_partitions, partition_by="label", num_shards_per_partition=shards_per_client, seed=seed
    )
    return [np.sort(p) for p in _flower_partitions(partitioner, labels, num_partitions)]


def partition_pool(
    labels: np.ndarray,
    num_partitions: int,
    num_classes: int,
    scheme: str,
    seed: int,
    *,
    dirichlet_alpha: float = 0.5,
    noniid_majority: int = 2,
    noniid_minority_fraction: float = 0.012,
    shards_per_client: int = 2,
    class_names: Sequence[str] | None = None,
) -> list[np.ndarray]:
    """Partition the training pool into ``num_partitions`` clients by ``scheme``.

    Parameters
    ----------
    labels : np.ndarray
        int [N] class labels of the pool.
    num_partitions, num_classes : int
        C clients, K classes.
    scheme : str
        One of :data:`PARTITIONS`.
    seed : int
        Seed; the result is a pure function of the arguments.
    class_names : sequence of str, optional
        The K class names, for the messages (classes are named by index without them).

    Returns
    -------
    list[np.ndarray]
        C disjoint int64 index arrays into the pool.

    Raises
    ------
    ValueError
        On an unknown scheme (:class:`~fedul_flwr.registry.UnknownChoiceError`, naming the
        valid ones) or invalid scheme parameters.
    """
    return PARTITIONS.get(scheme)(
        labels,
        num_partitions,
        num_classes,
        seed,
        dirichlet_alpha=dirichlet_alpha,
        noniid_majority=noniid_majority,
        noniid_minority_fraction=noniid_minority_fraction,
        shards_per_client=shards_per_client,
        class_names=class_names,
    )


PARTITIONS.add("iid", lambda labels, n, k, seed, **_: iid_partition(labels, n, seed))
PARTITIONS.add(
    "noniid",
    lambda labels, n, k, seed, *, noniid_majority, noniid_minority_fraction, class_names=None, **_: noniid_partition(
        labels, n, k, seed, noniid_majority, noniid_minority_fraction, class_names
    ),
)
PARTITIONS.add(
    "shards", lambda labels, n, k, seed, *, shards_per_client, **_: shard_partition(labels, n, shards_per_client, seed)
)
PARTITIONS.add(
    "dirichlet", lambda labels, n, k, seed, *, dirichlet_alpha, **_: dirichlet_partition(labels, n, dirichlet_alpha, seed)
)
PARTITIONS.add(
    "inner-dirichlet",
    lambda labels, n, k, seed, *, dirichlet_alpha, **_: inner_dirichlet_partition(labels, n, dirichlet_alpha, seed),
)


def _equal_sizes(pool_size: int, num_partitions: int) -> list[int]:
    """Sizes of ``num_partitions`` equal shares of ``pool_size`` (the first ``pool_size mod C`` one larger)."""
    size, extra = divmod(pool_size, num_partitions)
    return [size + (i < extra) for i in range(num_partitions)]


def _check_dirichlet(num_partitions: int, pool_size: int, alpha: float) -> None:
    _check_num_partitions(num_partitions, pool_size)
    if not alpha > 0:
        raise ValueError(f"dirichlet-alpha must be > 0, got {alpha!r}")


def _check_num_partitions(num_partitions: int, pool_size: int) -> None:
    if not 1 <= num_partitions <= pool_size:
        raise ValueError(f"number of partitions must be in [1, {pool_size}], got {num_partitions}")


def holdout_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Class-stratified random hold-out of ``fraction`` of the pool (the paper's 20%
    validation split, App. D.2). Returns (kept, held_out) sorted int64 index arrays; with
    ``fraction == 0`` everything is kept. The held-out part is *labeled*: using it for model
    selection uses labels."""
    labels = np.asarray(labels)
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"val-fraction must be in [0, 1), got {fraction}")
    draw = numpy_generator("validation", seed)
    held = [
        draw.permutation(np.flatnonzero(labels == k))[: int(round(fraction * np.sum(labels == k)))]
        for k in np.unique(labels)
    ]
    held_out = np.sort(np.concatenate(held)).astype(np.int64) if held else np.zeros(0, np.int64)
    kept = np.setdiff1d(np.arange(len(labels), dtype=np.int64), held_out)
    return kept, held_out
