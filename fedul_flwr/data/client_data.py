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

import dataclasses
import functools
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedul_flwr.config import RunConfig
from fedul_flwr.data.datasets import DatasetInfo, ImageDataset, dataset_info, load_dataset, normalize
from fedul_flwr.data.partition import holdout_split, partition_pool
from fedul_flwr.data.prior_noise import noisy_priors
from fedul_flwr.data.usets import USets, build_usets, condition_number

log = logging.getLogger(__name__)

# extra entropy words that give the optional random draws their own streams, so enabling
# them leaves the U sets of the default path (rng = [seed, partition id]) unchanged
_SUBSAMPLE_STREAM = 1
_PRIOR_NOISE_STREAM = 2


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
    labels : torch.Tensor | None
        int64 ``[n_c]`` true labels of ``x`` (same order), filled only for methods that
        declare ``needs_labels`` (the supervised reference); ``None`` for FedUL and the
        weakly supervised baselines.
    """

    x: torch.Tensor
    set_index: torch.Tensor
    priors: np.ndarray
    test_prior: np.ndarray
    class_names: tuple[str, ...]
    test_x: torch.Tensor | None = None
    test_y: torch.Tensor | None = None
    labels: torch.Tensor | None = None

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
    if cfg.samples_per_client > 0:  # App. E.2 / Table E.10: a fixed budget per client
        if cfg.samples_per_client > len(indices):
            raise ValueError(
                f"samples-per-client={cfg.samples_per_client} but client {partition_id} holds only {len(indices)}"
            )
        sub_rng = np.random.default_rng([cfg.seed, partition_id, _SUBSAMPLE_STREAM])
        indices = np.sort(sub_rng.choice(indices, cfg.samples_per_client, replace=False))
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


def prior_noise_rng(seed: int, partition_id: int) -> np.random.Generator:
    """The generator that draws gamma of ``prior-noise`` (Table E.9) for one client.

    A function of (seed, partition id) only, separate from the U-set stream, so the same
    client is told the same Pi~ in every run and the U sets do not change with eps.
    """
    return np.random.default_rng([seed, partition_id, _PRIOR_NOISE_STREAM])


@functools.lru_cache(maxsize=64)
def load_client(cfg: RunConfig, partition_id: int, num_partitions: int, *, with_labels: bool = False) -> ClientData:
    """Build (once per process) the :class:`ClientData` of simulated client ``partition_id``.

    Logs the client's number of sets, size and the condition number of its prior matrix.
    ``with_labels=True`` (only for methods with ``needs_labels``) also fills
    ``ClientData.labels``; the cache keys on it, so a label-free client never holds labels.
    With ``prior-noise`` eps > 0 the method is told the perturbed matrix of
    :func:`~fedul_flwr.data.prior_noise.noisy_priors` (the sets are unchanged).
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
    told = noisy_priors(usets.priors, cfg.prior_noise, prior_noise_rng(cfg.seed, partition_id))
    if cfg.prior_noise > 0:  # the method is told another matrix: is it still usable?
        told_cond = condition_number(told, usets.present_classes)
        log.info("client %d: told priors with prior-noise eps=%g: cond(Pi~_c)=%.1f", partition_id, cfg.prior_noise, told_cond)
        if not np.isfinite(told_cond):
            log.warning("client %d: the told priors Pi~_c are column-rank deficient: f is not identifiable", partition_id)
    test_x = test_y = None
    if len(local_test):
        test_x = normalize(data.train_x[local_test], data.mean, data.std)
        test_y = data.train_y[local_test].clone()
    return ClientData(
        x=normalize(data.train_x[torch.from_numpy(order)], data.mean, data.std),
        set_index=torch.from_numpy(ybar),
        priors=told,
        test_prior=parse_test_prior(cfg.test_prior, data.num_classes),
        class_names=data.class_names,
        test_x=test_x,
        test_y=test_y,
        labels=data.train_y[torch.from_numpy(order)].clone() if with_labels else None,
    )


# --------------------------------------------------------------------------- deployment


def run_dataset_info(cfg: RunConfig) -> DatasetInfo:
    """The run's dataset facts a node must match: ``dataset`` with ``class-names`` applied.

    Raises
    ------
    ConfigError
        If ``class-names`` does not list K distinct names (K of the run's dataset).
    """
    from fedul_flwr.config import ConfigError

    info = dataset_info(cfg.dataset)
    if not cfg.class_names.strip():
        return info
    names = tuple(n.strip() for n in cfg.class_names.split(","))
    if len(names) != len(info.class_names) or len(set(names)) != len(names) or not all(names):
        raise ConfigError(
            f"class-names={cfg.class_names!r}: expected {len(info.class_names)} distinct non-empty comma-separated "
            f"names (K of dataset {cfg.dataset!r}), got {len(names)}"
        )
    return dataclasses.replace(info, class_names=names)


def _dir_fingerprint(path: str) -> tuple[tuple[str, int], ...]:
    """(name, mtime_ns) of a node folder's files and folders, so edits invalidate the cache."""
    root = Path(path).expanduser()
    if not root.is_dir():
        return ()
    return tuple(sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*")))


@functools.lru_cache(maxsize=16)
def _load_node(cfg: RunConfig, path: str, fingerprint: tuple[tuple[str, int], ...]) -> ClientData:
    from fedul_flwr.data.node_dir import load_node_dir
    from fedul_flwr.transition import parse_test_prior

    info = run_dataset_info(cfg)
    client = load_node_dir(
        path,
        class_names=info.class_names,
        image_size=info.image_size,
        channels=info.channels,
        mean=info.mean,
        std=info.std,
        test_prior=parse_test_prior(cfg.test_prior, len(info.class_names)),
    )
    log.info(
        "node data %s: %d images in M_c=%d U sets, cond(Pi_c)=%.1f",
        path,
        client.num_examples,
        client.num_sets,
        condition_number(client.priors, np.any(client.priors > 0, axis=0)),
    )
    return client


def client_from_node_config(cfg: RunConfig, node_config: Mapping[str, Any], *, with_labels: bool = False) -> ClientData:
    """The client's data, from a deployed node's folder or a simulated partition.

    The one place that decides where a ClientApp's data comes from:

    - ``node_config["data-dir"]`` set (deployment: ``flower-supernode --node-config
      "data-dir=/path"``): the node folder of :mod:`fedul_flwr.data.node_dir`, checked
      against the run's dataset facts (:func:`run_dataset_info`);
    - else ``partition-id`` / ``num-partitions`` (simulation): :func:`load_client`.

    Parameters
    ----------
    cfg : RunConfig
        The run configuration.
    node_config : Mapping[str, Any]
        ``context.node_config``.
    with_labels : bool
        Fill ``ClientData.labels`` (supervised reference only; simulation only).

    Returns
    -------
    ClientData
        Cached per process (a node folder is re-read when its files change).

    Raises
    ------
    NodeDataError
        If the node folder is missing or invalid (the message names file, row or value).
    ValueError
        If ``node_config`` has neither ``data-dir`` nor ``partition-id``/``num-partitions``,
        or labels are asked of a deployed node.
    """
    data_dir = str(node_config.get("data-dir", "")).strip()
    if data_dir:
        if with_labels:
            raise ValueError(
                f"method {cfg.method!r} needs labels, but deployed node data ({data_dir}) holds unlabeled sets only"
            )
        path = str(Path(data_dir).expanduser().resolve())
        return _load_node(cfg, path, _dir_fingerprint(path))
    if "partition-id" not in node_config or "num-partitions" not in node_config:
        raise ValueError(
            f"node_config {dict(node_config)} names no data: give 'data-dir=/path' (deployment) or "
            "'partition-id' and 'num-partitions' (simulation)"
        )
    return load_client(
        cfg, int(node_config["partition-id"]), int(node_config["num-partitions"]), with_labels=with_labels
    )


def node_key(node_config: Mapping[str, Any], node_id: int) -> int:
    """A stable per-node integer for seeds and per-client settings: the partition id in
    simulation, else a hash of the node's data folder (stable across SuperNode restarts,
    unlike the node id), else the node id."""
    if "partition-id" in node_config:
        return int(node_config["partition-id"])
    data_dir = str(node_config.get("data-dir", "")).strip()
    if data_dir:
        return int.from_bytes(hashlib.sha256(data_dir.encode()).digest()[:4], "little")
    return int(node_id)
