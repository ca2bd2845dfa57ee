"""Image datasets for FedUL: the embedded MNIST sample and torchvision datasets.

Every dataset is returned as an :class:`ImageDataset`: whole train/test splits held
in memory as ``uint8`` image tensors of shape ``[N, C, H, W]`` and ``int64`` label
tensors of shape ``[N]``, together with class names and per-channel normalisation
constants. Partitioning into clients and unlabeled sets happens elsewhere
(:mod:`fedul_flwr.data.partition`); this module only loads.

Names (see :data:`DATASETS`):

``"mnist-sample"``
    A class-stratified 12k/10k subset of MNIST shipped with the project in
    ``fedul_flwr/assets/mnist_sample.npz`` (built by ``scripts/build_mnist_sample.py``).
    Needs no ``data_dir`` and no network.
``"mnist"``, ``"fashion-mnist"``, ``"cifar10"``
    Loaded through ``torchvision.datasets`` (``MNIST``, ``FashionMNIST``, ``CIFAR10``)
    from the torchvision root folder ``data_dir``.

Offline and read-only roots: when a root holds only the original, md5-verified
archives (``<root>/MNIST/raw/*.gz``, ``<root>/cifar-10-python.tar.gz``), they are
extracted without touching the network: in place when the folder is writable,
otherwise into a cache folder (``$FEDUL_CACHE_DIR``, default
``~/.cache/fedul-flwr``) that is then used as the torchvision root.

Loaded datasets are cached per process (keyed by name, resolved ``data_dir`` and
``download``), because Flower/Ray client actors call :func:`load_dataset` every
round. The returned tensors are shared between callers: do not modify them in place.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

import numpy as np
import torch

from fedul_flwr.registry import Registry

__all__ = [
    "DATASETS",
    "DatasetError",
    "DatasetInfo",
    "dataset_info",
    "ImageDataset",
    "embedded_sample_path",
    "load_dataset",
    "normalize",
]

DATASETS: Registry[Callable[[str, bool], "ImageDataset"]] = Registry("dataset")
"""Dataset loaders ``(torchvision root, download) -> ImageDataset`` by name (registered at the
end of this module)."""

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
    """One original archive and the files it extracts to."""

    archive: str  # file name, in <root>/<archive_dir>
    md5: str
    prefix: str  # folder inside the extraction output holding the files ("" for a .gz)
    files: tuple[str, ...]  # extracted file names, in <root>/<extract_dir>


@dataclass(frozen=True)
class _Spec:
    name: str
    cls_name: str  # torchvision.datasets class
    archive_dir: str  # relative to the torchvision root
    extract_dir: str  # relative to the torchvision root
    members: tuple[_Member, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def tv_class(self) -> type:
        import torchvision.datasets as tvd

        return getattr(tvd, self.cls_name)


def _mnist_like_spec(name: str, cls_name: str, mean: tuple[float, ...], std: tuple[float, ...]) -> _Spec:
    import torchvision.datasets as tvd

    cls = getattr(tvd, cls_name)
    members = []
    for res, md5 in cls.resources:
        archive = os.path.basename(res)
        members.append(_Member(archive, md5, "", (archive[: -len(".gz")],)))
    raw = f"{cls_name}/raw"
    return _Spec(name, cls_name, raw, raw, tuple(members), mean, std)


def _cifar10_spec() -> _Spec:
    import torchvision.datasets as tvd

    cls = tvd.CIFAR10
    files = tuple(f for f, _ in cls.train_list + cls.test_list) + (cls.meta["filename"],)
    member = _Member(cls.filename, cls.tgz_md5, cls.base_folder, files)
    return _Spec(
        "cifar10", "CIFAR10", "", cls.base_folder, (member,), (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    )


def _spec(name: str) -> _Spec:
    if name == "mnist":
        return _mnist_like_spec("mnist", "MNIST", _MNIST_MEAN, _MNIST_STD)
    if name == "fashion-mnist":
        return _mnist_like_spec("fashion-mnist", "FashionMNIST", (0.2860,), (0.3530,))
    if name == "cifar10":
        return _cifar10_spec()
    raise DatasetError(f"Unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")


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


def _missing_files(spec: _Spec, root: Path) -> list[_Member]:
    """Members whose extracted files are not all present under ``root``."""
    ext = root / spec.extract_dir
    return [m for m in spec.members if not all((ext / f).is_file() for f in m.files)]


def _describe_expected(spec: _Spec, root: Path, members: Sequence[_Member]) -> str:
    """Human-readable list of the files that must exist under ``root``."""
    ext, arc = root / spec.extract_dir, root / spec.archive_dir
    lines = []
    for m in members:
        if len(m.files) == 1 and m.archive == m.files[0] + ".gz" and ext == arc:
            lines.append(f"{ext / m.files[0]}(.gz)")
        else:
            lines.append(f"{arc / m.archive} (or its extracted files {', '.join(m.files)} in {ext}/)")
    return "; ".join(lines)


def _extract_member(spec: _Spec, member: _Member, src_root: Path, dst_root: Path) -> None:
    """Extract ``member``'s archive from ``src_root`` into ``dst_root``'s extract folder.

    Extraction goes to a temporary folder next to the destination and the files are
    moved in with ``os.replace``, so concurrent processes never see half-written files.
    """
    from torchvision.datasets.utils import extract_archive

    dst = dst_root / spec.extract_dir
    dst.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst, prefix=".extract-") as tmp:
        extract_archive(str(src_root / spec.archive_dir / member.archive), tmp)
        base = Path(tmp) / member.prefix
        for f in member.files:
            src = base / f
            if not src.is_file():
                raise DatasetError(
                    f"Archive {src_root / spec.archive_dir / member.archive} for dataset "
                    f"{spec.name!r} does not contain {member.prefix + '/' if member.prefix else ''}{f}"
                )
            os.replace(src, dst / f)


def _prepare_from_archives(spec: _Spec, root: Path, members: Sequence[_Member]) -> Path | None:
    """Make the extracted files of ``members`` available without the network.

    Returns the torchvision root to load from (``root`` itself or the cache root), or
    ``None`` if some archive is absent (nothing is extracted then). Raises
    :class:`DatasetError` if an archive is present but fails md5 verification.
    """
    arc_dir = root / spec.archive_dir
    if not all((arc_dir / m.archive).is_file() for m in members):
        return None
    bad = [m for m in members if not _verify_archive(arc_dir / m.archive, m.md5)]
    if bad:
        raise DatasetError(
            f"Dataset {spec.name!r}: archive(s) in {arc_dir} failed md5 verification: "
            + ", ".join(f"{m.archive} (expected md5 {m.md5})" for m in bad)
            + ". Replace them with the original files (torchvision's checksums), or remove them "
            "and use download=true on a machine with internet access."
        )
    # In place when the root is writable, as torchvision itself would; else the cache.
    if _is_writable_dir(root / spec.extract_dir):
        try:
            for m in members:
                _extract_member(spec, m, root, root)
            return root
        except PermissionError:
            pass
    # Read-only root: the cache root must hold every member. Members extracted in `root`
    # are copied; the others come from their (verified) archives.
    cache = _cache_root()
    try:
        for m in _missing_files(spec, cache):
            src_files = [root / spec.extract_dir / f for f in m.files]
            if m not in members and all(p.is_file() for p in src_files):
                dst = cache / spec.extract_dir
                dst.mkdir(parents=True, exist_ok=True)
                for p in src_files:
                    tmp = dst / f".{p.name}.tmp{os.getpid()}"
                    shutil.copyfile(p, tmp)
                    os.replace(tmp, dst / p.name)
            else:
                _extract_member(spec, m, root, cache)
    except OSError as exc:
        raise DatasetError(
            f"Dataset {spec.name!r}: {root} is read-only and extracting its archives into the "
            f"cache folder {cache} failed ({exc}). Set ${_CACHE_ENV} to a writable folder."
        ) from exc
    return cache


def _torchvision_download(spec: _Spec, root: Path) -> None:
    """Let torchvision download (and extract) ``spec`` into ``root``. Tests replace this."""
    spec.tv_class()(root=str(root), train=True, download=True)


def _load_torchvision(spec: _Spec, root: Path) -> ImageDataset:
    """Read both splits with torchvision from a root that holds the extracted files."""
    cls = spec.tv_class()
    try:
        train = cls(root=str(root), train=True, download=False)
        test = cls(root=str(root), train=False, download=False)
    except (RuntimeError, OSError, ValueError) as exc:
        raise DatasetError(
            f"torchvision could not read dataset {spec.name!r} from {root}: {exc}. Expected files: "
            f"{_describe_expected(spec, root, spec.members)}"
        ) from exc

    def images(data: torch.Tensor | np.ndarray) -> torch.Tensor:
        t = torch.as_tensor(data)
        if t.dim() == 3:  # MNIST-like: [N, H, W] -> [N, 1, H, W]
            return t.unsqueeze(1).contiguous()
        return t.permute(0, 3, 1, 2).contiguous()  # CIFAR: [N, H, W, C] -> [N, C, H, W]

    def labels(targets: torch.Tensor | list[int]) -> torch.Tensor:
        return torch.as_tensor(targets, dtype=torch.int64).clone()

    return ImageDataset(
        name=spec.name,
        train_x=images(train.data).to(torch.uint8),
        train_y=labels(train.targets),
        test_x=images(test.data).to(torch.uint8),
        test_y=labels(test.targets),
        class_names=tuple(str(c) for c in train.classes),
        mean=spec.mean,
        std=spec.std,
    )


def _resolve_root(spec: _Spec, data_dir: str, download: bool) -> Path:
    """Validate ``data_dir`` and return the torchvision root holding extracted files."""
    if not str(data_dir).strip():
        raise DatasetError(
            f"Dataset {spec.name!r} needs data-dir: the torchvision root folder that holds "
            f"{spec.extract_dir}/ (or the original archives), e.g. data-dir=\"/data\" with "
            f"{_describe_expected(spec, Path('/data'), spec.members)}. data-dir is empty; use "
            "dataset 'mnist-sample' for the embedded sample that needs no files."
        )
    root = Path(data_dir).expanduser().resolve()
    if not root.exists():
        if not download:
            raise DatasetError(
                f"data-dir {root} for dataset {spec.name!r} does not exist. Create it and put the "
                f"files there: {_describe_expected(spec, root, spec.members)}; or set download=true "
                "on a machine with internet access."
            )
        root.mkdir(parents=True, exist_ok=True)
    if not root.is_dir():
        raise DatasetError(f"data-dir {root} for dataset {spec.name!r} is not a folder")

    missing = _missing_files(spec, root)
    if not missing:
        return root
    prepared = _prepare_from_archives(spec, root, missing)
    if prepared is not None:
        return prepared
    if not download:
        # Only name what is absent in both forms (extracted and archived).
        absent = [m for m in missing if not (root / spec.archive_dir / m.archive).is_file()]
        raise DatasetError(
            f"Dataset {spec.name!r} not found in data-dir {root}. Missing: "
            f"{_describe_expected(spec, root, absent or missing)}. Put the original files there "
            "(torchvision layout), or set download=true on a machine with internet access."
        )
    try:
        _torchvision_download(spec, root)
    except Exception as exc:  # noqa: BLE001 - torchvision raises RuntimeError, URLError, OSError...
        raise DatasetError(
            f"Downloading dataset {spec.name!r} into {root} failed ({type(exc).__name__}: {exc}). "
            "This machine seems to be offline or cannot reach the dataset host. Place these files "
            f"manually and retry with download=false: {_describe_expected(spec, root, spec.members)}"
        ) from exc
    return root


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, root: str, download: bool) -> ImageDataset:
    return DATASETS.get(name)(root, download)


def _load_named_torchvision(name: str, root: str, download: bool) -> ImageDataset:
    spec = _spec(name)
    return _load_torchvision(spec, _resolve_root(spec, root, download))


DATASETS.add("mnist-sample", lambda root, download: _load_sample(embedded_sample_path()))
for _name in ("mnist", "fashion-mnist", "cifar10"):
    DATASETS.add(_name, functools.partial(_load_named_torchvision, _name))


def load_dataset(name: str, data_dir: str = "", download: bool = False) -> ImageDataset:
    """Load a dataset's full train and test splits into memory.

    Parameters
    ----------
    name : str
        One of :data:`DATASETS`.
    data_dir : str, optional
        torchvision root folder (``<data_dir>/MNIST/raw/...``,
        ``<data_dir>/FashionMNIST/raw/...``, ``<data_dir>/cifar-10-batches-py/...``).
        Ignored for ``"mnist-sample"``; required otherwise. ``~`` is expanded and
        relative paths are resolved against the current working directory.
    download : bool, optional
        Let torchvision download missing files into ``data_dir``. Not needed when the
        original archives are already there (they are extracted without the network).

    Returns
    -------
    ImageDataset
        ``train_x`` ``uint8 [N, C, H, W]``, ``train_y`` ``int64 [N]``, ``test_x``
        ``uint8 [N_test, C, H, W]``, ``test_y`` ``int64 [N_test]``. Cached per process;
        treat the tensors as read-only.

    Raises
    ------
    DatasetError
        Unknown name, empty or missing ``data_dir``, missing or corrupt files, or a
        failed download; the message says which files are needed and where.
    """
    if name not in DATASETS:
        raise DatasetError(f"Unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")
    if name == "mnist-sample":
        return _load_cached(name, "", False)
    root = str(Path(data_dir).expanduser().resolve()) if str(data_dir).strip() else ""
    return _load_cached(name, root, bool(download))


_CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


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
    """

    name: str
    class_names: tuple[str, ...]
    channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


def dataset_info(name: str) -> DatasetInfo:
    """The :class:`DatasetInfo` of dataset ``name``, without reading any data file.

    Raises
    ------
    DatasetError
        On an unknown name.
    """
    if name in ("mnist-sample", "mnist"):
        return DatasetInfo(name, _MNIST_CLASSES, 1, 28, _MNIST_MEAN, _MNIST_STD)
    if name == "fashion-mnist":
        import torchvision.datasets as tvd

        spec = _spec(name)
        return DatasetInfo(name, tuple(tvd.FashionMNIST.classes), 1, 28, spec.mean, spec.std)
    if name == "cifar10":
        spec = _spec(name)
        return DatasetInfo(name, _CIFAR10_CLASSES, 3, 32, spec.mean, spec.std)
    raise DatasetError(f"Unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")
