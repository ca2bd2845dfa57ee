"""The labels-at-server setting of federated semi-supervised learning (SemiFL, Diao et al.,
NeurIPS 2022, Sec. 3; FedRGD, Zhang et al., IEEE BigData 2021; FedMatch's "labels-at-server"
scenario, Jeong et al., ICLR 2021, Sec. 4).

    dataset -> **labeled pool (the server's) + unlabeled pool, partitioned over the clients** -> ClientData -> method

The server holds a small labeled set and trains on it between rounds
(:meth:`fedul_flwr.methods.base.Method.server_update`); the clients hold only unlabeled
images:

1. A class-balanced labeled pool of N_lab images (``num-labeled``; N_lab / K per class) is
   drawn from the training pool, with the same draw as the labels-at-clients setting
   (:func:`~fedul_flwr.data.labels_at_clients.draw_labeled_pool`, stream ``labeled-pool``): for
   one seed both settings label the same images, so their rows compare like with like.
2. The rest, the unlabeled pool, is partitioned over the clients (IID, Dirichlet, ...; any scheme
   of :data:`~fedul_flwr.data.partition.PARTITIONS`) with the labels-at-clients setting's
   unlabeled partition seed.

Choice: the server's labeled images are not also given to the clients without labels (SemiFL's
code splits the training set into the server's labeled part and the clients' unlabeled rest).
In deployment the server's labeled images are its own folder (``server-data-dir``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fedul_flwr.data.labels_at_clients import draw_labeled_pool
from fedul_flwr.rng import numpy_from_seed

__all__ = ["split_labels_at_server"]


def split_labels_at_server(
    labels: np.ndarray, num_labeled: int, num_classes: int, partition: Callable[[np.ndarray, int], list[np.ndarray]],
    seeds: tuple[int, int], class_names: Sequence[str] | None = None,
) -> tuple[np.ndarray, list[np.ndarray]]:  # fmt: skip
    """The server's labeled rows and every client's unlabeled rows (module docstring).

    Parameters
    ----------
    labels : np.ndarray
        int ``[N]`` labels of the training pool.
    num_labeled : int
        N_lab, the server's labeled images.
    num_classes : int
        K.
    partition : Callable
        ``(labels [n], seed) -> one index array into labels per client``: the run's partition
        scheme with the number of clients bound.
    seeds : tuple[int, int]
        Seeds of the labeled-pool draw and of the unlabeled pool's partition.
    class_names : sequence of str, optional
        The K class names, for the messages.

    Returns
    -------
    (np.ndarray, list[np.ndarray])
        int64 ``[N_lab]`` sorted rows of the server's labeled images, and one sorted int64
        array of rows per client, together the rest of the pool.

    Raises
    ------
    ValueError
        From :func:`~fedul_flwr.data.labels_at_clients.draw_labeled_pool` (N_lab < K, a class
        too small) or the partition (e.g. more clients than unlabeled images).
    """
    labeled_pool = draw_labeled_pool(labels, num_labeled, num_classes, numpy_from_seed(seeds[0]), class_names)
    unlabeled_pool = np.setdiff1d(np.arange(len(labels)), labeled_pool)
    parts = partition(labels[unlabeled_pool], seeds[1])
    return labeled_pool, [np.sort(unlabeled_pool[p]) for p in parts]
