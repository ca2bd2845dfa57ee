"""The one image decoder and the one image-folder reader of the project.

Every image file that enters a run -- a user dataset ``hf:<source>`` (an image folder, a
Parquet or Arrow file, a ``save_to_disk`` folder, a Hub dataset;
:mod:`fedul_flwr.data.user_datasets`) and a deployed node's own folder
(:mod:`fedul_flwr.data.node_folder.layout`) -- is opened and decoded here, by the same rules, so a node
folder holding the run's images as files is accepted exactly when the run's dataset is, and
the model sees what a photo viewer shows:

- **file types**: :data:`IMAGE_SUFFIXES` (anything PIL reads of those); hidden files
  (``.*``) are ignored, any other file is an error (no image is silently skipped). HEIC /
  HEIF files (:data:`HEIC_SUFFIXES`, or such bytes in a Parquet row) are refused with the hint
  to convert them: PIL cannot read them without a plugin.
- **orientation**: the EXIF orientation tag is applied (``PIL.ImageOps.exif_transpose``), as
  a photo viewer and ``datasets``' own decoding do: a phone's photo stored sideways with
  ``Orientation = 6`` trains upright (a damaged EXIF block is ignored: the pixels as stored).
- **bit depth**: 16-bit greyscale (PIL modes ``I;16``, ``I;16B``, ``I;16L``, and ``I``
  holding values in 0..65535, as PIL opens some 16-bit files) is scaled from its full range,
  x / 257 rounded (0 -> 0, 65535 -> 255), as a viewer shows it; a 12-bit scan stored in 16
  bits therefore stays as dark as a viewer shows it. 32-bit float greyscale (``F``) in
  [0, 1] is scaled by 255, rounded. A float image with values outside [0, 1] or holding NaN
  or infinite values (said so), or an integer image with values outside 0..65535, is refused: its scale is not in
  the file, and stretching each image to its own minimum and maximum would silently give every
  image another contrast (save such images as 8- or 16-bit integers, or as floats in [0, 1]).
- **channels**: every image is converted to the run's C channels with PIL (``L`` for C = 1,
  ``RGB`` for C = 3: greyscale images are repeated to three channels, colour images turned
  to luminance, CMYK, YCbCr, LAB and palettes resolved by PIL; a mode PIL converts to ``RGB``
  but not to ``L``, such as ``LAB``, goes through ``RGB``, so colour and greyscale runs read it
  alike). A mode PIL cannot convert is refused naming the mode as unsupported.
- **frames**: an animated GIF/WebP/PNG or a multi-page TIFF is read by its first frame only.
- **transparency**: an image with an alpha channel (``RGBA``, ``LA``, ``PA``) or a
  transparent palette colour is composited over white (``Image.alpha_composite``), as a
  viewer on a white page shows it; the colour an encoder left under fully transparent pixels
  is arbitrary and never reaches the model.
- **size**: with ``image-size=S`` (``resize``) every image is resized to S x S (PIL,
  bilinear, antialiased when shrinking); a non-square image is stretched to the square, like
  ``torchvision.transforms.Resize((S, S))`` -- not cropped, so nothing at its borders is lost.
  With ``image-size=0`` an image of another size than the run's (a non-square one included)
  is an error that names the ``image-size=N`` hint.
- **decompression bombs**: an image of more than PIL's ``Image.MAX_IMAGE_PIXELS`` pixels
  (89,478,485; PIL warns above it and refuses above twice it) is refused, so a small file
  cannot make a node decode gigabytes.
- **errors**: :class:`ImageError`, one line naming the file (or dataset, split and row) and
  the cause: an unreadable or truncated file, a size mismatch, a decompression bomb, any
  error PIL raises. Where many files are read (:func:`decode_files`,
  :func:`read_image_folder`), every bad file is found in one pass and the one line names the
  first :data:`MAX_NAMED` of them, then how many more.

An *image folder* (:func:`read_image_folder`) is ``<root>/<class name>/<image files>``,
optionally under split folders ``<root>/train/``, ``<root>/test/``, ``<root>/validation/``
(:data:`SPLIT_FOLDERS`). Splits come only from split folders, never from file names (a flat
class folder whose files are called ``test_*.png`` trains on every one of them). A folder named
as a split beside other folders is refused (a class named like a split, such as CIFAR-100's
``train``, goes under split folders: ``<root>/train/train/``). Class names are folder names in
Unicode NFC, so a name written decomposed (NFD, as macOS writes it) is the same class.
"""

from __future__ import annotations

import io
import re
import unicodedata
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import ExifTags, Image, ImageOps

__all__ = [
    "HEIC_SUFFIXES",
    "IMAGE_SUFFIXES",
    "MAX_NAMED",
    "SPLIT_FOLDERS",
    "ImageError",
    "ImageFolder",
    "ImageSpec",
    "Problems",
    "channels_of_mode",
    "decode_array",
    "decode_files",
    "decode_image",
    "image_files",
    "read_header",
    "read_image_folder",
]

IMAGE_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
"""The image file types of image folders and node folders (lower-case; matched case-insensitively)."""
HEIC_SUFFIXES: tuple[str, ...] = (".heic", ".heif")
"""Phone photo types PIL cannot read without a plugin: refused with the hint to convert them."""
SPLIT_FOLDERS: tuple[str, ...] = ("train", "test", "validation")
"""Names of split folders of an image folder: ``train`` trains, ``test`` (else ``validation``) tests."""
MAX_NAMED = 10
"""How many bad files one error line names before it says how many more there are."""
_GREY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
_INT_MODES = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N"})
_ALPHA_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})
_HEIC_BRANDS = (b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1")
_CONVERT_HINT = "convert it to PNG or JPEG (PIL cannot read HEIC/HEIF without a plugin)"


class ImageError(ValueError):
    """An image cannot enter the run; the message is one line naming the file or row and why."""


class Problems:
    """The bad files of one pass over many files, raised together as one :class:`ImageError`.

    Use :meth:`catch` around the work on each file, then :meth:`raise_any`: one line naming
    the first :data:`MAX_NAMED` problems (each names its file), then how many more.
    """

    def __init__(self, messages: Sequence[str] = (), noun: str = "bad image files") -> None:
        self.messages: list[str] = list(messages)
        self.noun = noun  # what the many are called in the line: files, or a dataset's rows

    def add(self, message: str) -> None:
        """Note one problem (a one-line message naming the file)."""
        self.messages.append(message)

    @contextmanager
    def catch(self) -> Iterator[None]:
        """Note an :class:`ImageError` raised inside the block instead of propagating it."""
        try:
            yield
        except ImageError as exc:
            self.add(str(exc))

    def raise_any(self) -> None:
        """Raise the noted problems, if any.

        Raises
        ------
        ImageError
            The one problem's message, or ``"<n> bad image files: <first>; <second>; ...;
            and <k> more"`` (``bad rows`` for a dataset's rows, :attr:`noun`).
        """
        if len(self.messages) == 1:
            raise ImageError(self.messages[0])
        if self.messages:
            shown = self.messages[:MAX_NAMED]
            more = len(self.messages) - len(shown)
            raise ImageError(f"{len(self.messages)} {self.noun}: " + "; ".join(shown)
                             + (f"; and {more} more" if more else ""))  # fmt: skip


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
    """1 for a PIL greyscale mode (``L``, ``LA``, ``1``, ``I;16``, ``F`` ...), else 3."""
    return 1 if mode in _GREY_MODES else 3


def _is_heic(source: str | Path | bytes) -> bool:
    """A HEIC/HEIF file by its name or its ISO-BMFF ``ftyp`` brand."""
    if not isinstance(source, bytes):
        if Path(source).suffix.lower() in HEIC_SUFFIXES:
            return True
        try:
            with open(source, "rb") as f:
                source = f.read(12)
        except OSError:
            return False
    return source[4:8] == b"ftyp" and source[8:12] in _HEIC_BRANDS


@contextmanager
def _opened(source: str | Path | bytes, origin: str) -> Iterator[Any]:
    """The PIL image of ``source`` (not yet decoded), every error PIL raises while it is open
    turned into one :class:`ImageError` line naming ``origin``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)  # PIL's limit is the refusal
            with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as img:
                yield img
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        found = re.search(r"\((\d+) pixels\)", str(exc))
        size = f"{int(found.group(1)):,} pixels" if found else "an image"
        raise ImageError(f"{origin}: {size}, over PIL's decompression-bomb limit of {Image.MAX_IMAGE_PIXELS:,} "
                         "pixels; refused as a possible decompression bomb (downscale the file if it is a real "
                         "image)") from None  # fmt: skip
    except Exception as exc:  # noqa: BLE001 -- PIL raises many types for damaged files; each is named in one line
        if _is_heic(source):
            raise ImageError(f"{origin}: a HEIC/HEIF image; {_CONVERT_HINT}") from None
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        why = re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", why)  # PIL names the buffer: origin names the row
        raise ImageError(f"{origin}: unreadable or truncated image ({type(exc).__name__}: {why})") from None


def read_header(source: str | Path | bytes, origin: str) -> tuple[str, tuple[int, int]]:
    """The PIL mode and the upright ``(width, height)`` of an image, from its header (no
    pixel is decoded).

    Parameters
    ----------
    source : str, Path or bytes
        The file, or its encoded bytes.
    origin : str
        Where it comes from, for the error message.

    Returns
    -------
    (str, (int, int))
        The mode and the size as shown, after its EXIF orientation (orientations 5 to 8 swap
        width and height; a PNG's EXIF is read here only where it precedes the pixels, as PIL
        and other encoders write it).

    Raises
    ------
    ImageError
        As :func:`decode_image`, for what the header shows (an unidentified file, HEIC, a
        decompression bomb).
    """
    with _opened(source, origin) as img:
        turned = False
        if img.format != "PNG" or "exif" in img.info:  # a PNG's getexif() without an eXIf chunk before the
            try:  # pixels would decode the whole image to look after them
                turned = img.getexif().get(ExifTags.Base.Orientation) in (5, 6, 7, 8)
            except Exception:  # noqa: BLE001 -- a damaged EXIF block: exif_transpose decides when decoding
                pass
        return img.mode, (img.size[::-1] if turned else img.size)


def _scaled_grey(img: Any, origin: str) -> Any:
    """A 16-bit or float greyscale image as ``L``, from its own range (module doc)."""
    arr = np.asarray(img)
    if img.mode == "F":
        nan, inf = int(np.isnan(arr).sum()), int(np.isinf(arr).sum())
        if nan or inf:
            held = " and ".join(f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "infinite")) if n)
            raise ImageError(f"{origin}: float image holding {held} value{'s' if nan + inf > 1 else ''} of "
                             f"{arr.size}; save it as 8- or 16-bit integers, or as finite floats in [0, 1]")  # fmt: skip
        if arr.min() < 0.0 or arr.max() > 1.0:
            raise ImageError(f"{origin}: float image with values in [{arr.min():.4g}, {arr.max():.4g}], "
                             "outside [0, 1]; its scale is not in the file: save it as 8- or 16-bit integers, or as "
                             "floats in [0, 1]")  # fmt: skip
        return Image.fromarray(np.rint(arr.astype(np.float64) * 255.0).astype(np.uint8))
    if arr.min() < 0 or arr.max() > 65535:
        raise ImageError(f"{origin}: {img.mode!r} integer image with values in [{arr.min()}, {arr.max()}], outside "
                         "0..65535; its scale is not in the file: save it as 8- or 16-bit integers")  # fmt: skip
    return Image.fromarray(np.rint(arr.astype(np.float64) / 257.0).astype(np.uint8))


def _upright(img: Any, origin: str) -> Any:
    """The loaded image as a viewer shows it: EXIF orientation applied, 16-bit and float
    greyscale scaled to ``L``, transparency composited over white."""
    try:
        ImageOps.exif_transpose(img, in_place=True)
    except Exception:  # noqa: BLE001 -- a damaged EXIF block: the pixels as stored, as read_header sizes them
        pass
    if img.mode in _INT_MODES or img.mode == "F":
        return _scaled_grey(img, origin)
    if img.mode in _ALPHA_MODES or "transparency" in img.info:
        rgba = img.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return img


def _finish(img: Any, origin: str, spec: ImageSpec) -> np.ndarray:
    """A PIL image as uint8 ``[C, S, S]``: converted to the run's channels, resized or checked."""
    target = "L" if spec.channels == 1 else "RGB"
    if img.mode != target:
        try:
            img = img.convert(target)
        except ValueError:  # PIL has no direct conversion (LAB to L): through RGB, as a colour run reads it
            try:
                img = img.convert("RGB").convert(target)
            except ValueError:  # none at all: an unsupported mode, not a damaged file
                raise ImageError(f"{origin}: colour mode {img.mode!r} is not supported (PIL cannot convert it to "
                                 f"{target!r}); save the image as RGB or greyscale") from None  # fmt: skip
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
    """Decode one image file (or its bytes) to the run's format, by the rules of the module doc.

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
        uint8 ``[C, S, S]``: upright (EXIF orientation), 16-bit / float greyscale scaled from
        its range, transparency over white.

    Raises
    ------
    ImageError
        One line naming ``origin``: a file PIL cannot identify (HEIC with the hint to
        convert), a truncated or corrupt file, a decompression bomb, a float image outside
        [0, 1], or (without ``resize``) an image of another size than ``S x S``.
    """
    with _opened(source, origin) as img:
        try:
            img.load()
            shown = _upright(img, origin)
        except ImageError:
            raise
        except Exception as exc:  # noqa: BLE001 -- PIL's decoders raise many types on damaged data
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ImageError(f"{origin}: unreadable or truncated image ({type(exc).__name__}: {why})") from None
        return _finish(shown, origin, spec)


def decode_files(items: Sequence[tuple[str | Path | bytes, str]], spec: ImageSpec,
                 problems: Problems | None = None) -> np.ndarray:  # fmt: skip
    """Decode many images (:func:`decode_image`), every bad one found in the same pass.

    Parameters
    ----------
    items : sequence of (source, origin)
        Each image's file or bytes and where it comes from.
    spec : ImageSpec
        The run's channels and size.
    problems : Problems, optional
        Note the bad images here (with what the caller found before, e.g. the stray files of
        the folder) and leave raising to the caller; ``None``: raise them here.

    Returns
    -------
    np.ndarray
        uint8 ``[n, C, S, S]`` in the order of ``items`` (zeros where an image is bad and
        ``problems`` is given).

    Raises
    ------
    ImageError
        Without ``problems``: one line naming the first :data:`MAX_NAMED` bad images and how
        many more (:class:`Problems`).
    """
    out = np.zeros((len(items), spec.channels, spec.size, spec.size), dtype=np.uint8)
    noted = Problems() if problems is None else problems
    for i, (source, origin) in enumerate(items):
        with noted.catch():
            out[i] = decode_image(source, origin, spec)
    if problems is None:
        noted.raise_any()
    return out


def decode_array(images: np.ndarray, origin: str, spec: ImageSpec) -> np.ndarray:
    """Images given as an array (a node's ``images.npy``) in the run's format, by the same
    rules as files: uint8 ``[n, H, W]`` or ``[n, H, W, C]`` (C = 1 or 3) ->
    ``[n, C_run, S, S]``; converted or resized through PIL only where they differ.

    Raises
    ------
    ImageError
        On another dtype or number of dimensions, or (without ``resize``) another size.
    """
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


def image_files(folder: Path, what: str, problems: Problems, extra: str = "") -> list[Path]:
    """The image files of ``folder`` (sorted by name, hidden files ignored); every other
    entry is noted in ``problems`` (a HEIC file with the hint to convert it).

    Parameters
    ----------
    folder : Path
        The folder.
    what : str
        What the folder is, for the messages (``"a class folder"``, ``"set 'a'"``).
    problems : Problems
        Where the bad entries and an empty folder are noted.
    extra : str
        Also accepted besides image files, in the message (``" or one images.npy"``).

    Returns
    -------
    list of Path
        The image files.
    """
    entries = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    if not entries:
        problems.add(f"{folder}: {what} holds no image")
    files = []
    for p in entries:
        if p.is_file() and p.suffix.lower() in HEIC_SUFFIXES:
            problems.add(f"{p}: a HEIC/HEIF image; {_CONVERT_HINT}")
        elif p.is_dir() or p.suffix.lower() not in IMAGE_SUFFIXES:
            problems.add(f"{p}: not an image file; {what} holds only {list(IMAGE_SUFFIXES)} files{extra}")
        else:
            files.append(p)
    return files


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


def _nfc(name: str) -> str:
    """A folder name as a class name: Unicode NFC, so ``caté`` written decomposed (NFD, as macOS
    does) is the class ``caté`` composed."""
    return unicodedata.normalize("NFC", name)


def _entries(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def read_image_folder(root: str | Path, class_names: Sequence[str] | None = None, allow_splits: bool = True,
                      problems: Problems | None = None) -> ImageFolder:  # fmt: skip
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
    problems : Problems, optional
        Note the bad entries (stray files, empty class folders) here and return what the
        folder holds, so that the caller names them together with the images that fail to
        decode; ``None``: raise them here.

    Returns
    -------
    ImageFolder

    Raises
    ------
    ImageError
        One line naming the entry: split folders mixed with class folders, a folder not named
        as a class of the run, only one class, a test class the training split lacks; or
        naming every bad entry at once (the first :data:`MAX_NAMED`, then how many more): a
        file beside the class folders, a class folder without image or holding another file.
    """
    root = Path(root)
    entries = _entries(root)
    if not entries:
        raise ImageError(f"{root}: empty; an image folder holds one folder per class (<class name>/<image files>)")
    split_dirs = {p.name.lower(): p for p in entries if p.is_dir() and p.name.lower() in SPLIT_FOLDERS}
    if allow_splits and split_dirs:
        others = [p.name for p in entries if p.name.lower() not in SPLIT_FOLDERS]
        if others or "train" not in split_dirs:
            raise ImageError(
                f"{root}: holds split folders {sorted(split_dirs)} and {others or 'no train/'}; split folders are "
                f"{list(SPLIT_FOLDERS)}, with train/ among them, and nothing beside them (a class named like a split, "
                f"e.g. CIFAR-100's 'train', goes under split folders: {root}/train/<class>/, {root}/test/<class>/)"
            )
        roots = {name: split_dirs[name] for name in SPLIT_FOLDERS if name in split_dirs}
    else:
        roots = {"train": root}
    own = problems is None
    problems = Problems() if problems is None else problems
    classes = {split: [p for p in _entries(folder) if p.is_dir()] for split, folder in roots.items()}
    for split, folder in roots.items():
        for p in _entries(folder):
            if not p.is_dir():
                problems.add(f"{p}: a file beside the class folders of split {split!r}" if len(roots) > 1 or
                             folder != root else f"{p}: a file beside the class folders; an image folder holds only "
                             "class folders (<class name>/<image files>)")  # fmt: skip
        if not classes[split]:
            problems.add(f"{folder}: holds no class folder")
            problems.raise_any()
    if class_names is None:
        names = tuple(_nfc(p.name) for p in classes["train"])
        if len(names) < 2:
            raise ImageError(f"{roots['train']}: only one class ({names[0]!r}); a classifier needs at least two class "
                             "folders")  # fmt: skip
    else:
        names = tuple(_nfc(n) for n in class_names)
    index = {n: i for i, n in enumerate(names)}
    for folders in classes.values():
        for p in folders:
            if _nfc(p.name) not in index:
                known = "the training split's" if class_names is None else "the run's"
                raise ImageError(f"{p}: folder name {p.name!r} is not one of {known} classes {list(names)}")
    splits: dict[str, tuple[list[Path], np.ndarray]] = {}
    for split, folders in classes.items():
        files: list[Path] = []
        labels: list[int] = []
        for p in folders:
            found = image_files(p, "class folder", problems)
            files += found
            labels += [index[_nfc(p.name)]] * len(found)
        splits[split] = (files, np.asarray(labels, dtype=np.int64))
    if own:
        problems.raise_any()
    return ImageFolder(names, splits)
