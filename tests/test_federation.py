"""An in-process federation (real ServerApp logic + real ClientApp, no Ray) trains f."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from flwr.app import Context, RecordDict

from fedul_flwr.client_app import app as client_app
from fedul_flwr.preflight import resolve_config
from fedul_flwr.config import default_config
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.server_app import run_federation
from fedul_flwr.strategies import NoSuccessfulReplyError


def _run(tmp_path: Path, num_nodes: int = 3, **overrides: object):
    rc = {"output-dir": str(tmp_path), "run-name": "t", "num-rounds": 3, **overrides}
    grid = InProcessGrid(client_app, num_nodes, rc)
    return run_federation(grid, resolve_config(rc)), grid


def test_three_rounds_lower_the_loss_and_write_outputs(tmp_path: Path) -> None:
    outputs, _ = _run(tmp_path, **{"val-fraction": 0.5})  # 6k training images
    rows = json.loads((outputs.path / "metrics.json").read_text())
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert rows[3]["train-loss"] < rows[1]["train-loss"]
    assert rows[3]["test-loss"] < rows[0]["test-loss"]
    assert rows[3]["test-accuracy"] > 0.85  # from ~0.1 at round 0, on the embedded MNIST sample
    state = torch.load(outputs.path / "model.pt")
    assert not any("transition" in k or "log_coef" in k for k in state)  # f only, no Q_c
    assert (outputs.path / "accuracy.png").stat().st_size > 1000
    config = json.loads((outputs.path / "config.json").read_text())
    assert config["num-rounds"] == 3 and config["method"] == "fedul"
    line = outputs.summary()
    assert "clients=3" in line and "final-test-accuracy=" in line


def test_runs_are_deterministic(tmp_path: Path, small_test_set: None) -> None:
    small = {"num-rounds": 1, "samples-per-client": 500}
    a, _ = _run(tmp_path / "a", num_nodes=2, **small)
    b, _ = _run(tmp_path / "b", num_nodes=2, **small)
    ra = json.loads((a.path / "metrics.json").read_text())
    rb = json.loads((b.path / "metrics.json").read_text())
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall-time"} for r in rows]  # noqa: E731
    assert strip(ra) == strip(rb)


def test_round_without_successful_reply_fails_loudly(tmp_path: Path) -> None:
    # partition-id out of range on every node -> every ClientApp raises
    rc = {"output-dir": str(tmp_path), "run-name": "bad", "num-rounds": 1}
    grid = InProcessGrid(client_app, 2, rc, node_configs=[{"partition-id": 5, "num-partitions": 2}] * 2)
    with pytest.raises(NoSuccessfulReplyError, match="partition-id=5"):
        run_federation(grid, resolve_config(rc))


def test_uniform_and_sample_weighting_differ(tmp_path: Path, small_test_set: None) -> None:
    # unequal clients (num-sets differs -> same data, so use the non-IID split: equal sizes);
    # use a Dirichlet split, whose client sizes differ, and compare aggregated weights.
    # val-fraction=0.8 only shrinks the pool (2.4k images) to keep the test quick
    common = {"num-rounds": 1, "partition": "dirichlet", "dirichlet-alpha": 1.0, "val-fraction": 0.8}
    a, _ = _run(tmp_path / "n", num_nodes=2, **common)
    b, _ = _run(tmp_path / "u", num_nodes=2, **common, **{"aggregation-weights": "uniform"})
    wa, wb = torch.load(a.path / "model.pt"), torch.load(b.path / "model.pt")
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)


def test_round_with_too_few_successful_replies_stops(tmp_path: Path) -> None:
    # 3 nodes, 2 broken (partition-id out of range), min-train-nodes=2 -> the round stops
    rc = {"output-dir": str(tmp_path), "run-name": "few", "num-rounds": 1, "min-train-nodes": 2,
          "samples-per-client": 200}
    nodes = [{"partition-id": 0, "num-partitions": 3}] + [{"partition-id": 9, "num-partitions": 3}] * 2
    grid = InProcessGrid(client_app, 3, rc, node_configs=nodes)
    with pytest.raises(NoSuccessfulReplyError, match=r"1 successful training reply out of 3, 2 needed"):
        run_federation(grid, resolve_config(rc))


def test_server_main_resolves_what_the_user_typed_and_logs_the_sources(monkeypatch, caplog) -> None:
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    from fedul_flwr import server_app

    seen = {}

    def fake_run(grid, cfg):
        seen["cfg"] = cfg
        raise SystemExit  # stop before any round

    monkeypatch.setattr(server_app, "run_federation", fake_run)
    typed = {"preset": "paper-mnist", "num-rounds": 20, "model": "small-cnn", "lr": 0.001, "data-dir": "/data"}
    grid = InProcessGrid(client_app, 1, typed)  # override_config = what was typed
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={**default_config(), **typed})
    FLOWER_LOGGER.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger=FLOWER_LOGGER.name), pytest.raises(SystemExit):
            server_app.main(grid, context)
    finally:
        FLOWER_LOGGER.removeHandler(caplog.handler)
    cfg = seen["cfg"]
    assert (cfg.num_rounds, cfg.model, cfg.lr, cfg.val_fraction) == (20, "small-cnn", 0.001, 0.2)
    line = next(r.getMessage() for r in caplog.records if "run configuration" in r.getMessage())
    assert "preset='paper-mnist'" in line and "from the preset:" in line and "num-rounds=20" in line.split("typed by the user:")[1]


def test_bad_test_prior_fails_before_round_one(tmp_path: Path) -> None:
    from fedul_flwr import server_app
    from fedul_flwr.config import ConfigError

    typed = {"test-prior": "0.5,0.5", "output-dir": str(tmp_path)}
    grid = InProcessGrid(client_app, 2, typed)
    pushed = []
    grid.push_messages = lambda messages: pushed.extend(messages) or []  # type: ignore[method-assign]
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={**default_config(), **typed})
    with pytest.raises(ConfigError, match=r"test-prior.*expected 10 values"):
        server_app.main(grid, context)
    assert pushed == [] and not any(tmp_path.iterdir())  # no message, no run folder


def test_summary_names_the_preset(tmp_path: Path) -> None:
    outputs, _ = _run(tmp_path, num_nodes=2, **{"num-rounds": 1, "samples-per-client": 100, "preset": "authors-code"})
    assert "preset=authors-code" in outputs.summary()


def test_tensorboard_event_files_hold_every_recorded_metric(tmp_path: Path, small_test_set: None) -> None:
    """tensorboard=true: <run folder>/tensorboard holds one scalar per metric and round, the
    same values as metrics.json (vector metrics as <name>/<i>)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    outputs, _ = _run(tmp_path, num_nodes=2, **{"num-rounds": 2, "samples-per-client": 200, "tensorboard": True})
    rows = json.loads((outputs.path / "metrics.json").read_text())
    events = EventAccumulator(str(outputs.path / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"test-accuracy", "test-loss", "train-loss"} <= tags
    for key in ("test-accuracy", "train-loss"):
        logged = {e.step: e.value for e in events.Scalars(key)}
        assert logged == pytest.approx({r["round"]: r[key] for r in rows if key in r}, rel=1e-6)
    without, _ = _run(tmp_path / "off", num_nodes=2, **{"num-rounds": 1, "samples-per-client": 100})
    assert not (without.path / "tensorboard").exists()
