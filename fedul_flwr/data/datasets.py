"""Image datasets for FedUL: the embedded MNIST sample and torchvision datasets.

Every dataset is returned as an :class:`ImageDataset`: whole train/test splits held
in memory as ``uint8`` image tensors of shape ``[N, C, H, W]`` and ``int64`` label
tensors of shape ``[N]``, together with class names and per-channel normalisation
constants. Partitioning into clients and unlabeled sets happens elsewhere
(:mod:`fedul_flwr.data.partition`); this module only loads.

Names (see :data:`DATASETS`; docs/datasets.md describes each):

``"mnist-sample"``
    A class-stratified 12k/10k subset of MNIST shipped with the project in
    ``fedul_flwr/assets/mnist_sample.npz`` (built by ``scripts/build_mnist_sample.py``).
    Needs no ``data_dir`` and no network.
``"mnist"``, ``"fashion-mnist"``, ``"cifar10"``, ``"cifar100"``, ``"svhn"``
    Read by ``torchvision.datasets`` (``MNIST``, ``FashionMNIST``, ``CIFAR10``, ``CIFAR100``,
    ``SVHN``; :data:`TORCHVISION`) from the torchvision root folder ``data_dir``.

Files and checksums are torchvision's: where the files torchvision reads are missing but the
original files (archives, SVHN's ``.mat``) are in ``data_dir``, this module checks them against
torchvision's checksums (a clear error names a corrupt file) and lets torchvision's own
``download=True`` extract them, which uses no network when every original file is present and
verified. A read-only root gets a cache root instead (``$FEDUL_CACHE_DIR``, default
``~/.cache/fedul-flwr``) holding links to its files, where torchvision extracts.

Loaded datasets are cached per process (keyed by name, resolved ``data_dir`` and
``download``), because Flower/Ray client actors call :func:`load_dataset` every
round. The returned tensors are shared between callers: do not modify them in place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

import numpy as np
import torch

from fedul_flwr.registry import Registry, closest
from fedul_flwr.store import remove

__all__ = [
    "DATASETS",
    "TORCHVISION",
    "DatasetError",
    "DatasetInfo",
    "DatasetOptions",
    "DatasetRegistry",
    "DatasetSource",
    "ImageDataset",
    "TorchvisionSpec",
    "cache_for",
    "clear_caches",
    "dataset_info",
    "embedded_sample_path",
    "load_dataset",
    "load_torchvision",
    "normalize",
    "run_dataset",
    "run_dataset_info",
    "run_options",
]

_DIST_NAME = "fedul-flwr"
_SAMPLE_RELPATH = "fedul_flwr/assets/mnist_sample.npz"
_CACHE_ENV = "FEDUL_CACHE_DIR"

_MNIST_MEAN, _MNIST_STD = (0.1307,), (0.3081,)
_MNIST_CLASSES = (
    "0 - zero",
    "1 - one",
    "2 - two",
    "3 - three",
    "4 - four",
    "5 - five",
    "6 - six",
    "7 - seven",
    "8 - eight",
    "9 - nine",
)


class DatasetError(ValueError):
    """A dataset cannot be loaded: unknown name, bad ``data_dir``, missing or corrupt files,
    or a failed download. The message names the dataset, the folder and the files."""


@dataclass(frozen=True)
class ImageDataset:
    """A fully in-memory image classification dataset.

    Attributes
    ----------
    name : str
        Dataset name, one of :data:`DATASETS`.
    train_x : torch.Tensor
        ``uint8`` training images, shape ``[N, C, H, W]``, values 0..255.
    train_y : torch.Tensor
        ``int64`` training labels, shape ``[N]``, values in ``0 .. num_classes-1``.
    test_x : torch.Tensor
        ``uint8`` test images, shape ``[N_test, C, H, W]``.
    test_y : torch.Tensor
        ``int64`` test labels, shape ``[N_test]``.
    class_names : tuple of str
        Human-readable class names, indexed by label (``len == num_classes``).
    mean, std : tuple of float
        Per-channel normalisation constants on the ``[0, 1]`` scale (``len == C``),
        for use with :func:`normalize`.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    class_names: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def num_classes(self) -> int:
        """Number of classes ``K`` (``len(class_names)``)."""
        return len(self.class_names)

    @property
    def in_channels(self) -> int:
        """Number of image channels ``C``."""
        return int(self.train_x.shape[1])

    @property
    def image_size(self) -> int:
        """Image height ``H`` (images are square: ``H == W``)."""
        return int(self.train_x.shape[2])


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """Scale ``uint8`` images to ``float32`` and standardise each channel.

    Parameters
    ----------
    x : torch.Tensor
        ``uint8`` images, shape ``[N, C, H, W]`` (any device).
    mean, std : sequence of float
        Per-channel constants on the ``[0, 1]`` scale, each of length ``C``.

    Returns
    -------
    torch.Tensor
        ``float32`` tensor of shape ``[N, C, H, W]`` on ``x``'s device, equal to
        ``(x / 255 - mean[c]) / std[c]`` in channel ``c``.
    """
    if x.dim() != 4:
        raise ValueError(f"normalize expects images of shape [N, C, H, W], got {tuple(x.shape)}")
    c = x.shape[1]
    if len(mean) != c or len(std) != c:
        raise ValueError(
            f"normalize: {c} channels but mean has {len(mean)} and std has {len(std)} entries"
        )
    m = torch.tensor(mean, dtype=torch.float32, device=x.device).view(1, c, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=x.device).view(1, c, 1, 1)
    return (x.to(torch.float32) / 255.0 - m) / s


# --------------------------------------------------------------------------------------
# Embedded sample
# --------------------------------------------------------------------------------------


def embedded_sample_path() -> Path:
    """Locate the embedded MNIST sample ``mnist_sample.npz``.

    The app may run from a Flower FAB copy of the package that carries no ``.npz``
    files, so the file is searched for in this order:

    1. ``fedul_flwr/assets/mnist_sample.npz`` next to this module's package;
    2. the installed ``fedul-flwr`` distribution: a file it lists, or, for an editable
       install, ``<project dir>/fedul_flwr/assets/mnist_sample.npz``.

    Returns
    -------
    pathlib.Path
        Path of an existing file.

    Raises
    ------
    DatasetError
        If the file is found in neither place.
    """
    local = Path(__file__).resolve().parent.parent / "assets" / "mnist_sample.npz"
    if local.is_file():
        return local
    tried = [str(local)]
    for candidate in _distribution_sample_candidates():
        if candidate.is_file():
            return candidate
        tried.append(str(candidate))
    raise DatasetError(
        "The embedded MNIST sample (dataset 'mnist-sample') is missing; looked in: "
        + ", ".join(tried)
        + ". Install the project (pip install -e .) from a checkout that has "
        "fedul_flwr/assets/mnist_sample.npz, or rebuild it from real MNIST with "
        "`python scripts/build_mnist_sample.py --mnist-root <torchvision root with MNIST/raw>`."
    )


def _distribution_sample_candidates() -> list[Path]:
    """Candidate sample paths from the installed ``fedul-flwr`` distribution (may be empty)."""
    try:
        dist = metadata.distribution(_DIST_NAME)
    except metadata.PackageNotFoundError:
        return []
    out: list[Path] = []
    for f in dist.files or ():
        if f.as_posix() == _SAMPLE_RELPATH:
            out.append(Path(str(dist.locate_file(f))))
            break
    try:
        raw = dist.read_text("direct_url.json")
    except OSError:
        raw = None
    if raw:
        try:
            info = json.loads(raw)
        except ValueError:
            info = {}
        if info.get("dir_info", {}).get("editable") and str(info.get("url", "")).startswith("file:"):
            root = Path(url2pathname(unquote(urlparse(info["url"]).path)))
            out.append(root / _SAMPLE_RELPATH)
    return out


def _load_sample(path: Path) -> ImageDataset:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in ("train_x", "train_y", "test_x", "test_y")}
    except (OSError, KeyError, ValueError) as exc:
        raise DatasetError(
            f"Cannot read the embedded MNIST sample {path}: {exc}. Rebuild it with "
            "`python scripts/build_mnist_sample.py`."
        ) from exc

    def images(a: np.ndarray) -> torch.Tensor:
        # [N, 28, 28] uint8 -> [N, 1, 28, 28] uint8
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.uint8)).unsqueeze(1)

    def labels(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.astype(np.int64))

    return ImageDataset(
        name="mnist-sample",
        train_x=images(arrays["train_x"]),
        train_y=labels(arrays["train_y"]),
        test_x=images(arrays["test_x"]),
        test_y=labels(arrays["test_y"]),
        class_names=_MNIST_CLASSES,
        mean=_MNIST_MEAN,
        std=_MNIST_STD,
    )


# --------------------------------------------------------------------------------------
# torchvision datasets
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Member:
    """One original file of a torchvision root and the files torchvision reads from it.

    Paths are relative to the torchvision root; ``files == (archive,)`` for a file that is
    read as it is (SVHN's ``.mat``)."""

    archive: str
    md5: str
    files: tuple[str, ...]


@dataclass(frozen=True)
class TorchvisionSpec:
    """A dataset read by a ``torchvision.datasets`` class from a torchvision root.

    Attributes
    ----------
    name : str
        The ``dataset`` value.
    cls_name : str
        The ``torchvision.datasets`` class (``"CIFAR100"``); its own checksum attributes
        (``resources``, ``tgz_md5`` / ``train_list`` / ``test_list`` / ``meta``,
        ``split_list``) are the only checksum table: the files are checked against them.
    splits : tuple of dict
        The class's keyword arguments of the train and the test split.
    info : DatasetInfo
        Class names, image shape and normalisation constants.
    """

    name: str
    cls_name: str
    splits: tuple[dict[str, Any], dict[str, Any]]
    info: "DatasetInfo"

    def tv_class(self) -> type:
        """The ``torchvision.datasets`` class."""
        import torchvision.datasets as tvd

        return getattr(tvd, self.cls_name)

    def members(self) -> tuple[_Member, ...]:
        """The original files and what torchvision reads from them, from the class's attributes
        (read at call time, so a test may register the checksums of generated files there)."""
        cls = self.tv_class()
        if hasattr(cls, "resources"):  # MNIST-like: <Class>/raw/<file>.gz, each extracted beside it
            raw = f"{cls.__name__}/raw"
            names = [(os.path.basename(url), md5) for url, md5 in cls.resources]
            return tuple(_Member(f"{raw}/{gz}", md5, (f"{raw}/{os.path.splitext(gz)[0]}",)) for gz, md5 in names)
        if hasattr(cls, "tgz_md5"):  # CIFAR: one .tar.gz holding <base_folder>/<batches and meta>
            names = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
            return (_Member(cls.filename, cls.tgz_md5, tuple(f"{cls.base_folder}/{f}" for f in names)),)
        # SVHN: one .mat per split, read as it is
        files = [cls.split_list[s["split"]][1:3] for s in self.splits]
        return tuple(_Member(name, md5, (name,)) for name, md5 in files)


def _verify_archive(path: Path, md5: str) -> bool:
    """True if ``path`` exists and its md5 is ``md5`` (torchvision's ``check_integrity``)."""
    from torchvision.datasets.utils import check_integrity

    return check_integrity(str(path), md5)


def _cache_root() -> Path:
    """Writable folder used as a torchvision root for archives from read-only roots."""
    env = os.environ.get(_CACHE_ENV, "")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedul-flwr"


def _is_writable_dir(path: Path) -> bool:
    """True if ``path`` is (or can be created as) a folder we may write to.

    Permission bits are checked as well as ``os.access``, so a folder marked read-only
    is left alone even when running as root (for whom ``os.access`` always says yes).
    """
    p = path
    while not p.exists():
        if p.parent == p:
            return False
        p = p.parent
    try:
        mode = p.stat().st_mode
    except OSError:
        return False
    return stat.S_ISDIR(mode) and bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) and os.access(p, os.W_OK)


def _missing(members: Sequence[_Member], root: Path) -> list[_Member]:
    """Members whose files are not all present under ``root``."""
    return [m for m in members if not all((root / f).is_file() for f in m.files)]


def _describe_expected(root: Path, members: Sequence[_Member]) -> str:
    """Human-readable list of the files that must exist under ``root``."""
    lines = []
    for m in members:
        if m.files == (m.archive,):
            lines.append(f"{root / m.archive}")
        elif len(m.files) == 1 and m.archive == m.files[0] + ".gz":
            lines.append(f"{root / m.files[0]}(.gz)")
        else:
            folder = os.path.dirname(m.files[0])
            names = ", ".join(os.path.basename(f) for f in m.files)
            lines.append(f"{root / m.archive} (or its extracted files {names} in {root / folder}/)")
    return "; ".join(lines)


def _torchvision_prepare(spec: TorchvisionSpec, root: Path) -> None:
    """torchvision's own ``download=True``: it verifies the original files in ``root`` by their
    checksums, downloads those that are absent or corrupt, and extracts the archives. With
    every archive present and verified it never touches the network."""
    cls = spec.tv_class()
    for split in spec.splits:
        cls(root=str(root), download=True, **split)


@contextlib.contextmanager
def _root_lock(root: Path) -> Iterator[None]:
    """A lock on preparing ``root`` across processes (Flower's client actors load at the same
    time), held in the cache folder so that nothing is written into the data folder; without
    a writable cache folder, no lock."""
    from filelock import FileLock

    locks = _cache_root() / "locks"
    try:
        locks.mkdir(parents=True, exist_ok=True)
    except OSError:
        yield
        return
    with FileLock(str(locks / (hashlib.sha256(str(root).encode()).hexdigest()[:16] + ".lock"))):
        yield


def cache_for(root: Path) -> Path:
    """The torchvision root that stands in for the read-only ``root``: a folder of its own in
    the cache folder (``$FEDUL_CACHE_DIR``, default ``~/.cache/fedul-flwr``), named by a hash
    of ``root``'s path."""
    return _cache_root() / "roots" / hashlib.sha256(str(root).encode()).hexdigest()[:16]


def _linked_cache(root: Path, members: Sequence[_Member]) -> Path:
    """The cache root for a read-only ``root`` (:func:`cache_for`): a symbolic link to each of its
    original files (and to the files already read from one), so torchvision extracts there."""
    cache = cache_for(root)
    for m in members:
        for rel in m.files if not _missing([m], root) else (m.archive,):
            link = cache / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                remove(link, missing_ok=True)  # a dangling link (fedul_flwr.store.remove)
                link.symlink_to(root / rel)
    return cache


def _prepare(spec: TorchvisionSpec, root: Path, download: bool) -> Path:
    """The torchvision root to read ``spec`` from: ``root`` when it holds the files torchvision
    reads; else ``root`` or, when ``root`` is read-only, the cache root, after torchvision
    verified and extracted the original archives (offline) or downloaded them (``download``).

    Raises
    ------
    DatasetError
        An archive fails its checksum, files are missing and ``download`` is false, the
        download fails, or a read-only root's cache cannot be written.
    """
    members = spec.members()
    missing = _missing(members, root)
    offline = all((root / m.archive).is_file() for m in members)  # every original file is here
    if missing and not offline and not download:
        absent = [m for m in missing if not (root / m.archive).is_file()]  # in neither form
        why = "" if absent else (  # torchvision extracts from the whole set of original files only
            f" (torchvision extracts {', '.join(m.archive for m in missing)} only with every original file "
            f"present: also put {', '.join(m.archive for m in members if not (root / m.archive).is_file())} there)")
        raise DatasetError(
            f"Dataset {spec.name!r} not found in data-dir {root}. Missing: "
            f"{_describe_expected(root, absent or missing)}{why}. Put the original files there "
            "(torchvision layout), or set download=true on a machine with internet access."
        )
    # the archives about to be extracted, and the files torchvision reads as they are (SVHN)
    checked = [m for m in members if (missing and offline) or (m.files == (m.archive,) and m not in missing)]
    bad = [m for m in checked if not _verify_archive(root / m.archive, m.md5)]
    if bad:
        raise DatasetError(
            f"Dataset {spec.name!r}: file(s) in {root} failed md5 verification: "
            + ", ".join(f"{m.archive} (expected md5 {m.md5})" for m in bad)
            + ". Replace them with the original files (torchvision's checksums), or remove them "
            "and use download=true on a machine with internet access."
        )
    if not missing:
        return root
    target = root
    if offline and not all(_is_writable_dir((root / f).parent) for m in missing for f in m.files):
        try:
            target = _linked_cache(root, members)
        except OSError as exc:
            raise DatasetError(
                f"Dataset {spec.name!r}: {root} is read-only and preparing the cache folder "
                f"{cache_for(root)} failed ({exc}). Set ${_CACHE_ENV} to a writable folder."
            ) from exc
    try:
        _torchvision_prepare(spec, target)
    except Exception as exc:  # noqa: BLE001 - torchvision raises RuntimeError, URLError, OSError...
        if offline:
            raise DatasetError(f"torchvision could not extract dataset {spec.name!r} in {target}: {exc}") from exc
        raise DatasetError(
            f"Downloading dataset {spec.name!r} into {root} failed ({type(exc).__name__}: {exc}). "
            "This machine seems to be offline or cannot reach the dataset host. Place these files "
            f"manually and retry with download=false: {_describe_expected(root, members)}"
        ) from exc
    return target


def _images(data: torch.Tensor | np.ndarray, channels: int) -> torch.Tensor:
    """torchvision's ``data`` as ``uint8 [N, C, H, W]``: MNIST's ``[N, H, W]`` gains a channel,
    CIFAR's ``[N, H, W, C]`` is permuted, SVHN's ``[N, C, H, W]`` is kept."""
    t = torch.as_tensor(data)
    if t.dim() == 3:
        t = t.unsqueeze(1)
    elif t.shape[1] != channels:
        t = t.permute(0, 3, 1, 2)
    return t.to(torch.uint8).contiguous()


def _read_torchvision(spec: TorchvisionSpec, root: Path) -> ImageDataset:
    """Both splits of ``spec`` read by torchvision (``download=False``: it checks the files it
    reads against its checksums, CIFAR's batches and SVHN's ``.mat``)."""
    cls = spec.tv_class()
    try:
        train, test = (cls(root=str(root), download=False, **split) for split in spec.splits)
    except (RuntimeError, OSError, ValueError) as exc:
        raise DatasetError(
            f"torchvision could not read dataset {spec.name!r} from {root}: {exc}. Expected files: "
            f"{_describe_expected(root, spec.members())}"
        ) from exc

    def labels(split: Any) -> torch.Tensor:
        targets = split.labels if hasattr(split, "labels") else split.targets  # SVHN: labels
        return torch.as_tensor(np.asarray(targets), dtype=torch.int64).clone()

    c = spec.info.channels
    return ImageDataset(
        name=spec.name,
        train_x=_images(train.data, c),
        train_y=labels(train),
        test_x=_images(test.data, c),
        test_y=labels(test),
        class_names=tuple(str(n) for n in getattr(train, "classes", spec.info.class_names)),
        mean=spec.info.mean,
        std=spec.info.std,
    )


def _resolve_root(spec: TorchvisionSpec, data_dir: str, download: bool) -> Path:
    """Validate ``data_dir`` and return it as a resolved folder (created only for a download)."""
    if not str(data_dir).strip():
        raise DatasetError(
            f"Dataset {spec.name!r} needs data-dir: the torchvision root folder that holds its original "
            f"files, e.g. data-dir=\"/data\" with {_describe_expected(Path('/data'), spec.members())}. "
            "data-dir is empty; use dataset 'mnist-sample' for the embedded sample that needs no files."
        )
    root = Path(data_dir).expanduser().resolve()
    if not root.exists():
        if not download:
            raise DatasetError(
                f"data-dir {root} for dataset {spec.name!r} does not exist. Create it and put the "
                f"files there: {_describe_expected(root, spec.members())}; or set download=true "
                "on a machine with internet access."
            )
        root.mkdir(parents=True, exist_ok=True)
    if not root.is_dir():
        raise DatasetError(f"data-dir {root} for dataset {spec.name!r} is not a folder")
    return root


def load_torchvision(spec: TorchvisionSpec, data_dir: str, download: bool) -> ImageDataset:
    """Load ``spec`` from the torchvision root ``data_dir`` (see :func:`load_dataset`).

    Raises
    ------
    DatasetError
        On an empty, missing or non-folder ``data_dir``, missing or corrupt files, or a
        failed download; the message names the files and where they belong.
    """
    root = _resolve_root(spec, data_dir, download)
    with _root_lock(root):
        source = _prepare(spec, root, download)
    return _read_torchvision(spec, source)


# --------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetInfo:
    """What a node must agree on with the run's dataset, known without loading any image.

    A deployed SuperNode holds its own images, not the dataset: it needs the class names,
    the image shape and the normalisation constants of the run's dataset to turn its
    images into the tensors f expects.

    Attributes
    ----------
    name : str
        Dataset name, one of :data:`DATASETS`.
    class_names : tuple of str
        The K class names, indexed by label.
    channels : int
        Image channels C.
    image_size : int
        Image height = width, in pixels.
    mean, std : tuple of float
        Per-channel normalisation constants (``len == channels``), as for :func:`normalize`.
    flip : bool
        Whether the classes are invariant under horizontal mirroring, so that augmentation may
        flip images (:mod:`fedul_flwr.augment`): ``True`` for Fashion-MNIST, CIFAR-10 and
        CIFAR-100, ``False`` for digits (MNIST, SVHN) and, unless the run says otherwise, an
        ``hf:`` dataset; the run key ``horizontal-flip`` sets it for any dataset
        (:func:`run_dataset_info`).
    """

    name: str
    class_names: tuple[str, ...]
    channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    flip: bool = False

    def to_json(self) -> str:
        """The facts as a JSON object (what the ServerApp sends the nodes with the run config)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "DatasetInfo":
        """The facts of :meth:`to_json`.

        Raises
        ------
        ValueError
            If ``text`` is not such a JSON object.
        """
        try:
            d = json.loads(text)
            if not isinstance(d["flip"], bool):
                raise ValueError(f"flip={d['flip']!r} is not a bool")
            return cls(str(d["name"]), tuple(str(n) for n in d["class_names"]), int(d["channels"]),
                       int(d["image_size"]), tuple(float(v) for v in d["mean"]), tuple(float(v) for v in d["std"]),
                       d["flip"])  # fmt: skip
        except (TypeError, KeyError, ValueError) as exc:
            raise ValueError(f"not the dataset facts of a run: {text[:80]!r} ({exc})") from None


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

_CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# the fine label names of CIFAR-100's meta file, in label order
_CIFAR100_CLASSES = tuple("""
apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can castle
caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin elephant flatfish
forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle
mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy porcupine
possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper snail snake spider squirrel streetcar
sunflower sweet_pepper table tank telephone television tiger tractor train trout tulip turtle wardrobe whale willow_tree
wolf woman worm""".split())  # fmt: skip
_FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")

_TRAIN_TEST = ({"train": True}, {"train": False})
TORCHVISION: dict[str, TorchvisionSpec] = {
    spec.name: spec
    for spec in (
        TorchvisionSpec("mnist", "MNIST", _TRAIN_TEST, DatasetInfo("mnist", _MNIST_CLASSES, 1, 28, _MNIST_MEAN, _MNIST_STD)),
        TorchvisionSpec("fashion-mnist", "FashionMNIST", _TRAIN_TEST,
                        DatasetInfo("fashion-mnist", _FASHION_CLASSES, 1, 28, (0.2860,), (0.3530,), flip=True)),
        TorchvisionSpec("cifar10", "CIFAR10", _TRAIN_TEST,
                        DatasetInfo("cifar10", _CIFAR10_CLASSES, 3, 32, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616),
                                    flip=True)),
        TorchvisionSpec("cifar100", "CIFAR100", _TRAIN_TEST,
                        DatasetInfo("cifar100", _CIFAR100_CLASSES, 3, 32, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762),
                                    flip=True)),
        # SVHN's train and test splits (not "extra"); labels 0-9, the digit (torchvision maps its 10 to 0)
        TorchvisionSpec("svhn", "SVHN", ({"split": "train"}, {"split": "test"}),
                        DatasetInfo("svhn", _MNIST_CLASSES, 3, 32, (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970))),
    )
}  # fmt: skip
"""The datasets read by ``torchvision.datasets`` classes: normalisation constants are the
per-channel pixel mean and standard deviation of the training split on the [0, 1] scale."""

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
                                      lambda root, download: _load_sample(embedded_sample_path())))  # fmt: skip
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

