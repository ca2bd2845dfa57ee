"""A deployed node's data folder: every bad input names its culprit; write -> validate -> load
round trips; validation never modifies anything."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedul_flwr.preflight import resolve_config
from fedul_flwr.data.node_folder.layout import LAYOUTS, NodeDataError
from fedul_flwr.data.node_folder.reader import load_node_dir, read_node_dir, validate_node_dir
from fedul_flwr.data.node_folder.writer import write_node_dir
from fedul_flwr.data.simulated import client_usets, load_run_dataset
from fedul_flwr.data.datasets import run_dataset_info
from fedul_flwr.data.sources import client_from_node_config
from fedul_flwr.node_data_cli import main as node_data_main
from fedul_flwr.node_data_cli import write_nodes

CLASSES = ("cat", "dog", "bird")
SIZE, CHANNELS = 8, 1
PRIORS = np.array(
    [[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.2, 0.1, 0.7], [0.4, 0.3, 0.3]],
)


def _write_priors(root: Path, rows: list[list[str]], header: list[str] | None = None) -> None:
    with (root / "priors.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header or ["set", *CLASSES])
        w.writerows(rows)


def _rows(priors: np.ndarray = PRIORS) -> list[list[str]]:
    return [[f"s{m}", *(str(v) for v in row)] for m, row in enumerate(priors)]


def _make_node(root: Path, *, fmt: str = "npy", sizes: tuple[int, ...] = (5, 6, 7, 4)) -> Path:
    """A valid K=3, M=4 node folder of 8x8 grey images; set m's pixels all equal m."""
    root.mkdir(parents=True, exist_ok=True)
    _write_priors(root, _rows())
    for m, n in enumerate(sizes):
        folder = root / "sets" / f"s{m}"
        folder.mkdir(parents=True)
        imgs = np.full((n, SIZE, SIZE), m * 10 + np.arange(n)[:, None, None], dtype=np.uint8)
        if fmt == "npy":
            np.save(folder / "images.npy", imgs)
        else:
            for i, img in enumerate(imgs):
                Image.fromarray(img).save(folder / f"img{i:03d}.png")
    return root


def _validate(root: Path):
    return validate_node_dir(root, CLASSES, SIZE, CHANNELS)


def _load(root: Path):
    return load_node_dir(root, class_names=CLASSES, image_size=SIZE, channels=CHANNELS, mean=(0.5,), std=(0.25,))


def _labeled_images(n: int, offset: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """uint8 [n, 8, 8] images whose pixels equal offset + i, and labels i mod K."""
    x = np.full((n, SIZE, SIZE), offset + np.arange(n)[:, None, None], dtype=np.uint8)
    return x, np.arange(n) % len(CLASSES)


def _add_labeled(root: Path, n: int = 5) -> tuple[np.ndarray, np.ndarray]:
    x, y = _labeled_images(n)
    (root / "labeled").mkdir(parents=True)
    np.save(root / "labeled" / "images.npy", x)
    np.save(root / "labeled" / "labels.npy", y)
    return x, y


def _add_unlabeled(root: Path, n: int = 4) -> np.ndarray:
    x = np.full((n, SIZE, SIZE), 200 + np.arange(n)[:, None, None], dtype=np.uint8)
    (root / "unlabeled").mkdir(parents=True)
    np.save(root / "unlabeled" / "images.npy", x)
    return x


def _expect(root: Path, *fragments: str) -> str:
    with pytest.raises(NodeDataError) as err:
        _validate(root)
    msg = str(err.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    return msg


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return _make_node(tmp_path / "node")


# --------------------------------------------------------------------------- good folders


@pytest.mark.parametrize("fmt", ["npy", "png"])
def test_valid_folder_report(tmp_path: Path, fmt: str) -> None:
    root = _make_node(tmp_path / "n", fmt=fmt)
    report = _validate(root)
    assert report.set_names == ("s0", "s1", "s2", "s3")
    assert report.set_sizes == (5, 6, 7, 4)
    assert report.set_formats == (("npy",) if fmt == "npy" else ("files",)) * 4
    np.testing.assert_allclose(report.priors, PRIORS)
    assert 1.0 <= report.condition_number < 10
    assert report.num_test == 0 and report.absent_classes == ()
    assert report.num_labeled == 0 and report.num_unlabeled == 0
    assert report.parts == ("unlabeled", "usets")
    assert "4 sets, 22 images" in report.summary()


def test_load_gives_surrogate_labels_in_csv_order(tmp_path: Path) -> None:
    root = _make_node(tmp_path / "n", fmt="png")
    client = _load(root)
    assert client.unlabeled.shape == (22, 1, SIZE, SIZE) and client.unlabeled.dtype == torch.uint8
    assert client.usets.set_index.tolist() == [0] * 5 + [1] * 6 + [2] * 7 + [3] * 4
    # set 2, image 3 has pixel value 23, kept as uint8 (normalised per batch, not at load time)
    assert client.unlabeled[11 + 3, 0, 0, 0].item() == 23
    np.testing.assert_allclose(client.usets.priors, PRIORS)
    np.testing.assert_allclose(client.usets.surrogate_prior, np.array([5, 6, 7, 4]) / 22)
    assert client.class_names == CLASSES and client.labeled is None and client.test is None
    assert client.parts() == ("unlabeled", "usets")
    assert client.node == str(root.resolve()) and client.mean == (0.5,) and client.std == (0.25,)


def test_rows_within_tolerance_are_renormalised(node: Path) -> None:
    _write_priors(node, _rows(np.round(PRIORS * 0.9995, 6)))
    np.testing.assert_allclose(_validate(node).priors.sum(axis=1), 1.0)


def test_spreadsheet_csv_with_bom_and_crlf_is_accepted(node: Path) -> None:
    text = "\r\n".join(",".join(r) for r in [["set", *CLASSES], *_rows()]) + "\r\n"
    (node / "priors.csv").write_bytes(b"\xef\xbb\xbf" + text.encode())
    np.testing.assert_allclose(_validate(node).priors, PRIORS)


def test_zero_column_is_reported_as_absent_class(tmp_path: Path) -> None:
    root = _make_node(tmp_path / "n")
    pri = np.array([[0.9, 0.1, 0.0], [0.2, 0.8, 0.0], [0.5, 0.5, 0.0], [0.3, 0.7, 0.0]])
    _write_priors(root, _rows(pri))
    report = _validate(root)
    assert report.absent_classes == ("bird",)


def test_validation_modifies_nothing(node: Path) -> None:
    def snapshot() -> dict[str, tuple[int, int, bytes]]:
        return {
            str(p): (p.stat().st_mtime_ns, p.stat().st_size, p.read_bytes())
            for p in sorted(node.rglob("*"))
            if p.is_file()
        }

    before = snapshot()
    _validate(node)
    (node / "sets" / "s1" / "images.npy").unlink()
    after_break = snapshot()
    _expect(node, "s1")
    assert snapshot() == after_break
    assert set(before) - set(after_break) == {str(node / "sets" / "s1" / "images.npy")}


def test_labeled_only_node(tmp_path: Path) -> None:
    root = tmp_path / "n"
    x, y = _add_labeled(root, n=7)
    report = _validate(root)
    assert report.parts == ("labeled", "positive-classes")  # the classes it labels
    assert report.num_labeled == 7 and report.num_unlabeled == 0 and report.num_images == 0
    assert report.set_names == report.set_sizes == report.set_formats == ()
    assert report.priors.shape == (0, 3) and np.isnan(report.condition_number)
    text = report.summary()
    assert "labeled: 7 images" in text and "sets" not in text and "cond(Pi)" not in text
    client = _load(root)
    assert client.parts() == ("labeled", "positive-classes")
    assert client.unlabeled is None and client.usets is None
    assert client.labeled.x.dtype == torch.uint8 and client.labeled.x.shape == (7, 1, SIZE, SIZE)
    torch.testing.assert_close(client.labeled.x[:, 0], torch.from_numpy(x))
    assert client.labeled.y.dtype == torch.int64 and client.labeled.y.tolist() == y.tolist()
    assert client.image_shape == (1, SIZE, SIZE)


def test_node_with_sets_and_labeled_part(node: Path) -> None:
    x, y = _add_labeled(node, n=6)
    report = _validate(node)
    assert report.parts == ("labeled", "unlabeled", "usets", "positive-classes")
    assert report.num_labeled == 6 and report.num_unlabeled == 0 and report.num_images == 22
    text = report.summary()
    assert "labeled: 6 images" in text and "4 sets, 22 images" in text
    client = _load(node)
    assert client.parts() == ("labeled", "unlabeled", "usets", "positive-classes")
    assert len(client.unlabeled) == 22 and len(client.usets.set_index) == 22
    torch.testing.assert_close(client.labeled.x[:, 0], torch.from_numpy(x))
    assert client.labeled.y.tolist() == y.tolist()


def test_plain_unlabeled_node(tmp_path: Path) -> None:
    root = tmp_path / "n"
    x = _add_unlabeled(root, n=4)
    report = _validate(root)
    assert report.parts == ("unlabeled",) and report.num_unlabeled == 4 and report.num_sets == 0
    client = _load(root)
    assert client.parts() == ("unlabeled",) and client.usets is None
    torch.testing.assert_close(client.unlabeled[:, 0], torch.from_numpy(x))
    _add_labeled(root, n=3)  # labeled + plain unlabeled is accepted too
    assert _validate(root).parts == ("labeled", "unlabeled", "positive-classes")
    assert _load(root).parts() == ("labeled", "unlabeled", "positive-classes")


def test_write_node_dir_with_labeled_part(tmp_path: Path) -> None:
    cfg = resolve_config({"num-sets": 10, "seed": 4})
    data = load_run_dataset(cfg)
    usets, _ = client_usets(cfg, 1, 3)
    idx = torch.from_numpy(np.concatenate(usets.indices)[:9])
    root = write_node_dir(
        tmp_path / "n",
        data.train_x,
        usets,
        data.class_names,
        max_set_size=2,
        labeled=(data.train_x[idx], data.train_y[idx]),
    )
    info = run_dataset_info(cfg)
    report = validate_node_dir(root, info.class_names, info.image_size, info.channels)
    assert report.parts == ("labeled", "unlabeled", "usets", "positive-classes")
    assert report.num_labeled == 9 and report.set_sizes == (2,) * 10
    client = load_node_dir(root, class_names=info.class_names, image_size=info.image_size, channels=info.channels,
                           mean=info.mean, std=info.std)
    torch.testing.assert_close(client.labeled.x, data.train_x[idx])
    torch.testing.assert_close(client.labeled.y, data.train_y[idx])


# --------------------------------------------------------------------------- bad folders


def test_unlabeled_folder_with_usets_names_both(node: Path) -> None:
    _add_unlabeled(node)
    _expect(node, str(node / "unlabeled"), str(node / "sets"), "not both", "ambiguous")


def test_priors_csv_without_sets_folder(tmp_path: Path) -> None:
    root = tmp_path / "n"
    root.mkdir()
    _write_priors(root, _rows())
    _expect(root, str(root / "sets"), "missing", "priors.csv")


def test_sets_folder_without_priors_csv_next_to_labeled(node: Path) -> None:
    (node / "priors.csv").unlink()
    _add_labeled(node)  # a labeled part does not excuse half a U-set layout
    _expect(node, str(node / "priors.csv"), "missing")


@pytest.mark.parametrize("extra", [None, "meta", "test"])
def test_folder_without_training_data_lists_the_layouts(tmp_path: Path, extra: str | None) -> None:
    root = tmp_path / "n"
    root.mkdir()
    if extra == "meta":
        (root / "meta.json").write_text(json.dumps({"image_size": SIZE}))
    elif extra == "test":  # a local test split alone is no training data
        (root / "test").mkdir()
        np.save(root / "test" / "images.npy", np.zeros((2, SIZE, SIZE), dtype=np.uint8))
        np.save(root / "test" / "labels.npy", np.array([0, 1]))
    _expect(root, str(root), "no training data", *LAYOUTS)
    assert "priors.csv + sets/" in LAYOUTS[0]
    assert "labeled/labels.npy" in LAYOUTS[1] and "unlabeled/images.npy" in LAYOUTS[2]


def test_labeled_label_out_of_range(tmp_path: Path) -> None:
    root = tmp_path / "n"
    _add_labeled(root, n=4)
    np.save(root / "labeled" / "labels.npy", np.array([0, 1, 2, -1]))
    _expect(root, str(root / "labeled" / "labels.npy"), "label -1 at position 3", "0..2")
    np.save(root / "labeled" / "labels.npy", np.array([0, 7, 2, 1]))
    _expect(root, str(root / "labeled" / "labels.npy"), "label 7 at position 1")


def test_labeled_part_missing_labels(node: Path) -> None:
    _add_labeled(node)
    (node / "labeled" / "labels.npy").unlink()
    _expect(node, str(node / "labeled" / "labels.npy"), "missing", "labeled part")


def test_labeled_part_label_count_and_dtype(tmp_path: Path) -> None:
    root = tmp_path / "n"
    _add_labeled(root, n=4)
    np.save(root / "labeled" / "labels.npy", np.array([0, 1, 2]))
    _expect(root, str(root / "labeled" / "labels.npy"), "3 labels for 4 images")
    np.save(root / "labeled" / "labels.npy", np.array([0.0, 1.0, 2.0, 0.0]))
    _expect(root, str(root / "labeled" / "labels.npy"), "float64", "integer labels")


def test_labeled_and_unlabeled_folders_reject_stray_files(tmp_path: Path) -> None:
    root = tmp_path / "n"
    _add_labeled(root)
    (root / "labeled" / "extra.png").write_bytes(b"x")
    _expect(root, str(root / "labeled"), "['extra.png']")
    (root / "labeled" / "extra.png").unlink()
    (root / "unlabeled").mkdir()
    _expect(root, str(root / "unlabeled" / "images.npy"), "missing")
    np.save(root / "unlabeled" / "images.npy", np.zeros((2, SIZE, SIZE), dtype=np.float32))
    _expect(root, str(root / "unlabeled" / "images.npy"), "float32", "uint8")


def test_empty_labeled_folder(tmp_path: Path) -> None:
    root = tmp_path / "n"
    (root / "labeled").mkdir(parents=True)
    _expect(root, str(root / "labeled"), "empty")




def test_missing_folder(tmp_path: Path) -> None:
    _expect(tmp_path / "nowhere", str(tmp_path / "nowhere"), "does not exist")


def test_missing_priors_csv(node: Path) -> None:
    (node / "priors.csv").unlink()
    _expect(node, "priors.csv", "missing")


def test_set_in_csv_without_folder(node: Path) -> None:
    (node / "sets" / "s2" / "images.npy").unlink()
    (node / "sets" / "s2").rmdir()
    _expect(node, str(node / "sets" / "s2"), "missing", "'s2'")


def test_folder_without_csv_row(node: Path) -> None:
    (node / "sets" / "stray").mkdir()
    _expect(node, "['stray']", "no row in", "priors.csv")


def test_empty_set_folder(node: Path) -> None:
    (node / "sets" / "s3" / "images.npy").unlink()
    _expect(node, str(node / "sets" / "s3"), "empty")


def test_unreadable_image(tmp_path: Path) -> None:
    root = _make_node(tmp_path / "n", fmt="png")
    bad = root / "sets" / "s1" / "img002.png"
    bad.write_bytes(b"not a png at all")
    _expect(root, str(bad), "unreadable or truncated image")


def test_wrongly_sized_image(tmp_path: Path) -> None:
    root = _make_node(tmp_path / "n", fmt="png")
    bad = root / "sets" / "s0" / "img001.png"
    Image.fromarray(np.zeros((SIZE + 2, SIZE), dtype=np.uint8)).save(bad)
    _expect(root, str(bad), "8x10 pixels", "8x8", "image-size=N")


def test_npy_of_other_channels(node: Path) -> None:
    """Colour images in a greyscale run are converted as image files are (one decoder); two
    channels are no image."""
    colour = node / "sets" / "s0" / "images.npy"
    np.save(colour, np.full((3, SIZE, SIZE, 3), 200, dtype=np.uint8))
    assert read_node_dir(node, CLASSES, SIZE, 1).unlabeled[:3].tolist() == np.full((3, 1, SIZE, SIZE), 200).tolist()
    np.save(colour, np.zeros((3, SIZE, SIZE, 2), dtype=np.uint8))
    _expect(node, str(colour), "C = 1 or 3")


def test_npy_of_wrong_dtype(node: Path) -> None:
    bad = node / "sets" / "s0" / "images.npy"
    np.save(bad, np.zeros((3, SIZE, SIZE), dtype=np.float32))
    _expect(node, str(bad), "float32", "uint8")


def test_non_image_file_in_set(node: Path) -> None:
    (node / "sets" / "s1" / "images.npy").unlink()
    Image.fromarray(np.zeros((SIZE, SIZE), dtype=np.uint8)).save(node / "sets" / "s1" / "a.png")
    (node / "sets" / "s1" / "scan.txt").write_bytes(b"x")
    _expect(node, "scan.txt", "not an image file", "'s1'")


def test_row_not_summing_to_one(node: Path) -> None:
    rows = _rows()
    rows[2] = ["s2", "0.2", "0.1", "0.5"]
    _write_priors(node, rows)
    _expect(node, "priors.csv", "line 4", "'s2'", "sum to 0.8")


def test_negative_prior(node: Path) -> None:
    rows = _rows()
    rows[1] = ["s1", "1.1", "-0.1", "0.0"]
    _write_priors(node, rows)
    _expect(node, "line 3", "'s1'", "'dog'", "-0.1", "negative")


def test_nan_prior(node: Path) -> None:
    rows = _rows()
    rows[0] = ["s0", "nan", "0.5", "0.5"]
    _write_priors(node, rows)
    _expect(node, "line 2", "'s0'", "'cat'", "'nan'")


def test_non_numeric_prior(node: Path) -> None:
    rows = _rows()
    rows[3] = ["s3", "0.4", "three tenths", "0.3"]
    _write_priors(node, rows)
    _expect(node, "line 5", "'s3'", "'three tenths'", "not a number")


def test_wrong_number_of_priors_in_row(node: Path) -> None:
    rows = _rows()
    rows[3] = ["s3", "0.5", "0.5"]
    _write_priors(node, rows)
    _expect(node, "line 5", "'s3'", "2 priors", "K=3")


def test_class_names_do_not_match_run(node: Path) -> None:
    _write_priors(node, _rows(), header=["set", "cat", "dog", "fish"])
    _expect(node, "priors.csv", "line 1", "missing ['bird']", "unknown ['fish']")


def test_class_names_in_other_order(node: Path) -> None:
    _write_priors(node, _rows(), header=["set", "dog", "cat", "bird"])
    _expect(node, "line 1", "another order")


def test_fewer_sets_than_classes(tmp_path: Path) -> None:
    root = _make_node(tmp_path / "n", sizes=(3, 3))
    _write_priors(root, _rows(PRIORS[:2]))
    _expect(root, "priors.csv", "2 sets < K=3")


def test_rank_deficient_matrix(node: Path) -> None:
    # column 'bird' = column 'cat': rank 2 < 3
    pri = np.array([[0.4, 0.2, 0.4], [0.1, 0.8, 0.1], [0.25, 0.5, 0.25], [0.3, 0.4, 0.3]])
    _write_priors(node, _rows(pri))
    _expect(node, "priors.csv", "rank 2 < 3", "full column rank", "['s0', 's1', 's2', 's3']")


def test_repeated_set_name(node: Path) -> None:
    rows = _rows()
    rows[3][0] = "s0"
    _write_priors(node, rows)
    _expect(node, "line 5", "'s0'", "repeats line 2")


def test_meta_json_mismatch(node: Path) -> None:
    (node / "meta.json").write_text(json.dumps({"image_size": 28}))
    _expect(node, "meta.json", "image_size = 28", "expects 8")


def test_test_split_label_out_of_range(node: Path) -> None:
    (node / "test").mkdir()
    np.save(node / "test" / "images.npy", np.zeros((2, SIZE, SIZE), dtype=np.uint8))
    np.save(node / "test" / "labels.npy", np.array([0, 3]))
    _expect(node, "labels.npy", "label 3 at position 1")


def test_test_split_missing_labels(node: Path) -> None:
    (node / "test").mkdir()
    np.save(node / "test" / "images.npy", np.zeros((2, SIZE, SIZE), dtype=np.uint8))
    _expect(node, str(node / "test" / "labels.npy"), "missing")


def test_write_refuses_to_overwrite(node: Path) -> None:
    cfg = resolve_config({"num-sets": 10})
    usets, _ = client_usets(cfg, 0, 3)
    with pytest.raises(NodeDataError, match="refusing to overwrite"):
        write_node_dir(node, load_run_dataset(cfg).train_x, usets, CLASSES)
    assert (node / "sets" / "s0" / "images.npy").is_file()


# --------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("fmt", ["npy", "png"])
def test_round_trip_from_the_run_dataset(tmp_path: Path, fmt: str) -> None:
    cfg = resolve_config({"num-sets": 10, "client-test-fraction": 0.1, "seed": 3})
    paths = write_nodes(cfg, tmp_path, 2, image_format=fmt, max_set_size=None if fmt == "npy" else 6)
    data = load_run_dataset(cfg)
    info = run_dataset_info(cfg)
    for i, path in enumerate(paths):
        usets, local_test = client_usets(cfg, i, 2)
        report = validate_node_dir(path, info.class_names, info.image_size, info.channels)
        assert report.num_sets == 10 and report.num_test == len(local_test)
        np.testing.assert_allclose(report.priors, usets.priors, rtol=0, atol=1e-15)
        client = client_from_node_config(cfg, {"data-dir": str(path)}, method="fedul", parts=("unlabeled", "usets"),
                                         facts=run_dataset_info(cfg))
        assert client.parts() == ("unlabeled", "usets")
        np.testing.assert_allclose(client.usets.priors, usets.priors, rtol=0, atol=1e-15)
        assert client.mean == tuple(info.mean) and client.std == tuple(info.std)
        if fmt == "npy":  # every image of every set, in set order
            assert report.set_sizes == tuple(usets.set_sizes.tolist())
            order, ybar = usets.surrogate_dataset()
            torch.testing.assert_close(client.unlabeled, data.train_x[torch.from_numpy(order)])
            assert client.usets.set_index.tolist() == ybar.tolist()
            torch.testing.assert_close(client.test.y, data.train_y[torch.from_numpy(local_test)])
            torch.testing.assert_close(client.test.x, data.train_x[torch.from_numpy(local_test)])
        else:
            assert report.set_sizes == (6,) * 10
            assert client.usets.set_index.tolist() == np.repeat(np.arange(10), 6).tolist()


def test_cli_write_and_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nodes"
    assert node_data_main(["write", "--out", str(out), "--num-nodes", "2", "--max-set-size", "3",
                           "--run-config", "num-sets=10 seed=2"]) == 0
    assert sorted(os.listdir(out)) == ["node-0", "node-1"]
    capsys.readouterr()
    assert node_data_main(["validate", str(out / "node-1"), "--dataset", "mnist-sample"]) == 0
    text = capsys.readouterr().out
    assert "node-1: OK" in text and "10 sets, 30 images of 1x28x28" in text and "cond(Pi)=" in text
    # validating against full MNIST needs its facts only, not its files (no data-dir)
    assert node_data_main(["validate", str(out / "node-1"), "--dataset", "mnist"]) == 0
    assert "node-1: OK" in capsys.readouterr().out
    # a broken row: exit 1, the culprit on stderr
    csv_path = out / "node-1" / "priors.csv"
    lines = csv_path.read_text().splitlines()
    lines[3] = "set-02," + ",".join(["0.2"] * 10)
    csv_path.write_text("\n".join(lines) + "\n")
    assert node_data_main(["validate", str(out / "node-1"), "--dataset", "mnist-sample"]) == 1
    err = capsys.readouterr().err
    assert "line 4" in err and "'set-02'" in err and "sum to 2" in err
    # class names of the run (class-names setting) must match the header
    assert node_data_main(["validate", str(out / "node-0"), "--run-config",
                           'class-names="a,b,c,d,e,f,g,h,i,j"']) == 1
    err = capsys.readouterr().err
    assert "meta.json: class_names" in err and "the run expects ['a', 'b'" in err
    (out / "node-0" / "meta.json").unlink()  # without meta.json the CSV header is checked
    assert node_data_main(["validate", str(out / "node-0"), "--run-config",
                           'class-names="a,b,c,d,e,f,g,h,i,j"']) == 1
    assert "do not match the run's class names" in capsys.readouterr().err


def test_cli_write_labeled(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nodes"
    assert node_data_main(["write", "--out", str(out), "--num-nodes", "2", "--max-set-size", "2", "--labeled",
                           "--run-config", "num-sets=10 seed=5"]) == 0
    text = capsys.readouterr().out
    assert "'labeled', 'unlabeled', 'usets'" in text
    cfg = resolve_config({"num-sets": 10, "seed": 5})
    data = load_run_dataset(cfg)
    info = run_dataset_info(cfg)
    for i in range(2):
        path = out / f"node-{i}"
        usets, _ = client_usets(cfg, i, 2)
        idx = np.concatenate(usets.indices)
        labels = np.load(path / "labeled" / "labels.npy")
        # the whole pool, in set order, with its true labels (--max-set-size cuts the sets only)
        assert labels.dtype == np.int64 and labels.tolist() == data.train_y[torch.from_numpy(idx)].tolist()
        report = validate_node_dir(path, info.class_names, info.image_size, info.channels)
        assert report.num_labeled == len(idx) > report.num_images == 20
        client = client_from_node_config(cfg, {"data-dir": str(path)}, method="supervised", parts=("labeled",),
                                         facts=run_dataset_info(cfg))
        torch.testing.assert_close(client.labeled.x, data.train_x[torch.from_numpy(idx)])
        torch.testing.assert_close(client.labeled.y, data.train_y[torch.from_numpy(idx)])
    # without --labeled no labeled part is written
    assert node_data_main(["write", "--out", str(tmp_path / "plain"), "--num-nodes", "1", "--max-set-size", "2",
                           "--run-config", "num-sets=10 seed=5"]) == 0
    assert not (tmp_path / "plain" / "node-0" / "labeled").exists()


def test_node_config_without_data_names_the_keys() -> None:
    with pytest.raises(ValueError, match="data-dir=/path"):
        client_from_node_config(resolve_config({}), {"something": 1}, method="fedul", parts=("unlabeled", "usets"))


# --------------------------------------------------------------------------- refusals of the tool


@pytest.mark.parametrize(
    ("row", "fragment"),
    [("0," * (len(CLASSES) - 1) + "0", "every class prior is 0"), ("nan," + "0.1," * (len(CLASSES) - 1), "not a finite"),
     ("inf," + "0.1," * (len(CLASSES) - 1), "'inf' is not a finite number")],
    ids=["all-zero", "nan", "inf"],
)
def test_class_prior_must_be_finite_and_not_all_zero(tmp_path: Path, row: str, fragment: str) -> None:
    """A positive-unlabeled node told a prior of zero for every class (or a non-finite one)
    would train on a meaningless risk: the folder is refused, naming the file and line."""
    root = tmp_path / "node"
    _add_labeled(root)
    _add_unlabeled(root)
    (root / "class_prior.csv").write_text(",".join(CLASSES) + "\n" + row.rstrip(",") + "\n")
    _expect(root, "class_prior.csv", "line 2", fragment)


def test_validate_refuses_an_unknown_run_config_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped key would leave the folder checked against the default dataset: refused,
    naming the key, the closest valid one and where the valid keys are; a known key still passes."""
    out = tmp_path / "nodes"
    assert node_data_main(["write", "--out", str(out), "--num-nodes", "1", "--max-set-size", "2",
                           "--run-config", "num-sets=10"]) == 0  # fmt: skip
    capsys.readouterr()
    assert node_data_main(["validate", str(out / "node-0"), "--run-config", 'datset="cifar10"']) == 1
    err = capsys.readouterr().err
    assert "'datset' (did you mean 'dataset'?)" in err and "docs/configuration.md" in err and "\n" not in err.strip()
    assert node_data_main(["validate", str(out / "node-0"), "--run-config", 'seed=3 dataset="mnist-sample"']) == 0
    assert node_data_main(["write", "--out", str(tmp_path / "other"), "--num-nodes", "1",
                           "--run-config", "num-set=10"]) == 1  # fmt: skip
    assert "'num-set' (did you mean 'num-sets'?)" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


def test_write_refuses_a_positive_class_without_a_labeled_image(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--max-set-size 1`` would keep one labeled image of a node meant to label two classes,
    so the node would label one class only: refused, naming the node and the class, before any
    node folder is written."""
    out = tmp_path / "nodes"
    args = ["write", "--out", str(out), "--num-nodes", "5", "--run-config", 'client-setting="pu" positive-classes="2"']
    assert node_data_main([*args, "--max-set-size", "1"]) == 1
    err = capsys.readouterr().err
    assert re.search(r"node-0: positive class\(es\) \['\d - \w+'\] would get no labeled image", err), err
    assert not out.exists() or not any(out.iterdir())
    assert node_data_main([*args, "--max-set-size", "40"]) == 0
    for i in range(5):  # each node labels both of its classes
        assert len(np.unique(np.load(out / f"node-{i}" / "labeled" / "labels.npy"))) == 2


def test_write_refuses_fewer_sets_than_classes_before_writing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nodes"
    assert node_data_main(["write", "--out", str(out), "--num-nodes", "2", "--run-config", "num-sets=5"]) == 1
    assert "num-sets=5" in capsys.readouterr().err and not out.exists()


# --------------------------------------------------------------------------- what a photo viewer shows, on a node


def test_a_node_folder_decodes_orientation_6_photos_upright(tmp_path: Path) -> None:
    """The node folder's own photos go through the same decoder as the server's dataset: the
    tagged folder gives exactly the upright folder's tensors."""
    from tests.test_own_images import orientation_twins

    upright, tagged = orientation_twins(tmp_path, ".jpg", per_class=3)
    facts = {"class_names": ("cat", "dog"), "image_size": 24, "channels": 3, "mean": (0.5,) * 3, "std": (0.5,) * 3}
    a, b = load_node_dir(upright, **facts), load_node_dir(tagged, **facts)
    assert a.labeled is not None and b.labeled is not None and len(a.labeled) == 6
    assert torch.equal(a.labeled.x, b.labeled.x) and not torch.equal(a.labeled.x, a.labeled.x.rot90(1, (2, 3)))


def test_a_decompression_bomb_on_a_node_is_named_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``fedul node-data validate`` and the ClientApp's data door name the file, not PIL's raw
    error, together with the folder's other bad files; the node's flip fact travels with the
    run's facts."""
    import dataclasses

    from tests.test_own_images import bomb_png

    cfg = resolve_config({"dataset": "mnist-sample"})
    facts = dataclasses.replace(run_dataset_info(cfg), flip=True)  # as the server sends them (horizontal-flip=true)
    node = tmp_path / "node"
    for k, name in enumerate(facts.class_names[:2]):
        (node / name).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(np.full((28, 28), 60 * k + i, dtype=np.uint8)).save(node / name / f"{i}.png")
    client = client_from_node_config(cfg, {"data-dir": str(node)}, method="supervised", parts=("labeled",), facts=facts)
    assert client.flip is True and len(client.labeled) == 4  # type: ignore[arg-type]
    bomb = bomb_png(node / facts.class_names[1] / "scan.png")
    message = re.escape(str(bomb)) + r": 196,000,000 pixels, over PIL's decompression-bomb limit"
    with pytest.raises(NodeDataError, match=message) as refused:
        client_from_node_config(cfg, {"data-dir": str(node)}, method="supervised", parts=("labeled",), facts=facts)
    assert "\n" not in str(refused.value)
    stray = node / facts.class_names[0] / "Thumbs.db"
    stray.write_bytes(b"\0")
    assert node_data_main(["validate", str(node), "--dataset", "mnist-sample"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and re.search(message, err[0]), err
    assert "2 bad image files: " in err[0] and f"{stray}: not an image file" in err[0]  # both in one pass


@pytest.mark.parametrize("part", ["images.npy", "labels.npy"])
@pytest.mark.parametrize("content", [b"hello\n", b"PK\x03\x04 a zip archive", b""])
def test_file_that_is_no_npy_is_named_as_such(tmp_path: Path, part: str, content: bytes) -> None:
    """Any other kind of file under a .npy name is 'not a .npy file' (numpy would call it
    pickled data), naming the file; a valid header with a cut body stays 'unreadable'."""
    root = tmp_path / "n"
    _add_labeled(root)
    (root / "labeled" / part).write_bytes(content)
    _expect(root, str(root / "labeled" / part), "not a .npy file")
    (root / "labeled" / part).write_bytes(b"\x93NUMPY")
    _expect(root, str(root / "labeled" / part), "unreadable .npy file")
