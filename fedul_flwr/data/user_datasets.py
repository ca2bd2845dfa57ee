"""The user's own image-classification datasets, read through Hugging Face ``datasets``.

A run names one with ``dataset="hf:<source>"``, where ``<source>`` is either

- a Hugging Face Hub dataset name ``owner/name`` (``hf:uoft-cs/cifar10``), fetched and cached
  by ``datasets.load_dataset`` (in ``data-dir`` when it is set, else the Hugging Face cache).
  Offline, only an exact cached copy is used: ``datasets`` would fall back to "the latest
  cached version" of a name that it snake-cases (``Owner/MyData`` -> ``owner___my_data``),
  which may be another dataset, so that fallback is refused; or
- an absolute local path, read offline:

  * an image folder, one sub-folder per class (``<path>/<class>/<image>``, optionally under
    split folders ``<path>/train/<class>/...`` and ``<path>/test/<class>/...``), read by
    :func:`fedul_flwr.data.images.read_image_folder` -- the same reader as a deployed
    node's class folders; class names are the sub-folder names, sorted; splits come only from
    split folders, never from file names;
  * a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``
    (``state.json`` or ``dataset_dict.json``): ``datasets.load_from_disk``;
  * a Parquet file (``.parquet``), a folder of Parquet files (``datasets`` infers the
    splits from the file names: ``train-*.parquet``, ``test-*.parquet``) or an Arrow file
    (``.arrow``).

  A source that is not absolute is refused: a Hub name is ``owner/name``; a name that exists
  as a local folder relative to the working folder gets the absolute-path hint (Flower runs
  the app from its own copy, so a relative path would point elsewhere).

The image column is the one ``Image`` feature (``image-column`` names another), the label
column the one ``ClassLabel`` feature, else a column called ``label`` (``label-column``
names another); class names are the ``ClassLabel`` names (integer labels: ``"0"`` ..
``"K-1"``; text labels: the sorted distinct texts). A dataset of one class, or with a class
that has no training image, is refused. The training split is ``train`` (or the only split);
the test split is ``test``, else ``validation``, else a class-stratified
:data:`TEST_FRACTION` of the training split drawn with seed :data:`TEST_SPLIT_SEED` (the same
for every run, like a published test split). Images are decoded by the project's one decoder
(:mod:`fedul_flwr.data.images`): if any image has colour every image becomes RGB, else
greyscale; with ``image-size=0`` every image must be square and of the first training
image's size; ``image-size=S`` resizes each image to ``S x S`` (bilinear). Normalisation:
mean 0.5, std 0.5 per channel.

The result is an :class:`~fedul_flwr.data.image_dataset.ImageDataset` (uint8 ``[N, C, H, W]``,
int64 ``[N]``) like the torchvision datasets, so partitions, client settings and node folders
work on it unchanged. Every bad input raises :class:`~fedul_flwr.data.image_dataset.DatasetError`
with a one-line message naming the file, row or key.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedul_flwr.data.datasets import DATASETS, DatasetOptions, DatasetSource
from fedul_flwr.data.image_dataset import DatasetError, DatasetInfo, ImageDataset
from fedul_flwr.data.images import (
    ImageError,
    ImageSpec,
    Problems,
    channels_of_mode,
    decode_files,
    decode_image,
    read_header,
    read_image_folder,
)
from fedul_flwr.data.partition import holdout_split

__all__ = [
    "PREFIX",
    "TEST_FRACTION",
    "TEST_SPLIT_SEED",
    "check_source",
    "load_user_dataset",
    "user_dataset_info",
]

PREFIX = "hf:"
"""``dataset`` values starting with this name a user dataset: ``hf:<Hub owner/name or /absolute/path>``."""
TEST_FRACTION = 0.2
"""Share of each class held out as the test split of a dataset without a ``test`` / ``validation`` split."""
TEST_SPLIT_SEED = 0
"""Seed of that hold-out: the same test split for every run (it belongs to the dataset, not to a run)."""
_TEST_SPLITS = ("test", "validation")
_LABEL_NAMES = ("label", "labels")
_MEAN, _STD = 0.5, 0.5
_HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_source(name: str) -> str:
    """The source of ``hf:<source>``, checked from the name alone.

    Returns
    -------
    str
        The Hub name ``owner/name`` or the absolute local path (``~`` expanded).

    Raises
    ------
    DatasetError
        If the source is empty, a relative path, or neither an absolute path nor a Hub
        name ``owner/name`` (a name that exists as a local folder gets the absolute-path hint).
    """
    source = str(name)[len(PREFIX) :].strip()
    if not source:
        raise DatasetError(f"dataset={name!r}: give a Hugging Face Hub name owner/name or an absolute path after 'hf:'")
    if source.startswith("~"):
        source = str(Path(source).expanduser())
    if source.startswith("/"):
        return source
    if Path(source).exists():
        raise DatasetError(f"dataset={name!r}: a local dataset path must be absolute: hf:{Path(source).resolve()} "
                           "(Flower runs the app from its own copy)")  # fmt: skip
    if source.startswith(".") or not _HUB_NAME.match(source):
        raise DatasetError(f"dataset={name!r}: neither an absolute local path (hf:/data/my-images) nor a Hugging Face "
                           "Hub name owner/name (hf:uoft-cs/cifar10)")  # fmt: skip
    return source


# --------------------------------------------------------------------------- opening


class _FallbackWatch(logging.Handler):
    """Notes ``datasets``' warning that it used "the latest cached version" of a Hub name."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.fell_back = False

    def emit(self, record: logging.LogRecord) -> None:
        if "latest cached version" in record.getMessage():
            self.fell_back = True


def _open_hub(source: str, data_dir: str) -> dict[str, Any]:
    """The splits of Hub dataset ``source``, refusing ``datasets``' fallback to a cached copy
    of a snake-cased name (which may be another dataset)."""
    import datasets  # deferred: import cost of datasets (seconds), paid only by an hf: dataset
    from datasets.naming import camelcase_to_snakecase  # deferred: import cost of datasets (seconds)

    watch = _FallbackWatch()
    logger = logging.getLogger("datasets")
    logger.addHandler(watch)
    try:
        loaded = dict(datasets.load_dataset(source, cache_dir=data_dir or None))
    except Exception as exc:  # noqa: BLE001 - network, auth and format errors of the Hub
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise DatasetError(
            f"dataset='hf:{source}': Hugging Face datasets could not load it ({type(exc).__name__}: {first}); "
            "offline, save it on an online machine with Dataset.save_to_disk and use dataset='hf:/that/folder'"
        ) from exc
    finally:
        logger.removeHandler(watch)
    owner, repo = source.split("/")
    if watch.fell_back and camelcase_to_snakecase(repo) != repo:
        raise DatasetError(
            f"dataset='hf:{source}': the Hub cannot be reached and datasets offered its cached copy of "
            f"'{owner}/{camelcase_to_snakecase(repo)}', which may be another dataset; go online once, or save the "
            "dataset with Dataset.save_to_disk and use dataset='hf:/that/folder'"
        )
    return loaded


def _open(source: str, data_dir: str) -> dict[str, Any] | _Folder:
    """The splits of ``source`` as ``{split name: datasets.Dataset}``, or an image folder."""
    import datasets  # deferred: import cost of datasets (seconds), paid only by an hf: dataset

    if not source.startswith("/"):
        return _open_hub(source, data_dir)
    path = Path(source)
    if not path.exists():
        raise DatasetError(f"{path}: no such file or folder (dataset='hf:{source}')")
    try:
        if path.is_file():
            if path.suffix == ".parquet":
                return dict(datasets.load_dataset("parquet", data_files={"train": str(path)}))
            if path.suffix == ".arrow":
                return {"train": datasets.Dataset.from_file(str(path))}
            raise DatasetError(
                f"{path}: not a .parquet or .arrow file; give an image folder, a save_to_disk folder, "
                "or a Parquet/Arrow file"
            )
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            loaded = datasets.load_from_disk(str(path))
            return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        if any(p.suffix in (".parquet", ".arrow") for p in path.rglob("*") if p.is_file()):
            return dict(datasets.load_dataset(str(path)))
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - datasets raises many types for unreadable files
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise DatasetError(f"{path}: Hugging Face datasets cannot read it ({type(exc).__name__}: {first})") from exc
    try:
        problems = Problems()  # stray files: named with the images that fail, in one line (user_dataset_info)
        return _Folder(read_image_folder(path, problems=problems), tuple(problems.messages))
    except ImageError as exc:
        raise DatasetError(str(exc)) from None


@dataclass(frozen=True)
class _Folder:
    """An image folder (:func:`fedul_flwr.data.images.read_image_folder`) and its bad entries."""

    folder: Any
    problems: tuple[str, ...] = ()


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


def _columns(ds: Any, options: DatasetOptions, where: str) -> tuple[str, str]:
    """The image and the label column of ``ds``."""
    import datasets  # deferred: import cost of datasets (seconds), paid only by an hf: dataset

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
    import datasets  # deferred: import cost of datasets (seconds), paid only by an hf: dataset

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
    items: Any = field(repr=False)  # per row of the split: {"bytes", "path"}, not decoded
    rows: np.ndarray = field(repr=False)  # int64 row numbers in the split
    labels: np.ndarray = field(repr=False)  # int64 labels of those rows


@dataclass(frozen=True)
class _Plan:
    """What a user dataset holds, known without decoding an image."""

    where: str
    class_names: tuple[str, ...]
    train: _Part
    test: _Part
    files: bool = False  # the rows are an image folder's files, named by their paths (else by split and row)
    problems: tuple[str, ...] = ()  # an image folder's bad entries (stray files, empty class folders)


def _check_classes(where: str, names: tuple[str, ...], y_train: np.ndarray) -> None:
    """A classifier needs at least two classes, each with a training image."""
    if len(names) < 2:
        raise DatasetError(f"{where}: only one class ({names[0] if names else 'none'!r}); a classifier needs at least two")
    empty = [names[k] for k in np.flatnonzero(np.bincount(y_train, minlength=len(names)) == 0)]
    if empty:
        raise DatasetError(f"{where}: class {empty[0]!r} has no training image (empty classes: {empty[:5]})")


def _split_parts(where: str, names: tuple[str, ...], train: tuple[str, Any, np.ndarray],
                 test: tuple[str, Any, np.ndarray] | None, files: bool = False) -> _Plan:  # fmt: skip
    """The plan of a training split and a test split (or a held-out share of the training split)."""
    _check_classes(where, names, train[2])
    if test is not None:
        return _Plan(where, names, _Part(train[0], train[1], np.arange(len(train[2])), train[2]),
                     _Part(test[0], test[1], np.arange(len(test[2])), test[2]), files)  # fmt: skip
    keep, held = holdout_split(train[2], TEST_FRACTION, TEST_SPLIT_SEED)  # a fixed class-stratified share
    if not len(held):
        raise DatasetError(f"{where}: no test split and too few images to hold out {TEST_FRACTION:.0%} of a class")
    return _Plan(where, names, _Part(train[0], train[1], keep, train[2][keep]),
                 _Part(train[0], train[1], held, train[2][held]), files)  # fmt: skip


@functools.lru_cache(maxsize=4)
def _plan(name: str, options: DatasetOptions, data_dir: str = "") -> _Plan:
    """Open the dataset, choose splits and columns, read the labels, hold out the test rows."""
    import datasets  # deferred: import cost of datasets (seconds), paid only by an hf: dataset

    source = check_source(name)
    if options.image_size < 0:
        raise DatasetError(f"image-size={options.image_size}: must be >= 0 (0 keeps the images' size)")
    opened = _open(source, data_dir)
    where = f"dataset={name!r}"
    if isinstance(opened, _Folder):
        if options.image_column or options.label_column:
            raise DatasetError(f"{where}: an image folder has no columns; image-column and label-column apply to "
                               "Parquet, Arrow, saved and Hub datasets")  # fmt: skip
        folder = opened.folder

        def split(name_: str) -> tuple[str, Any, np.ndarray]:
            files, labels = folder.splits[name_]
            return name_, [{"bytes": None, "path": str(f)} for f in files], labels

        test_name = next((s for s in _TEST_SPLITS if s in folder.splits), None)
        try:
            plan = _split_parts(where, folder.class_names, split("train"),
                                None if test_name is None else split(test_name), files=True)  # fmt: skip
        except DatasetError:
            _raise(Problems(opened.problems))  # an empty class folder: named as such
            raise
        return dataclasses.replace(plan, problems=opened.problems)
    train_name, test_name = _pick_splits(opened, where)
    train = opened[train_name]
    test = None if test_name is None else opened[test_name]
    image_col, label_col = _columns(train, options, where)
    if test is not None:
        for col in (image_col, label_col):
            if col not in test.features:
                raise DatasetError(f"{where}: split {test_name!r} has no column {col!r} (columns {list(test.features)})")
    if len(train) == 0:
        raise DatasetError(f"{where}: split {train_name!r} holds no row")
    class_names, y_train, y_test = _labels(train, test, label_col, where)

    def items(ds: Any) -> Any:
        try:
            return list(ds.cast_column(image_col, datasets.Image(decode=False))[image_col])
        except Exception as exc:  # noqa: BLE001 -- pyarrow and datasets raise many types for a column of no images
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DatasetError(f"{where}: image-column {image_col!r} holds {ds.features[image_col]}, not images "
                               f"({type(exc).__name__}: {first})") from None  # fmt: skip

    return _split_parts(where, class_names, (train_name, items(train), y_train),
                        None if test is None else (str(test_name), items(test), y_test))  # type: ignore[arg-type]  # fmt: skip


def _origin(plan: _Plan, part: _Part, row: int) -> tuple[Any, str]:
    """The encoded image of ``row`` of ``part`` (bytes or a path) and where it comes from."""
    item = part.items[int(row)] or {}
    data, path = item.get("bytes"), item.get("path")
    origin = f"{path}" if plan.files else f"{plan.where}: split {part.split!r}, row {row}" + (
        f" ({path})" if path else "")  # fmt: skip
    if data is None and not path:
        raise ImageError(f"{origin}: no image")
    return (data if data is not None else path), origin


def _raise(problems: Problems) -> None:
    """The noted bad images, if any, as one :class:`DatasetError` line."""
    try:
        problems.raise_any()
    except ImageError as exc:
        raise DatasetError(str(exc)) from None


def _decode(plan: _Plan, spec: ImageSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The training and the test images as uint8 ``[n, C, S, S]``, decoded in one pass by the
    project's one decoder (:func:`fedul_flwr.data.images.decode_files`), which names every bad
    image of both at once."""
    problems = Problems(noun="bad image files" if plan.files else "bad rows")
    items = []
    for part in (plan.train, plan.test):
        for row in part.rows:
            with problems.catch():
                items.append(_origin(plan, part, row))
    try:
        problems.raise_any()
        out = decode_files(items, spec, problems)
        problems.raise_any()
    except ImageError as exc:
        raise DatasetError(str(exc)) from None
    return torch.from_numpy(out[: len(plan.train.rows)]), torch.from_numpy(out[len(plan.train.rows) :])


@functools.lru_cache(maxsize=4)
def user_dataset_info(name: str, data_dir: str = "", options: DatasetOptions = DatasetOptions()) -> DatasetInfo:
    """The :class:`~fedul_flwr.data.image_dataset.DatasetInfo` of a user dataset, from its labels
    and the images' headers (no image is decoded; the ServerApp sends it to the nodes).

    Class names: the label column's (see the module doc); channels: 3 if any image is in a
    colour mode, else 1; image size: ``image-size``, else the first training image's side
    (it must be square); mean = std = 0.5 per channel.

    Raises
    ------
    DatasetError
        As :func:`load_user_dataset` (a file PIL cannot identify, a non-square first image
        with ``image-size=0``, ...).
    """
    plan = _plan(name, options, data_dir)
    grey, first = True, None
    problems = Problems(plan.problems, noun="bad image files" if plan.files else "bad rows")
    bad: dict[int, str] = {}  # the bad images by their place in the dataset: named in its order
    readable = []
    for i, (part, row) in enumerate((part, row) for part in (plan.train, plan.test) for row in part.rows):
        try:
            source, origin = _origin(plan, part, row)
            mode, size = read_header(source, origin)
        except ImageError as exc:
            bad[i] = str(exc)
            continue
        readable.append((i, source, origin))
        grey = grey and channels_of_mode(mode) == 1
        if first is None:
            first = (size, origin)
    if (bad or problems.messages) and first is not None and (options.image_size or first[0][0] == first[0][1]):
        spec = ImageSpec(1 if grey else 3, options.image_size or first[0][0], bool(options.image_size))
        for i, source, origin in readable:  # name the images that fail to decode too, in the same line
            try:
                decode_image(source, origin, spec)
            except ImageError as exc:
                bad[i] = str(exc)
    for i in sorted(bad):
        problems.add(bad[i])
    _raise(problems)
    (width, height), origin = first  # type: ignore[misc]
    if not options.image_size and width != height:
        raise DatasetError(f"{origin}: image of {width}x{height} pixels is not square; set image-size=N to resize "
                           "every image to NxN")  # fmt: skip
    channels = 1 if grey else 3
    return DatasetInfo(name, plan.class_names, channels, options.image_size or width, (_MEAN,) * channels,
                       (_STD,) * channels)  # fmt: skip


def load_user_dataset(name: str, data_dir: str = "", download: bool = False,
                      options: DatasetOptions = DatasetOptions()) -> ImageDataset:  # fmt: skip
    """Load a user dataset's training and test splits into memory (call it through
    :func:`fedul_flwr.data.datasets.load_dataset`, which caches it per process).

    Parameters
    ----------
    name : str
        ``hf:<Hub owner/name or /absolute/path>`` (see the module doc for the formats).
    data_dir : str
        The cache folder of ``datasets`` for a Hub dataset (``""``: Hugging Face's default).
    download : bool
        Unused (a Hub dataset is fetched when it is not cached).
    options : DatasetOptions
        Image and label columns, image size.

    Returns
    -------
    ImageDataset
        ``train_x`` uint8 ``[N, C, S, S]``, ``train_y`` int64 ``[N]``, ``test_x`` uint8
        ``[N_test, C, S, S]``, ``test_y`` int64 ``[N_test]``; C and S as
        :func:`user_dataset_info` says; class names from the label column; mean = std = 0.5
        per channel.

    Raises
    ------
    DatasetError
        One line naming the file, row or key: a missing path, an unreadable, truncated or
        missing file, an empty class folder, one class only, a missing column, a label
        outside the classes, an image of another size (with ``image-size=0``), or a Hub
        dataset that cannot be fetched.
    """
    info = user_dataset_info(name, data_dir, options)
    plan = _plan(name, options, data_dir)
    spec = ImageSpec(info.channels, info.image_size, resize=bool(options.image_size))
    train_x, test_x = _decode(plan, spec)
    return ImageDataset(
        name=name,
        train_x=train_x,
        train_y=torch.from_numpy(plan.train.labels.astype(np.int64)),
        test_x=test_x,
        test_y=torch.from_numpy(plan.test.labels.astype(np.int64)),
        class_names=plan.class_names,
        mean=info.mean,
        std=info.std,
    )


def _clear() -> None:
    _plan.cache_clear()
    user_dataset_info.cache_clear()


DATASETS.add_prefix(PREFIX, DatasetSource(load_user_dataset, user_dataset_info, _clear))
