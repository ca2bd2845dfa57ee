"""Build the embedded MNIST sample ``fedul_flwr/assets/mnist_sample.npz``.

Loads real MNIST through torchvision (via :func:`fedul_flwr.data.datasets.load_dataset`,
so a read-only root holding only the original ``.gz`` files works offline), then keeps

* a class-stratified random subset of exactly ``--train-size`` of the 60k training
  images (per-class counts proportional to MNIST's class frequencies, largest-remainder
  rounding, deterministic from ``--seed``), in their original order, and
* all 10k test images.

The ``.npz`` holds ``train_x`` uint8 ``[N, 28, 28]``, ``train_y`` uint8 ``[N]``,
``test_x`` uint8 ``[10000, 28, 28]``, ``test_y`` uint8 ``[10000]`` and ``meta``, a 0-d
string array with JSON provenance (md5s of the four source ``.gz`` files, seed, sizes,
selected training indices' digest).

Usage::

    python scripts/build_mnist_sample.py --mnist-root /path/to/torchvision-root
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fedul_flwr.data.datasets import load_dataset  # noqa: E402

GZ_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)


def stratified_indices(labels: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Pick ``size`` indices with per-class counts proportional to class frequencies.

    Parameters
    ----------
    labels : np.ndarray
        Integer labels, shape ``[N]``.
    size : int
        Number of indices to return, ``0 < size <= N``.
    seed : int
        Seed of the ``numpy.random.default_rng`` generator.

    Returns
    -------
    np.ndarray
        Sorted ``int64`` indices, shape ``[size]``.
    """
    n = labels.shape[0]
    if not 0 < size <= n:
        raise ValueError(f"train size must be in 1..{n}, got {size}")
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * size / n
    take = np.floor(exact).astype(np.int64)
    # Largest remainder: hand out the leftover slots to the largest fractional parts.
    order = np.argsort(-(exact - take), kind="stable")
    take[order[: size - int(take.sum())]] += 1
    rng = np.random.default_rng(seed)
    picked = [rng.choice(np.flatnonzero(labels == c), size=int(k), replace=False) for c, k in zip(classes, take)]
    return np.sort(np.concatenate(picked)).astype(np.int64)


def md5(path: Path) -> str:
    h = hashlib.md5()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mnist-root", required=True, help="torchvision root holding MNIST/raw/")
    ap.add_argument("--train-size", type=int, default=12000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "fedul_flwr" / "assets" / "mnist_sample.npz"))
    args = ap.parse_args(argv)

    ds = load_dataset("mnist", data_dir=args.mnist_root, download=False)
    train_x = ds.train_x[:, 0].numpy()  # [60000, 28, 28] uint8
    train_y = ds.train_y.numpy()
    idx = stratified_indices(train_y, args.train_size, args.seed)

    raw = Path(args.mnist_root).expanduser().resolve() / "MNIST" / "raw"
    sources = {f: md5(raw / f) for f in GZ_FILES if (raw / f).is_file()}
    meta = {
        "source": "MNIST (Y. LeCun, C. Cortes, C. Burges), via torchvision.datasets.MNIST",
        "source_gz_md5": sources,
        "seed": args.seed,
        "train_size": int(idx.size),
        "test_size": int(ds.test_y.numel()),
        "selection": "class-stratified (largest remainder), numpy default_rng(seed), original order",
        "train_indices_sha256": hashlib.sha256(idx.tobytes()).hexdigest(),
        "builder": "scripts/build_mnist_sample.py",
    }

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out,
        train_x=np.ascontiguousarray(train_x[idx], dtype=np.uint8),
        train_y=train_y[idx].astype(np.uint8),
        test_x=np.ascontiguousarray(ds.test_x[:, 0].numpy(), dtype=np.uint8),
        test_y=ds.test_y.numpy().astype(np.uint8),
        meta=np.array(json.dumps(meta, sort_keys=True)),
    )
    counts = np.bincount(train_y[idx], minlength=10).tolist()
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB): train {idx.size} {counts}, test {ds.test_y.numel()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
