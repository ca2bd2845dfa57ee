"""A deployed node's data folder: every bad input names its culprit; write -> validate -> load
round trips; validation never modifies anything."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedul_flwr.config import resolve_config
from fedul_flwr.data.client_data import client_from_node_config, client_usets, load_run_dataset, run_dataset_info
from fedul_flwr.data.datasets import normalize
from fedul_flwr.data.node_dir import (
    NodeDataError,
    load_node_dir,
    validate_node_dir,
    write_node_dir,
)
from fedul_flwr.node_data import main as node_data_main
from fedul_flwr.node_data import write_nodes

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
    assert "4 sets, 22 images" in report.summary()


def test_load_gives_surrogate_labels_in_csv_order(tmp_path: Path) -> None:
    root = _make_node(tmp_path / "n", fmt="png")
    client = load_node_dir(
        root, class_names=CLASSES, image_size=SIZE, channels=CHANNELS, mean=(0.5,), std=(0.25,), test_prior=np.ones(3) / 3
    )
    assert client.x.shape == (22, 1, SIZE, SIZE) and client.x.dtype == torch.float32
    assert client.set_index.tolist() == [0] * 5 + [1] * 6 + [2] * 7 + [3] * 4
    # set 2, image 3 has pixel value 23, normalised with (x/255 - 0.5) / 0.25
    assert client.x[11 + 3, 0, 0, 0].item() == pytest.approx((23 / 255 - 0.5) / 0.25)
    np.testing.assert_allclose(client.surrogate_prior, np.array([5, 6, 7, 4]) / 22)
    assert client.class_names == CLASSES and client.labels is None


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


# --------------------------------------------------------------------------- bad folders


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
    _expect(root, str(bad), "unreadable image")


def test_wrongly_sized_image(tmp_path: Path) -> None:
    root = _make_node(tmp_path / "n", fmt="png")
    bad = root / "sets" / "s0" / "img001.png"
    Image.fromarray(np.zeros((SIZE + 2, SIZE), dtype=np.uint8)).save(bad)
    _expect(root, str(bad), "(1, 10, 8)", "(1, 8, 8)")


def test_wrong_channels_in_npy(node: Path) -> None:
    bad = node / "sets" / "s0" / "images.npy"
    np.save(bad, np.zeros((3, SIZE, SIZE, 3), dtype=np.uint8))
    _expect(node, str(bad), "(3, 8, 8)")


def test_npy_of_wrong_dtype(node: Path) -> None:
    bad = node / "sets" / "s0" / "images.npy"
    np.save(bad, np.zeros((3, SIZE, SIZE), dtype=np.float32))
    _expect(node, str(bad), "float32", "uint8")


def test_non_image_file_in_set(node: Path) -> None:
    (node / "sets" / "s1" / "images.npy").unlink()
    Image.fromarray(np.zeros((SIZE, SIZE), dtype=np.uint8)).save(node / "sets" / "s1" / "a.png")
    (node / "sets" / "s1" / "scan.tiff").write_bytes(b"x")
    _expect(node, "scan.tiff", "not an image file", "'s1'")


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
        client = client_from_node_config(cfg, {"data-dir": str(path)})
        np.testing.assert_allclose(client.priors, usets.priors, rtol=0, atol=1e-15)
        if fmt == "npy":  # every image of every set, in set order
            assert report.set_sizes == tuple(usets.set_sizes.tolist())
            order, ybar = usets.surrogate_dataset()
            torch.testing.assert_close(client.x, normalize(data.train_x[torch.from_numpy(order)], data.mean, data.std))
            assert client.set_index.tolist() == ybar.tolist()
            torch.testing.assert_close(client.test_y, data.train_y[torch.from_numpy(local_test)])
        else:
            assert report.set_sizes == (6,) * 10
            assert client.set_index.tolist() == np.repeat(np.arange(10), 6).tolist()


def test_cli_write_and_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nodes"
    assert node_data_main(["write", "--out", str(out), "--num-nodes", "2", "--max-set-size", "3",
                           "--run-config", "num-sets=10 seed=2"]) == 0
    assert sorted(os.listdir(out)) == ["node-0", "node-1"]
    capsys.readouterr()
    assert node_data_main(["validate", str(out / "node-1"), "--dataset", "mnist-sample"]) == 0
    text = capsys.readouterr().out
    assert "node-1: OK" in text and "10 sets, 30 images of 1x28x28" in text and "cond(Pi)=" in text
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


def test_node_config_without_data_names_the_keys() -> None:
    with pytest.raises(ValueError, match="data-dir=/path"):
        client_from_node_config(resolve_config({}), {"something": 1})
