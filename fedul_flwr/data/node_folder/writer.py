"""Writing a deployed node's data folder (layout: :mod:`fedul_flwr.data.node_folder.layout`)
from a labeled dataset and simulated U sets, optionally with a labeled part, plain unlabeled
images, a class prior and a local test split (demos, tests, ``fedul node-data write``); it
refuses to overwrite anything.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from fedul_flwr.data.node_folder.layout import (
    ARRAY_FILE,
    CLASS_PRIOR_FILE,
    LABELED_DIR,
    LABELS_FILE,
    META_FILE,
    PRIORS_FILE,
    SETS_DIR,
    TEST_DIR,
    UNLABELED_DIR,
    NodeDataError,
)
from fedul_flwr.data.usets import USets
from fedul_flwr.rng import numpy_from_seed

__all__ = ["write_node_dir"]


def _to_nhwc(images: torch.Tensor | np.ndarray) -> np.ndarray:
    arr = images.numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    if arr.dtype != np.uint8 or arr.ndim != 4:
        raise ValueError(f"images must be uint8 [n, C, H, W], got {arr.dtype} {arr.shape}")
    arr = np.moveaxis(arr, 1, 3)  # [n, H, W, C]
    return arr[..., 0] if arr.shape[3] == 1 else arr


def _write_png(folder: Path, images: torch.Tensor | np.ndarray) -> None:
    """One PNG file per image (``000000.png``, ...) in ``folder`` (created)."""
    folder.mkdir(parents=True)
    for i, img in enumerate(_to_nhwc(torch.as_tensor(images))):
        Image.fromarray(img).save(folder / f"{i:06d}.png")


def _write_labeled(folder: Path, pair: tuple[torch.Tensor | np.ndarray, torch.Tensor | np.ndarray],
                   class_names: Sequence[str] = (), image_format: str = "npy") -> None:  # fmt: skip
    """``folder/images.npy`` (uint8 ``[n, H, W(, C)]``) and ``folder/labels.npy`` (int64 ``[n]``),
    or with ``image_format="png"`` one class folder of PNG files per class that occurs."""
    x, y = pair
    labels = np.asarray(torch.as_tensor(y), dtype=np.int64)
    images = _to_nhwc(torch.as_tensor(x))
    if labels.shape != images.shape[:1]:
        raise ValueError(f"{folder}: {labels.shape} labels for {len(images)} images")
    if image_format == "png":
        for k in np.unique(labels):
            _write_png(folder / class_names[int(k)], torch.as_tensor(x)[torch.from_numpy(np.flatnonzero(labels == k))])
        return
    folder.mkdir()
    np.save(folder / ARRAY_FILE, images)
    np.save(folder / LABELS_FILE, labels)


def write_node_dir(
    out: str | Path,
    images: torch.Tensor | np.ndarray,
    usets: USets | None,
    class_names: Sequence[str],
    *,
    unlabeled: torch.Tensor | np.ndarray | None = None,
    class_prior: np.ndarray | None = None,
    image_format: str = "npy",
    max_set_size: int | None = None,
    labeled: tuple[torch.Tensor | np.ndarray, torch.Tensor | np.ndarray] | None = None,
    test: tuple[torch.Tensor | np.ndarray, torch.Tensor | np.ndarray] | None = None,
    meta: dict[str, Any] | None = None,
    rng: np.random.Generator | None = None,
) -> Path:
    """Write one simulated node's folder: U sets, or a positive-unlabeled node (labeled
    positives, plain unlabeled images, class prior).

    Parameters
    ----------
    out : str or Path
        Folder to create; must not exist or be empty (nothing is overwritten).
    images : torch.Tensor or np.ndarray
        uint8 ``[N, C, H, W]``: the images ``usets.indices`` point into.
    usets : USets or None
        The node's sets; set m becomes ``sets/set-<m>`` with row m of ``usets.priors``.
        ``None``: no U sets (then ``unlabeled`` and/or ``labeled`` give the data).
    class_names : sequence of str
        The K class names (CSV header).
    unlabeled : torch.Tensor or np.ndarray or None
        Plain unlabeled images ``unlabeled/`` (uint8 ``[n_u, C, H, W]``); only without U sets.
    class_prior : np.ndarray or None
        ``[K]`` class prior written to ``class_prior.csv``.
    image_format : str
        ``"npy"`` (one ``images.npy`` per set or part) or ``"png"`` (one PNG file per image:
        in each set folder, in ``unlabeled/`` and in one ``labeled/<class name>/`` folder per
        class; the local test split stays ``images.npy`` + ``labels.npy``).
    max_set_size : int or None
        Keep at most this many images per set, drawn uniformly at random with ``rng``
        (a random subset of a set still follows the set's class priors): tiny demo nodes.
        Does not apply to ``labeled`` or ``test``.
    labeled : (images, labels) or None
        Optional labeled part ``labeled/``: uint8 ``[n_l, C, H, W]`` and int ``[n_l]``.
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
        On a bad ``image_format``, ``max_set_size`` or image / label array.
    """
    if image_format not in ("npy", "png"):
        raise ValueError(f"image_format must be 'npy' or 'png', got {image_format!r}")
    if max_set_size is not None and max_set_size < 1:
        raise ValueError(f"max_set_size must be >= 1, got {max_set_size}")
    root = Path(out).expanduser()
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise NodeDataError(f"{root}: exists and is not an empty folder; refusing to overwrite it")
    if usets is not None and unlabeled is not None:
        raise ValueError("a node holds either U sets or plain unlabeled images, not both")
    rng = rng or numpy_from_seed(0)
    all_images = images if isinstance(images, torch.Tensor) else torch.from_numpy(np.asarray(images))
    _, channels, height, _ = all_images.shape
    root.mkdir(parents=True, exist_ok=True)
    if usets is not None:
        _write_usets(root, all_images, usets, class_names, image_format, max_set_size, rng)
    if unlabeled is not None and image_format == "png":
        _write_png(root / UNLABELED_DIR, unlabeled)
    elif unlabeled is not None:
        (root / UNLABELED_DIR).mkdir()
        np.save(root / UNLABELED_DIR / ARRAY_FILE, _to_nhwc(torch.as_tensor(unlabeled)))
    if class_prior is not None:
        with (root / CLASS_PRIOR_FILE).open("w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows([list(class_names), [repr(float(v)) for v in class_prior]])
    if labeled is not None:
        _write_labeled(root / LABELED_DIR, labeled, class_names, image_format)
    if test is not None:
        _write_labeled(root / TEST_DIR, test)
    info = {"class_names": list(class_names), "image_size": int(height), "channels": int(channels), **(meta or {})}
    (root / META_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return root


def _write_usets(
    root: Path, all_images: torch.Tensor, usets: USets, class_names: Sequence[str], image_format: str,
    max_set_size: int | None, rng: np.random.Generator,
) -> None:  # fmt: skip
    """``sets/set-<m>/`` and ``priors.csv`` of ``usets`` under ``root``."""
    width = max(2, len(str(usets.num_sets - 1)))
    set_names = [f"set-{m:0{width}d}" for m in range(usets.num_sets)]
    (root / SETS_DIR).mkdir(parents=True, exist_ok=True)
    for name, idx in zip(set_names, usets.indices):
        idx = np.array(idx, dtype=np.int64)  # a copy: the caller's may be read-only
        if max_set_size is not None and len(idx) > max_set_size:
            idx = np.sort(rng.choice(idx, size=max_set_size, replace=False))
        folder = root / SETS_DIR / name
        chosen = all_images[torch.from_numpy(idx)]
        if image_format == "npy":
            folder.mkdir()
            np.save(folder / ARRAY_FILE, _to_nhwc(chosen))
        else:
            _write_png(folder, chosen)
    with (root / PRIORS_FILE).open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["set", *class_names])
        for name, row in zip(set_names, usets.priors):
            writer.writerow([name, *(repr(float(v)) for v in row)])
