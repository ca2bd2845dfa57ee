"""Tests for fedul_flwr.data.datasets.

They need no dataset files and no network: the embedded sample ships with the repo, and
the torchvision paths run on tiny fake datasets written into ``tmp_path`` (real IDX ``.gz``
files for MNIST, pickled batches in a ``.tar.gz`` for CIFAR-10). The fakes cannot match
torchvision's md5s, so the archive check ``_verify_archive`` is monkeypatched where the
extraction path itself is under test.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import stat
import tarfile
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch

from fedul_flwr.data import datasets as D
from fedul_flwr.data.datasets import (
    DATASETS,
    DatasetError,
    ImageDataset,
    embedded_sample_path,
    load_dataset,
    normalize,
)

MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """Fresh in-process cache and a private extraction cache for every test."""
    D._load_cached.cache_clear()
    monkeypatch.setenv("FEDUL_CACHE_DIR", str(tmp_path / "fedul-cache"))
    yield
    D._load_cached.cache_clear()


def _idx_bytes(arr: np.ndarray) -> bytes:
    """IDX encoding of a uint8 array: magic 0x0000 08 <ndim>, big-endian dims, data."""
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return header + np.ascontiguousarray(arr, dtype=np.uint8).tobytes()


def _write_fake_mnist(root: Path, folder: str = "MNIST", n_train: int = 20, n_test: int = 10, gz: bool = True):
    """Write a tiny MNIST-layout dataset; returns the arrays written."""
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": (np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test) % 10).astype(np.uint8),
    }
    raw = root / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name, arr in arrays.items():
        if gz:
            with gzip.open(raw / f"{name}.gz", "wb") as f:
                f.write(_idx_bytes(arr))
        else:
            (raw / name).write_bytes(_idx_bytes(arr))
    return arrays


def _all_verified(monkeypatch):
    monkeypatch.setattr(D, "_verify_archive", lambda path, md5: Path(path).is_file())


# ----------------------------------------------------------------------------- sample


def test_mnist_sample_shapes_dtypes_and_classes():
    ds = load_dataset("mnist-sample")
    assert isinstance(ds, ImageDataset)
    assert ds.name == "mnist-sample"
    assert ds.train_x.dtype == torch.uint8 and ds.test_x.dtype == torch.uint8
    assert ds.train_y.dtype == torch.int64 and ds.test_y.dtype == torch.int64
    n = ds.train_x.shape[0]
    assert ds.train_x.shape == (n, 1, 28, 28) and ds.train_y.shape == (n,)
    assert ds.test_x.shape == (10_000, 1, 28, 28) and ds.test_y.shape == (10_000,)
    assert n == 12_000
    assert ds.num_classes == 10 and len(ds.class_names) == 10
    assert ds.in_channels == 1 and ds.image_size == 28
    assert set(ds.train_y.tolist()) == set(range(10))
    assert set(ds.test_y.tolist()) == set(range(10))
    assert ds.mean == (0.1307,) and ds.std == (0.3081,)
    # stratified: every class within 1 % of its overall MNIST share (~9-11 %)
    frac = torch.bincount(ds.train_y, minlength=10).float() / n
    assert frac.min() > 0.08 and frac.max() < 0.12


def test_mnist_sample_ignores_data_dir_and_is_cached(tmp_path):
    a = load_dataset("mnist-sample")
    b = load_dataset("mnist-sample", data_dir=str(tmp_path / "nowhere"), download=True)
    assert a is b


def test_sample_metadata():
    with np.load(embedded_sample_path()) as z:
        meta = json.loads(str(z["meta"]))
        assert z["train_x"].shape == (12_000, 28, 28)
    assert meta["train_size"] == 12_000 and meta["seed"] == 0
    assert meta["source_gz_md5"]["train-images-idx3-ubyte.gz"] == "f68b3c2dcbeaaa9fbdd348bbdeb94873"


def test_normalize_on_sample_is_standardised():
    ds = load_dataset("mnist-sample")
    z = normalize(ds.train_x, ds.mean, ds.std)
    assert z.dtype == torch.float32 and z.shape == ds.train_x.shape
    assert abs(z.mean().item()) < 0.05
    assert abs(z.std().item() - 1.0) < 0.05
    # exact formula on a pixel
    x = torch.tensor([[[[0, 255]]]], dtype=torch.uint8)
    out = normalize(x, (0.5,), (0.25,))
    assert torch.allclose(out, torch.tensor([[[[-2.0, 2.0]]]]))


def test_normalize_rejects_channel_mismatch():
    with pytest.raises(ValueError, match="3 channels"):
        normalize(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), (0.5,), (0.5,))


def test_embedded_sample_path_finds_file():
    p = embedded_sample_path()
    assert p.is_file() and p.name == "mnist_sample.npz"


def test_embedded_sample_path_editable_install_fallback(monkeypatch, tmp_path):
    """From a FAB copy (no assets next to the module) the editable install is used."""
    repo = Path(embedded_sample_path()).parent.parent.parent
    monkeypatch.setattr(D, "__file__", str(tmp_path / "fab" / "fedul_flwr" / "data" / "datasets.py"))

    class FakeDist:
        files = None

        def read_text(self, name):
            assert name == "direct_url.json"
            return json.dumps({"url": repo.as_uri(), "dir_info": {"editable": True}})

    monkeypatch.setattr(D.metadata, "distribution", lambda name: FakeDist())
    assert embedded_sample_path() == repo / "fedul_flwr" / "assets" / "mnist_sample.npz"


def test_embedded_sample_missing_says_how_to_rebuild(monkeypatch, tmp_path):
    monkeypatch.setattr(D, "__file__", str(tmp_path / "fab" / "fedul_flwr" / "data" / "datasets.py"))

    def not_installed(name):
        raise D.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(D.metadata, "distribution", not_installed)
    with pytest.raises(DatasetError, match="build_mnist_sample.py") as e:
        load_dataset("mnist-sample")
    assert "mnist-sample" in str(e.value)


# ----------------------------------------------------------------------------- errors


def test_unknown_name_lists_valid_names():
    with pytest.raises(DatasetError) as e:
        load_dataset("svhn")
    msg = str(e.value)
    assert "'svhn'" in msg
    for name in DATASETS:
        assert name in msg


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist", "cifar10"])
def test_empty_data_dir(name):
    with pytest.raises(DatasetError, match="data-dir") as e:
        load_dataset(name, data_dir="")
    assert repr(name) in str(e.value) and "mnist-sample" in str(e.value)


def test_missing_data_dir(tmp_path):
    missing = tmp_path / "does-not-exist"
    with pytest.raises(DatasetError, match="does not exist") as e:
        load_dataset("mnist", data_dir=str(missing))
    assert str(missing) in str(e.value) and "'mnist'" in str(e.value)
    assert not missing.exists()


def test_missing_files_names_each_file(tmp_path):
    with pytest.raises(DatasetError) as e:
        load_dataset("fashion-mnist", data_dir=str(tmp_path))
    msg = str(e.value)
    assert "'fashion-mnist'" in msg and "download=true" in msg
    for f in MNIST_FILES:
        assert f"{tmp_path}/FashionMNIST/raw/{f}(.gz)" in msg


def test_missing_only_some_files(tmp_path):
    _write_fake_mnist(tmp_path)
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetError) as e:
        load_dataset("mnist", data_dir=str(tmp_path))
    msg = str(e.value)
    assert "MNIST/raw/t10k-labels-idx1-ubyte(.gz)" in msg
    assert "train-images" not in msg


def test_cifar_missing_files_names_archive(tmp_path):
    with pytest.raises(DatasetError) as e:
        load_dataset("cifar10", data_dir=str(tmp_path))
    assert f"{tmp_path}/cifar-10-python.tar.gz" in str(e.value)
    assert "cifar-10-batches-py" in str(e.value)


def test_unverified_archives_are_rejected(tmp_path):
    """The fake archives do not have torchvision's md5s: clear error, nothing extracted."""
    _write_fake_mnist(tmp_path)
    with pytest.raises(DatasetError, match="md5") as e:
        load_dataset("mnist", data_dir=str(tmp_path))
    assert "train-images-idx3-ubyte.gz" in str(e.value)
    assert not (tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte").exists()


def test_download_failure_says_offline(monkeypatch, tmp_path):
    def offline(spec, root):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz", URLError("no network"))

    monkeypatch.setattr(D, "_torchvision_download", offline)
    with pytest.raises(DatasetError, match="offline") as e:
        load_dataset("mnist", data_dir=str(tmp_path / "new"), download=True)
    msg = str(e.value)
    assert "'mnist'" in msg and f"{tmp_path}/new/MNIST/raw/train-images-idx3-ubyte(.gz)" in msg


def test_download_not_called_when_archives_present(monkeypatch, tmp_path):
    _write_fake_mnist(tmp_path)
    _all_verified(monkeypatch)
    monkeypatch.setattr(D, "_torchvision_download", lambda spec, root: pytest.fail("network used"))
    ds = load_dataset("mnist", data_dir=str(tmp_path), download=True)
    assert ds.train_x.shape == (20, 1, 28, 28)


# ----------------------------------------------------------------------------- torchvision paths


@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fashion-mnist", "FashionMNIST")])
def test_extracted_files_load(tmp_path, name, folder):
    arrays = _write_fake_mnist(tmp_path, folder=folder, gz=False)
    ds = load_dataset(name, data_dir=str(tmp_path))
    assert ds.train_x.shape == (20, 1, 28, 28) and ds.train_x.dtype == torch.uint8
    assert ds.test_y.dtype == torch.int64 and ds.test_y.shape == (10,)
    assert torch.equal(ds.train_x[:, 0], torch.from_numpy(arrays["train-images-idx3-ubyte"]))
    assert ds.num_classes == 10
    assert load_dataset(name, data_dir=str(tmp_path)) is ds  # cached


def test_gz_extracted_in_place_when_writable(monkeypatch, tmp_path):
    arrays = _write_fake_mnist(tmp_path)
    _all_verified(monkeypatch)
    ds = load_dataset("mnist", data_dir=str(tmp_path))
    assert torch.equal(ds.test_x[:, 0], torch.from_numpy(arrays["t10k-images-idx3-ubyte"]))
    assert torch.equal(ds.train_y, torch.from_numpy(arrays["train-labels-idx1-ubyte"]).long())
    for f in MNIST_FILES:
        assert (tmp_path / "MNIST" / "raw" / f).is_file()
    assert not (tmp_path / "fedul-cache").exists()
    assert not [p for p in (tmp_path / "MNIST" / "raw").iterdir() if p.name.startswith(".")]


def test_gz_from_read_only_root_goes_to_cache(monkeypatch, tmp_path):
    root = tmp_path / "ro"
    arrays = _write_fake_mnist(root)
    _all_verified(monkeypatch)
    raw = root / "MNIST" / "raw"
    for p in [raw, raw.parent, root]:
        p.chmod(0o555)
    before = sorted(p.name for p in raw.iterdir())
    try:
        ds = load_dataset("mnist", data_dir=str(root))
        assert sorted(p.name for p in raw.iterdir()) == before  # root untouched
        for f in MNIST_FILES:
            assert (tmp_path / "fedul-cache" / "MNIST" / "raw" / f).is_file()
        assert torch.equal(ds.train_x[:, 0], torch.from_numpy(arrays["train-images-idx3-ubyte"]))
        # a second process-level load reuses the cache
        D._load_cached.cache_clear()
        assert torch.equal(load_dataset("mnist", data_dir=str(root)).train_x, ds.train_x)
    finally:
        for p in [root, raw.parent, raw]:
            p.chmod(0o755)


def _write_fake_cifar_tar(root: Path, n_per_batch: int = 4):
    import torchvision.datasets as tvd

    rng = np.random.default_rng(1)
    staging = root / "staging" / tvd.CIFAR10.base_folder
    staging.mkdir(parents=True)
    chw = {}
    for fname, _ in tvd.CIFAR10.train_list + tvd.CIFAR10.test_list:
        data = rng.integers(0, 256, (n_per_batch, 3 * 32 * 32), dtype=np.uint8)
        labels = rng.integers(0, 10, n_per_batch).tolist()
        chw[fname] = (data.reshape(-1, 3, 32, 32), labels)
        with open(staging / fname, "wb") as f:
            pickle.dump({"data": data, "labels": labels}, f)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    with open(staging / tvd.CIFAR10.meta["filename"], "wb") as f:
        pickle.dump({tvd.CIFAR10.meta["key"]: names}, f)
    with tarfile.open(root / tvd.CIFAR10.filename, "w:gz") as tar:
        tar.add(staging, arcname=tvd.CIFAR10.base_folder)
    return chw, names


def test_cifar10_from_tar_gz_is_chw(monkeypatch, tmp_path):
    import torchvision.datasets.cifar as tv_cifar

    chw, names = _write_fake_cifar_tar(tmp_path)
    _all_verified(monkeypatch)
    monkeypatch.setattr(tv_cifar, "check_integrity", lambda path, md5=None: os.path.isfile(path))
    ds = load_dataset("cifar10", data_dir=str(tmp_path))
    assert ds.train_x.shape == (20, 3, 32, 32) and ds.train_x.dtype == torch.uint8
    assert ds.test_x.shape == (4, 3, 32, 32) and ds.test_y.dtype == torch.int64
    assert torch.equal(ds.train_x[:4], torch.from_numpy(chw["data_batch_1"][0]))
    assert ds.test_y.tolist() == chw["test_batch"][1]
    assert ds.class_names == tuple(names)
    assert ds.in_channels == 3 and ds.image_size == 32 and len(ds.mean) == 3
    assert ds.train_x.is_contiguous()
    assert stat.S_ISDIR((tmp_path / "cifar-10-batches-py").stat().st_mode)
