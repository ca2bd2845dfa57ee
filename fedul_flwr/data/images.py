"""The one image decoder and the one image-folder reader of the project.

Every image file that enters a run -- a user dataset ``hf:<source>``
(:mod:`fedul_flwr.data.user_datasets`) and a deployed node's own folder
(:mod:`fedul_flwr.data.node_dir`) -- is decoded here, by the same rules, so a node folder
holding the run's images as files is accepted exactly when the run's dataset is:

- **file types**: :data:`IMAGE_SUFFIXES` (anything PIL reads of those); hidden files
  (``.*``) are ignored, any other file is an error (no image is silently skipped);
- **channels**: every image is converted to the run's C channels with PIL (``L`` for C = 1,
  ``RGB`` for C = 3: greyscale images are repeated to three channels, colour images turned
  to luminance, palettes and alpha resolved by PIL);
- **size**: with ``image-size=S`` (``resize``) every image is resized to S x S (PIL,
  bilinear); with ``image-size=0`` an image of another size than the run's is an error that
  names the ``image-size=N`` hint;
- **errors**: :class:`ImageError`, one line naming the file (or row) and the cause: an
  unreadable or truncated file, a size mismatch.

An *image folder* (:func:`read_image_folder`) is ``<root>/<class name>/<image files>``,
optionally under split folders ``<root>/train/``, ``<root>/test/``, ``<root>/validation/``
(:data:`SPLIT_FOLDERS`). Splits come only from split folders, never from file names (a flat
class folder whose files are called ``test_*.png`` trains on every one of them).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "IMAGE_SUFFIXES",
    "SPLIT_FOLDERS",
    "ImageError",
    "ImageFolder",
    "ImageSpec",
    "channels_of_mode",
    "decode_array",
    "decode_image",
    "read_image_folder",
]

IMAGE_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
"""The image file types of image folders and node folders (lower-case; matched case-insensitively)."""
SPLIT_FOLDERS: tuple[str, ...] = ("train", "test", "validation")
"""Names of split folders of an image folder: ``train`` trains, ``test`` (else ``validation``) tests."""
_GREY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"})


class ImageError(ValueError):
    """An image cannot enter the run; the message is one line naming the file or row and why."""


@dataclass(frozen=True)
class ImageSpec:
    """What every image of a run becomes.

    Attributes
    ----------
    channels : int
        C, 1 (greyscale) or 3 (RGB).
    size : int
        The side S in pixels of the run's square images.
    resize : bool
        Resize every image to ``S x S`` (the run set ``image-size=S``); else an image of
        another size is an :class:`ImageError`.
    """

    channels: int
    size: int
    resize: bool = False


def channels_of_mode(mode: str) -> int:
    """1 for a PIL greyscale mode (``L``, ``1``, ``I;16`` ...), else 3."""
    return 1 if mode in _GREY_MODES else 3


def _finish(img, origin: str, spec: ImageSpec) -> np.ndarray:  # type: ignore[no-untyped-def]
    """A loaded PIL image as uint8 ``[C, S, S]`` by the rules of the module doc."""
    from PIL import Image

    if img.mode != ("L" if spec.channels == 1 else "RGB"):
        img = img.convert("L" if spec.channels == 1 else "RGB")
    if img.size != (spec.size, spec.size):
        if not spec.resize:
            raise ImageError(
                f"{origin}: image of {img.size[0]}x{img.size[1]} pixels, the run's images are {spec.size}x{spec.size}; "
                "set image-size=N to resize every image to NxN"
            )
        img = img.resize((spec.size, spec.size), Image.Resampling.BILINEAR)
    arr = np.asarray(img, dtype=np.uint8)
    return arr[None] if arr.ndim == 2 else np.ascontiguousarray(np.moveaxis(arr, 2, 0))


def decode_image(source: str | Path | bytes, origin: str, spec: ImageSpec) -> np.ndarray:
    """Decode one image file (or its bytes) to the run's format.

    Parameters
    ----------
    source : str, Path or bytes
        The file, or its encoded bytes (a Parquet / Arrow row).
    origin : str
        Where the image comes from, for the error message (a path, or ``dataset=...: row 7``).
    spec : ImageSpec
        The run's channels and size, and whether to resize.

    Returns
    -------
    np.ndarray
        uint8 ``[C, S, S]``.

    Raises
    ------
    ImageError
        On a file PIL cannot identify, a truncated or corrupt file, or (without ``resize``)
        an image of another size than ``S x S``.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as img:
            img.load()
            return _finish(img, origin, spec)
    except ImageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ImageError(f"{origin}: unreadable or truncated image ({why})") from exc


def decode_array(images: np.ndarray, origin: str, spec: ImageSpec) -> np.ndarray:
    """Images given as an array (a node's ``images.npy``) in the run's format, by the same
    rules as files: uint8 ``[n, H, W]`` or ``[n, H, W, C]`` (C = 1 or 3) ->
    ``[n, C_run, S, S]``; converted or resized through PIL only where they differ.

    Raises
    ------
    ImageError
        On another dtype or number of dimensions, or (without ``resize``) another size.
    """
    from PIL import Image

    if images.dtype != np.uint8:
        raise ImageError(f"{origin}: dtype {images.dtype}, expected uint8 pixel values 0..255")
    if images.ndim == 4 and images.shape[3] == 1:
        images = images[..., 0]
    if images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[3] != 3):
        raise ImageError(f"{origin}: shape {images.shape}, expected [n, H, W] or [n, H, W, C] with C = 1 or 3")
    channels = 1 if images.ndim == 3 else 3
    if channels == spec.channels and images.shape[1:3] == (spec.size, spec.size):
        return np.ascontiguousarray(images[:, None] if channels == 1 else np.moveaxis(images, 3, 1))
    return np.stack([_finish(Image.fromarray(img), f"{origin}: image {i}", spec) for i, img in enumerate(images)])


@dataclass(frozen=True)
class ImageFolder:
    """The files and labels of an image folder (nothing decoded).

    Attributes
    ----------
    class_names : tuple of str
        The K class names: the given ones, else the training split's class folders, sorted.
    splits : dict
        ``{split: (files, labels)}``: the image files (sorted by class, then file name) and
        int64 ``[n]`` labels (indices into ``class_names``); ``"train"`` always, ``"test"`` /
        ``"validation"`` when the folder has that split folder.
    """

    class_names: tuple[str, ...]
    splits: dict[str, tuple[list[Path], np.ndarray]]


def _entries(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def _class_files(folder: Path) -> list[Path]:
    files = _entries(folder)
    if not files:
        raise ImageError(f"{folder}: class folder holds no image")
    for p in files:
        if p.is_dir() or p.suffix.lower() not in IMAGE_SUFFIXES:
            raise ImageError(f"{p}: not an image file; a class folder holds only {list(IMAGE_SUFFIXES)} files")
    return files


def read_image_folder(root: str | Path, class_names: Sequence[str] | None = None,
                      allow_splits: bool = True) -> ImageFolder:  # fmt: skip
    """List an image folder ``<root>/<class>/<files>`` (or ``<root>/<split>/<class>/<files>``).

    Parameters
    ----------
    root : str or Path
        The folder.
    class_names : sequence of str, optional
        The run's classes: every class folder must be named as one of them (a folder may hold
        only some). ``None``: the classes are the training split's folders, sorted, and at
        least two.
    allow_splits : bool
        Accept split folders (:data:`SPLIT_FOLDERS`); a node folder's class folders are not
        split.

    Returns
    -------
    ImageFolder

    Raises
    ------
    ImageError
        One line naming the entry: a file beside the class folders, split folders mixed with
        class folders, a class folder without image or holding another file, a folder not
        named as a class of the run, only one class, a test class the training split lacks.
    """
    root = Path(root)
    entries = _entries(root)
    if not entries:
        raise ImageError(f"{root}: empty; an image folder holds one folder per class (<class name>/<image files>)")
    for p in entries:
        if not p.is_dir():
            raise ImageError(f"{p}: a file beside the class folders; an image folder holds only class folders "
                             "(<class name>/<image files>)")  # fmt: skip
    split_dirs = {p.name.lower(): p for p in entries if p.name.lower() in SPLIT_FOLDERS}
    if allow_splits and split_dirs:
        others = [p.name for p in entries if p.name.lower() not in SPLIT_FOLDERS]
        if others or "train" not in split_dirs:
            raise ImageError(
                f"{root}: holds split folders {sorted(split_dirs)} and {others or 'no train/'}; split folders are "
                f"{list(SPLIT_FOLDERS)}, with train/ among them, and nothing beside them"
            )
        roots = {name: split_dirs[name] for name in SPLIT_FOLDERS if name in split_dirs}
    else:
        roots = {"train": root}
    classes = {split: _entries(folder) for split, folder in roots.items()}
    for split, folders in classes.items():
        for p in folders:
            if not p.is_dir():
                raise ImageError(f"{p}: a file beside the class folders of split {split!r}")
        if not folders:
            raise ImageError(f"{roots[split]}: holds no class folder")
    if class_names is None:
        names = tuple(p.name for p in classes["train"])
        if len(names) < 2:
            raise ImageError(f"{roots['train']}: only one class ({names[0]!r}); a classifier needs at least two class "
                             "folders")  # fmt: skip
    else:
        names = tuple(class_names)
    index = {n: i for i, n in enumerate(names)}
    splits: dict[str, tuple[list[Path], np.ndarray]] = {}
    for split, folders in classes.items():
        files: list[Path] = []
        labels: list[int] = []
        for p in folders:
            if p.name not in index:
                known = "the training split's" if class_names is None else "the run's"
                raise ImageError(f"{p}: folder name {p.name!r} is not one of {known} classes {list(names)}")
            found = _class_files(p)
            files += found
            labels += [index[p.name]] * len(found)
        splits[split] = (files, np.asarray(labels, dtype=np.int64))
    return ImageFolder(names, splits)
