"""The user's own image-classification datasets, read through Hugging Face ``datasets``.

A run names one with ``dataset="hf:<source>"``, where ``<source>`` is either

- a Hugging Face Hub dataset name (``hf:uoft-cs/cifar10``), fetched and cached by
  ``datasets.load_dataset`` (in ``data-dir`` when it is set, else the Hugging Face cache); or
- an absolute local path, read offline:

  * an image folder, one sub-folder per class (``<path>/<class>/<image>``, optionally under
    split folders ``<path>/train/<class>/...`` and ``<path>/test/<class>/...``): the
    ``imagefolder`` builder of ``datasets``; class names are the sub-folder names;
  * a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``
    (``state.json`` or ``dataset_dict.json``): ``datasets.load_from_disk``;
  * a Parquet file (``.parquet``), a folder of Parquet files (``datasets`` infers the
    splits from the file names: ``train-*.parquet``, ``test-*.parquet``) or an Arrow file
    (``.arrow``).

The image column is the one ``Image`` feature (``image-column`` names another), the label
column the one ``ClassLabel`` feature, else a column called ``label`` (``label-column``
names another); class names are the ``ClassLabel`` names (integer labels: ``"0"`` ..
``"K-1"``; text labels: the sorted distinct texts). The training split is ``train`` (or the
only split); the test split is ``test``, else ``validation``, else a class-stratified
:data:`TEST_FRACTION` of the training split drawn with seed :data:`TEST_SPLIT_SEED` (the same
for every run, like a published test split). Images are decoded with PIL: greyscale modes
become one channel, every other mode RGB (if any image has colour, greyscale images are
repeated to three channels). With ``image-size=0`` every image must be square and of the
first training image's size; ``image-size=S`` resizes each image to ``S x S`` (bilinear).
Normalisation: mean 0.5, std 0.5 per channel.

The result is an :class:`~fedul_flwr.data.datasets.ImageDataset` (uint8 ``[N, C, H, W]``,
int64 ``[N]``) like the torchvision datasets, so partitions, client settings and node folders
work on it unchanged. Every bad input raises :class:`~fedul_flwr.data.datasets.DatasetError`
with a one-line message naming the file, row or key.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedul_flwr.data.datasets import DatasetError, DatasetInfo, ImageDataset, dataset_info, load_dataset
from fedul_flwr.data.partition import holdout_split

__all__ = [
    "PREFIX",
    "TEST_FRACTION",
    "TEST_SPLIT_SEED",
    "UserDatasetOptions",
    "any_dataset",
    "any_dataset_info",
    "check_source",
    "is_user_dataset",
    "load_user_dataset",
    "user_dataset_info",
]

PREFIX = "hf:"
"""``dataset`` values starting with this name a user dataset: ``hf:<Hub name or /absolute/path>``."""
TEST_FRACTION = 0.2
"""Share of each class held out as the test split of a dataset without a ``test`` / ``validation`` split."""
TEST_SPLIT_SEED = 0
"""Seed of that hold-out: the same test split for every run (it belongs to the dataset, not to a run)."""
_TEST_SPLITS = ("test", "validation")
_LABEL_NAMES = ("label", "labels")
_GREY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"})
_MEAN, _STD = 0.5, 0.5


@dataclass(frozen=True)
class UserDatasetOptions:
    """How to read a user dataset: the run-config keys ``image-column``, ``label-column`` and
    ``image-size``.

    Attributes
    ----------
    image_column : str
        Column holding the images; ``""``: the dataset's one ``Image`` column.
    label_column : str
        Column holding the class labels; ``""``: the one ``ClassLabel`` column, else ``label``.
    image_size : int
        Side S in pixels every image is resized to (``S x S``); 0 keeps the size, which then
        must be square and the same for every image.

    cache_dir : str
        Cache folder of ``datasets`` for Hub datasets (the run's ``data-dir``); ``""``: the
        Hugging Face default.
    """

    image_column: str = ""
    label_column: str = ""
    image_size: int = 0
    cache_dir: str = ""

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> UserDatasetOptions:
        """The options of a dashed-key mapping (a run config's ``as_dict()``); absent keys take
        the defaults."""
        return cls(
            str(values.get("image-column", "")).strip(),
            str(values.get("label-column", "")).strip(),
            int(values.get("image-size", 0)),
            str(values.get("data-dir", "")).strip(),
        )


def is_user_dataset(name: str) -> bool:
    """True if ``name`` names a user dataset (``hf:...``)."""
    return str(name).startswith(PREFIX)


def check_source(name: str) -> str:
    """The source of ``hf:<source>``, checked from the name alone.

    Returns
    -------
    str
        The Hub name or the absolute local path (``~`` expanded).

    Raises
    ------
    DatasetError
        If the source is empty or a relative path (``./x``, ``../x``): Flower runs the app from
        its own copy, so only absolute local paths point where the user means.
    """
    source = str(name)[len(PREFIX) :].strip()
    if not source:
        raise DatasetError(f"dataset={name!r}: give a Hugging Face Hub name or an absolute path after 'hf:'")
    if source.startswith("."):
        raise DatasetError(f"dataset={name!r}: a local dataset path must be absolute (hf:/data/my-images)")
    return str(Path(source).expanduser()) if source.startswith("~") else source


# --------------------------------------------------------------------------- opening


def _class_folder_problem(folder: Path) -> str | None:
    """Why an image folder's class sub-folder is unusable (no file in it), else ``None``."""
    if not any(p.is_file() and not p.name.startswith(".") for p in folder.rglob("*")):
        return f"{folder}: class folder holds no image"
    return None


def _check_image_folder(root: Path) -> None:
    """Refuse an image folder with an empty class folder (``datasets`` would drop the class)."""
    subdirs = [p for p in sorted(root.iterdir()) if p.is_dir() and not p.name.startswith(".")]
    if not subdirs:
        raise DatasetError(f"{root}: holds no class sub-folder; an image folder is <path>/<class name>/<image files>")
    split_names = {"train", "test", "validation", "valid", "val", "dev", "training", "eval", "evaluation"}
    class_dirs = subdirs
    if all(p.name.lower() in split_names for p in subdirs):
        class_dirs = [c for s in subdirs for c in sorted(s.iterdir()) if c.is_dir() and not c.name.startswith(".")]
    for folder in class_dirs:
        problem = _class_folder_problem(folder)
        if problem:
            raise DatasetError(problem)


def _open(source: str, cache_dir: str) -> dict[str, Any]:
    """The splits of ``source`` as ``{split name: datasets.Dataset}``."""
    import datasets

    cache = cache_dir or None
    if not source.startswith("/"):  # a Hub name
        try:
            return dict(datasets.load_dataset(source, cache_dir=cache))
        except Exception as exc:  # noqa: BLE001 - network, auth and format errors of the Hub
            raise DatasetError(
                f"dataset='hf:{source}': Hugging Face datasets could not load it ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); offline, save it on an online machine with "
                "Dataset.save_to_disk and use dataset='hf:/that/folder'"
            ) from exc
    path = Path(source)
    if not path.exists():
        raise DatasetError(f"{path}: no such file or folder (dataset='hf:{source}')")
    try:
        if path.is_file():
            if path.suffix == ".parquet":
                return dict(datasets.load_dataset("parquet", data_files={"train": str(path)}, cache_dir=cache))
            if path.suffix == ".arrow":
                return {"train": datasets.Dataset.from_file(str(path))}
            raise DatasetError(
                f"{path}: not a .parquet or .arrow file; give an image folder, a save_to_disk folder, "
                "or a Parquet/Arrow file"
            )
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            loaded = datasets.load_from_disk(str(path))
            return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        if not any(p.suffix in (".parquet", ".arrow") for p in path.rglob("*") if p.is_file()):
            _check_image_folder(path)
        return dict(datasets.load_dataset(str(path), cache_dir=cache))
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - datasets raises many types for unreadable files
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise DatasetError(f"{path}: Hugging Face datasets cannot read it ({type(exc).__name__}: {first})") from exc


def _pick_splits(splits: dict[str, Any], where: str) -> tuple[str, str | None]:
    """(training split name, test split name or ``None`` when it is to be held out)."""
    if not splits:
        raise DatasetError(f"{where}: holds no split")
    if "train" in splits:
        train = "train"
    elif len(splits) == 1:
        train = next(iter(splits))
    else:
        raise DatasetError(f"{where}: splits {sorted(splits)} and none is called 'train'")
    test = next((s for s in _TEST_SPLITS if s in splits and s != train), None)
    return train, test


def _column(features: Any, key: str, given: str, found: list[str], where: str) -> str:
    """The column named by run-config ``key`` (``given``), else the one candidate of ``found``."""
    names = list(features)
    if given:
        if given not in features:
            raise DatasetError(f"{key}={given!r}: {where} has no such column (columns {names})")
        return given
    if len(found) != 1:
        raise DatasetError(f"{where}: cannot tell the {key.split('-')[0]} column among {names} (candidates {found}); "
                           f"set {key}")  # fmt: skip
    return found[0]


def _columns(ds: Any, options: UserDatasetOptions, where: str) -> tuple[str, str]:
    """The image and the label column of ``ds``."""
    import datasets

    features = ds.features
    images = [k for k, f in features.items() if isinstance(f, datasets.Image)]
    labels = [k for k, f in features.items() if isinstance(f, datasets.ClassLabel)] or [
        k for k in _LABEL_NAMES if k in features
    ]
    image = _column(features, "image-column", options.image_column, images, where)
    label = _column(features, "label-column", options.label_column, labels, where)
    if image == label:
        raise DatasetError(f"{where}: image-column and label-column are both {image!r}")
    return image, label


def _labels(train: Any, test: Any, column: str, where: str) -> tuple[tuple[str, ...], np.ndarray, np.ndarray | None]:
    """Class names and int64 labels of the training (and test) split."""
    import datasets

    feature = train.features[column]
    y_train = list(train[column])
    y_test = None if test is None else list(test[column])
    if isinstance(feature, datasets.ClassLabel):
        names = tuple(str(n) for n in feature.names)
        if test is not None:
            other = test.features[column]
            if isinstance(other, datasets.ClassLabel) and tuple(other.names) != names:
                raise DatasetError(
                    f"{where}: label-column {column!r} has classes {list(names)} in the training split but "
                    f"{list(other.names)} in the test split"
                )
    elif all(isinstance(v, str) for v in y_train + (y_test or [])):
        names = tuple(sorted(set(y_train + (y_test or []))))
        index = {n: i for i, n in enumerate(names)}
        y_train = [index[v] for v in y_train]
        y_test = None if y_test is None else [index[v] for v in y_test]
    elif all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in y_train + (y_test or [])):
        names = tuple(str(k) for k in range(max(y_train + (y_test or [0])) + 1))
    else:
        raise DatasetError(f"label-column={column!r} of {where}: labels must be class labels, integers or texts")

    def array(values: list[Any], split: str) -> np.ndarray:
        y = np.asarray(values, dtype=np.int64)
        bad = np.flatnonzero((y < 0) | (y >= len(names)))
        if bad.size:
            raise DatasetError(f"{where}: split {split!r}, row {int(bad[0])}: label {int(y[bad[0]])} is not a class "
                               f"(0..{len(names) - 1})")  # fmt: skip
        return y

    return names, array(y_train, "train"), None if y_test is None else array(y_test, "test")


@dataclass(frozen=True)
class _Part:
    """The rows of one split that make the training or the test set."""

    split: str
    items: Any = field(repr=False)  # the image column's {"bytes", "path"} entries, not decoded
    rows: np.ndarray = field(repr=False)  # int64 row numbers in the split
    labels: np.ndarray = field(repr=False)  # int64 labels of those rows


@dataclass(frozen=True)
class _Plan:
    """What a user dataset holds, known without decoding an image."""

    where: str
    class_names: tuple[str, ...]
    train: _Part
    test: _Part


@functools.lru_cache(maxsize=4)
def _plan(name: str, options: UserDatasetOptions) -> _Plan:
    """Open the dataset, choose splits and columns, read the labels, hold out the test rows."""
    import datasets

    source = check_source(name)
    if options.image_size < 0:
        raise DatasetError(f"image-size={options.image_size}: must be >= 0 (0 keeps the images' size)")
    splits = _open(source, options.cache_dir)
    where = f"dataset={name!r}"
    train_name, test_name = _pick_splits(splits, where)
    train = splits[train_name]
    test = None if test_name is None else splits[test_name]
    image_col, label_col = _columns(train, options, where)
    if test is not None:
        for col in (image_col, label_col):
            if col not in test.features:
                raise DatasetError(f"{where}: split {test_name!r} has no column {col!r} (columns {list(test.features)})")
    if len(train) == 0:
        raise DatasetError(f"{where}: split {train_name!r} holds no row")
    class_names, y_train, y_test = _labels(train, test, label_col, where)

    def items(ds: Any) -> Any:
        return list(ds.cast_column(image_col, datasets.Image(decode=False))[image_col])

    if test is not None:
        return _Plan(where, class_names, _Part(train_name, items(train), np.arange(len(y_train)), y_train),
                     _Part(str(test_name), items(test), np.arange(len(y_test)), y_test))  # type: ignore[arg-type]  # fmt: skip
    keep, held = holdout_split(y_train, TEST_FRACTION, TEST_SPLIT_SEED)  # a fixed class-stratified share
    if not len(held):
        raise DatasetError(f"{where}: no test split and too few images to hold out {TEST_FRACTION:.0%} of a class")
    both = items(train)
    return _Plan(where, class_names, _Part(train_name, both, keep, y_train[keep]),
                 _Part(train_name, both, held, y_train[held]))  # fmt: skip


def _origin(plan: _Plan, part: _Part, row: int, item: dict[str, Any]) -> str:
    return f"{plan.where}: split {part.split!r}, row {row}" + (f" ({item['path']})" if item.get("path") else "")


def _open_image(plan: _Plan, part: _Part, row: int) -> tuple[Any, str]:
    """The PIL image (not yet decoded) of ``row`` of ``part`` and where it comes from."""
    from PIL import Image, UnidentifiedImageError

    item = part.items[int(row)] or {}
    origin = _origin(plan, part, int(row), item)
    data, path = item.get("bytes"), item.get("path")
    if data is None and not path:
        raise DatasetError(f"{origin}: no image")
    try:
        return Image.open(io.BytesIO(data) if data is not None else path), origin
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DatasetError(f"{origin}: unreadable image ({exc})") from exc


def _decode(plan: _Plan, part: _Part, channels: int, side: int, resize: bool) -> torch.Tensor:
    """The images of ``part`` as uint8 ``[n, channels, side, side]`` (resized when ``resize``,
    else checked to be ``side x side``)."""
    from PIL import Image, UnidentifiedImageError

    out = np.empty((len(part.rows), channels, side, side), dtype=np.uint8)
    for i, row in enumerate(part.rows):
        img, origin = _open_image(plan, part, row)
        try:
            with img:
                img.load()
                img = img.convert("L" if channels == 1 else "RGB")
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
            raise DatasetError(f"{origin}: unreadable image ({exc})") from exc
        if resize and img.size != (side, side):
            img = img.resize((side, side), Image.Resampling.BILINEAR)
        if img.size != (side, side):
            raise DatasetError(
                f"{origin}: image of {img.size[0]}x{img.size[1]} pixels, the dataset's images are {side}x{side}; "
                "set image-size=N to resize every image to NxN"
            )
        arr = np.asarray(img, dtype=np.uint8)
        out[i] = arr[None] if arr.ndim == 2 else np.moveaxis(arr, 2, 0)
    return torch.from_numpy(out)


@functools.lru_cache(maxsize=4)
def user_dataset_info(name: str, options: UserDatasetOptions = UserDatasetOptions()) -> DatasetInfo:
    """The :class:`~fedul_flwr.data.datasets.DatasetInfo` of a user dataset, from its labels
    and the images' headers (no image is decoded; a deployed node needs only this).

    Class names: the label column's (see the module doc); channels: 3 if any image is in a
    colour mode, else 1; image size: ``image-size``, else the first training image's side
    (it must be square); mean = std = 0.5 per channel.

    Raises
    ------
    DatasetError
        As :func:`load_user_dataset` (a file PIL cannot identify, a non-square first image
        with ``image-size=0``, ...).
    """
    plan = _plan(name, options)
    grey, first = True, None
    for part in (plan.train, plan.test):
        for row in part.rows:
            img, origin = _open_image(plan, part, row)
            with img:
                grey = grey and img.mode in _GREY_MODES
                if first is None:
                    first = (img.size, origin)
    (width, height), origin = first  # type: ignore[misc]
    if not options.image_size and width != height:
        raise DatasetError(f"{origin}: image of {width}x{height} pixels is not square; set image-size=N to resize "
                           "every image to NxN")  # fmt: skip
    channels = 1 if grey else 3
    return DatasetInfo(name, plan.class_names, channels, options.image_size or width, (_MEAN,) * channels,
                       (_STD,) * channels)  # fmt: skip


@functools.lru_cache(maxsize=4)
def load_user_dataset(name: str, options: UserDatasetOptions = UserDatasetOptions()) -> ImageDataset:
    """Load a user dataset's training and test splits into memory.

    Parameters
    ----------
    name : str
        ``hf:<Hub name or /absolute/path>`` (see the module doc for the formats).
    options : UserDatasetOptions
        Image and label columns, image size, cache folder.

    Returns
    -------
    ImageDataset
        ``train_x`` uint8 ``[N, C, S, S]``, ``train_y`` int64 ``[N]``, ``test_x`` uint8
        ``[N_test, C, S, S]``, ``test_y`` int64 ``[N_test]``; C and S as
        :func:`user_dataset_info` says; class names from the label column; mean = std = 0.5
        per channel. Cached per process: treat the tensors as read-only.

    Raises
    ------
    DatasetError
        One line naming the file, row or key: a missing path, an unreadable or missing file,
        an empty class folder, a missing column, a label outside the classes, an image of
        another size (with ``image-size=0``), or a Hub dataset that cannot be fetched.
    """
    info = user_dataset_info(name, options)
    plan = _plan(name, options)
    resize = bool(options.image_size)
    return ImageDataset(
        name=name,
        train_x=_decode(plan, plan.train, info.channels, info.image_size, resize),
        train_y=torch.from_numpy(plan.train.labels.astype(np.int64)),
        test_x=_decode(plan, plan.test, info.channels, info.image_size, resize),
        test_y=torch.from_numpy(plan.test.labels.astype(np.int64)),
        class_names=plan.class_names,
        mean=info.mean,
        std=info.std,
    )


def any_dataset(name: str, data_dir: str = "", download: bool = False,
                options: UserDatasetOptions = UserDatasetOptions()) -> ImageDataset:  # fmt: skip
    """The run's dataset, whichever kind: a user dataset ``hf:...`` (:func:`load_user_dataset`
    with ``options``) or a built-in one (:func:`fedul_flwr.data.datasets.load_dataset` with
    ``data_dir`` and ``download``).

    Raises
    ------
    DatasetError
        From the loader (one line naming the file, row or key).
    """
    if is_user_dataset(name):
        return load_user_dataset(name, options)
    return load_dataset(name, data_dir, download)


def any_dataset_info(name: str, options: UserDatasetOptions = UserDatasetOptions()) -> DatasetInfo:
    """The :class:`~fedul_flwr.data.datasets.DatasetInfo` of any dataset: a user dataset's is
    read from it (:func:`user_dataset_info`), a built-in one's needs no file
    (:func:`fedul_flwr.data.datasets.dataset_info`).

    Raises
    ------
    DatasetError
        On an unknown name or an unreadable user dataset.
    """
    return user_dataset_info(name, options) if is_user_dataset(name) else dataset_info(name)
