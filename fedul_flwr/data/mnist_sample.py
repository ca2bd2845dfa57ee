"""The embedded MNIST sample (dataset ``"mnist-sample"``): a class-stratified 12k/10k subset of
MNIST shipped with the project in ``fedul_flwr/assets/mnist_sample.npz`` (built by
``scripts/build_mnist_sample.py``); it needs no ``data_dir`` and no network.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

import numpy as np
import torch

from fedul_flwr.data.image_dataset import DatasetError, ImageDataset
from fedul_flwr.data.torchvision_datasets import TORCHVISION

__all__ = ["embedded_sample_path", "load_sample"]

_DIST_NAME = "fedul-flwr"
_SAMPLE_RELPATH = "fedul_flwr/assets/mnist_sample.npz"


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


def load_sample(path: Path) -> ImageDataset:
    """The sample at ``path`` (:func:`embedded_sample_path`): ``uint8 [N, 1, 28, 28]`` images
    and ``int64 [N]`` labels of both splits, with MNIST's class names and constants.

    Raises
    ------
    DatasetError
        If the file cannot be read.
    """
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

    mnist = TORCHVISION["mnist"].info
    return ImageDataset(
        name="mnist-sample",
        train_x=images(arrays["train_x"]),
        train_y=labels(arrays["train_y"]),
        test_x=images(arrays["test_x"]),
        test_y=labels(arrays["test_y"]),
        class_names=mnist.class_names,
        mean=mnist.mean,
        std=mnist.std,
    )
