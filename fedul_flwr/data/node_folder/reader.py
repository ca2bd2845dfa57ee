"""Reading and checking a deployed node's data folder (layout:
:mod:`fedul_flwr.data.node_folder.layout`), read-only: :func:`read_node_dir`,
:func:`validate_node_dir` (the report only) and :func:`load_node_dir` (a
:class:`~fedul_flwr.data.client_data.ClientData`). Every problem raises
:class:`~fedul_flwr.data.node_folder.layout.NodeDataError` naming the file, the CSV line or
the value.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedul_flwr.data.client_data import SEMI_SUPERVISED_PARTS, ClientData, LabeledImages, USetIndex
from fedul_flwr.data.images import (
    ImageError,
    ImageSpec,
    Problems,
    decode_array,
    decode_files,
    image_files,
    read_image_folder,
)
from fedul_flwr.data.node_folder.layout import (
    ARRAY_FILE,
    CLASS_PRIOR_FILE,
    LABELED_DIR,
    LABELS_FILE,
    LAYOUTS,
    META_FILE,
    PRIOR_ROW_TOLERANCE,
    PRIORS_FILE,
    SETS_DIR,
    TEST_DIR,
    UNLABELED_DIR,
    NodeDataError,
    NodeDataReport,
)
from fedul_flwr.data.usets import PriorMatrixError, condition_number, validate_prior_matrix

__all__ = ["NodeImages", "load_node_dir", "read_node_dir", "validate_node_dir"]


def _read_priors(path: Path, class_names: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """Parse and check ``priors.csv``: header, one row per set, K finite non-negative
    priors per row summing to 1 (tolerance). Returns (set names, ``[M, K]`` float64)."""
    if not path.is_file():
        raise NodeDataError(f"{path}: missing or not a file; U sets need a {PRIORS_FILE} (header 'set,<class names>')")
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


def _read_class_prior(path: Path, class_names: Sequence[str]) -> np.ndarray:
    """``class_prior.csv``: header = the K class names, one row of K finite values in [0, 1],
    not all zero.

    Raises
    ------
    NodeDataError
        On a header that is not the run's class names, not exactly one data row, a value
        that is not a finite number or lies outside [0, 1], or a row of zeros (names the
        file, line and value).
    """
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = [row for row in csv.reader(fh) if any(cell.strip() for cell in row)]
    except (OSError, UnicodeDecodeError) as exc:
        raise NodeDataError(f"{path}: cannot read ({exc})") from exc
    if not rows or [c.strip() for c in rows[0]] != list(class_names):
        got = rows[0] if rows else "nothing"
        raise NodeDataError(f"{path}: line 1: header must be the run's class names {list(class_names)}, got {got}")
    if len(rows) != 2:
        raise NodeDataError(f"{path}: needs exactly one row of {len(class_names)} class priors, found {len(rows) - 1}")
    row = rows[1]
    if len(row) != len(class_names):
        raise NodeDataError(f"{path}: line 2: {len(row)} values for {len(class_names)} classes")
    values = []
    for name, cell in zip(class_names, row, strict=True):
        try:
            value = float(cell)
        except ValueError:
            raise NodeDataError(f"{path}: line 2, class {name!r}: {cell!r} is not a number") from None
        if not math.isfinite(value):
            raise NodeDataError(f"{path}: line 2, class {name!r}: {cell.strip()!r} is not a finite number")
        if not 0.0 <= value <= 1.0:
            raise NodeDataError(f"{path}: line 2, class {name!r}: {value} is outside [0, 1]")
        values.append(value)
    if not any(values):
        raise NodeDataError(f"{path}: line 2: every class prior is 0; the positive-unlabeled risk needs the share "
                            "pi of each positive class among the node's images")  # fmt: skip
    return np.asarray(values, dtype=np.float64)


def _images(call: Any, *args: Any) -> np.ndarray:
    """``call(*args)`` of :mod:`fedul_flwr.data.images`, its :class:`ImageError` as a
    :class:`NodeDataError` with the same one-line message."""
    try:
        return call(*args)
    except ImageError as exc:
        raise NodeDataError(str(exc)) from None


def _load_npy(path: Path) -> np.ndarray:
    """The array in the ``.npy`` file ``path``, never unpickled.

    Raises
    ------
    NodeDataError
        If the file does not start with NumPy's ``.npy`` magic bytes (another kind of file
        under a ``.npy`` name), or is truncated or unreadable; naming the file.
    """
    try:
        with open(path, "rb") as handle:
            npy = handle.read(len(np.lib.format.MAGIC_PREFIX)) == np.lib.format.MAGIC_PREFIX
        if npy:
            return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise NodeDataError(f"{path}: unreadable .npy file ({exc})") from exc
    raise NodeDataError(f"{path}: not a .npy file (it does not begin with NumPy's .npy header; write it with numpy.save)")


def _read_npy(path: Path, spec: ImageSpec) -> np.ndarray:
    arr = _images(decode_array, _load_npy(path), str(path), spec)
    if len(arr) == 0:
        raise NodeDataError(f"{path}: holds no images")
    return arr


def _read_files(listing: Any, spec: ImageSpec) -> np.ndarray:
    """The image files ``listing(problems)`` returns, as uint8 ``[n, C, S, S]``
    (:func:`fedul_flwr.data.images.decode_files`): the bad entries the listing notes and the
    files that fail to decode are named together in one :class:`NodeDataError`."""
    problems = Problems()
    files = listing(problems)
    images = decode_files([(p, str(p)) for p in files], spec, problems)
    _images(problems.raise_any)
    return images


def _read_set(folder: Path, set_name: str, spec: ImageSpec) -> tuple[np.ndarray, str]:
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
        return _read_npy(folder / ARRAY_FILE, spec), "npy"
    return _read_files(lambda problems: image_files(folder, f"set {set_name!r}", problems, f" or one {ARRAY_FILE}"),
                       spec), "files"  # fmt: skip


def _read_image_files(folder: Path, what: str, spec: ImageSpec) -> np.ndarray:
    """The image files of ``folder`` (sorted by name, hidden files ignored) as uint8
    ``[n, C, H, W]``; a folder without image or holding another file is an error."""
    return _read_files(lambda problems: image_files(folder, what, problems), spec)


def _read_class_folders(folder: Path, class_names: Sequence[str], spec: ImageSpec) -> tuple[np.ndarray, np.ndarray]:
    """An image folder ``<folder>/<class name>/<image files>`` as uint8 ``[n, C, S, S]`` images
    and int64 ``[n]`` labels (the class's index among ``class_names``), read by the same reader
    and decoder as an ``hf:`` image folder (:mod:`fedul_flwr.data.images`).

    Raises
    ------
    NodeDataError
        Naming the entry: a folder not named as a class of the run; or every bad entry at once:
        a file beside the class folders, a class folder without image, a file that is no
        image, unreadable or of the wrong size.
    """
    problems = Problems()
    files, labels = _images(read_image_folder, folder, class_names, False, problems).splits["train"]
    images = decode_files([(p, str(p)) for p in files], spec, problems)
    _images(problems.raise_any)
    return images, labels


def _is_image_folder(root: Path, reserved: tuple[str, ...] = ()) -> bool:
    """True if ``root`` holds only (non-hidden) folders, none named as in ``reserved``,
    besides an optional ``meta.json``."""
    entries = [p for p in root.iterdir() if not p.name.startswith(".") and p.name != META_FILE]
    return bool(entries) and all(p.is_dir() and p.name not in reserved for p in entries)


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


def _read_labeled(folder: Path, num_classes: int, spec: ImageSpec, what: str) -> tuple[np.ndarray, np.ndarray] | None:
    """``images.npy`` + ``labels.npy`` of ``folder`` (the local test split or the labeled part).

    Returns
    -------
    (np.ndarray, np.ndarray) or None
        uint8 ``[n, C, H, W]`` images and int64 ``[n]`` labels; ``None`` if neither file exists.

    Raises
    ------
    NodeDataError
        If only one of the two files exists, either is unreadable or mis-shaped, the counts
        differ, or a label is outside ``0..K-1`` (naming the file and the position).
    """
    images, labels = folder / ARRAY_FILE, folder / LABELS_FILE
    if not images.exists() and not labels.exists():
        return None
    for have, missing in ((images, labels), (labels, images)):
        if have.exists() and not missing.exists():
            raise NodeDataError(f"{missing}: missing; {what} needs both {ARRAY_FILE} and {LABELS_FILE}")
    x = _read_npy(images, spec)
    y = _load_npy(labels)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise NodeDataError(f"{labels}: expected integer labels [n], got dtype {y.dtype} shape {y.shape}")
    if len(y) != len(x):
        raise NodeDataError(f"{labels}: {len(y)} labels for {len(x)} images in {images}")
    bad = np.flatnonzero((y < 0) | (y >= num_classes))
    if bad.size:
        raise NodeDataError(f"{labels}: label {int(y[bad[0]])} at position {int(bad[0])} is not in 0..{num_classes - 1}")
    return x, y.astype(np.int64)


def _check_part_folder(folder: Path, allowed: tuple[str, ...], what: str) -> None:
    """``folder`` is a folder holding only ``allowed`` files (hidden files ignored)."""
    if not folder.is_dir():
        raise NodeDataError(f"{folder}: is not a folder; {what} is a folder holding {list(allowed)}")
    stray = sorted(p.name for p in folder.iterdir() if not p.name.startswith(".") and p.name not in allowed)
    if stray:
        raise NodeDataError(f"{folder}: holds {stray[:5]}; {what} holds only {list(allowed)}")


@dataclass(frozen=True)
class NodeImages:
    """The data of a validated node folder and its report.

    Attributes
    ----------
    report : NodeDataReport
        The description.
    unlabeled : np.ndarray or None
        uint8 ``[n_u, C, H, W]``: the U sets' images concatenated in ``priors.csv`` row order,
        or the plain ``unlabeled/`` images; ``None`` if the node has neither.
    set_index : np.ndarray or None
        int64 ``[n_u]`` set index m of every unlabeled image; ``None`` without U sets.
    labeled : (np.ndarray, np.ndarray) or None
        uint8 ``[n_l, C, H, W]`` images and int64 ``[n_l]`` labels of ``labeled/``.
    test : (np.ndarray, np.ndarray) or None
        The local test split, same types.
    """

    report: NodeDataReport
    unlabeled: np.ndarray | None
    set_index: np.ndarray | None
    labeled: tuple[np.ndarray, np.ndarray] | None
    test: tuple[np.ndarray, np.ndarray] | None


def _read_usets(root: Path, class_names: Sequence[str], spec: ImageSpec) -> tuple[list[str], np.ndarray, list[np.ndarray], list[str]]:
    """``priors.csv`` and ``sets/``: (set names, priors ``[M, K]``, images per set, formats)."""
    set_names, priors = _read_priors(root / PRIORS_FILE, class_names)
    sets_dir = root / SETS_DIR
    if not sets_dir.is_dir():
        raise NodeDataError(f"{sets_dir}: is not a folder; it must hold one folder per set of {root / PRIORS_FILE}")
    extra = sorted(p.name for p in sets_dir.iterdir() if not p.name.startswith(".") and p.name not in set_names)
    if extra:
        raise NodeDataError(
            f"{sets_dir}: folder(s) {extra} have no row in {root / PRIORS_FILE}; add their priors or move them away"
        )
    images, formats = [], []
    for name in set_names:
        arr, fmt = _read_set(sets_dir / name, name, spec)
        images.append(arr)
        formats.append(fmt)
    return set_names, priors, images, formats


def read_node_dir(path: str | Path, class_names: Sequence[str], image_size: int, channels: int,
                  resize: bool = False) -> NodeImages:  # fmt: skip
    """Read and check a node folder (read-only), returning its data and report.

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
    resize : bool
        Resize every image to ``image_size x image_size`` (the run set ``image-size``), as
        the run's own dataset is; else an image of another size is an error.

    Returns
    -------
    NodeImages
        ``unlabeled`` uint8 ``[n_u, C, H, W]`` (U sets concatenated in ``priors.csv`` order,
        or ``unlabeled/``), ``set_index`` int64 ``[n_u]`` (U sets only), optional
        ``labeled`` and ``test`` (uint8 images, int64 labels).

    Raises
    ------
    NodeDataError
        For every problem, naming the file, CSV line or value; in particular when
        ``priors.csv`` and ``sets/`` do not come together, when ``unlabeled/`` comes with U
        sets, or when the folder holds none of the three layouts of :data:`LAYOUTS`.
    """
    root = Path(path).expanduser()
    if not root.exists():
        raise NodeDataError(f"{root}: node data folder does not exist")
    if not root.is_dir():
        raise NodeDataError(f"{root}: is not a folder")
    root = root.resolve()
    _check_meta(root / META_FILE, class_names, image_size, channels)
    spec = ImageSpec(channels, image_size, resize)

    # which layouts are there: decided on names alone, before reading any data
    priors_path, sets_dir = root / PRIORS_FILE, root / SETS_DIR
    labeled_dir, unlabeled_dir = root / LABELED_DIR, root / UNLABELED_DIR
    has_usets = priors_path.exists() or sets_dir.exists()
    if has_usets and not priors_path.exists():
        raise NodeDataError(
            f"{priors_path}: missing; {sets_dir} holds U sets, which need a {PRIORS_FILE} "
            "(header 'set,<class names>', one row of class priors per set)"
        )
    if has_usets and not sets_dir.exists():
        raise NodeDataError(f"{sets_dir}: missing; it must hold one folder per set of {priors_path}")
    if has_usets and unlabeled_dir.exists():
        raise NodeDataError(
            f"{unlabeled_dir} and {sets_dir}: a node holds either plain unlabeled images or U sets "
            f"({priors_path} + {sets_dir}), not both; the 'unlabeled' part would be ambiguous"
        )
    image_folder = not (has_usets or labeled_dir.exists() or unlabeled_dir.exists()) and _is_image_folder(root, (TEST_DIR,))
    if not (has_usets or labeled_dir.exists() or unlabeled_dir.exists() or image_folder):
        raise NodeDataError(
            f"{root}: holds no training data; a node folder needs at least one of: " + "; ".join(LAYOUTS)
        )

    num_classes = len(class_names)
    unlabeled = set_index = None
    set_names: list[str] = []
    formats: list[str] = []
    sizes: tuple[int, ...] = ()
    priors = np.zeros((0, num_classes), dtype=np.float64)
    cond = math.nan
    absent: tuple[str, ...] = ()
    if has_usets:
        set_names, priors, images, formats = _read_usets(root, class_names, spec)
        sizes = tuple(len(a) for a in images)
        unlabeled = np.concatenate(images)
        set_index = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        present = np.any(priors > 0, axis=0)
        cond = condition_number(priors, present)
        absent = tuple(c for c, p in zip(class_names, present) if not p)
    num_unlabeled = 0
    if unlabeled_dir.exists():
        what = f"the plain unlabeled part {UNLABELED_DIR}/"
        has_files = unlabeled_dir.is_dir() and any(not p.name.startswith(".") for p in unlabeled_dir.iterdir())
        if not has_files and unlabeled_dir.is_dir():
            raise NodeDataError(f"{unlabeled_dir / ARRAY_FILE}: missing; {unlabeled_dir} must hold one {ARRAY_FILE} "
                                "or image files")  # fmt: skip
        if has_files and not (unlabeled_dir / ARRAY_FILE).exists():
            unlabeled = _read_image_files(unlabeled_dir, what, spec)
        else:
            _check_part_folder(unlabeled_dir, (ARRAY_FILE,), what)
            unlabeled = _read_npy(unlabeled_dir / ARRAY_FILE, spec)
        num_unlabeled = len(unlabeled)
    labeled = None
    if image_folder:
        labeled = _read_class_folders(root, class_names, spec)
    if labeled_dir.exists():
        what = f"the labeled part {LABELED_DIR}/"
        if labeled_dir.is_dir() and _is_image_folder(labeled_dir):
            labeled = _read_class_folders(labeled_dir, class_names, spec)
        else:
            _check_part_folder(labeled_dir, (ARRAY_FILE, LABELS_FILE), what)
            labeled = _read_labeled(labeled_dir, num_classes, spec, what)
        if labeled is None:
            raise NodeDataError(f"{labeled_dir}: empty; {what} needs {ARRAY_FILE} and {LABELS_FILE}, or one "
                                "folder of image files per class")  # fmt: skip
    test = _read_labeled(root / TEST_DIR, num_classes, spec, "the local test split")
    prior_path = root / CLASS_PRIOR_FILE
    class_prior = _read_class_prior(prior_path, class_names) if prior_path.exists() else None
    positives = () if labeled is None else tuple(class_names[c] for c in np.unique(labeled[1]))
    report = NodeDataReport(
        path=root,
        set_names=tuple(set_names),
        set_sizes=sizes,
        set_formats=tuple(formats),
        priors=priors,
        class_names=tuple(class_names),
        channels=channels,
        image_size=image_size,
        condition_number=cond,
        absent_classes=absent,
        num_test=0 if test is None else len(test[1]),
        num_labeled=0 if labeled is None else len(labeled[1]),
        num_unlabeled=num_unlabeled,
        positive_classes=positives,
        class_prior=class_prior,
    )
    return NodeImages(report, unlabeled, set_index, labeled, test)


def validate_node_dir(path: str | Path, class_names: Sequence[str], image_size: int, channels: int,
                      resize: bool = False) -> NodeDataReport:  # fmt: skip
    """Check a node folder against the run (read-only) and describe it.

    Same parameters and errors as :func:`read_node_dir`; returns only the
    :class:`NodeDataReport`.
    """
    return read_node_dir(path, class_names, image_size, channels, resize).report


def load_node_dir(
    path: str | Path,
    *,
    class_names: Sequence[str],
    image_size: int,
    channels: int,
    mean: Sequence[float],
    std: Sequence[float],
    resize: bool = False,
    flip: bool = False,
) -> ClientData:
    """Validate a node folder and turn it into the client's data.

    Parameters
    ----------
    path : str or Path
        The node's folder.
    class_names, image_size, channels
        The run's dataset facts (see :func:`read_node_dir`).
    mean, std : sequence of float
        Per-channel normalisation constants of the run's dataset (``len == channels``),
        stored in the container (applied per batch, not here).
    resize : bool
        Resize every image to the run's size (the run set ``image-size``).
    flip : bool
        Whether augmentation may mirror the images (the run dataset's ``DatasetInfo.flip``).

    Returns
    -------
    ClientData
        ``node`` = the folder path; uint8 images throughout: ``unlabeled`` ``[n_u, C, H, W]``
        and ``usets`` (set index int64 ``[n_u]``, priors ``[M_c, K]`` from ``priors.csv``)
        when the node has U sets, ``unlabeled`` alone for ``unlabeled/``, ``labeled`` and
        ``positive_classes`` (the classes of its labels) for ``labeled/``, ``class_prior``
        for ``class_prior.csv``, ``test`` for ``test/``. A node of labeled and plain unlabeled
        images only (the semi-supervised layout, either part may be absent) marks both parts
        optional: a method requiring the absent one sits the round out on it.

    Raises
    ------
    NodeDataError
        See :func:`read_node_dir`.
    """
    node = read_node_dir(path, class_names, image_size, channels, resize)

    def labeled(pair: tuple[np.ndarray, np.ndarray] | None) -> LabeledImages | None:
        return None if pair is None else LabeledImages(torch.from_numpy(pair[0]), torch.from_numpy(pair[1]))

    return ClientData(
        node=str(node.report.path),
        class_names=tuple(class_names),
        mean=tuple(float(m) for m in mean),
        std=tuple(float(s) for s in std),
        labeled=labeled(node.labeled),
        unlabeled=None if node.unlabeled is None else torch.from_numpy(node.unlabeled),
        usets=None
        if node.set_index is None
        else USetIndex(torch.from_numpy(node.set_index), node.report.priors),
        positive_classes=None if node.labeled is None else tuple(int(c) for c in np.unique(node.labeled[1])),
        class_prior=node.report.class_prior,
        test=labeled(node.test),
        optional_parts=SEMI_SUPERVISED_PARTS if node.set_index is None and node.report.class_prior is None else frozenset(),
        flip=flip,
    )
