"""Tests for fedul_flwr.data.datasets.

They need no dataset files and no network (``urllib.request.urlopen`` refuses every call):
the embedded sample ships with the repo, and the torchvision paths run on tiny files written
into ``tmp_path`` in each real format (IDX ``.gz`` for MNIST, pickled batches in a ``.tar.gz``
for CIFAR-10 and CIFAR-100, ``.mat`` for SVHN). The generated files cannot have torchvision's
published md5s, so where the loading path itself is under test their own md5s are written into
torchvision's checksum attributes (:func:`_register_checksums`), the table that both this
project and torchvision check files against; without that, the files are refused.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import pickle
import stat
import tarfile
import urllib.request
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch

from fedul_flwr.data import datasets as D
from fedul_flwr.data import mnist_sample
from fedul_flwr.data.torchvision_datasets import cache_for
from fedul_flwr.data.datasets import DATASETS, load_dataset
from fedul_flwr.data.image_dataset import DatasetError, ImageDataset, normalize
from fedul_flwr.data.mnist_sample import embedded_sample_path

MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """Fresh in-process cache, a private extraction cache and no network for every test."""
    D._load_cached.cache_clear()
    monkeypatch.setenv("FEDUL_CACHE_DIR", str(tmp_path / "fedul-cache"))

    def offline(*args, **kwargs):
        raise URLError("no network in the tests")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
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


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _register_checksums(monkeypatch, cls_name: str, root: Path, staging: Path | None = None) -> None:
    """Write the md5s of the files generated under ``root`` (and of the batches staged in
    ``staging`` before they were archived) into torchvision's checksum attributes of
    ``cls_name``, as if they were the published files."""
    import torchvision.datasets as tvd

    cls = getattr(tvd, cls_name)
    if hasattr(cls, "resources"):
        raw = root / cls.__name__ / "raw"
        monkeypatch.setattr(cls, "resources", [(url, _md5(raw / url) if (raw / url).is_file() else md5)
                                               for url, md5 in cls.resources])  # fmt: skip
    elif hasattr(cls, "tgz_md5"):
        assert staging is not None
        monkeypatch.setattr(cls, "tgz_md5", _md5(root / cls.filename))
        for attr in ("train_list", "test_list"):
            monkeypatch.setattr(cls, attr, [[f, _md5(staging / f)] for f, _ in getattr(cls, attr)])
        monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": _md5(staging / cls.meta["filename"])})
    else:
        monkeypatch.setattr(cls, "split_list", {k: [url, f, _md5(root / f) if (root / f).is_file() else md5]
                                                for k, (url, f, md5) in cls.split_list.items()})  # fmt: skip


def _all_verified(monkeypatch, root: Path, cls_name: str = "MNIST"):
    _register_checksums(monkeypatch, cls_name, root)


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
    monkeypatch.setattr(mnist_sample, "__file__", str(tmp_path / "fab" / "fedul_flwr" / "data" / "mnist_sample.py"))

    class FakeDist:
        files = None

        def read_text(self, name):
            assert name == "direct_url.json"
            return json.dumps({"url": repo.as_uri(), "dir_info": {"editable": True}})

    monkeypatch.setattr(mnist_sample.metadata, "distribution", lambda name: FakeDist())
    assert embedded_sample_path() == repo / "fedul_flwr" / "assets" / "mnist_sample.npz"


def test_embedded_sample_missing_says_how_to_rebuild(monkeypatch, tmp_path):
    monkeypatch.setattr(mnist_sample, "__file__", str(tmp_path / "fab" / "fedul_flwr" / "data" / "mnist_sample.py"))

    def not_installed(name):
        raise mnist_sample.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(mnist_sample.metadata, "distribution", not_installed)
    with pytest.raises(DatasetError, match="build_mnist_sample.py") as e:
        load_dataset("mnist-sample")
    assert "mnist-sample" in str(e.value)


# ----------------------------------------------------------------------------- errors


def test_unknown_name_lists_valid_names():
    with pytest.raises(DatasetError) as e:
        load_dataset("imagenet")
    msg = str(e.value)
    assert "'imagenet'" in msg
    for name in DATASETS:
        assert name in msg


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist", "cifar10", "cifar100", "svhn"])
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


def test_partly_extracted_root_names_the_original_files_torchvision_needs(tmp_path):
    """The training files extracted (their .gz gone), the test files only as .gz: torchvision
    extracts only with all four .gz files, and the message says which to add."""
    _write_fake_mnist(tmp_path)
    raw = tmp_path / "MNIST" / "raw"
    for f in MNIST_FILES[:2]:
        (raw / f).write_bytes(gzip.decompress((raw / f"{f}.gz").read_bytes()))
        (raw / f"{f}.gz").unlink()
    with pytest.raises(DatasetError, match="also put MNIST/raw/train-images-idx3-ubyte.gz, MNIST/raw/train-labels"):
        load_dataset("mnist", data_dir=str(tmp_path))


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


def test_download_failure_says_offline(tmp_path):
    """torchvision's own download, offline (urlopen refuses): one message naming the files."""
    with pytest.raises(DatasetError, match="offline") as e:
        load_dataset("mnist", data_dir=str(tmp_path / "new"), download=True)
    msg = str(e.value)
    assert "'mnist'" in msg and f"{tmp_path}/new/MNIST/raw/train-images-idx3-ubyte(.gz)" in msg


def test_download_not_called_when_archives_present(monkeypatch, tmp_path):
    _write_fake_mnist(tmp_path)
    _all_verified(monkeypatch, tmp_path)
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail("network used"))
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
    _all_verified(monkeypatch, tmp_path)
    ds = load_dataset("mnist", data_dir=str(tmp_path))
    assert torch.equal(ds.test_x[:, 0], torch.from_numpy(arrays["t10k-images-idx3-ubyte"]))
    assert torch.equal(ds.train_y, torch.from_numpy(arrays["train-labels-idx1-ubyte"]).long())
    for f in MNIST_FILES:
        assert (tmp_path / "MNIST" / "raw" / f).is_file()
    assert not cache_for(tmp_path).exists()  # extracted in place, not in the cache
    assert not [p for p in (tmp_path / "MNIST" / "raw").iterdir() if p.name.startswith(".")]


def test_gz_from_read_only_root_goes_to_cache(monkeypatch, tmp_path):
    root = tmp_path / "ro"
    arrays = _write_fake_mnist(root)
    _all_verified(monkeypatch, root)
    raw = root / "MNIST" / "raw"
    for p in [raw, raw.parent, root]:
        p.chmod(0o555)
    before = sorted(p.name for p in raw.iterdir())
    try:
        ds = load_dataset("mnist", data_dir=str(root))
        assert sorted(p.name for p in raw.iterdir()) == before  # root untouched
        for f in MNIST_FILES:
            assert (cache_for(root) / "MNIST" / "raw" / f).is_file()
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
    chw, names = _write_fake_cifar_tar(tmp_path)
    _register_checksums(monkeypatch, "CIFAR10", tmp_path, tmp_path / "staging" / "cifar-10-batches-py")
    ds = load_dataset("cifar10", data_dir=str(tmp_path))
    assert ds.train_x.shape == (20, 3, 32, 32) and ds.train_x.dtype == torch.uint8
    assert ds.test_x.shape == (4, 3, 32, 32) and ds.test_y.dtype == torch.int64
    assert torch.equal(ds.train_x[:4], torch.from_numpy(chw["data_batch_1"][0]))
    assert ds.test_y.tolist() == chw["test_batch"][1]
    assert ds.class_names == tuple(names)
    assert ds.in_channels == 3 and ds.image_size == 32 and len(ds.mean) == 3
    assert ds.train_x.is_contiguous()
    assert stat.S_ISDIR((tmp_path / "cifar-10-batches-py").stat().st_mode)


# ----------------------------------------------------------------------------- CIFAR-100 and SVHN


def _write_fake_cifar100_tar(root: Path, n_train: int = 200, n_test: int = 100) -> tuple[dict, Path]:
    """CIFAR-100's layout: ``cifar-100-python.tar.gz`` holding ``cifar-100-python/{train,test,meta}``
    (pickled dicts with ``data`` [N, 3072], ``fine_labels``, ``coarse_labels``; ``fine_label_names``)."""
    import torchvision.datasets as tvd

    rng = np.random.default_rng(2)
    staging = root / "staging" / tvd.CIFAR100.base_folder
    staging.mkdir(parents=True)
    written = {}
    for fname, n in (("train", n_train), ("test", n_test)):
        data = rng.integers(0, 256, (n, 3 * 32 * 32), dtype=np.uint8)
        fine = (np.arange(n) % 100).tolist()
        written[fname] = (data.reshape(-1, 3, 32, 32), fine)
        with open(staging / fname, "wb") as f:
            pickle.dump({"data": data, "fine_labels": fine, "coarse_labels": [c // 5 for c in fine]}, f)
    with open(staging / "meta", "wb") as f:
        pickle.dump({"fine_label_names": list(D.dataset_info("cifar100").class_names),
                     "coarse_label_names": [f"super{i}" for i in range(20)]}, f)  # fmt: skip
    with tarfile.open(root / tvd.CIFAR100.filename, "w:gz") as tar:
        tar.add(staging, arcname=tvd.CIFAR100.base_folder)
    return written, staging


def _write_fake_svhn(root: Path, n_train: int = 60, n_test: int = 30) -> dict:
    """SVHN's layout: ``train_32x32.mat`` / ``test_32x32.mat`` with ``X`` [32, 32, 3, N] uint8 and
    ``y`` [N, 1] in 1..10 (10 is the digit 0)."""
    import scipy.io

    rng = np.random.default_rng(3)
    written = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
        digits = np.arange(n) % 10
        scipy.io.savemat(root / f"{split}_32x32.mat", {"X": x, "y": np.where(digits == 0, 10, digits).reshape(-1, 1)})
        written[split] = (x.transpose(3, 2, 0, 1), digits)  # torchvision's [N, C, H, W]: X[h, w, c, n] -> [n, c, h, w]
    return written


def test_cifar100_from_tar_gz(monkeypatch, tmp_path):
    written, staging = _write_fake_cifar100_tar(tmp_path)
    _register_checksums(monkeypatch, "CIFAR100", tmp_path, staging)
    ds = load_dataset("cifar100", data_dir=str(tmp_path))
    assert ds.train_x.shape == (200, 3, 32, 32) and ds.train_x.dtype == torch.uint8 and ds.train_x.is_contiguous()
    assert ds.test_x.shape == (100, 3, 32, 32) and ds.test_y.dtype == torch.int64
    assert torch.equal(ds.train_x, torch.from_numpy(written["train"][0]))
    assert ds.train_y.tolist() == written["train"][1] and ds.test_y.tolist() == written["test"][1]  # fine labels
    assert ds.num_classes == 100 and ds.class_names == D.dataset_info("cifar100").class_names
    assert ds.class_names[:3] == ("apple", "aquarium_fish", "baby") and ds.class_names[-1] == "worm"
    assert ds.mean == (0.5071, 0.4865, 0.4409) and len(ds.std) == 3
    assert (tmp_path / "cifar-100-python" / "train").is_file()  # torchvision extracted it in place


def test_cifar100_unverified_archive_is_refused(tmp_path):
    """Generated files do not have the published md5: one line naming the archive, nothing extracted."""
    _write_fake_cifar100_tar(tmp_path, n_train=4, n_test=4)
    with pytest.raises(DatasetError, match="md5") as e:
        load_dataset("cifar100", data_dir=str(tmp_path))
    assert "cifar-100-python.tar.gz" in str(e.value)
    assert not (tmp_path / "cifar-100-python").exists()


def test_cifar100_read_only_root_goes_to_cache(monkeypatch, tmp_path):
    root = tmp_path / "ro"
    root.mkdir()
    written, staging = _write_fake_cifar100_tar(root, n_train=8, n_test=4)
    _register_checksums(monkeypatch, "CIFAR100", root, staging)
    before = sorted(p.name for p in root.iterdir())
    root.chmod(0o555)
    try:
        ds = load_dataset("cifar100", data_dir=str(root))
        assert sorted(p.name for p in root.iterdir()) == before
        assert (cache_for(root) / "cifar-100-python" / "train").is_file()
        assert cache_for(root).parent.parent == tmp_path / "fedul-cache"
        assert torch.equal(ds.test_x, torch.from_numpy(written["test"][0]))
    finally:
        root.chmod(0o755)


def test_svhn_from_mat(monkeypatch, tmp_path):
    written = _write_fake_svhn(tmp_path)
    _register_checksums(monkeypatch, "SVHN", tmp_path)
    ds = load_dataset("svhn", data_dir=str(tmp_path))
    assert ds.train_x.shape == (60, 3, 32, 32) and ds.train_x.dtype == torch.uint8 and ds.train_x.is_contiguous()
    assert ds.test_x.shape == (30, 3, 32, 32) and ds.test_y.dtype == torch.int64
    assert torch.equal(ds.train_x, torch.from_numpy(np.ascontiguousarray(written["train"][0])))
    assert ds.train_y.tolist() == written["train"][1].tolist()  # the .mat's 10 is the digit 0
    assert ds.test_y.tolist() == written["test"][1].tolist() and set(ds.train_y.tolist()) == set(range(10))
    assert ds.class_names == D.dataset_info("svhn").class_names and ds.class_names[0] == "0 - zero"
    assert ds.in_channels == 3 and ds.image_size == 32 and ds.mean == (0.4377, 0.4438, 0.4728)


def test_svhn_checked_against_published_md5(tmp_path):
    _write_fake_svhn(tmp_path, n_train=4, n_test=4)
    with pytest.raises(DatasetError, match="md5") as e:
        load_dataset("svhn", data_dir=str(tmp_path))
    assert "train_32x32.mat (expected md5 e26dedcc434d2e4c54c9b2d4a06d8373)" in str(e.value)


def test_svhn_missing_files_name_both_mats(tmp_path):
    (tmp_path / "train_32x32.mat").write_bytes(b"")
    with pytest.raises(DatasetError, match="not found") as e:
        load_dataset("svhn", data_dir=str(tmp_path))
    assert f"{tmp_path}/test_32x32.mat" in str(e.value) and "train_32x32" not in str(e.value)


def test_flips_only_where_classes_survive_mirroring():
    """FedDB's authors flip CIFAR's images, never SVHN's digits: a fact of each dataset."""
    flips = {name for name in DATASETS if D.dataset_info(name).flip}
    assert {"cifar10", "cifar100", "fashion-mnist"} <= flips and not {"svhn", "mnist", "mnist-sample"} & flips


def test_dataset_info_matches_torchvision_and_is_complete():
    import torchvision.datasets as tvd

    assert D.dataset_info("fashion-mnist").class_names == tuple(tvd.FashionMNIST.classes)
    assert D.dataset_info("mnist").class_names == tuple(tvd.MNIST.classes)
    names = D.dataset_info("cifar100").class_names
    assert len(names) == len(set(names)) == 100 and list(names) == sorted(names)
    for name in DATASETS:
        info = D.dataset_info(name)
        assert info.name == name and len(info.mean) == len(info.std) == info.channels


@pytest.fixture
def fixture_roots(monkeypatch, tmp_path) -> dict[str, Path]:
    """Generated CIFAR-100 (1000 training images, 10 per class) and SVHN roots, their md5s registered."""
    roots = {"cifar100": tmp_path / "c100", "svhn": tmp_path / "svhn"}
    for root in roots.values():
        root.mkdir()
    _, staging = _write_fake_cifar100_tar(roots["cifar100"], n_train=1000, n_test=100)
    _register_checksums(monkeypatch, "CIFAR100", roots["cifar100"], staging)
    _write_fake_svhn(roots["svhn"], n_train=200, n_test=50)
    _register_checksums(monkeypatch, "SVHN", roots["svhn"])
    return roots


@pytest.mark.parametrize("dataset", ["cifar100", "svhn"])
@pytest.mark.parametrize("method", ["fedul", "feddb"])
def test_one_round_trains_on_each_dataset(fixture_roots, tmp_path, dataset, method):
    """FedUL (every client 100 or 10 U sets: M >= K) and FedDB (labels at the clients) through the
    in-process runner: the model has K outputs and one aggregated round changes the test loss."""
    from fedul_flwr.experiments import runner

    k = len(D.dataset_info(dataset).class_names)
    setting = {"fedul": {"num-sets": k}, "feddb": {"client-setting": "labels-at-clients", "num-labeled": k, "batch-size": 8}}
    rc = {"dataset": dataset, "data-dir": str(fixture_roots[dataset]), "method": method, "model": "small-cnn",
          "num-rounds": 1, "local-epochs": 1, "device": "cpu", "precision": "fp32", "seed": 0,
          "output-dir": str(tmp_path / "runs"), "run-name": f"{dataset}-{method}", **setting[method]}  # fmt: skip
    spec = runner.RunSpec("datasets", dataset, method, "*", 0, 2, "", rc)
    record = runner.execute(spec, rc)
    rows = record["metrics"]
    assert [r["round"] for r in rows] == [0, 1] and record["config"]["dataset"] == dataset
    assert rows[1]["test-loss"] != rows[0]["test-loss"]  # trained and aggregated
    assert 0.0 <= record["last-test-error"] <= 1.0
