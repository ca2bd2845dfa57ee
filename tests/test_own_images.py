"""The user's own images as a new user brings them: PNG class folders with split folders, three
image sizes, greyscale and colour mixed; a flat class folder; a Parquet file with other column
names. Every method trains on them, every bad image is one line before round 1 (``fedul
check``, ``fedul reproduce``, the ServerApp through ``flwr run``) with no run folder, and a
deployed node with greyscale PNGs of another size trains without a copy of the server's
dataset."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from fedul_flwr.preflight import check_before_round_one, resolve_config
from fedul_flwr.config import ConfigError
from fedul_flwr.data.datasets import DatasetOptions, clear_caches, load_dataset
from fedul_flwr.data.image_dataset import DatasetError

CLASSES = ("cat", "dog", "emu")


def _pixels(k: int, i: int, side: int, channels: int) -> np.ndarray:
    """A uint8 image of class k (brightness grows with k: learnable), noise varying with i."""
    rng = np.random.default_rng([k, i, side])
    base = 40 + 70 * k + rng.integers(0, 30, size=(side, side, channels))
    return np.clip(base, 0, 255).astype(np.uint8).squeeze()


def _png(path: Path, arr: np.ndarray) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)
    return path


def messy_folder(root: Path, per_class: int = 12, test_per_class: int = 3) -> Path:
    """train/ and test/ split folders; sides 16, 20 and 24; greyscale and colour mixed."""
    for split, n in (("train", per_class), ("test", test_per_class)):
        for k, name in enumerate(CLASSES):
            for i in range(n):
                side, channels = (16, 20, 24)[i % 3], (1, 3)[(i + k) % 2]
                _png(root / split / name / f"{i:03d}.png", _pixels(k, i, side, channels))
    return root


def flat_folder(root: Path, per_class: int = 10) -> Path:
    """One folder per class; file names that `datasets` would read as split names."""
    for k, name in enumerate(CLASSES):
        for i in range(per_class):
            prefix = ("test", "train", "validation", "img")[i % 4]
            _png(root / name / f"{prefix}_{i:02d}.png", _pixels(k, i, 16, 3))
    return root


def parquet_file(path: Path, per_class: int = 12) -> Path:
    """A Parquet file whose image column is ``picture`` and label column ``kind`` (texts)."""
    import datasets
    from PIL import Image

    rows = [(Image.fromarray(_pixels(k, i, 16, 3)), CLASSES[k]) for k in range(3) for i in range(per_class)]
    features = datasets.Features({"picture": datasets.Image(), "kind": datasets.Value("string"),
                                  "other": datasets.Image()})  # fmt: skip
    datasets.Dataset.from_dict({"picture": [r[0] for r in rows], "kind": [r[1] for r in rows],
                                "other": [r[0] for r in rows]}, features=features).to_parquet(str(path))  # fmt: skip
    return path


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, dict]]:
    tmp = tmp_path_factory.mktemp("own-images")
    return {
        "folder": (f"hf:{messy_folder(tmp / 'pets')}", {"image-size": 16}),
        "parquet": (f"hf:{parquet_file(tmp / 'pets.parquet')}", {"image-column": "picture", "label-column": "kind"}),
    }


# --------------------------------------------------------------------------- what the run sees


def test_mixed_sizes_and_modes_become_the_runs_images(own) -> None:  # type: ignore[no-untyped-def]
    name, extra = own["folder"]
    ds = load_dataset(name, options=DatasetOptions.from_values(extra))
    assert ds.class_names == CLASSES and tuple(ds.train_x.shape[1:]) == (3, 16, 16)  # colour present: RGB
    assert np.bincount(ds.train_y.numpy()).tolist() == [12] * 3 and np.bincount(ds.test_y.numpy()).tolist() == [3] * 3
    means = [float(ds.train_x[ds.train_y == c].float().mean()) for c in range(3)]
    assert means == sorted(means)


def test_flat_folder_uses_every_image_whatever_the_file_names(tmp_path: Path) -> None:
    root = flat_folder(tmp_path / "flat")
    ds = load_dataset(f"hf:{root}")
    assert len(ds.train_y) + len(ds.test_y) == 30  # 24 trained, 6 held out: no file read as a split
    assert np.bincount(ds.train_y.numpy()).tolist() == [8] * 3


def test_default_run_folder_name_is_a_slug_of_the_dataset(own, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from fedul_flwr.outputs import run_folder

    name, extra = own["folder"]
    path = run_folder(resolve_config({"dataset": name, "output-dir": str(tmp_path), "num-sets": 3, **extra}))
    assert path.parent == tmp_path and "/" not in path.name and "hf-" in path.name and ":" not in path.name


SETTINGS = {
    "fedul": {"num-sets": 3},
    "supervised": {"num-sets": 3},
    "fedpu": {"client-setting": "pu", "positive-classes": "2"},
    "fixmatch": {"client-setting": "labels-at-clients", "num-labeled": 6, "fixmatch-mu": 2},
    "feddb": {"client-setting": "labels-at-clients", "num-labeled": 6, "fixmatch-mu": 2},
    "hassle": {"client-setting": "annotation-heterogeneity", "label-layout": "L,U", "labeled-share": 0.5},
}


@pytest.mark.parametrize("fmt", ["folder", "parquet"])
@pytest.mark.parametrize("method", list(SETTINGS))
def test_every_method_trains_two_rounds(own, tmp_path: Path, method: str, fmt: str) -> None:  # type: ignore[no-untyped-def]
    """The real ServerApp and ClientApp (in process, as ``fedul reproduce`` runs them)."""
    from fedul_flwr.experiments.runner import RunSpec, execute

    name, extra = own[fmt]
    rc = {"dataset": name, "method": method, "num-rounds": 2, "batch-size": 8, "output-dir": str(tmp_path),
          "run-name": "r", **SETTINGS[method], **extra}  # fmt: skip
    record = execute(RunSpec("own", fmt, method, "*", 0, 2, "", rc), rc)
    rows = record["metrics"]
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert all(np.isfinite(r["test-accuracy"]) for r in rows)


# --------------------------------------------------------------------------- what a photo viewer shows


def _saved(path: Path, arr: np.ndarray, orientation: int = 0, **kwargs: object) -> Path:
    """``arr`` saved by PIL (the format from the suffix), with an EXIF orientation tag when given."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    if orientation:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kwargs["exif"] = exif
    Image.fromarray(arr).save(path, **kwargs)
    return path


def _upright(k: int, i: int) -> np.ndarray:
    """A 24x24 RGB image of 8x8 blocks, asymmetric (so any rotation or mirror changes it): block
    colours from (k, i); 8x8 blocks and no chroma subsampling make a JPEG's 90-degree rotation
    lossless, so the rotated file decodes to exactly the upright one's pixels."""
    rng = np.random.default_rng([k, i, 24])
    return np.kron(rng.integers(0, 256, (3, 3, 3)), np.ones((8, 8, 1))).astype(np.uint8)


def orientation_twins(root: Path, suffix: str, per_class: int = 4) -> tuple[Path, Path]:
    """Two image folders of the same photos: stored upright, and stored rotated by 90 degrees
    counter-clockwise with EXIF ``Orientation = 6`` (rotate 90 degrees clockwise to show: what
    a phone held upright writes)."""
    kwargs = {"quality": 100, "subsampling": 0} if suffix == ".jpg" else {}
    for k, name in enumerate(CLASSES[:2]):
        for i in range(per_class):
            arr = _upright(k, i)
            _saved(root / "upright" / name / f"{i}{suffix}", arr, **kwargs)
            _saved(root / "tagged" / name / f"{i}{suffix}", np.ascontiguousarray(np.rot90(arr)), 6, **kwargs)
    return root / "upright", root / "tagged"


def bomb_png(path: Path, side: int = 14000) -> Path:
    """A 1-bit all-black PNG of side x side pixels (14000: 196 million, over twice PIL's
    decompression-bomb limit) written row by row: 24 kB on disk, no image in memory."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer = zlib.compressobj(9)
    row = bytes(1 + (side + 7) // 8)  # filter byte 0, then the row's bits
    pixels = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0))
                     + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))  # fmt: skip
    return path


@pytest.mark.parametrize("suffix", [".png", ".jpg"])
def test_an_orientation_6_photo_decodes_equal_to_its_upright_twin(tmp_path: Path, suffix: str) -> None:
    """The tagged folder trains on exactly the upright folder's pixels (a viewer shows both the
    same); without the tag the rotated pixels would differ from the upright ones."""
    upright, tagged = orientation_twins(tmp_path, suffix)
    a, b = (load_dataset(f"hf:{root}") for root in (upright, tagged))
    assert a.train_x.shape == b.train_x.shape and len(a.train_x) + len(a.test_x) == 8
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_x, b.test_x)
    assert not torch.equal(a.train_x, a.train_x.rot90(1, (2, 3)))  # the test could fail: rotation matters


def test_an_orientation_6_row_of_parquet_and_of_a_saved_dataset_decodes_upright(tmp_path: Path) -> None:
    """The same tagged bytes as rows of a Parquet file and a ``save_to_disk`` folder."""
    import datasets

    upright, tagged = orientation_twins(tmp_path, ".jpg")
    expected = load_dataset(f"hf:{upright}")
    files = sorted(tagged.rglob("*.jpg"))
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(CLASSES[:2]))})
    rows = datasets.Dataset.from_dict({"image": [{"bytes": f.read_bytes(), "path": None} for f in files],
                                       "label": [CLASSES.index(f.parent.name) for f in files]}, features=features)  # fmt: skip
    rows.to_parquet(str(tmp_path / "tagged.parquet"))
    rows.save_to_disk(str(tmp_path / "saved"))
    for name in (f"hf:{tmp_path / 'tagged.parquet'}", f"hf:{tmp_path / 'saved'}"):
        got = load_dataset(name)
        assert torch.equal(got.train_x, expected.train_x) and torch.equal(got.test_x, expected.test_x), name


def test_16_bit_and_float_greyscale_keep_their_grey_levels(tmp_path: Path) -> None:
    """A 16-bit PNG ramp 0..65535 decodes to 256 grey levels (x / 257, as a viewer shows it),
    not to 0 and 255; a float TIFF in [0, 1] to round(255 x), not to 0 and 1."""
    ramp16 = np.tile(np.linspace(0, 65535, 256).round().astype(np.uint16), (256, 1))
    ramp_f = np.tile(np.linspace(0, 1, 256, dtype=np.float32), (256, 1))
    for k, name in enumerate(CLASSES[:2]):
        for i in range(3):
            _saved(tmp_path / "xray" / name / f"{i}.png", ramp16)
            _saved(tmp_path / "float" / name / f"{i}.tif", ramp_f)
    xray = load_dataset(f"hf:{tmp_path / 'xray'}")
    assert tuple(xray.train_x.shape[1:]) == (1, 256, 256)
    assert len(np.unique(xray.train_x.numpy())) == 256
    assert np.array_equal(xray.train_x[0, 0].numpy(), np.rint(ramp16 / 257.0).astype(np.uint8))
    grey = load_dataset(f"hf:{tmp_path / 'float'}")
    assert np.array_equal(grey.train_x[0, 0].numpy(), np.rint(ramp_f.astype(np.float64) * 255).astype(np.uint8))
    bad = _saved(tmp_path / "float" / "cat" / "9.tif", ramp_f * 1000)
    clear_caches()
    with pytest.raises(DatasetError, match=re.escape(str(bad)) + r": float image with values in \[0, 1000\], outside "
                       r"\[0, 1\]") as refused:  # fmt: skip
        load_dataset(f"hf:{tmp_path / 'float'}")
    assert "\n" not in str(refused.value)


def test_transparency_is_shown_over_white_and_non_square_images_are_stretched(tmp_path: Path) -> None:
    """RGBA: the red an encoder left under transparent pixels never reaches the model (white,
    as on a white page). Non-square with image-size: stretched to the square, not cropped (the
    left quarter stays in view)."""
    rgba = np.zeros((16, 16, 4), dtype=np.uint8)
    rgba[..., 0] = 255  # red everywhere, transparent in the bottom half
    rgba[:8, :, 3] = 255
    wide = np.full((16, 32, 3), 255, dtype=np.uint8)
    wide[:, :8] = 0  # the left quarter black: a centre crop would lose it
    for k, name in enumerate(CLASSES[:2]):
        for i in range(3):
            _saved(tmp_path / "logos" / name / f"{i}.png", rgba)
            _saved(tmp_path / "wide" / name / f"{i}.png", wide)
    logo = load_dataset(f"hf:{tmp_path / 'logos'}").train_x[0].numpy()
    assert (logo[:, :8] == np.array([255, 0, 0])[:, None, None]).all() and (logo[:, 8:] == 255).all()
    stretched = load_dataset(f"hf:{tmp_path / 'wide'}", options=DatasetOptions(image_size=16)).train_x[0, 0].numpy()
    assert (stretched[:, :3] == 0).all() and (stretched[:, 5:] == 255).all()


def test_every_bad_file_of_a_folder_is_named_in_one_pass(tmp_path: Path) -> None:
    """README.txt, Thumbs.db, a phone's HEIC photo and a truncated PNG in one try (listing and
    decoding name their bad files together); twelve broken files: the first ten named, then
    "and 2 more"."""
    from fedul_flwr.data.images import MAX_NAMED

    root = flat_folder(tmp_path / "pets", per_class=4)
    strays = [root / "cat" / "README.txt", root / "dog" / "Thumbs.db", root / "emu" / "IMG_0001.HEIC"]
    for p in strays:
        p.write_bytes(b"\0" * 40)
    truncated = root / "dog" / "img_03.png"
    whole = truncated.read_bytes()
    truncated.write_bytes(whole[:-60])
    clear_caches()
    with pytest.raises(DatasetError) as refused:
        load_dataset(f"hf:{root}")
    message = str(refused.value)
    assert "\n" not in message and message.startswith("4 bad image files: ")
    assert all(str(p) in message for p in strays) and "convert it to PNG or JPEG" in message
    assert f"{truncated}: unreadable or truncated image" in message
    for p in strays:
        p.unlink()
    truncated.write_bytes(whole)
    broken = sorted(root.rglob("*.png"))[:12]
    for p in broken:
        p.write_bytes(p.read_bytes()[:-60])
    clear_caches()
    with pytest.raises(DatasetError) as refused:
        load_dataset(f"hf:{root}")
    message = str(refused.value)
    named = [p for p in broken if f"{p}: unreadable or truncated image" in message]
    assert len(named) == MAX_NAMED and message.startswith("12 bad image files: ") and message.endswith("; and 2 more")


def test_messages_name_classes_by_their_names(tmp_path: Path) -> None:
    """``class 'four' has 2 images``, not ``class 0``."""
    for k, (name, n) in enumerate((("four", 2), ("nine", 10))):
        for i in range(n):
            _png(tmp_path / "digits" / name / f"{i}.png", _pixels(k, i, 16, 1))
    settings = {"dataset": f"hf:{tmp_path / 'digits'}", "method": "fixmatch", "client-setting": "labels-at-clients",
                "num-labeled": 6, "output-dir": str(tmp_path / "runs")}  # fmt: skip
    from fedul_flwr.client_app import app
    from fedul_flwr.inprocess import InProcessGrid

    with pytest.raises(ConfigError, match=r"num-labeled=6: class 'four' has 2 images, fewer than its 3 labels"):
        check_before_round_one(resolve_config(settings), InProcessGrid(app, 2, settings))


# --------------------------------------------------------------------------- bad inputs


def _bad(kind: str, root: Path) -> tuple[str, dict, str]:
    """(dataset, extra settings, what the one line must say) of one bad input."""
    folder = root / kind
    if kind == "truncated":
        flat_folder(folder)
        bad = folder / "dog" / "img_03.png"
        bad.write_bytes(bad.read_bytes()[:-60])
        return f"hf:{folder}", {}, re.escape(str(bad)) + ": unreadable or truncated image"
    if kind == "other-size":
        flat_folder(folder)
        bad = _png(folder / "emu" / "late.png", _pixels(2, 99, 20, 3))  # after the first image, which is 16x16
        return f"hf:{folder}", {}, re.escape(str(bad)) + r": image of 20x20 pixels.*16x16.*image-size=N"
    if kind == "too-small":
        for k, name in enumerate(CLASSES):
            for i in range(5):
                _png(folder / name / f"{i}.png", _pixels(k, i, 8, 1))
        return f"hf:{folder}", {}, r"model='small-cnn' needs images of at least 16x16 pixels, got 8x8.*image-size="
    if kind == "one-class":
        for i in range(5):
            _png(folder / "cat" / f"{i}.png", _pixels(0, i, 16, 1))
        return f"hf:{folder}", {}, r"only one class \('cat'\)"
    if kind == "empty-class":
        flat_folder(folder)
        (folder / "fox").mkdir()
        return f"hf:{folder}", {}, re.escape(str(folder / "fox")) + ": class folder holds no image"
    if kind == "bomb":
        flat_folder(folder)
        bad = bomb_png(folder / "dog" / "scan.png")
        return f"hf:{folder}", {}, re.escape(str(bad)) + r": 196,000,000 pixels, over PIL's decompression-bomb limit"
    if kind == "relative":
        flat_folder(folder)
        return f"hf:{kind}", {}, r"must be absolute: hf:/"  # run from `root`, where `relative/` exists
    if kind == "not-a-hub-name":
        return "hf:B", {}, r"neither an absolute local path.*owner/name"
    if kind == "hassle-layout":
        flat_folder(folder)
        return (f"hf:{folder}", {"method": "hassle", "client-setting": "annotation-heterogeneity", "label-layout": "L,P",
                                 "labeled-share": 0.3}, r"label-layout='L,P'.*labeled-share=0.3")  # fmt: skip
    if kind == "hassle-no-labels":
        flat_folder(folder)
        return (f"hf:{folder}", {"method": "hassle", "client-setting": "annotation-heterogeneity", "label-layout": "U,U",
                                 "labeled-share": 0.0}, r"label-layout='U,U'.*no client holds a labeled image")  # fmt: skip
    raise AssertionError(kind)


BAD = ["truncated", "bomb", "other-size", "too-small", "one-class", "empty-class", "relative", "not-a-hub-name", "hassle-layout",
       "hassle-no-labels"]


@pytest.mark.parametrize("kind", BAD)
def test_bad_input_is_one_line_before_round_one(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``fedul check`` and through the ServerApp's checks on a simulated grid: one line,
    nothing written."""
    from fedul_flwr.check_cli import main as check_main
    from fedul_flwr.inprocess import InProcessGrid
    from fedul_flwr.client_app import app

    monkeypatch.chdir(tmp_path)
    clear_caches()
    dataset, extra, message = _bad(kind, tmp_path)
    runs = tmp_path / "runs"
    settings = {"dataset": dataset, "num-sets": 3, "output-dir": str(runs), **extra}
    typed = " ".join(f"{k}={json.dumps(v)}" for k, v in settings.items())
    code = check_main(["--run-config", typed, "--federation-config", "num-supernodes=2"])
    assert code == 1
    with pytest.raises(ConfigError) as refused:
        check_before_round_one(resolve_config(settings), InProcessGrid(app, 2, settings))
    assert re.search(message, str(refused.value)) and "\n" not in str(refused.value), str(refused.value)
    assert not runs.exists()


def test_fedul_check_reads_every_image_and_says_how_many(own, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from fedul_flwr.check_cli import main as check_main

    name, extra = own["folder"]
    assert check_main(["--run-config", f'dataset="{name}" image-size=16 num-sets=3']) == 0
    assert "read 45 images" in capsys.readouterr().out


def test_builtin_dataset_refuses_options_it_cannot_honour() -> None:
    with pytest.raises(DatasetError, match=r"image-size=32: dataset 'mnist-sample' has 28x28 images"):
        load_dataset("mnist-sample", options=DatasetOptions(image_size=32))
    with pytest.raises(ConfigError, match=r"Dataset 'mnist' needs data-dir"):
        check_before_round_one(resolve_config({"dataset": "mnist"}), object())


def test_fedul_reproduce_refuses_a_bad_dataset_in_one_line(tmp_path: Path) -> None:
    clear_caches()
    dataset, _, message = _bad("truncated", tmp_path)
    out = tmp_path / "grid"
    proc = subprocess.run(
        [shutil.which("fedul") or "fedul", "reproduce", "--grid", "smoke", "--out", str(out), "--set",
         f"dataset={dataset}", "--set", "num-sets=3"], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert any(re.search(message, line) for line in err), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not any(p.is_dir() and (p / "metrics.json").exists() for p in out.rglob("*")) if out.exists() else True


# --------------------------------------------------------------------------- Flower runtimes


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_flwr_run_refuses_bad_images_in_one_line(tmp_path: Path) -> None:
    """``flwr run .`` through a real SuperLink: a truncated image and images too small for the
    model are refused before round 1 with the project's one line, no traceback, no run folder."""
    from tests.flower_harness import superlink

    runs = tmp_path / "runs"
    with superlink(tmp_path) as link:
        for kind in ("truncated", "bomb", "too-small"):
            dataset, _, message = _bad(kind, tmp_path)
            run_id = link.submit(f"dataset='{dataset}' num-sets=3 num-rounds=1 output-dir='{runs}'",
                                 "num-supernodes=2 client-resources-num-cpus=1")  # fmt: skip
            record, log = link.wait(run_id, 300)
            assert record.get("status") == "finished:failed", log[-3000:]
            assert re.search("run refused before round 1, nothing written: .*" + message, log), log[-3000:]
            assert "Traceback" not in log, log[-3000:]
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.slow
def test_deployed_nodes_with_greyscale_pngs_of_another_size_and_no_copy_of_the_dataset(tmp_path: Path) -> None:
    """Two real SuperNodes whose ``data-dir`` is all they can read (the server's dataset folder
    is hidden from them by a private mount namespace where the machine allows one): one node's
    folder is the organisation's own image folder (two of the three classes), the other's
    ``labeled/<class>/`` and ``unlabeled/`` images; greyscale PNGs of 20x20 pixels in a colour
    run of ``image-size=16`` train FixMatch two rounds with both nodes in every round."""
    from tests.test_deployment import _Federation

    dataset = flat_folder(tmp_path / "server-pets", per_class=8)
    own, mixed = tmp_path / "hospital-a", tmp_path / "hospital-b"  # an image folder; labeled/ + unlabeled/
    for k, name in enumerate(CLASSES[:2]):
        for i in range(6):
            _png(own / name / f"{i}.png", _pixels(k, i, 20, 1))
    for k, name in enumerate(CLASSES[1:]):
        for i in range(3):
            _png(mixed / "labeled" / name / f"{i}.png", _pixels(k + 1, i, 20, 1))
    for i in range(12):
        _png(mixed / "unlabeled" / f"{i:02d}.png", _pixels(i % 3, 40 + i, 20, 1))
    nodes = [own, mixed]
    hide = subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0

    class Hidden(_Federation):
        def _start(self, name: str, cmd: list[str]) -> None:
            if name.startswith("supernode") and hide:
                from tests.test_deployment import VENV_BIN

                line = " ".join(f"'{c}'" for c in [str(VENV_BIN / cmd[0]), *cmd[1:]])
                cmd = ["unshare", "--mount", "sh", "-c", f"mount -t tmpfs none '{dataset}' && exec {line}"]
                log = (self.tmp / f"{name}.log").open("a")
                self.procs[name] = subprocess.Popen(cmd, env=self.env, cwd=self.tmp, stdout=log,
                                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                    start_new_session=True)  # fmt: skip
                return
            super()._start(name, cmd)

    fed = Hidden(tmp_path, nodes)
    runs = tmp_path / "runs"
    try:
        run_id = fed.submit(f'dataset="hf:{dataset}" image-size=16 method="fixmatch" client-setting="labels-at-clients" '
                            f'batch-size=4 fixmatch-mu=2 num-rounds=2 min-available-nodes=2 min-train-nodes=2 '
                            f'device="cpu" verbose=true output-dir="{runs}" run-name="grey"')  # fmt: skip
        status, log = fed.wait(run_id)
    finally:
        fed.close()
    assert status == "finished:completed", log[-4000:]
    assert re.findall(r"aggregate_train: Received (\d+) results and (\d+) failures", log) == [("2", "0")] * 2, log[-4000:]
    assert [row["round"] for row in json.loads((runs / "grey" / "metrics.json").read_text())] == [0, 1, 2]
    if hide:
        assert os.listdir(dataset)  # hidden from the nodes only


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"num-sets": 10}, r"client \d of 2 \(client-setting='usets'\): .*cannot be split into 10 non-empty sets"),
        ({"method": "feddb", "client-setting": "labels-at-clients", "num-labeled": 100},
         r"client-setting='labels-at-clients'.*num-labeled=100"),
    ],
    ids=["more-sets-than-images", "more-labels-than-images"],
)
def test_clients_that_cannot_be_built_are_refused_before_round_one(tmp_path: Path, settings: dict, message: str) -> None:
    """What the partition and the client setting cannot make of a small dataset is one line
    before round 1 (``fedul check`` and the ServerApp), not a failure of every client in it."""
    from fedul_flwr.check_cli import main as check_main
    from fedul_flwr.client_app import app
    from fedul_flwr.inprocess import InProcessGrid

    root = flat_folder(tmp_path / "small", per_class=5)  # 12 training images
    full = {"dataset": f"hf:{root}", "output-dir": str(tmp_path / "runs"), **settings}
    typed = " ".join(f"{k}={json.dumps(v)}" for k, v in full.items())
    assert check_main(["--run-config", typed, "--federation-config", "num-supernodes=2"]) == 1
    with pytest.raises(ConfigError, match=message):
        check_before_round_one(resolve_config(full), InProcessGrid(app, 2, full))
    assert not (tmp_path / "runs").exists()


def test_hub_name_offline_without_a_cached_copy_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(DatasetError) as refused:
        load_dataset("hf:someone/no-such-dataset", str(tmp_path / "cache"))
    assert str(refused.value).startswith("dataset='hf:someone/no-such-dataset': Hugging Face datasets could not load it")
    assert "\n" not in str(refused.value)


def test_nan_or_infinite_float_images_are_said_so_in_one_line(tmp_path: Path, recwarn: pytest.WarningsRecorder) -> None:
    """An all-NaN float TIFF and a [0, 1] one with one NaN are refused as holding NaN (not as
    values "outside [0, 1]"), an infinite one as infinite, without numpy's warnings."""
    from fedul_flwr.data.images import ImageError, ImageSpec, decode_image

    ramp = np.tile(np.linspace(0, 1, 16, dtype=np.float32), (16, 1))
    one = ramp.copy()
    one[0, 0] = np.nan
    inf = ramp.copy()
    inf[3, 3] = np.inf
    cases = {"all.tif": (np.full((16, 16), np.nan, np.float32), "256 NaN values of 256"),
             "one.tif": (one, "1 NaN value of 256"), "inf.tif": (inf, "1 infinite value of 256")}  # fmt: skip
    for name, (arr, said) in cases.items():
        path = _saved(tmp_path / name, arr)
        with pytest.raises(ImageError, match=re.escape(f"{path}: float image holding {said}")) as refused:
            decode_image(path, str(path), ImageSpec(1, 16))
        assert "outside" not in str(refused.value) and "\n" not in str(refused.value)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_a_lab_image_reads_alike_in_greyscale_and_colour_runs(tmp_path: Path) -> None:
    """A LAB TIFF (PIL converts LAB to RGB but not to L) decodes in a colour run as PIL's RGB
    and in a greyscale run as that RGB's luminance, not as "unreadable or truncated"."""
    from PIL import Image

    from fedul_flwr.data.images import ImageSpec, decode_image

    rgb = Image.fromarray(_pixels(1, 0, 16, 3).astype(np.uint8))
    path = tmp_path / "lab.tif"
    Image.merge("LAB", rgb.split()).save(path)
    with Image.open(path) as lab:
        colour = lab.convert("RGB")
    assert np.array_equal(decode_image(path, str(path), ImageSpec(3, 16)), np.moveaxis(np.asarray(colour), 2, 0))
    assert np.array_equal(decode_image(path, str(path), ImageSpec(1, 16))[0], np.asarray(colour.convert("L")))


def test_class_folders_in_nfd_are_the_nfc_classes(tmp_path: Path) -> None:
    """A class folder named ``caté`` decomposed (NFD, as macOS writes it) is the class ``caté``
    composed (NFC): of a dataset's classes, and against the run's classes given in NFC."""
    import unicodedata

    from fedul_flwr.data.images import read_image_folder

    nfd, nfc = unicodedata.normalize("NFD", "caté"), unicodedata.normalize("NFC", "caté")
    assert nfd != nfc
    for k, name in enumerate((nfd, "dog")):
        for i in range(2):
            _png(tmp_path / name / f"{i}.png", _pixels(k, i, 16, 3))
    folder = read_image_folder(tmp_path, class_names=[nfc, "dog"], allow_splits=False)
    assert folder.class_names == (nfc, "dog") and folder.splits["train"][1].tolist() == [0, 0, 1, 1]
    assert read_image_folder(tmp_path).class_names == (nfc, "dog")


def test_a_class_named_like_a_split_is_told_to_go_under_split_folders(tmp_path: Path) -> None:
    """A flat folder with a class ``train`` (CIFAR-100 has one) beside ``bus`` is refused with
    the hint to nest the classes under split folders; nested so, it reads."""
    from fedul_flwr.data.images import ImageError, read_image_folder

    for k, name in enumerate(("train", "bus")):
        for i in range(2):
            _png(tmp_path / "flat" / name / f"{i}.png", _pixels(k, i, 16, 3))
            _png(tmp_path / "nested" / "train" / name / f"{i}.png", _pixels(k, i, 16, 3))
    with pytest.raises(ImageError, match=r"a class named like a split, e\.g\. CIFAR-100's 'train', goes under split "
                       r"folders: .*/flat/train/<class>/"):  # fmt: skip
        read_image_folder(tmp_path / "flat")
    assert read_image_folder(tmp_path / "nested").class_names == ("bus", "train")
