"""The simulated source of client data: dataset -> partition -> the client's setting -> :class:`ClientData`.

    dataset (uint8 x, y)        fedul_flwr.data.datasets.load_dataset (the DATASETS registry)
      -> partition (indices)    fedul_flwr.data.partition.partition_pool
      -> the client's setting   ``client-setting`` (:data:`SETTINGS`):
                                "usets": U sets + prior matrix (fedul_flwr.data.usets.build_usets)
                                "pu": labeled positives + unlabeled rest (fedul_flwr.data.pu)
                                "labels-at-clients": a few labeled + many unlabeled images
                                (fedul_flwr.data.labels_at_clients)
                                "labels-at-server": unlabeled images only; the server holds
                                the labeled pool (fedul_flwr.data.labels_at_server)
                                "annotation-heterogeneity": fully / partially / un-labeled
                                clients (fedul_flwr.data.annotation)
      -> ClientData             fedul_flwr.data.client_data

In simulation the labels of the pool are used to *make* the U sets and are then dropped: the
client's ``unlabeled`` part holds the images of its U sets (concatenated in set order) and its
``usets`` part their set indices and the prior matrix. Only a method that requires the
``labeled`` part (the supervised reference) gets the same images with their true labels.
In the PU setting the client's labeled part holds the labeled images of its positive classes
(with their labels), the unlabeled part everything else, and the positive classes and class
prior are parts of their own. In the labels-at-clients setting the labeled pool and the
unlabeled pool are partitioned separately. Everything is a pure function of (config, partition id) and is
cached per process (the clients in memory while they fit, :class:`ClientCache`), so a Ray actor
or the in-process engine builds a client once, not every round.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedul_flwr import get_logger
from fedul_flwr.config import RunConfig
from fedul_flwr.data.annotation import label_fractions, labeled_rows, parse_layout
from fedul_flwr.data.client_data import SEMI_SUPERVISED_PARTS, ClientData, LabeledImages, USetIndex
from fedul_flwr.data.datasets import run_dataset, run_dataset_info
from fedul_flwr.data.image_dataset import ImageDataset
from fedul_flwr.data.labels_at_clients import ClientSplit, split_to_clients
from fedul_flwr.data.labels_at_server import split_labels_at_server
from fedul_flwr.data.partition import holdout_split, partition_pool
from fedul_flwr.data.prior_noise import noisy_priors
from fedul_flwr.data.pu import assign_positive_classes, class_prior, parse_positive_classes, pu_split
from fedul_flwr.data.usets import USets, build_usets, condition_number
from fedul_flwr.registry import Registry
from fedul_flwr.rng import numpy_generator, stream_seed

__all__ = ["SETTINGS", "ClientCache", "client_rows", "client_usets", "load_client", "load_run_dataset", "prior_noise_rng",
           "server_labeled_rows", "validation_indices"]  # fmt: skip

SettingBuilder = Callable[[RunConfig, int, int, frozenset[str]], ClientData]
SETTINGS: Registry[SettingBuilder] = Registry("client setting")
"""Builders of a simulated client's :class:`ClientData` by ``client-setting`` name."""
SETTING_PARTS: dict[str, tuple[str, ...]] = {
    "usets": ("unlabeled", "usets", "labeled"),
    "pu": ("labeled", "unlabeled", "positive-classes", "class-prior"),
    "labels-at-clients": ("labeled", "unlabeled"),
    "labels-at-server": ("unlabeled",),
    "annotation-heterogeneity": ("labeled", "unlabeled"),
}
"""The parts a simulated client of each setting can hold (``labeled`` of ``usets``: on request)."""

log = get_logger(__name__)

# extra entropy words that give the optional random draws their own streams, so enabling
# them leaves the U sets of the default path (rng = [seed, partition id]) unchanged


def load_run_dataset(cfg: RunConfig) -> ImageDataset:
    """The run's dataset (:func:`fedul_flwr.data.datasets.run_dataset`; cached per process)."""
    return run_dataset(cfg.as_dict())


def _partition(cfg: RunConfig, labels: np.ndarray, num_partitions: int, seed: int) -> list[np.ndarray]:
    """The run's partition scheme on ``labels`` (index arrays into them)."""
    return partition_pool(
        labels,
        num_partitions,
        load_run_dataset(cfg).num_classes,
        cfg.partition,
        seed,
        dirichlet_alpha=cfg.dirichlet_alpha,
        noniid_majority=cfg.noniid_majority_classes,
        noniid_minority_fraction=cfg.noniid_minority_fraction,
        shards_per_client=cfg.shards_per_client,
        class_names=load_run_dataset(cfg).class_names,
    )


@functools.lru_cache(maxsize=4)
def _partitions(cfg: RunConfig, num_partitions: int) -> tuple[np.ndarray, list[np.ndarray]]:
    labels = load_run_dataset(cfg).train_y.numpy()
    pool, _ = holdout_split(labels, cfg.val_fraction, cfg.seed)
    return pool, [pool[p] for p in _partition(cfg, labels[pool], num_partitions, cfg.seed)]


@functools.lru_cache(maxsize=4)
def labels_at_clients_splits(cfg: RunConfig, num_partitions: int) -> list[ClientSplit]:
    """Every client's labeled and unlabeled rows (into the training set) of the
    labels-at-clients setting (:func:`~fedul_flwr.data.labels_at_clients.split_to_clients`;
    cached per process).

    Raises
    ------
    ValueError
        From the labeled-pool draw or the partition.
    """
    labels = load_run_dataset(cfg).train_y.numpy()
    pool, _ = holdout_split(labels, cfg.val_fraction, cfg.seed)
    seeds = tuple(stream_seed(s, cfg.seed) for s in ("labeled-pool", "labeled-partition", "unlabeled-partition"))
    splits = split_to_clients(
        labels[pool], cfg.num_labeled, load_run_dataset(cfg).num_classes,
        lambda part_labels, seed: _partition(cfg, part_labels, num_partitions, seed), seeds,  # type: ignore[arg-type]
        load_run_dataset(cfg).class_names,
    )  # fmt: skip
    return [ClientSplit(pool[s.labeled], pool[s.unlabeled]) for s in splits]


def validation_indices(cfg: RunConfig) -> np.ndarray:
    """Indices of the labeled validation hold-out (``val-fraction`` of the training set)."""
    return holdout_split(load_run_dataset(cfg).train_y.numpy(), cfg.val_fraction, cfg.seed)[1]


def client_rows(cfg: RunConfig, partition_id: int, num_partitions: int) -> tuple[np.ndarray, np.ndarray, np.random.Generator]:
    """Training-set rows of client ``partition_id``, the rows of its labeled local test split,
    and the client's generator (already used for the test split) for its setting's draws.

    Raises
    ------
    ValueError
        If ``partition_id`` is out of range, ``samples-per-client`` exceeds the client's
        images, or from partitioning.
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id={partition_id} out of range for num-partitions={num_partitions}")
    _, parts = _partitions(cfg, num_partitions)
    indices = parts[partition_id]
    if cfg.samples_per_client > 0:  # App. E.2 / Table E.10: a fixed budget per client
        if cfg.samples_per_client > len(indices):
            raise ValueError(
                f"samples-per-client={cfg.samples_per_client} but client {partition_id} holds only {len(indices)}"
            )
        sub_rng = numpy_generator("subsample", cfg.seed, partition_id)
        indices = np.sort(sub_rng.choice(indices, cfg.samples_per_client, replace=False))
    rng = numpy_generator("client-data", cfg.seed, partition_id)
    local_test = np.zeros(0, dtype=np.int64)
    if cfg.client_test_fraction > 0:
        perm = rng.permutation(indices)
        n_test = int(round(cfg.client_test_fraction * len(indices)))
        local_test, indices = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    return indices, local_test, rng


def client_usets(cfg: RunConfig, partition_id: int, num_partitions: int) -> tuple[USets, np.ndarray]:
    """U sets of client ``partition_id`` and the indices of its labeled local test split.

    Returns
    -------
    (USets, np.ndarray)
        The sets (indices into the training set) and int64 ``[n_t]`` local test indices.

    Raises
    ------
    ValueError
        See :func:`client_rows`; from U-set validation.
    """
    labels = load_run_dataset(cfg).train_y.numpy()
    indices, local_test, rng = client_rows(cfg, partition_id, num_partitions)
    usets = build_usets(
        labels[indices],
        indices,
        cfg.num_sets_of(partition_id),
        load_run_dataset(cfg).num_classes,
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
    return numpy_generator("prior-noise", seed, partition_id)


def _nbytes(value: Any) -> int:
    """Bytes of the tensors and arrays held by ``value`` (a ClientData and its parts)."""
    if isinstance(value, torch.Tensor):
        return value.nbytes
    if isinstance(value, np.ndarray):
        return value.nbytes
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(_nbytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _memory_budget() -> int:
    """A quarter of the memory available when the first client is built (``MemAvailable`` of
    ``/proc/meminfo``; 4 GiB where it cannot be read)."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 // 4
    except OSError:
        pass
    return 4 * 2**30


class ClientCache:
    """The simulated clients of this process, each built once and kept while they fit in memory.

    A client is built on its first visit (:data:`SETTINGS`) and kept, least recently used
    first out, while the kept clients' tensors stay within ``budget`` bytes (default: a quarter
    of the memory available at the first build): a population of any size is built once per
    process when it fits, and never holds more memory than that when it does not. Thread-safe
    (the in-process engine trains clients in threads); a client two threads ask for at once
    may be built twice, the same client both times (every draw is seeded).

    Parameters
    ----------
    build : callable
        ``build(cfg, partition_id, num_partitions, parts) -> ClientData``.
    budget : int | None
        Bytes the kept clients' tensors may take; ``None``: :func:`_memory_budget` at the
        first build.
    """

    def __init__(self, build: Callable[[RunConfig, int, int, frozenset[str]], ClientData], budget: int | None = None) -> None:
        self.__wrapped__ = build
        self.budget = budget
        self._clients: OrderedDict[tuple[Any, ...], tuple[ClientData, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __call__(self, cfg: RunConfig, partition_id: int, num_partitions: int, parts: frozenset[str]) -> ClientData:
        """The client (built on its first visit).

        Raises
        ------
        UnknownChoiceError, ValueError
            From the builder, on every call that asks for a client it cannot build.
        """
        key = (cfg, partition_id, num_partitions, parts)
        with self._lock:
            kept = self._clients.get(key)
            if kept is not None:
                self._clients.move_to_end(key)
                return kept[0]
        client = self.__wrapped__(cfg, partition_id, num_partitions, parts)
        size = _nbytes(client)
        with self._lock:
            if self.budget is None:
                self.budget = _memory_budget()
            if key not in self._clients:
                self._clients[key] = (client, size)
                self._bytes += size
            while self._bytes > self.budget and len(self._clients) > 1:
                _, (_, freed) = self._clients.popitem(last=False)
                self._bytes -= freed
        return client

    def cache_clear(self) -> None:
        """Forget every kept client (their tensors are freed once no one else holds them)."""
        with self._lock:
            self._clients.clear()
            self._bytes = 0

    def cache_info(self) -> tuple[int, int, int]:
        """(kept clients, their bytes, the budget in bytes; 0 before the first build)."""
        with self._lock:
            return len(self._clients), self._bytes, self.budget or 0


def _build_client(cfg: RunConfig, partition_id: int, num_partitions: int, parts: frozenset[str]) -> ClientData:
    """Build the :class:`ClientData` of simulated client ``partition_id`` in the run's
    ``client-setting`` (:data:`SETTINGS`).

    Raises
    ------
    UnknownChoiceError
        On an unknown setting.
    ValueError
        From the setting's builder.
    """
    return SETTINGS.get(cfg.client_setting)(cfg, partition_id, num_partitions, parts)


load_client = ClientCache(_build_client)
"""``load_client(cfg, partition_id, num_partitions, parts) -> ClientData``: the simulated client
of the run's ``client-setting``, built once per process and kept while it fits in memory
(:class:`ClientCache`).

Raises UnknownChoiceError on an unknown setting, ValueError from the setting's builder."""


@SETTINGS.register("usets")
def usets_client(cfg: RunConfig, partition_id: int, num_partitions: int, parts: frozenset[str]) -> ClientData:
    """A client of the U-set setting (FedUL).

    Parameters
    ----------
    cfg : RunConfig
        The run configuration (dataset, partition, U-set settings, seed).
    partition_id, num_partitions : int
        Which client of how many.
    parts : frozenset[str]
        The parts the method needs. The ``unlabeled`` and ``usets`` parts are always built
        (the U-set setting); the ``labeled`` part -- the same images with their true labels,
        in the same row order -- only when asked for, so a label-free method never holds
        labels (the cache keys on ``parts``).

    Returns
    -------
    ClientData
        With prior-noise eps > 0 the ``usets`` part carries the perturbed matrix of
        :func:`~fedul_flwr.data.prior_noise.noisy_priors` (the sets are unchanged).

    Raises
    ------
    ValueError
        See :func:`client_usets`.
    """
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
    rows = torch.from_numpy(order)
    images = data.train_x[rows]
    test = _local_test(cfg, local_test)
    return ClientData(
        node=f"simulated partition {partition_id} of {num_partitions}",
        class_names=data.class_names,
        mean=data.mean,
        std=data.std,
        labeled=LabeledImages(images, data.train_y[rows].clone()) if "labeled" in parts else None,
        unlabeled=images,
        usets=USetIndex(torch.from_numpy(ybar), told),
        test=test,
        flip=run_dataset_info(cfg).flip,
    )


def _labeled_and_unlabeled(
    cfg: RunConfig, partition_id: int, num_partitions: int, labeled: np.ndarray, unlabeled: np.ndarray,
    local_test: np.ndarray, **parts: Any,
) -> ClientData:  # fmt: skip
    """The ClientData of a simulated client with labeled rows (images and labels), unlabeled
    rows (images only), a local test split and the setting's other ``parts``."""
    data = load_run_dataset(cfg)
    labeled_rows, unlabeled_rows = torch.from_numpy(labeled), torch.from_numpy(unlabeled)
    return ClientData(
        node=f"simulated partition {partition_id} of {num_partitions}",
        class_names=data.class_names,
        mean=data.mean,
        std=data.std,
        labeled=LabeledImages(data.train_x[labeled_rows], data.train_y[labeled_rows].clone()),
        unlabeled=data.train_x[unlabeled_rows],
        unlabeled_classes=data.train_y[unlabeled_rows].clone(),  # diagnostics only (ClientData)
        test=_local_test(cfg, local_test),
        flip=run_dataset_info(cfg).flip,
        **parts,
    )


def _local_test(cfg: RunConfig, local_test: np.ndarray) -> LabeledImages | None:
    data = load_run_dataset(cfg)
    if not len(local_test):
        return None
    rows = torch.from_numpy(local_test)
    return LabeledImages(data.train_x[rows], data.train_y[rows].clone())


@functools.lru_cache(maxsize=4)
def positive_class_sets(cfg: RunConfig, num_partitions: int) -> list[tuple[int, ...]]:
    """CP_k of every client of the PU setting (:func:`~fedul_flwr.data.pu.assign_positive_classes`
    over the clients' class counts; cached per process).

    Raises
    ------
    ValueError
        From parsing ``positive-classes`` or the assignment (names the key, client, class).
    """
    data = load_run_dataset(cfg)
    labels = data.train_y.numpy()
    spec = parse_positive_classes(cfg.positive_classes, num_partitions, data.num_classes, class_names=data.class_names)
    counts = [
        np.bincount(labels[client_rows(cfg, k, num_partitions)[0]], minlength=data.num_classes)
        for k in range(num_partitions)
    ]
    return assign_positive_classes(spec, counts, data.class_names)


@SETTINGS.register("pu")
def pu_client(cfg: RunConfig, partition_id: int, num_partitions: int, parts: frozenset[str]) -> ClientData:
    """A client of the positive-unlabeled setting (FedPU, Lin et al., ICML 2022, Sec. 3.1):
    the labeled part holds ``pu-labeled-fraction`` of each of its positive classes (with
    labels), the unlabeled part every other image of the client; ``positive-classes`` and
    ``class-prior`` are parts of their own.

    Raises
    ------
    ValueError
        See :func:`client_rows`, :func:`positive_class_sets` and
        :func:`~fedul_flwr.data.pu.class_prior`.
    """
    data = load_run_dataset(cfg)
    labels = data.train_y.numpy()
    indices, local_test, rng = client_rows(cfg, partition_id, num_partitions)
    positives = positive_class_sets(cfg, num_partitions)[partition_id]
    split = pu_split(indices, labels[indices], positives, cfg.pu_labeled_fraction, rng, data.class_names)
    pool, _ = _partitions(cfg, num_partitions)
    prior = class_prior(cfg.class_prior, data.num_classes, labels[pool], labels[split.unlabeled])
    log.info(
        "client %d/%d: positive classes %s, %d labeled + %d unlabeled images",
        partition_id, num_partitions, list(positives), len(split.labeled), len(split.unlabeled),
    )  # fmt: skip
    return _labeled_and_unlabeled(cfg, partition_id, num_partitions, split.labeled, split.unlabeled, local_test,
                                  positive_classes=positives, class_prior=prior)  # fmt: skip


@SETTINGS.register("labels-at-clients")
def labels_at_clients_client(cfg: RunConfig, partition_id: int, num_partitions: int, parts: frozenset[str]) -> ClientData:
    """A client of the labels-at-clients setting (FedDB, Zhu et al., IJCAI 2024): its share of
    the class-balanced labeled pool (with labels) and of the unlabeled pool, the unlabeled part
    holding its labeled images too (without labels). ``samples-per-client`` caps its share of
    the unlabeled pool (a random subset of that size; a client holding fewer keeps them all,
    as the small clients of a Dirichlet split do); ``client-test-fraction`` of that share
    becomes its labeled local test split.

    Raises
    ------
    ValueError
        If ``partition_id`` is out of range; see :func:`labels_at_clients_splits`.
    """
    _check_partition(partition_id, num_partitions)
    split = labels_at_clients_splits(cfg, num_partitions)[partition_id]
    pooled, local_test = _capped_share(cfg, partition_id, np.setdiff1d(split.unlabeled, split.labeled))
    unlabeled = np.sort(np.concatenate([pooled, split.labeled]))
    log.info("client %d/%d: %d labeled + %d unlabeled images", partition_id, num_partitions, len(split.labeled),
             len(unlabeled))  # fmt: skip
    return _labeled_and_unlabeled(cfg, partition_id, num_partitions, split.labeled, unlabeled, local_test)


@functools.lru_cache(maxsize=4)
def labels_at_server_splits(cfg: RunConfig, num_partitions: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """The server's labeled rows and every client's unlabeled rows (into the training set) of
    the labels-at-server setting (:func:`~fedul_flwr.data.labels_at_server.split_labels_at_server`;
    cached per process). The labeled pool is the labels-at-clients setting's (same seed, same
    images).

    Raises
    ------
    ValueError
        From the labeled-pool draw or the partition.
    """
    data = load_run_dataset(cfg)
    labels = data.train_y.numpy()
    pool, _ = holdout_split(labels, cfg.val_fraction, cfg.seed)
    seeds = (stream_seed("labeled-pool", cfg.seed), stream_seed("unlabeled-partition", cfg.seed))
    server, clients = split_labels_at_server(
        labels[pool], cfg.num_labeled, data.num_classes,
        lambda part_labels, seed: _partition(cfg, part_labels, num_partitions, seed), seeds, data.class_names,
    )  # fmt: skip
    return pool[server], [pool[c] for c in clients]


def server_labeled_rows(cfg: RunConfig) -> np.ndarray:
    """Rows (into the training set) of the server's labeled images in a simulation of the
    labels-at-server setting: the class-balanced pool of ``num-labeled`` images. It does not
    depend on the number of clients (the pool is drawn before the partition).

    Raises
    ------
    ValueError
        From the labeled-pool draw (``num-labeled`` < K, a class too small).
    """
    return labels_at_server_splits(cfg, 1)[0]


@SETTINGS.register("labels-at-server")
def labels_at_server_client(cfg: RunConfig, partition_id: int, num_partitions: int, parts: frozenset[str]) -> ClientData:
    """A client of the labels-at-server setting (SemiFL, FedRGD, FedMatch's L@S): its share of
    the unlabeled pool, without labels; no labeled part (the server holds the labels).
    ``samples-per-client`` and ``client-test-fraction`` act as in the labels-at-clients setting.

    Raises
    ------
    ValueError
        If ``partition_id`` is out of range; see :func:`labels_at_server_splits`.
    """
    _check_partition(partition_id, num_partitions)
    unlabeled, local_test = _capped_share(cfg, partition_id, labels_at_server_splits(cfg, num_partitions)[1][partition_id])
    log.info("client %d/%d: %d unlabeled images (the labels are at the server)", partition_id, num_partitions,
             len(unlabeled))  # fmt: skip
    client = _labeled_and_unlabeled(cfg, partition_id, num_partitions, np.zeros(0, np.int64), unlabeled, local_test)
    return dataclasses.replace(client, labeled=None)


def _check_partition(partition_id: int, num_partitions: int) -> None:
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id={partition_id} out of range for num-partitions={num_partitions}")


def _capped_share(cfg: RunConfig, partition_id: int, pooled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A client's share of an unlabeled pool cut to ``samples-per-client`` (a smaller share stays
    whole: Dirichlet splits) and, with ``client-test-fraction``, the rows of its labeled local
    test split taken from it: (training rows, local test rows), both sorted."""
    if 0 < cfg.samples_per_client < len(pooled):
        sub_rng = numpy_generator("subsample", cfg.seed, partition_id)
        pooled = np.sort(sub_rng.choice(pooled, cfg.samples_per_client, replace=False))
    local_test = np.zeros(0, dtype=np.int64)
    if cfg.client_test_fraction > 0:
        perm = numpy_generator("client-data", cfg.seed, partition_id).permutation(pooled)
        n_test = int(round(cfg.client_test_fraction * len(pooled)))
        local_test, pooled = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    return pooled, local_test


@functools.lru_cache(maxsize=4)
def client_label_fractions(cfg: RunConfig, num_partitions: int) -> list[float]:
    """The label fraction of every client of the annotation-heterogeneity setting
    (:func:`~fedul_flwr.data.annotation.label_fractions` over the clients' sizes; cached).

    Raises
    ------
    ValueError
        From :func:`~fedul_flwr.data.annotation.parse_layout` or the fraction solve.
    """
    layout = parse_layout(cfg.label_layout, num_partitions, cfg.labeled_share)
    sizes = [len(client_rows(cfg, k, num_partitions)[0]) for k in range(num_partitions)]
    return label_fractions(layout, sizes, cfg.labeled_share)


@SETTINGS.register("annotation-heterogeneity")
def annotation_client(cfg: RunConfig, partition_id: int, num_partitions: int, parts: frozenset[str]) -> ClientData:
    """A client of the annotation-heterogeneity setting (HASSLE): a random ``label fraction``
    of its images with labels (the labeled part; absent for an unlabeled client), the rest
    without (the unlabeled part; absent for a fully labeled client).

    Raises
    ------
    ValueError
        See :func:`client_rows` and :func:`client_label_fractions`.
    """
    indices, local_test, rng = client_rows(cfg, partition_id, num_partitions)
    fraction = client_label_fractions(cfg, num_partitions)[partition_id]
    labeled, unlabeled = labeled_rows(indices, fraction, rng)
    log.info("client %d/%d: label fraction %.3f, %d labeled + %d unlabeled images", partition_id, num_partitions,
             fraction, len(labeled), len(unlabeled))  # fmt: skip
    client = _labeled_and_unlabeled(cfg, partition_id, num_partitions, labeled, unlabeled, local_test)
    return dataclasses.replace(
        client, labeled=client.labeled if len(labeled) else None, unlabeled=client.unlabeled if len(unlabeled) else None,
        unlabeled_classes=client.unlabeled_classes if len(unlabeled) else client.unlabeled_classes[:0],
        optional_parts=SEMI_SUPERVISED_PARTS,
    )  # fmt: skip
