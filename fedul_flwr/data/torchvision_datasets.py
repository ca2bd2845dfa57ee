"""The datasets read by ``torchvision.datasets`` (``"mnist"``, ``"fashion-mnist"``, ``"cifar10"``,
``"cifar100"``, ``"svhn"``; :data:`TORCHVISION`) from a torchvision root folder ``data_dir``.

Files and checksums are torchvision's: where the files torchvision reads are missing but the
original files (archives, SVHN's ``.mat``) are in ``data_dir``, this module checks them against
torchvision's checksums (a clear error names a corrupt file) and lets torchvision's own
``download=True`` extract them, which uses no network when every original file is present and
verified. A read-only root gets a cache root instead (``$FEDUL_CACHE_DIR``, default
``~/.cache/fedul-flwr``) holding links to its files, where torchvision extracts.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock

from fedul_flwr.data.image_dataset import DatasetError, DatasetInfo, ImageDataset
from fedul_flwr.store import remove

__all__ = ["TORCHVISION", "TorchvisionSpec", "cache_for", "load_torchvision"]

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
    info: DatasetInfo

    def tv_class(self) -> type:
        """The ``torchvision.datasets`` class."""
        import torchvision.datasets as tvd  # deferred: import cost of torchvision (seconds), paid only by a torchvision dataset

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
    from torchvision.datasets.utils import check_integrity  # deferred: import cost of torchvision (seconds)

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
