"""One deployed node's unlabeled sets and priors, as a folder on its own disk.

In a real federation each organisation runs a SuperNode next to its data and starts it with
``flower-supernode --node-config "data-dir=/path/to/node"``. The folder holds::

    <dir>/priors.csv              header ``set,<class name 1>,...,<class name K>``; one row
                                  per U set: the set's name, then its K class priors
                                  Pi_c[m, :] (non-negative, summing to 1 within 1e-3)
    <dir>/sets/<set name>/        one folder per row of priors.csv, holding EITHER image
                                  files (``*.png``, ``*.jpg``, ``*.jpeg``; any file names)
                                  OR one ``images.npy``: uint8 ``[n, H, W]`` or ``[n, H, W, C]``
    <dir>/meta.json               optional: ``{"dataset": ..., "image_size": H,
                                  "channels": C, "class_names": [...]}``; checked against
                                  the run when present
    <dir>/test/images.npy         optional labeled local test split: uint8 images as above
    <dir>/test/labels.npy         and int labels ``[n_t]`` in ``0..K-1`` (both or neither)

The row order of ``priors.csv`` gives the set index m, i.e. the surrogate label ybar = m of
every image in ``sets/<name of row m>/`` (Lu et al., ICLR 2022, Eq. 6). Image files of a
set are decoded with PIL (8-bit grey ``L`` or colour ``RGB``) in sorted file-name order.
Hidden files (``.*``) are ignored; any other file is an error, so no image is silently
skipped.

:func:`validate_node_dir` reads everything and checks it; it never writes, moves or deletes
anything. Every problem raises :class:`NodeDataError`, whose message names the file, the row
(CSV line) or the value. :func:`load_node_dir` validates and returns a
:class:`~fedul_flwr.data.client_data.ClientData`. :func:`write_node_dir` writes such a folder
from a labeled dataset and simulated U sets (demos, tests), refusing to overwrite.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedul_flwr.data.usets import PriorMatrixError, USets, condition_number, validate_prior_matrix

if TYPE_CHECKING:  # pragma: no cover
    from fedul_flwr.data.client_data import ClientData

__all__ = [
    "IMAGE_SUFFIXES",
    "NodeDataError",
    "NodeDataReport",
    "NodeImages",
    "PRIOR_ROW_TOLERANCE",
    "load_node_dir",
    "read_node_dir",
    "validate_node_dir",
    "write_node_dir",
]

PRIORS_FILE = "priors.csv"
SETS_DIR = "sets"
META_FILE = "meta.json"
TEST_DIR = "test"
ARRAY_FILE = "images.npy"
LABELS_FILE = "labels.npy"
IMAGE_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg")
PRIOR_ROW_TOLERANCE = 1e-3
"""Largest accepted |sum of a priors.csv row - 1|; accepted rows are renormalised exactly."""


class NodeDataError(ValueError):
    """A node's data folder is missing, malformed or does not match the run; the message
    names the file, the CSV line / set or the offending value."""


@dataclass(frozen=True)
class NodeDataReport:
    """What :func:`validate_node_dir` found (no image data, only a description).

    Attributes
    ----------
    path : pathlib.Path
        The node's folder (resolved).
    set_names : tuple[str, ...]
        The M_c set names, in ``priors.csv`` row order (= surrogate label order).
    set_sizes : tuple[int, ...]
        Number of images of each set.
    set_formats : tuple[str, ...]
        ``"npy"`` or ``"files"`` per set.
    priors : np.ndarray
        float64 ``[M_c, K]`` prior matrix, rows renormalised to sum to 1.
    class_names : tuple[str, ...]
        The K class names (the run's, equal to the CSV header).
    channels, image_size : int
        Image shape ``[C, H, H]``.
    condition_number : float
        2-norm condition number of the prior matrix over the classes present.
    absent_classes : tuple[str, ...]
        Classes whose priors column is all zero (the node holds none of them).
    num_test : int
        Size of the labeled local test split (0 when absent).
    """

    path: Path
    set_names: tuple[str, ...]
    set_sizes: tuple[int, ...]
    set_formats: tuple[str, ...]
    priors: np.ndarray = field(repr=False)
    class_names: tuple[str, ...]
    channels: int
    image_size: int
    condition_number: float
    absent_classes: tuple[str, ...]
    num_test: int

    @property
    def num_sets(self) -> int:
        """M_c."""
        return len(self.set_names)

    @property
    def num_images(self) -> int:
        """n_c, images over all sets."""
        return int(sum(self.set_sizes))

    def summary(self) -> str:
        """A human-readable multi-line summary (for the ``validate`` command)."""
        lines = [
            f"{self.path}: OK",
            f"  {self.num_sets} sets, {self.num_images} images of {self.channels}x{self.image_size}x{self.image_size}, "
            f"K={len(self.class_names)} classes, cond(Pi)={self.condition_number:.2f}",
        ]
        if self.absent_classes:
            lines.append(f"  classes absent from this node (zero priors column): {list(self.absent_classes)}")
        lines.append(f"  labeled local test split: {self.num_test} images" if self.num_test else "  no local test split")
        width = max(len(n) for n in self.set_names)
        for name, size, fmt, row in zip(self.set_names, self.set_sizes, self.set_formats, self.priors):
            top = int(np.argmax(row))
            lines.append(
                f"  {name:<{width}}  {size:>7} images ({fmt})  max prior {row[top]:.3f} ({self.class_names[top]})"
            )
        return "\n".join(lines)


# --------------------------------------------------------------------------- reading


def _read_priors(path: Path, class_names: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """Parse and check ``priors.csv``: header, one row per set, K finite non-negative
    priors per row summing to 1 (tolerance). Returns (set names, ``[M, K]`` float64)."""
    if not path.is_file():
        raise NodeDataError(f"{path}: missing; every node folder needs a {PRIORS_FILE} (header 'set,<class names>')")
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:  # -sig: spreadsheet BOMs
            rows = [(i, r) for i, r in enumerate(csv.reader(fh), start=1) if any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise NodeDataError(f"{path}: cannot be read as CSV ({exc})") from exc
    if not rows:
        raise NodeDataError(f"{path}: is empty; expected a header 'set,<class names>' and one row per set")
    _, header = rows[0]
    header = [c.strip() for c in header]
    if header[0].lower() != "set":
        raise NodeDataError(f"{path}: line 1: first header column is {header[0]!r}, expected 'set'")
    names = header[1:]
    expected = [str(c) for c in class_names]
    if names != expected:
        missing = [c for c in expected if c not in names]
        extra = [c for c in names if c not in expected]
        detail = f"missing {missing}, unknown {extra}" if (missing or extra) else "same names in another order"
        raise NodeDataError(
            f"{path}: line 1: class columns {names} do not match the run's class names {expected} ({detail})"
        )
    num_classes = len(expected)
    set_names: list[str] = []
    values = []
    for line, row in rows[1:]:
        row = [c.strip() for c in row]
        name = row[0]
        where = f"{path}: line {line} (set {name!r})"
        if not name:
            raise NodeDataError(f"{path}: line {line}: empty set name")
        if name in set_names:
            raise NodeDataError(f"{where}: set name repeats line {rows[1 + set_names.index(name)][0]}")
        if len(row) != num_classes + 1:
            raise NodeDataError(f"{where}: has {len(row) - 1} priors, expected K={num_classes} (one per class)")
        entries = []
        for cls, text in zip(expected, row[1:]):
            try:
                value = float(text)
            except ValueError:
                raise NodeDataError(f"{where}: prior of class {cls!r} is {text!r}, not a number") from None
            if not math.isfinite(value):
                raise NodeDataError(f"{where}: prior of class {cls!r} is {text!r}; priors must be finite numbers")
            if value < 0:
                raise NodeDataError(f"{where}: prior of class {cls!r} is {text}, negative; priors must be >= 0")
            entries.append(value)
        total = sum(entries)
        if abs(total - 1.0) > PRIOR_ROW_TOLERANCE:
            raise NodeDataError(
                f"{where}: priors sum to {total:.6g}, not 1 (tolerance {PRIOR_ROW_TOLERANCE:g})"
            )
        set_names.append(name)
        values.append([v / total for v in entries])
    if not set_names:
        raise NodeDataError(f"{path}: has a header but no set rows")
    priors = np.asarray(values, dtype=np.float64)
    if len(set_names) < num_classes:
        raise NodeDataError(
            f"{path}: {len(set_names)} sets < K={num_classes} classes; FedUL needs at least one set per class "
            "(the prior matrix must have full column rank, Lu et al. 2022, Theorem 1)"
        )
    present = np.any(priors > 0, axis=0)
    try:
        validate_prior_matrix(priors, num_classes, source=str(path), atol=1e-6, present_classes=present)
    except PriorMatrixError as exc:
        raise NodeDataError(f"{exc} (columns = classes {expected}, rows = sets {set_names})") from exc
    return set_names, priors


def _as_nchw(arr: np.ndarray, where: str, channels: int, image_size: int) -> np.ndarray:
    """uint8 ``[n, H, W]`` / ``[n, H, W, C]`` -> ``[n, C, H, W]``, checking the shape."""
    if arr.dtype != np.uint8:
        raise NodeDataError(f"{where}: dtype {arr.dtype}, expected uint8 pixel values 0..255")
    if arr.ndim == 3:
        arr = arr[:, None, :, :]
    elif arr.ndim == 4:
        arr = np.moveaxis(arr, 3, 1)
    else:
        raise NodeDataError(f"{where}: shape {arr.shape}, expected [n, H, W] or [n, H, W, C]")
    expected = (channels, image_size, image_size)
    if tuple(arr.shape[1:]) != expected:
        raise NodeDataError(
            f"{where}: images of shape (C, H, W) = {tuple(arr.shape[1:])}, the run expects {expected}"
        )
    return arr


def _read_npy(path: Path, channels: int, image_size: int) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise NodeDataError(f"{path}: unreadable .npy file ({exc})") from exc
    arr = _as_nchw(arr, str(path), channels, image_size)
    if len(arr) == 0:
        raise NodeDataError(f"{path}: holds no images")
    return np.ascontiguousarray(arr)


_PIL_CHANNELS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}


def _read_image_file(path: Path, channels: int, image_size: int) -> np.ndarray:
    """One PNG/JPEG file as uint8 ``[C, H, W]`` (PIL; 8-bit grey, RGB or with alpha)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img.load()
            mode = img.mode
            arr = np.asarray(img)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise NodeDataError(f"{path}: unreadable image ({exc})") from exc
    if mode not in _PIL_CHANNELS:
        raise NodeDataError(f"{path}: image mode {mode!r}; expected 8-bit grey ('L') or colour ('RGB') pixels")
    arr = arr[None] if arr.ndim == 2 else np.moveaxis(arr, 2, 0)
    shape = tuple(arr.shape)
    if shape != (channels, image_size, image_size):
        raise NodeDataError(f"{path}: image of shape (C, H, W) = {shape}, the run expects {(channels, image_size, image_size)}")
    return arr


def _read_set(folder: Path, set_name: str, channels: int, image_size: int) -> tuple[np.ndarray, str]:
    """Images of one set as uint8 ``[n, C, H, W]`` and their format (``npy`` / ``files``)."""
    if not folder.is_dir():
        raise NodeDataError(f"{folder}: missing; set {set_name!r} is a row of {PRIORS_FILE} but has no folder")
    files = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    if not files:
        raise NodeDataError(f"{folder}: empty; set {set_name!r} needs image files or one {ARRAY_FILE}")
    if any(p.name == ARRAY_FILE for p in files):
        if len(files) > 1:
            others = [p.name for p in files if p.name != ARRAY_FILE][:5]
            raise NodeDataError(f"{folder}: holds {ARRAY_FILE} and other files {others}; use one or the other")
        return _read_npy(folder / ARRAY_FILE, channels, image_size), "npy"
    for p in files:
        if p.is_dir() or p.suffix.lower() not in IMAGE_SUFFIXES:
            raise NodeDataError(
                f"{p}: not an image file of set {set_name!r}; a set folder holds only {list(IMAGE_SUFFIXES)} files "
                f"or one {ARRAY_FILE}"
            )
    return np.stack([_read_image_file(p, channels, image_size) for p in files]), "files"


def _check_meta(path: Path, class_names: Sequence[str], image_size: int, channels: int) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NodeDataError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise NodeDataError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    checks = {"class_names": list(class_names), "image_size": image_size, "channels": channels}
    for key, expected in checks.items():
        if key in meta and meta[key] != expected:
            raise NodeDataError(f"{path}: {key} = {meta[key]!r}, the run expects {expected!r}")
    return meta


def _read_test(folder: Path, num_classes: int, channels: int, image_size: int) -> tuple[np.ndarray, np.ndarray] | None:
    images, labels = folder / ARRAY_FILE, folder / LABELS_FILE
    if not images.exists() and not labels.exists():
        return None
    for have, missing in ((images, labels), (labels, images)):
        if have.exists() and not missing.exists():
            raise NodeDataError(f"{missing}: missing; the local test split needs both {ARRAY_FILE} and {LABELS_FILE}")
    x = _read_npy(images, channels, image_size)
    try:
        y = np.load(labels, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise NodeDataError(f"{labels}: unreadable .npy file ({exc})") from exc
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise NodeDataError(f"{labels}: expected integer labels [n], got dtype {y.dtype} shape {y.shape}")
    if len(y) != len(x):
        raise NodeDataError(f"{labels}: {len(y)} labels for {len(x)} images in {images}")
    bad = np.flatnonzero((y < 0) | (y >= num_classes))
    if bad.size:
        raise NodeDataError(f"{labels}: label {int(y[bad[0]])} at position {int(bad[0])} is not in 0..{num_classes - 1}")
    return x, y.astype(np.int64)


@dataclass(frozen=True)
class NodeImages:
    """The images of a validated node folder (uint8 ``[n, C, H, W]``, set order) and report."""

    report: NodeDataReport
    x: np.ndarray
    set_index: np.ndarray
    test: tuple[np.ndarray, np.ndarray] | None


def read_node_dir(path: str | Path, class_names: Sequence[str], image_size: int, channels: int) -> NodeImages:
    """Read and check a node folder (read-only), returning its images and report.

    Parameters
    ----------
    path : str or Path
        The node's folder (see the module doc for its layout).
    class_names : sequence of str
        The run's K class names; the ``priors.csv`` header must list them in this order.
    image_size : int
        Expected image height = width (pixels).
    channels : int
        Expected image channels C.

    Returns
    -------
    NodeImages
        ``x`` uint8 ``[n_c, C, H, W]`` (sets concatenated in ``priors.csv`` order),
        ``set_index`` int64 ``[n_c]``, optional ``test`` (uint8 images, int64 labels).

    Raises
    ------
    NodeDataError
        For every problem, naming the file, CSV line or value.
    """
    root = Path(path).expanduser()
    if not root.exists():
        raise NodeDataError(f"{root}: node data folder does not exist")
    if not root.is_dir():
        raise NodeDataError(f"{root}: is not a folder")
    root = root.resolve()
    _check_meta(root / META_FILE, class_names, image_size, channels)
    set_names, priors = _read_priors(root / PRIORS_FILE, class_names)
    sets_dir = root / SETS_DIR
    if not sets_dir.is_dir():
        raise NodeDataError(f"{sets_dir}: missing; it must hold one folder per set of {root / PRIORS_FILE}")
    extra = sorted(p.name for p in sets_dir.iterdir() if not p.name.startswith(".") and p.name not in set_names)
    if extra:
        raise NodeDataError(
            f"{sets_dir}: folder(s) {extra} have no row in {root / PRIORS_FILE}; add their priors or move them away"
        )
    images, formats = [], []
    for name in set_names:
        arr, fmt = _read_set(sets_dir / name, name, channels, image_size)
        images.append(arr)
        formats.append(fmt)
    sizes = tuple(len(a) for a in images)
    test = _read_test(root / TEST_DIR, len(class_names), channels, image_size)
    present = np.any(priors > 0, axis=0)
    report = NodeDataReport(
        path=root,
        set_names=tuple(set_names),
        set_sizes=sizes,
        set_formats=tuple(formats),
        priors=priors,
        class_names=tuple(class_names),
        channels=channels,
        image_size=image_size,
        condition_number=condition_number(priors, present),
        absent_classes=tuple(c for c, p in zip(class_names, present) if not p),
        num_test=0 if test is None else len(test[1]),
    )
    set_index = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    return NodeImages(report, np.concatenate(images), set_index, test)


def validate_node_dir(path: str | Path, class_names: Sequence[str], image_size: int, channels: int) -> NodeDataReport:
    """Check a node folder against the run (read-only) and describe it.

    Same parameters and errors as :func:`read_node_dir`; returns only the
    :class:`NodeDataReport`.
    """
    return read_node_dir(path, class_names, image_size, channels).report


def load_node_dir(
    path: str | Path,
    *,
    class_names: Sequence[str],
    image_size: int,
    channels: int,
    mean: Sequence[float],
    std: Sequence[float],
    test_prior: np.ndarray,
) -> ClientData:
    """Validate a node folder and turn it into the client's training data.

    Parameters
    ----------
    path : str or Path
        The node's folder.
    class_names, image_size, channels
        The run's dataset facts (see :func:`read_node_dir`).
    mean, std : sequence of float
        Per-channel normalisation constants of the run's dataset (``len == channels``).
    test_prior : np.ndarray
        float ``[K]`` test class prior pi (a run setting).

    Returns
    -------
    ClientData
        ``x`` float32 ``[n_c, C, H, W]`` normalised, ``set_index`` int64 ``[n_c]``,
        ``priors`` ``[M_c, K]`` from ``priors.csv``, and the optional local test split.

    Raises
    ------
    NodeDataError
        See :func:`read_node_dir`.
    """
    from fedul_flwr.data.client_data import ClientData
    from fedul_flwr.data.datasets import normalize

    node = read_node_dir(path, class_names, image_size, channels)
    test_x = test_y = None
    if node.test is not None:
        test_x = normalize(torch.from_numpy(node.test[0]), mean, std)
        test_y = torch.from_numpy(node.test[1])
    return ClientData(
        x=normalize(torch.from_numpy(node.x), mean, std),
        set_index=torch.from_numpy(node.set_index),
        priors=node.report.priors,
        test_prior=np.asarray(test_prior, dtype=np.float64),
        class_names=tuple(class_names),
        test_x=test_x,
        test_y=test_y,
    )


# --------------------------------------------------------------------------- writing


def _to_nhwc(images: torch.Tensor | np.ndarray) -> np.ndarray:
    arr = images.numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    if arr.dtype != np.uint8 or arr.ndim != 4:
        raise ValueError(f"images must be uint8 [n, C, H, W], got {arr.dtype} {arr.shape}")
    arr = np.moveaxis(arr, 1, 3)  # [n, H, W, C]
    return arr[..., 0] if arr.shape[3] == 1 else arr


def write_node_dir(
    out: str | Path,
    images: torch.Tensor | np.ndarray,
    usets: USets,
    class_names: Sequence[str],
    *,
    image_format: str = "npy",
    max_set_size: int | None = None,
    test: tuple[torch.Tensor | np.ndarray, torch.Tensor | np.ndarray] | None = None,
    meta: dict[str, Any] | None = None,
    rng: np.random.Generator | None = None,
) -> Path:
    """Write one simulated node's folder from a labeled dataset and its U sets.

    Parameters
    ----------
    out : str or Path
        Folder to create; must not exist or be empty (nothing is overwritten).
    images : torch.Tensor or np.ndarray
        uint8 ``[N, C, H, W]``: the images ``usets.indices`` point into.
    usets : USets
        The node's sets; set m becomes ``sets/set-<m>`` with row m of ``usets.priors``.
    class_names : sequence of str
        The K class names (CSV header).
    image_format : str
        ``"npy"`` (one ``images.npy`` per set) or ``"png"`` (one PNG file per image).
    max_set_size : int or None
        Keep at most this many images per set, drawn uniformly at random with ``rng``
        (a random subset of a set still follows the set's class priors): tiny demo nodes.
    test : (images, labels) or None
        Optional labeled local test split: uint8 ``[n_t, C, H, W]`` and int ``[n_t]``.
    meta : dict or None
        Extra entries for ``meta.json`` (e.g. ``{"dataset": "mnist-sample"}``).
    rng : np.random.Generator or None
        Randomness of ``max_set_size`` (default: seed 0).

    Returns
    -------
    Path
        The written folder.

    Raises
    ------
    NodeDataError
        If ``out`` exists and is not an empty folder.
    ValueError
        On a bad ``image_format``, ``max_set_size`` or image array.
    """
    if image_format not in ("npy", "png"):
        raise ValueError(f"image_format must be 'npy' or 'png', got {image_format!r}")
    if max_set_size is not None and max_set_size < 1:
        raise ValueError(f"max_set_size must be >= 1, got {max_set_size}")
    root = Path(out).expanduser()
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise NodeDataError(f"{root}: exists and is not an empty folder; refusing to overwrite it")
    rng = rng or np.random.default_rng(0)
    all_images = images if isinstance(images, torch.Tensor) else torch.from_numpy(np.asarray(images))
    _, channels, height, _ = all_images.shape
    width = max(2, len(str(usets.num_sets - 1)))
    set_names = [f"set-{m:0{width}d}" for m in range(usets.num_sets)]
    (root / SETS_DIR).mkdir(parents=True, exist_ok=True)
    for name, idx in zip(set_names, usets.indices):
        idx = np.array(idx, dtype=np.int64)  # a copy: the caller's may be read-only
        if max_set_size is not None and len(idx) > max_set_size:
            idx = np.sort(rng.choice(idx, size=max_set_size, replace=False))
        folder = root / SETS_DIR / name
        folder.mkdir()
        chosen = all_images[torch.from_numpy(idx)]
        if image_format == "npy":
            np.save(folder / ARRAY_FILE, _to_nhwc(chosen))
        else:
            from PIL import Image

            for i, img in enumerate(_to_nhwc(chosen)):
                Image.fromarray(img).save(folder / f"{i:06d}.png")
    with (root / PRIORS_FILE).open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["set", *class_names])
        for name, row in zip(set_names, usets.priors):
            writer.writerow([name, *(repr(float(v)) for v in row)])
    if test is not None:
        tx, ty = test
        (root / TEST_DIR).mkdir()
        np.save(root / TEST_DIR / ARRAY_FILE, _to_nhwc(torch.as_tensor(tx)))
        np.save(root / TEST_DIR / LABELS_FILE, np.asarray(torch.as_tensor(ty), dtype=np.int64))
    info = {"class_names": list(class_names), "image_size": int(height), "channels": int(channels), **(meta or {})}
    (root / META_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return root
