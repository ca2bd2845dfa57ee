"""The labels-at-server setting: the server's class-balanced labeled pool and the clients'
unlabeled shares, the server's training before round 1 and after every aggregation (seeded from
its own streams), its folder in deployment (``server-data-dir``), and the refusals before round 1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedul_flwr import server_app
from fedul_flwr.cli import main as fedul
from fedul_flwr.client_app import app as client_app
from fedul_flwr.config import ConfigError
from fedul_flwr.data.simulated import labels_at_clients_splits, labels_at_server_splits, load_client, load_run_dataset
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.node_data_cli import write_nodes
from fedul_flwr.preflight import check_labels_at_server, resolve_config

LAS = {"method": "fixmatch", "client-setting": "labels-at-server", "num-labeled": 100, "samples-per-client": 150,
       "batch-size": 32, "fixmatch-mu": 2, "num-rounds": 2}  # fmt: skip


def test_the_server_holds_the_labels_at_clients_pool_and_the_clients_share_the_rest() -> None:
    cfg = resolve_config(LAS)
    labels = load_run_dataset(cfg).train_y.numpy()
    server, clients = labels_at_server_splits(cfg, 3)
    assert np.bincount(labels[server], minlength=10).tolist() == [10] * 10  # class-balanced
    same_pool = np.sort(np.concatenate([s.labeled for s in labels_at_clients_splits(cfg, 3)]))
    assert np.array_equal(np.sort(server), same_pool)  # one seed, one labeled pool in both settings
    rows = np.concatenate([server, *clients])
    assert len(np.unique(rows)) == len(rows) == len(labels)  # disjoint, everything used (val-fraction 0)
    client = load_client(cfg, 1, 3, frozenset({"unlabeled"}))
    assert client.labeled is None and client.parts() == ("unlabeled",) and len(client.unlabeled) == 150


def _run(tmp_path: Path, name: str, **overrides: object):
    rc = {**LAS, "output-dir": str(tmp_path), "run-name": name, **overrides}
    return server_app.run_federation(InProcessGrid(client_app, 3, rc), resolve_config(rc))


def test_the_server_trains_before_round_one_and_after_every_aggregation_and_repeats_itself(tmp_path: Path) -> None:
    first = _run(tmp_path, "a")
    again = _run(tmp_path, "b")
    plain = _run(tmp_path, "c", **{"client-setting": "labels-at-clients"})
    rows = [first.rows[r] for r in sorted(first.rows)]
    assert all(np.isfinite(r["server-train-loss"]) for r in rows[1:]) and "server-train-loss" not in plain.rows[1]
    # round 0 evaluates the server-trained initial model, not the initial weights
    assert rows[0]["test-accuracy"] > plain.rows[0]["test-accuracy"] + 0.1
    assert rows[-1]["test-accuracy"] > 0.2
    def learned(r: dict) -> dict:  # what training gave (not the clock)
        return {k: v for k, v in r.items() if "loss" in k or "accuracy" in k or "share" in k}

    assert [learned(again.rows[r]) for r in sorted(again.rows)] == [learned(r) for r in rows]  # seeded server draws
    summary, other = ((run.path / "summary.txt").read_text().rstrip() for run in (first, plain))
    assert " setting=labels-at-server clients=3 server-epochs=1 server-labeled=100 " in summary, summary
    assert summary.endswith("status=ok") and all(r["server-labeled-images"] == 100 for r in rows[1:]), summary
    assert " setting=labels-at-clients clients=3 rounds=2 " in other and "server-epochs" not in other, other


def test_the_servers_folder_is_read_in_place_of_the_pool(tmp_path: Path) -> None:
    written = write_nodes(resolve_config(LAS), tmp_path / "nodes", 3, max_set_size=40)
    assert [p.name for p in written] == ["node-0", "node-1", "node-2", "server"]
    server = check_labels_at_server(resolve_config({**LAS, "server-data-dir": str(written[-1])}), simulation=False)
    assert server is not None and len(server.labeled) == 40 and server.unlabeled is None


def test_refusals_name_the_key_before_anything_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    written = write_nodes(resolve_config(LAS), tmp_path / "nodes", 2, max_set_size=20)
    with pytest.raises(ConfigError, match="in a deployment: the server reads its labeled images from server-data-dir"):
        check_labels_at_server(resolve_config(LAS), simulation=False)
    with pytest.raises(ConfigError, match=r"method='supervised' with server-data-dir=.*does not train on the server"):
        check_labels_at_server(resolve_config({"method": "supervised", "server-data-dir": str(written[-1])}), True)
    with pytest.raises(ConfigError, match=r"server-data-dir='.*node-0'.*labeled"):  # a folder without labels
        check_labels_at_server(resolve_config({**LAS, "server-data-dir": str(written[0])}), simulation=False)
    with pytest.raises(ConfigError, match=r"^server-epochs=3: the server holds no labeled images to train on"):
        check_labels_at_server(resolve_config({**LAS, "client-setting": "labels-at-clients", "server-epochs": 3}), True)
    with pytest.raises(ConfigError, match="server-data-dir='server' must be absolute"):
        resolve_config({**LAS, "server-data-dir": "server"})
    assert fedul(["check", "--run-config", "method='fedul' client-setting='labels-at-server'"]) == 1
    assert "the method is defined for client-setting in ('usets',)" in capsys.readouterr().err
    assert fedul(["check", "--run-config", "method='fixmatch' client-setting='labels-at-server' num-labeled=100"]) == 0
    assert "the server's 100 labeled images" in capsys.readouterr().out
    with pytest.raises(ConfigError):
        _run(tmp_path, "refused", **{"method": "supervised", "server-data-dir": str(written[-1]), "client-setting": "labels-at-clients"})
    assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize("method", ["fixmatch", "fedrgd"])
def test_the_server_trains_in_a_round_where_every_client_is_idle(tmp_path: Path, method: str) -> None:
    """No pseudo-label reaches tau = 1 and FixMatch's ``used`` weight (FedRGD's too) makes every
    client idle: the server still trains the global model it sent, every round (the run does
    not stall)."""
    out = _run(tmp_path, "idle", **{"method": method, "fixmatch-threshold": 1.0, "fixmatch-weight": "used"})
    rows = [out.rows[r] for r in sorted(out.rows)]
    assert all(r["idle-replies"] == 3 for r in rows[1:]), rows
    assert all(np.isfinite(r["server-train-loss"]) for r in rows[1:])
    assert len({r["test-loss"] for r in rows}) == len(rows)  # the global model moved every round
    summary = (out.path / "summary.txt").read_text().rstrip()  # says that the server trained alone
    assert " setting=labels-at-server clients=0 server-epochs=1 server-labeled=100 rounds=2 " in summary, summary
    assert " sets=" not in summary and summary.endswith(" status=ok warning=no-client-trained"), summary


def test_a_resume_refuses_a_server_folder_whose_images_changed(tmp_path: Path) -> None:
    """The checkpoint holds the digest of the server's labeled images: a resume after the
    folder's labels changed is refused in one line, the run folder untouched; with the folder
    as it was, the resume goes on."""
    import hashlib

    from fedul_flwr.checkpoint import CheckpointError

    written = write_nodes(resolve_config(LAS), tmp_path / "nodes", 3, max_set_size=40)
    labels = written[-1] / "labeled" / "labels.npy"
    run = {"server-data-dir": str(written[-1]), "num-rounds": 1}
    _run(tmp_path, "folder", **run)
    folder = tmp_path / "folder"
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}
    original = np.load(labels)
    np.save(labels, np.roll(original, 1))
    with pytest.raises(CheckpointError, match=r"^resume=true: server-data-dir='.*server' holds other labeled images than "
                                              r"the run trained on \(SHA-256 .*\); resume with the images it started"):
        _run(tmp_path, "folder", **{**run, "num-rounds": 2, "resume": True})
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()} == before
    np.save(labels, original)
    resumed = _run(tmp_path, "folder", **{**run, "num-rounds": 2, "resume": True})
    assert sorted(resumed.rows) == [0, 1, 2]
    # the run folder says how many images the server's folder held (num-labeled, 100, did not size it)
    assert [resumed.rows[r]["server-labeled-images"] for r in (1, 2)] == [40, 40]
    assert " server-labeled=40 " in (folder / "summary.txt").read_text()
