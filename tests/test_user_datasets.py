"""The user's own datasets (``dataset="hf:<Hub name or /path>"``): tiny files built here in each
format ``datasets`` reads offline (an image folder of PNGs, a ``save_to_disk`` folder, a
Parquet file) load with the right shapes, labels and class names, every client setting builds
on them, FedUL and FedDB train a round on them in process, bad inputs fail with one line
naming the file or key, and a deployed node trains on an image folder of its own."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from fedul_flwr.preflight import resolve_config
from fedul_flwr.data.datasets import DatasetOptions, clear_caches, load_dataset
from fedul_flwr.data.image_dataset import DatasetError
from fedul_flwr.data.node_folder.layout import NodeDataError
from fedul_flwr.data.node_folder.reader import load_node_dir, validate_node_dir

SIDE = 16
PETS = ("cat", "dog", "emu")  # the image folder's class folders
PER_CLASS = 20


def _image(k: int, i: int, channels: int, side: int = SIDE) -> np.ndarray:
    """A uint8 image of class k: its mean brightness grows with k (learnable), noise varies with i."""
    rng = np.random.default_rng([k, i])
    base = 40 + 70 * k + rng.integers(0, 30, size=(side, side, channels))
    return np.clip(base, 0, 255).astype(np.uint8).squeeze()


def _save_png(path: Path, arr: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)


def _image_folder(root: Path, classes: tuple[str, ...] = PETS, per_class: int = PER_CLASS) -> Path:
    for k, name in enumerate(classes):
        for i in range(per_class):
            _save_png(root / name / f"{i:03d}.png", _image(k, i, 3))
    return root


def _hf_dataset(classes: tuple[str, ...], per_class: int, channels: int, image: str = "image", label: str = "label"):  # type: ignore[no-untyped-def]
    import datasets
    from PIL import Image

    rows = [(Image.fromarray(_image(k, i, channels)), k) for k in range(len(classes)) for i in range(per_class)]
    features = datasets.Features({image: datasets.Image(), label: datasets.ClassLabel(names=list(classes))})
    return datasets.Dataset.from_dict({image: [r[0] for r in rows], label: [r[1] for r in rows]}, features=features)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, dict, tuple[str, ...], int]]:
    """name -> (dataset value, extra run settings, class names, channels) of the three formats."""
    import datasets

    tmp = tmp_path_factory.mktemp("user-data")
    folder = _image_folder(tmp / "pets")
    saved = tmp / "saved"
    datasets.DatasetDict({"train": _hf_dataset(("a", "b", "c"), 16, 1), "test": _hf_dataset(("a", "b", "c"), 4, 1)}).save_to_disk(str(saved))
    parquet = tmp / "shapes.parquet"
    _hf_dataset(("w", "x", "y", "z"), 15, 3, image="img", label="fine").to_parquet(str(parquet))
    return {
        "imagefolder": (f"hf:{folder}", {}, PETS, 3),
        "save_to_disk": (f"hf:{saved}", {}, ("a", "b", "c"), 1),
        "parquet": (f"hf:{parquet}", {"image-column": "img", "label-column": "fine"}, ("w", "x", "y", "z"), 3),
    }


@pytest.mark.parametrize("fmt", ["imagefolder", "save_to_disk", "parquet"])
def test_each_format_loads_with_shapes_labels_and_class_names(sources, fmt: str) -> None:  # type: ignore[no-untyped-def]
    name, extra, classes, channels = sources[fmt]
    ds = load_dataset(name, options=DatasetOptions.from_values(extra))
    k = len(classes)
    assert ds.class_names == classes and ds.num_classes == k
    assert ds.train_x.dtype == torch.uint8 and ds.train_y.dtype == torch.int64
    assert tuple(ds.train_x.shape[1:]) == (channels, SIDE, SIDE) and tuple(ds.test_x.shape[1:]) == (channels, SIDE, SIDE)
    assert ds.mean == (0.5,) * channels and ds.std == (0.5,) * channels
    if fmt == "save_to_disk":  # its own test split: 16 + 4 images per class
        assert np.bincount(ds.train_y.numpy()).tolist() == [16] * k and np.bincount(ds.test_y.numpy()).tolist() == [4] * k
    else:  # no test split: 20% of each class held out with a fixed seed
        per_class = PER_CLASS if fmt == "imagefolder" else 15
        held = round(0.2 * per_class)
        assert np.bincount(ds.train_y.numpy()).tolist() == [per_class - held] * k
        assert np.bincount(ds.test_y.numpy()).tolist() == [held] * k
    # pixels and labels agree: class k's images are brighter than class k-1's (see _image)
    means = [float(ds.train_x[ds.train_y == c].float().mean()) for c in range(k)]
    assert means == sorted(means)
    # the run's dataset facts come from the dataset's features
    cfg = resolve_config({"dataset": name, "num-sets": k, **extra})
    from fedul_flwr.data.datasets import run_dataset_info

    info = run_dataset_info(cfg.as_dict())
    assert (info.class_names, info.channels, info.image_size) == (classes, channels, SIDE)


def test_image_folder_pixels_are_the_files(sources) -> None:  # type: ignore[no-untyped-def]
    """The image folder's training images are the PNG files, in channel-first layout."""
    from PIL import Image

    name, _, _, _ = sources["imagefolder"]
    ds = load_dataset(name)
    folder = Path(name[3:])
    files = {np.asarray(Image.open(p)).tobytes() for p in folder.rglob("*.png")}
    assert len(files) == len(PETS) * PER_CLASS
    for x in ds.train_x[:5]:
        assert x.permute(1, 2, 0).contiguous().numpy().tobytes() in files


@pytest.mark.parametrize(
    "setting",
    [
        {"client-setting": "usets", "num-sets": 3, "partition": "dirichlet", "dirichlet-alpha": 1.0},
        {"client-setting": "pu", "positive-classes": "1"},
        {"client-setting": "labels-at-clients", "num-labeled": 12},
        {"client-setting": "annotation-heterogeneity", "label-layout": "L,P,U", "labeled-share": 0.5},
    ],
    ids=lambda s: s["client-setting"],
)
def test_every_client_setting_builds_on_a_user_dataset(sources, setting: dict) -> None:  # type: ignore[no-untyped-def]
    from fedul_flwr.data.simulated import SETTING_PARTS, load_client

    name, *_ = sources["imagefolder"]
    cfg = resolve_config({"dataset": name, "seed": 1, **setting})
    for i in range(3):
        client = load_client(cfg, i, 3, frozenset(SETTING_PARTS[cfg.client_setting]))
        assert client.class_names == PETS
        x = client.unlabeled if client.unlabeled is not None else client.labeled.x  # type: ignore[union-attr]
        assert x.dtype == torch.uint8 and tuple(x.shape[1:]) == (3, SIDE, SIDE)


@pytest.mark.parametrize("method", ["fedul", "feddb"])
def test_one_round_in_process_on_each_format(sources, tmp_path: Path, method: str) -> None:  # type: ignore[no-untyped-def]
    """The reproduction runner's ``execute`` (InProcessGrid + the real apps) trains one round
    of FedUL and of FedDB on each format."""
    from fedul_flwr.experiments.runner import RunSpec, execute

    for fmt, (name, extra, classes, _) in sources.items():
        setting = (
            {"num-sets": len(classes)}
            if method == "fedul"
            else {"client-setting": "labels-at-clients", "num-labeled": 2 * len(classes), "fixmatch-mu": 2}
        )
        rc = {"dataset": name, "method": method, "num-rounds": 1, "batch-size": 8, "output-dir": str(tmp_path),
              "run-name": f"{method}-{fmt}", **setting, **extra}  # fmt: skip
        record = execute(RunSpec("user", fmt, method, "*", 0, 2, "", rc), rc)
        rows = record["metrics"]
        assert [r["round"] for r in rows] == [0, 1], fmt
        assert 0.0 <= rows[1]["test-accuracy"] <= 1.0 and np.isfinite(rows[1]["train-loss"]), fmt


# --------------------------------------------------------------------------- bad inputs


def _one_line_error(name: str, match: str, **options: object) -> str:
    clear_caches()
    with pytest.raises(DatasetError, match=match) as info:
        load_dataset(name, options=DatasetOptions(**options))  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_empty_class_folder_is_named(tmp_path: Path) -> None:
    root = _image_folder(tmp_path / "imgs", per_class=3)
    (root / "fox").mkdir()
    _one_line_error(f"hf:{root}", re.escape(f"{root / 'fox'}: class folder holds no image"))


def test_unreadable_image_is_named(tmp_path: Path) -> None:
    root = _image_folder(tmp_path / "imgs", per_class=5)
    (root / "dog" / "002.png").write_bytes(b"not a png")
    _one_line_error(f"hf:{root}", re.escape(str(root / "dog" / "002.png")) + ".*unreadable or truncated image")


def test_truncated_image_is_named_when_decoded_and_the_facts_need_only_headers(tmp_path: Path) -> None:
    """A deployed node needs only the dataset's facts: they come from the images' headers, so
    a file whose pixel data is cut off passes there and fails, named, when the images load."""
    from fedul_flwr.data.user_datasets import user_dataset_info

    root = _image_folder(tmp_path / "imgs", per_class=5)
    bad = root / "cat" / "001.png"
    bad.write_bytes(bad.read_bytes()[:-40])
    info = user_dataset_info(f"hf:{root}")
    assert (info.class_names, info.channels, info.image_size) == (PETS, 3, SIDE)
    _one_line_error(f"hf:{root}", re.escape(str(bad)) + ".*unreadable or truncated image")


def test_a_bad_row_is_named_by_dataset_split_and_row_and_a_column_of_no_images_by_its_key(tmp_path: Path) -> None:
    """A decompression bomb, garbage bytes and a HEIC photo in Parquet rows: one line naming the
    three rows; an ``image-column`` of integers: one line naming the key, not pyarrow's
    traceback."""
    import io

    import datasets
    from PIL import Image

    from tests.test_own_images import bomb_png

    def png(arr: np.ndarray) -> bytes:
        out = io.BytesIO()
        Image.fromarray(arr).save(out, format="PNG")
        return out.getvalue()

    images = [png(_image(k % 2, k, 1)) for k in range(10)]
    images[3], images[6] = bomb_png(tmp_path / "bomb.png").read_bytes(), b"garbage"
    images[8] = b"\0\0\0\x18ftypheic\0\0\0\0mif1heic" + bytes(64)  # an iPhone photo's first bytes
    images[1] = images[1][:-40]  # cut short: its header reads, its pixels do not (found in a later pass)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"]),
                                  "n": datasets.Value("int64")})  # fmt: skip
    datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in images], "label": [k % 2 for k in range(10)],
                                "n": list(range(10))}, features=features).to_parquet(str(tmp_path / "rows.parquet"))  # fmt: skip
    name = f"hf:{tmp_path / 'rows.parquet'}"
    where = re.escape(f"dataset={name!r}: split 'train', row ")
    message = _one_line_error(name, "^4 bad rows: ")
    assert re.search(where + r"1: unreadable or truncated image", message), message
    assert re.search(where + r"3: 196,000,000 pixels, over PIL's decompression-bomb limit", message), message
    assert re.search(where + r"6: unreadable or truncated image \(UnidentifiedImageError: cannot identify image "
                     r"file\); ", message), message  # the row named, not PIL's <_io.BytesIO object at 0x...>
    assert re.search(where + r"8: a HEIC/HEIF image; convert it to PNG or JPEG", message), message
    rows = [int(n) for n in re.findall(where + r"(\d+):", message)]
    assert rows == sorted(rows) == [1, 3, 6, 8] and "BytesIO" not in message  # in the dataset's row order
    _one_line_error(name, re.escape(f"dataset={name!r}: image-column 'n' holds Value('int64'), not images"),
                    image_column="n")


def test_wrong_size_is_named_and_image_size_resizes(tmp_path: Path) -> None:
    root = _image_folder(tmp_path / "imgs", per_class=5)
    bad = root / "emu" / "003.png"
    _save_png(bad, _image(2, 3, 3, side=20))
    message = _one_line_error(f"hf:{root}", re.escape(str(bad)))
    assert "20x20 pixels" in message and "16x16" in message and "image-size" in message
    clear_caches()
    ds = load_dataset(f"hf:{root}", options=DatasetOptions(image_size=12))
    assert tuple(ds.train_x.shape[1:]) == (3, 12, 12) and tuple(ds.test_x.shape[1:]) == (3, 12, 12)


def test_non_square_images_need_image_size(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    for k, name in enumerate(PETS):
        for i in range(5):
            _save_png(root / name / f"{i}.png", _image(k, i, 3)[:, :12])
    _one_line_error(f"hf:{root}", "16x12|12x16", image_size=0)
    clear_caches()
    assert tuple(load_dataset(f"hf:{root}", options=DatasetOptions(image_size=8)).train_x.shape[1:]) == (3, 8, 8)


def test_missing_column_names_the_key(sources) -> None:  # type: ignore[no-untyped-def]
    name, *_ = sources["parquet"]
    _one_line_error(name, re.escape("image-column='picture'") + ".*no such column.*'img'", image_column="picture",
                    label_column="fine")  # fmt: skip
    _one_line_error(name, re.escape("label-column='class'") + ".*no such column", image_column="img", label_column="class")
    clear_caches()  # without the keys: the one Image and the one ClassLabel column
    assert load_dataset(name).class_names == ("w", "x", "y", "z")


@pytest.mark.parametrize("kind", ["text", "int"])
def test_labels_without_class_names(tmp_path: Path, kind: str) -> None:
    """Text labels become their sorted texts, integer labels "0".."K-1"; two Image columns
    need image-column."""
    import datasets
    from PIL import Image

    labels = [["b", "a", "c"][i % 3] if kind == "text" else [1, 0, 2][i % 3] for i in range(15)]
    images = [Image.fromarray(_image(i % 3, i, 1)) for i in range(15)]
    data = datasets.Dataset.from_dict({"image": images, "label": labels}, features=datasets.Features(
        {"image": datasets.Image(), "label": datasets.Value("string" if kind == "text" else "int64")}))  # fmt: skip
    data.save_to_disk(str(tmp_path / "d"))
    ds = load_dataset(f"hf:{tmp_path / 'd'}")
    assert ds.class_names == (("a", "b", "c") if kind == "text" else ("0", "1", "2"))
    assert ds.in_channels == 1 and sorted(set(ds.train_y.tolist())) == [0, 1, 2]
    two = datasets.Features({"image": datasets.Image(), "copy": datasets.Image(), "label": data.features["label"]})
    datasets.Dataset.from_dict({"image": images, "copy": images, "label": labels}, features=two).save_to_disk(
        str(tmp_path / "two"))  # fmt: skip
    _one_line_error(f"hf:{tmp_path / 'two'}", r"cannot tell the image column.*\['image', 'copy'\].*set image-column")


def test_missing_path_and_relative_path_and_bad_keys(tmp_path: Path) -> None:
    _one_line_error(f"hf:{tmp_path / 'nowhere'}", re.escape(f"{tmp_path / 'nowhere'}: no such file or folder"))
    _one_line_error("hf:./imgs", "neither an absolute local path")
    from fedul_flwr.config import ConfigError

    with pytest.raises(ConfigError, match="image-size=-1"):
        resolve_config({"dataset": "hf:/x", "image-size": -1})


# --------------------------------------------------------------------------- node folders


def _facts(name: str) -> dict:
    from fedul_flwr.data.datasets import run_dataset_info

    info = run_dataset_info(resolve_config({"dataset": name, "num-sets": 3}).as_dict())
    return {"class_names": info.class_names, "image_size": info.image_size, "channels": info.channels}


def test_node_data_dir_may_be_an_image_folder(sources, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A node's own image folder with some of the run's classes is its labeled part; a node
    folder may hold labeled/<class>/ and unlabeled/ image files too."""
    name, *_ = sources["imagefolder"]
    facts = _facts(name)
    node = _image_folder(tmp_path / "node", classes=PETS[:2], per_class=4)
    client = load_node_dir(node, **facts, mean=(0.5,) * 3, std=(0.5,) * 3)
    assert client.labeled is not None and client.labeled.y.tolist() == [0] * 4 + [1] * 4
    assert tuple(client.labeled.x.shape) == (8, 3, SIDE, SIDE) and client.unlabeled is None
    report = validate_node_dir(node, **facts)
    assert report.parts == ("labeled", "positive-classes") and report.positive_classes == ("cat", "dog")
    mixed = tmp_path / "mixed"
    _image_folder(mixed / "labeled", classes=("emu",), per_class=2)
    for i in range(3):
        _save_png(mixed / "unlabeled" / f"{i}.png", _image(0, 10 + i, 3))
    client = load_node_dir(mixed, **facts, mean=(0.5,) * 3, std=(0.5,) * 3)
    assert client.labeled.y.tolist() == [2, 2] and tuple(client.unlabeled.shape) == (3, 3, SIDE, SIDE)  # type: ignore[union-attr]


def _node_error(root: Path, facts: dict, match: str) -> None:
    with pytest.raises(NodeDataError, match=match) as info:
        validate_node_dir(root, **facts)
    assert "\n" not in str(info.value)


def test_node_image_folder_bad_inputs_name_the_file(sources, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    name, *_ = sources["imagefolder"]
    facts = _facts(name)
    root = _image_folder(tmp_path / "node", per_class=2)
    (root / "emu" / "000.png").write_bytes(b"garbage")
    _node_error(root, facts, re.escape(f"{root / 'emu' / '000.png'}: unreadable or truncated image"))
    _save_png(root / "emu" / "000.png", _image(2, 0, 3, side=8))
    _node_error(root, facts, re.escape(f"{root / 'emu' / '000.png'}: image of 8x8 pixels, the run's images are 16x16"))
    _save_png(root / "emu" / "000.png", _image(2, 0, 3))
    (root / "owl").mkdir()
    _node_error(root, facts, re.escape(f"{root / 'owl'}: folder name 'owl' is not one of the run's classes"))
    (root / "owl").rmdir()
    for p in (root / "dog").iterdir():
        p.unlink()
    _node_error(root, facts, re.escape(f"{root / 'dog'}: class folder holds no image"))


def test_node_data_write_takes_a_user_dataset(sources, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``fedul node-data write`` splits a user dataset into node folders that validate against it."""
    from fedul_flwr.node_data_cli import main

    name, extra, classes, _ = sources["parquet"]
    settings = " ".join(f'{k}="{v}"' for k, v in extra.items())
    out = tmp_path / "nodes"
    assert main(["write", "--out", str(out), "--num-nodes", "2", "--dataset", name, "--run-config",
                 f'num-sets=4 {settings}']) == 0  # fmt: skip
    meta = json.loads((out / "node-0" / "meta.json").read_text())
    assert meta["dataset"] == name and meta["class_names"] == list(classes) and meta["channels"] == 3
    assert main(["validate", str(out / "node-1"), "--dataset", name, "--run-config", settings]) == 0


# --------------------------------------------------------------------------- Flower runtimes


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_the_datasets_page_commands_run_as_printed(tmp_path: Path) -> None:
    """The "Your own images" commands of docs/datasets.md, with /data/pets replaced by a tiny
    image folder: the run settings of the `flwr run` line resolve, and `fedul node-data write`
    writes and validates the node folders."""
    import shlex

    from fedul_flwr.preflight import check_setting
    from fedul_flwr.config.command_line import parse_run_config
    from fedul_flwr.node_data_cli import main

    page = (Path(__file__).resolve().parent.parent / "docs" / "datasets.md").read_text()
    section = page.split("## Your own images", 1)[1]
    folder = _image_folder(tmp_path / "pets", per_class=100)  # 5 nodes, 10 non-empty U sets each
    flwr_run = re.search(r"flwr run \. .*?--run-config '([^']*)'", section, re.S)
    assert flwr_run, section
    cfg = resolve_config(parse_run_config([flwr_run.group(1).replace("/data/pets", str(folder))]))
    check_setting(cfg)
    assert cfg.dataset == f"hf:{folder}" and cfg.image_size == 32
    write = re.search(r"^(fedul node-data write .*)$", section, re.M)
    assert write, section
    argv = shlex.split(write.group(1).replace("/data/pets", str(folder)).replace("/tmp/pets-nodes", str(tmp_path / "n")))
    assert main(argv[2:]) == 0
    assert json.loads((tmp_path / "n" / "node-4" / "meta.json").read_text())["image_size"] == 32
