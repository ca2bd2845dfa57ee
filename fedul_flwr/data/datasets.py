"""The registry of image datasets (:data:`DATASETS`), the one door of the project to a dataset:
:func:`load_dataset`, :func:`dataset_info` and the run's dataset (:func:`run_dataset`).

Every dataset is returned as an :class:`~fedul_flwr.data.image_dataset.ImageDataset`: whole train/test splits held
in memory as ``uint8`` image tensors of shape ``[N, C, H, W]`` and ``int64`` label
tensors of shape ``[N]``, together with class names and per-channel normalisation
constants. Partitioning into clients and unlabeled sets happens elsewhere
(:mod:`fedul_flwr.data.partition`); this module only loads.

Names (see :data:`DATASETS`; docs/datasets.md describes each):

``"mnist-sample"``
    A class-stratified 12k/10k subset of MNIST shipped with the project in
    ``fedul_flwr/assets/mnist_sample.npz`` (:mod:`fedul_flwr.data.mnist_sample`).
    Needs no ``data_dir`` and no network.
``"mnist"``, ``"fashion-mnist"``, ``"cifar10"``, ``"cifar100"``, ``"svhn"``
    Read by ``torchvision.datasets`` (``MNIST``, ``FashionMNIST``, ``CIFAR10``, ``CIFAR100``,
    ``SVHN``; :mod:`fedul_flwr.data.torchvision_datasets`) from the torchvision root folder ``data_dir``.

Loaded datasets are cached per process (keyed by name, resolved ``data_dir`` and
``download``), because Flower/Ray client actors call :func:`load_dataset` every
round. The returned tensors are shared between callers: do not modify them in place.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedul_flwr.data.image_dataset import DatasetError, DatasetInfo, ImageDataset
from fedul_flwr.data.mnist_sample import embedded_sample_path, load_sample
from fedul_flwr.data.torchvision_datasets import TORCHVISION, load_torchvision
from fedul_flwr.registry import Registry, closest

__all__ = [
    "DATASETS",
    "FLIP_CHOICES",
    "DatasetOptions",
    "DatasetRegistry",
    "DatasetSource",
    "clear_caches",
    "dataset_info",
    "load_dataset",
    "run_dataset",
    "run_dataset_info",
    "run_flip",
    "run_options",
]


@dataclass(frozen=True)
class DatasetOptions:
    """How to read a dataset's images: the run-config keys ``image-column``, ``label-column``
    and ``image-size``. A source that has no use for one refuses it (a built-in dataset takes
    no column and only its own image size), so a typed value is never ignored.

    Attributes
    ----------
    image_column : str
        Column holding the images; ``""``: the dataset's one ``Image`` column.
    label_column : str
        Column holding the class labels; ``""``: the one ``ClassLabel`` column, else ``label``.
    image_size : int
        Side S in pixels every image is resized to (``S x S``); 0 keeps the size, which then
        must be square and the same for every image.
    """

    image_column: str = ""
    label_column: str = ""
    image_size: int = 0

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> "DatasetOptions":
        """The options of a dashed-key mapping (a run config's ``as_dict()``); absent keys take
        the defaults."""
        return cls(
            str(values.get("image-column", "")).strip(),
            str(values.get("label-column", "")).strip(),
            int(values.get("image-size", 0)),
        )


@dataclass(frozen=True)
class DatasetSource:
    """One entry of :data:`DATASETS`: how to load a dataset and what it is.

    Attributes
    ----------
    load : callable
        ``load(name, data_dir, download, options) -> ImageDataset`` (``data_dir`` resolved,
        or ``""``).
    info : callable
        ``info(name, data_dir, options) -> DatasetInfo``, without decoding any image;
        raises :class:`DatasetError` on options the source cannot honour.
    clear : callable, optional
        Forget what the source cached (:func:`clear_caches`).
    """

    load: Callable[[str, str, bool, DatasetOptions], ImageDataset]
    info: Callable[[str, str, DatasetOptions], DatasetInfo]
    clear: Callable[[], None] | None = None


class DatasetRegistry(Registry[DatasetSource]):
    """The :class:`~fedul_flwr.registry.Registry` of datasets, where a source may also own a
    *prefix*: every name starting with it (``hf:`` -- the user's own datasets,
    :mod:`fedul_flwr.data.user_datasets`) resolves to that source."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self._prefixes: dict[str, DatasetSource] = {}

    def add_prefix(self, prefix: str, source: DatasetSource) -> None:
        """Make ``source`` the source of every name starting with ``prefix``.

        Raises
        ------
        ValueError
            If ``prefix`` is registered already.
        """
        if prefix in self._prefixes:
            raise ValueError(f"dataset prefix {prefix!r} is registered twice")
        self._prefixes[prefix] = source

    def prefixes(self) -> tuple[str, ...]:
        """The registered prefixes."""
        return tuple(self._prefixes)

    def get(self, name: str) -> DatasetSource:
        """The source of ``name``: its own entry, else the entry of its prefix.

        Raises
        ------
        DatasetError
            On a name that is neither registered nor starts with a registered prefix (the
            message lists the names, the prefixes and the closest name).
        """
        name = str(name)
        if name in self._items:
            return self._items[name]
        for prefix, source in self._prefixes.items():
            if name.startswith(prefix):
                return source
        valid = [*self.names(), *(f"{p}<source>" for p in self._prefixes)]
        raise DatasetError(f"Unknown dataset {name!r}; valid names: {', '.join(valid)}{closest(name, self.names())}")

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._items or any(name.startswith(p) for p in self._prefixes))


DATASETS = DatasetRegistry("dataset")
"""Every ``dataset`` value and its :class:`DatasetSource`: the one door of the project to a
dataset (:func:`load_dataset`, :func:`dataset_info`). A new dataset registers one
(``DATASETS.add(name, DatasetSource(load, info))``), a family of them a prefix
(``DATASETS.add_prefix("hf:", ...)``); :func:`load_dataset` caches what ``load`` returns per
process and :func:`dataset_info` answers from ``info``."""


def _builtin(info: DatasetInfo, load: Callable[[str, bool], ImageDataset]) -> DatasetSource:
    """The source of a built-in dataset: its fixed ``info``; options other than its own
    image size are refused (they apply to ``hf:`` datasets)."""

    def checked_info(name: str, data_dir: str, options: DatasetOptions) -> DatasetInfo:
        if options.image_column or options.label_column:
            key = "image-column" if options.image_column else "label-column"
            raise DatasetError(f"{key}={options.image_column or options.label_column!r}: dataset {name!r} has no "
                               "columns; image-column and label-column apply to hf: datasets")  # fmt: skip
        if options.image_size not in (0, info.image_size):
            raise DatasetError(f"image-size={options.image_size}: dataset {name!r} has {info.image_size}x"
                               f"{info.image_size} images; resizing (image-size) applies to hf: datasets")  # fmt: skip
        return info

    return DatasetSource(lambda name, root, download, options: load(root, download), checked_info)


DATASETS.add("mnist-sample", _builtin(dataclasses.replace(TORCHVISION["mnist"].info, name="mnist-sample"),
                                      lambda root, download: load_sample(embedded_sample_path())))  # fmt: skip
for _name, _spec in TORCHVISION.items():
    DATASETS.add(_name, _builtin(_spec.info, functools.partial(load_torchvision, _spec)))


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, root: str, download: bool, options: DatasetOptions) -> ImageDataset:
    return DATASETS.get(name).load(name, root, download, options)


def load_dataset(name: str, data_dir: str = "", download: bool = False,
                 options: DatasetOptions = DatasetOptions()) -> ImageDataset:  # fmt: skip
    """Load a dataset's full train and test splits into memory: every image of the run
    decoded and checked, once per process.

    Parameters
    ----------
    name : str
        One of :data:`DATASETS` (``hf:<source>`` included).
    data_dir : str, optional
        torchvision root folder (``<data_dir>/MNIST/raw/...``, ``<data_dir>/FashionMNIST/raw/...``,
        ``<data_dir>/cifar-10-python.tar.gz`` or ``<data_dir>/cifar-10-batches-py/...``,
        ``<data_dir>/cifar-100-python.tar.gz`` or ``<data_dir>/cifar-100-python/...``,
        ``<data_dir>/train_32x32.mat`` and ``test_32x32.mat``); for a Hub dataset the
        cache folder of ``datasets``. Ignored for ``"mnist-sample"`` and local ``hf:``
        sources; required for the torchvision datasets. ``~`` is expanded and relative paths
        are resolved against the current working directory.
    download : bool, optional
        Let torchvision download missing files into ``data_dir``. Not needed when the
        original files are already there (torchvision verifies and extracts them offline).
    options : DatasetOptions, optional
        Columns and image size of an ``hf:`` dataset (refused by the built-in ones).

    Returns
    -------
    ImageDataset
        ``train_x`` ``uint8 [N, C, H, W]``, ``train_y`` ``int64 [N]``, ``test_x``
        ``uint8 [N_test, C, H, W]``, ``test_y`` ``int64 [N_test]``. Cached per process;
        treat the tensors as read-only.

    Raises
    ------
    DatasetError
        One line: an unknown name, an option the source refuses, an empty or missing
        ``data_dir``, missing or corrupt files, a failed download, an unreadable, truncated
        or wrongly sized image (naming the file or row).
    """
    root = str(Path(data_dir).expanduser().resolve()) if str(data_dir).strip() else ""
    if name == "mnist-sample":
        root, download = "", False
    dataset_info(name, options, root)  # refuses options the source cannot honour, before any image is decoded
    return _load_cached(name, root, bool(download), options)


def dataset_info(name: str, options: DatasetOptions = DatasetOptions(), data_dir: str = "") -> DatasetInfo:
    """The :class:`DatasetInfo` of dataset ``name`` without decoding any image (a built-in
    dataset's needs no file; an ``hf:`` dataset's is read from its labels and image headers).

    Raises
    ------
    DatasetError
        On an unknown name, an option the source refuses, or an unreadable ``hf:`` source.
    """
    root = str(Path(data_dir).expanduser().resolve()) if str(data_dir).strip() else ""
    return DATASETS.get(name).info(name, root, options)


def clear_caches() -> None:
    """Forget every loaded dataset and what the sources cached, so the next load reads the
    files again (after they changed)."""
    _load_cached.cache_clear()
    for source in [*(s for _, s in DATASETS.items()), *DATASETS._prefixes.values()]:
        if source.clear is not None:
            source.clear()


def run_options(values: Any) -> tuple[str, str, bool, DatasetOptions]:
    """``(dataset, data-dir, download, options)`` of a run's settings: a
    :class:`~fedul_flwr.config.RunConfig` or its dashed-key mapping (:meth:`RunConfig.as_dict`)."""
    values = values.as_dict() if hasattr(values, "as_dict") else values
    return (str(values["dataset"]), str(values.get("data-dir", "")), bool(values.get("download", False)),
            DatasetOptions.from_values(values))  # fmt: skip


def run_dataset(values: Any) -> ImageDataset:
    """The run's dataset (:func:`load_dataset` of its settings; cached per process)."""
    name, data_dir, download, options = run_options(values)
    return load_dataset(name, data_dir, download, options)


FLIP_CHOICES: tuple[str, ...] = ("auto", "true", "false")
"""Values of the run key ``horizontal-flip``: ``auto`` keeps the dataset's own
:attr:`DatasetInfo.flip`; ``true`` / ``false`` (typed as a bool or a string) set it."""


def run_flip(value: Any) -> bool | None:
    """The run key ``horizontal-flip`` as ``True`` / ``False``, or ``None`` for ``auto``.

    Raises
    ------
    DatasetError
        On a value that is none of :data:`FLIP_CHOICES`.
    """
    text = str(value).strip().lower()
    if text not in FLIP_CHOICES:
        raise DatasetError(f"horizontal-flip={value!r} is not one of {FLIP_CHOICES}")
    return None if text == "auto" else text == "true"


def run_dataset_info(values: Any) -> DatasetInfo:
    """The run's dataset facts, what a node must agree on (:func:`dataset_info`), with the
    comma-separated ``class-names`` key replacing the dataset's own names when given, and the
    ``horizontal-flip`` key (:func:`run_flip`) the dataset's :attr:`DatasetInfo.flip`.

    Raises
    ------
    DatasetError
        As :func:`dataset_info`, if ``class-names`` does not list K distinct names, or on a
        ``horizontal-flip`` that is none of :data:`FLIP_CHOICES`.
    """
    name, data_dir, _, options = run_options(values)
    info = dataset_info(name, options, data_dir)
    settings = values.as_dict() if hasattr(values, "as_dict") else values
    flip = run_flip(settings.get("horizontal-flip", "auto"))
    if flip is not None:
        info = dataclasses.replace(info, flip=flip)
    given = str(settings.get("class-names", ""))
    if not given.strip():
        return info
    names = tuple(n.strip() for n in given.split(","))
    if len(names) != len(info.class_names) or len(set(names)) != len(names) or not all(names):
        raise DatasetError(f"class-names={given!r}: expected {len(info.class_names)} distinct non-empty "
                           f"comma-separated names (K of dataset {name!r}), got {len(names)}")  # fmt: skip
    return dataclasses.replace(info, class_names=names)
