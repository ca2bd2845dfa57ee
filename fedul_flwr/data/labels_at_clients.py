"""The labels-at-clients setting of federated semi-supervised learning (FedDB, Zhu et al.,
IJCAI 2024, Sec. 3.1 and 5.1; the FixMatch-in-FedAvg baseline).

    dataset -> **labeled pool + unlabeled pool, each partitioned** -> ClientData -> method

Every client holds a few labeled images and many unlabeled ones, with different class mixes:

1. A class-balanced labeled pool of N_lab images (``num-labeled``; N_lab / K per class) is
   drawn from the training pool first; the rest is the unlabeled pool.
2. The two pools are partitioned over the clients *independently* (IID, or Dirichlet with
   ``dirichlet-alpha`` = delta, as the paper's code does; any scheme of
   :data:`~fedul_flwr.data.partition.PARTITIONS`), each with its own seed, so a client's
   labeled and unlabeled class mixes differ (intra-client heterogeneity) and the clients
   differ from each other (inter-client heterogeneity).
3. "To enrich the unlabeled dataset, we add the samples from the labeled dataset to the
   unlabeled dataset after discarding their labels" (Sec. 5.1): a client's unlabeled part
   also holds its labeled images, without their labels.

Choice: the labeled pool takes floor(N_lab / K) images of every class (and one more of the
first N_lab mod K classes), drawn uniformly from a generator of (seed, stream).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fedul_flwr.data.partition import named_classes
from fedul_flwr.rng import numpy_from_seed

__all__ = ["ClientSplit", "draw_labeled_pool", "split_to_clients"]


def draw_labeled_pool(labels: np.ndarray, num_labeled: int, num_classes: int, rng: np.random.Generator,
                      class_names: Sequence[str] | None = None) -> np.ndarray:  # fmt: skip
    """The rows of a class-balanced labeled pool.

    Parameters
    ----------
    labels : np.ndarray
        int ``[N]`` labels of the training pool.
    num_labeled : int
        N_lab >= K.
    num_classes : int
        K.
    rng : np.random.Generator
        Source of the draw.
    class_names : sequence of str, optional
        The K class names, for the messages.

    Returns
    -------
    np.ndarray
        int64 ``[N_lab]`` sorted rows into ``labels``.

    Raises
    ------
    ValueError
        If N_lab < K, or a class has fewer images than its share (names the class).
    """
    if num_labeled < num_classes:
        raise ValueError(f"num-labeled={num_labeled} must be >= the {num_classes} classes (one label per class at least)")
    base, extra = divmod(num_labeled, num_classes)
    chosen = []
    for c in range(num_classes):
        rows = np.flatnonzero(labels == c)
        want = base + (c < extra)
        if len(rows) < want:
            raise ValueError(f"num-labeled={num_labeled}: class {named_classes(c, class_names)} has {len(rows)} images, fewer than its {want} labels")
        chosen.append(rng.choice(rows, want, replace=False))
    return np.sort(np.concatenate(chosen)).astype(np.int64)


@dataclass(frozen=True)
class ClientSplit:
    """Rows of one client of the labels-at-clients setting (into the training pool).

    Attributes
    ----------
    labeled : np.ndarray
        int64 ``[n_L]``: its labeled images.
    unlabeled : np.ndarray
        int64 ``[n_U]``: its unlabeled images, including its labeled ones (sorted).
    """

    labeled: np.ndarray
    unlabeled: np.ndarray


Partitioner = Callable[[np.ndarray, int], list[np.ndarray]]
"""``(labels [n], seed) -> one index array into labels per client``."""


def split_to_clients(
    labels: np.ndarray, num_labeled: int, num_classes: int, partition: Partitioner, seeds: tuple[int, int, int],
    class_names: Sequence[str] | None = None,
) -> list[ClientSplit]:
    """Draw the labeled pool and partition both pools independently (module docstring).

    Parameters
    ----------
    labels : np.ndarray
        int ``[N]`` labels of the training pool.
    num_labeled : int
        N_lab.
    num_classes : int
        K.
    partition : Partitioner
        The run's partition scheme with the number of clients bound.
    seeds : tuple[int, int, int]
        Seeds of the labeled-pool draw, of the labeled pool's partition and of the
        unlabeled pool's partition.
    class_names : sequence of str, optional
        The K class names, for the messages.

    Returns
    -------
    list[ClientSplit]
        One per client.

    Raises
    ------
    ValueError
        From :func:`draw_labeled_pool` or the partition (e.g. more clients than labels).
    """
    labeled_pool = draw_labeled_pool(labels, num_labeled, num_classes, numpy_from_seed(seeds[0]), class_names)
    unlabeled_pool = np.setdiff1d(np.arange(len(labels)), labeled_pool)
    labeled_parts = partition(labels[labeled_pool], seeds[1])
    unlabeled_parts = partition(labels[unlabeled_pool], seeds[2])
    return [
        ClientSplit(np.sort(labeled_pool[lp]), np.sort(np.concatenate([unlabeled_pool[up], labeled_pool[lp]])))
        for lp, up in zip(labeled_parts, unlabeled_parts, strict=True)
    ]
