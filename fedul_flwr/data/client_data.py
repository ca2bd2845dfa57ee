"""What one client holds, built along the data path, top to bottom.

    dataset (x, y tensors)        fedul_flwr.data.datasets.load_dataset
      -> partition (indices)      fedul_flwr.data.partition.partition_pool
      -> U sets + prior matrix    fedul_flwr.data.usets.build_usets
      -> surrogate dataset        ClientData (x, surrogate label = set index)

In simulation the labels of the pool are used to *make* the U sets and are then dropped:
a :class:`ClientData` carries images, set indices and the prior matrix, never labels --
except the optional labeled local test split (``client-test-fraction``), which only the
client's evaluation reads. Everything is a pure function of (config, partition id) and is
cached per process, so a Ray actor builds its clients once, not every round.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np
import torch

from fedul_flwr.config import RunConfig
from fedul_flwr.data.datasets import ImageDataset, load_dataset, normalize
from fedul_flwr.data.partition import holdout_split, partition_pool
from fedul_flwr.data.usets import USets, build_usets

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClientData:
    """One client's unlabeled sets, as ready tensors.

    Attributes
    ----------
    x : torch.Tensor
        float32 ``[n_c, C, H, W]``, normalised images of all U sets, concatenated in set order.
    set_index : torch.Tensor
        int64 ``[n_c]``, the surrogate label ybar = index m of the set holding each image.
    priors : np.ndarray
        ``[M_c, K]`` class priors Pi_c of the sets (rows sum to 1).
    test_prior : np.ndarray
        ``[K]`` class prior pi of the test distribution.
    test_x, test_y : torch.Tensor | None
        Optional labeled local test split (float32 ``[n_t, C, H, W]``, int64 ``[n_t]``).
    class_names : tuple[str, ...]
        The K class names.
    """

    x: torch.Tensor
    set_index: torch.Tensor
    priors: np.ndarray
    test_prior: np.ndarray
    class_names: tuple[str, ...]
    test_x: torch.Tensor | None = None
    test_y: torch.Tensor | None = None

    @property
    def num_sets(self) -> int:
        """M_c."""
        return int(self.priors.shape[0])

    @property
    def num_examples(self) -> int:
        """n_c, the number of unlabeled training images."""
        return int(self.x.shape[0])

    @property
    def surrogate_prior(self) -> np.ndarray:
        """``[M_c]`` pibar_c[m] = n_{c,m} / n_c (Theorem 1)."""
        counts = np.bincount(self.set_index.numpy(), minlength=self.num_sets)
        return counts / counts.sum()


@functools.lru_cache(maxsize=4)
def _dataset(cfg_key: tuple[str, str, bool]) -> ImageDataset:
    name, data_dir, download = cfg_key
    return load_dataset(name, data_dir, download)


def load_run_dataset(cfg: RunConfig) -> ImageDataset:
    """The run's dataset (cached per process)."""
    return _dataset((cfg.dataset, cfg.data_dir, cfg.download))


@functools.lru_cache(maxsize=4)
def _partitions(cfg: RunConfig, num_partitions: int) -> tuple[np.ndarray, list[np.ndarray]]:
    data = load_run_dataset(cfg)
    labels = data.train_y.numpy()
    pool, _ = holdout_split(labels, cfg.val_fraction, cfg.seed)
    parts = partition_pool(
        labels[pool],
        num_partitions,
        data.num_classes,
        cfg.partition,
        cfg.seed,
        dirichlet_alpha=cfg.dirichlet_alpha,
        noniid_majority=cfg.noniid_majority_classes,
        noniid_minority_fraction=cfg.noniid_minority_fraction,
    )
    return pool, [pool[p] for p in parts]


def validation_indices(cfg: RunConfig) -> np.ndarray:
    """Indices of the labeled validation hold-out (``val-fraction`` of the training set)."""
    return holdout_split(load_run_dataset(cfg).train_y.numpy(), cfg.val_fraction, cfg.seed)[1]


def client_usets(cfg: RunConfig, partition_id: int, num_partitions: int) -> tuple[USets, np.ndarray]:
    """U sets of client ``partition_id`` and the indices of its labeled local test split.

    Returns
    -------
    (USets, np.ndarray)
        The sets (indices into the training set) and int64 ``[n_t]`` local test indices.

    Raises
    ------
    ValueError
        If ``partition_id`` is out of range, or from partitioning / U-set validation.
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id={partition_id} out of range for num-partitions={num_partitions}")
    data = load_run_dataset(cfg)
    labels = data.train_y.numpy()
    _, parts = _partitions(cfg, num_partitions)
    indices = parts[partition_id]
    rng = np.random.default_rng([cfg.seed, partition_id])
    local_test = np.zeros(0, dtype=np.int64)
    if cfg.client_test_fraction > 0:
        perm = rng.permutation(indices)
        n_test = int(round(cfg.client_test_fraction * len(indices)))
        local_test, indices = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    usets = build_usets(
        labels[indices],
        indices,
        cfg.num_sets_of(partition_id),
        data.num_classes,
        cfg.prior_scheme,
        rng,
        dominant_factor=cfg.dominant_factor,
    )
    return usets, local_test


@functools.lru_cache(maxsize=64)
def load_client(cfg: RunConfig, partition_id: int, num_partitions: int) -> ClientData:
    """Build (once per process) the :class:`ClientData` of simulated client ``partition_id``.

    Logs the client's number of sets, size and the condition number of its prior matrix.
    """
    from fedul_flwr.transition import parse_test_prior

    data = load_run_dataset(cfg)
    usets, local_test = client_usets(cfg, partition_id, num_partitions)
    order, ybar = usets.surrogate_dataset()
    log.info(
        "client %d/%d: %d images in M_c=%d U sets (%s priors), cond(Pi_c)=%.1f",
        partition_id,
        num_partitions,
        len(order),
        usets.num_sets,
        cfg.prior_scheme,
        usets.condition_number,
    )
    test_x = test_y = None
    if len(local_test):
        test_x = normalize(data.train_x[local_test], data.mean, data.std)
        test_y = data.train_y[local_test].clone()
    return ClientData(
        x=normalize(data.train_x[torch.from_numpy(order)], data.mean, data.std),
        set_index=torch.from_numpy(ybar),
        priors=usets.priors,
        test_prior=parse_test_prior(cfg.test_prior, data.num_classes),
        class_names=data.class_names,
        test_x=test_x,
        test_y=test_y,
    )
