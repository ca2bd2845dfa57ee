"""Checkpoint and resume: the server writes f, the round and the strategy's state every round;
a run stopped after round 2 and resumed with ``resume=true`` ends with exactly the weights of
an uninterrupted 3-round run (CPU, fixed seed), also for strategies with server state
(FedAvgM's momentum, FedAdam's moments and bias correction by round)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from fedul_flwr.checkpoint import CHECKPOINT_FILE, NODE_DRAWS, CheckpointError, load_checkpoint, save_checkpoint
from fedul_flwr.client_app import app as client_app
from fedul_flwr.preflight import resolve_config
from fedul_flwr.config import ConfigError
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.outputs import read_metrics
from fedul_flwr.server_app import run_federation
from fedul_flwr.strategies.participation import fixed_size_draw

pytestmark = pytest.mark.usefixtures("small_test_set")  # central evaluation on 500 test images (tests/conftest.py)


def _run(tmp_path: Path, clients: int = 2, **overrides: object):
    run_config = {
        "num-sets": 10,
        "samples-per-client": 150,
        "batch-size": 32,
        "device": "cpu",
        "seed": 4,
        "min-available-nodes": 2,
        "min-train-nodes": 2,
        "output-dir": str(tmp_path),
        **overrides,
    }
    grid = InProcessGrid(client_app, clients, run_config)
    return run_federation(grid, resolve_config(run_config))


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy",
    [{"strategy": "fedavg"}, {"strategy": "fedadam", "server-lr": 0.01}, {"strategy": "fedavgm", "server-momentum": 0.9}],
    ids=lambda s: s["strategy"],
)
def test_interrupted_and_resumed_run_equals_uninterrupted(tmp_path: Path, strategy: dict) -> None:
    full = _run(tmp_path, **{"num-rounds": 3, "run-name": "full", **strategy})
    part = _run(tmp_path, **{"num-rounds": 2, "run-name": "part", **strategy})  # "stopped" after round 2
    ckpt = load_checkpoint(part.path)
    assert ckpt.round == 2 and ckpt.config["run-name"] == "part"
    if strategy["strategy"] == "fedadam":
        assert set(ckpt.strategy_state) == {"current_arrays", "m_t", "v_t"}
    elif strategy["strategy"] == "fedavgm":
        assert set(ckpt.strategy_state) == {"current_arrays", "momentum_vector"}
    else:
        assert ckpt.strategy_state == {}
    resumed = _run(tmp_path, **{"num-rounds": 3, "run-name": "part", "resume": True, **strategy})
    assert resumed.path == part.path

    final_full = torch.load(full.path / "model.pt", weights_only=True)
    final_resumed = torch.load(resumed.path / "model.pt", weights_only=True)
    assert final_full.keys() == final_resumed.keys()
    for key in final_full:
        assert torch.equal(final_full[key], final_resumed[key]), key
    assert load_checkpoint(resumed.path).round == 3
    # the metric table continues: rounds 0..3, round 3 identical to the uninterrupted run
    rows_full, rows_resumed = read_metrics(full.path), read_metrics(resumed.path)
    assert [r["round"] for r in rows_resumed] == [0, 1, 2, 3]
    for key in ("test-accuracy", "train-loss"):
        assert rows_resumed[-1][key] == rows_full[-1][key]
        assert rows_resumed[1][key] == rows_full[1][key]


def test_resume_without_checkpoint_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="checkpoint.pt does not exist"):
        _run(tmp_path, **{"num-rounds": 1, "run-name": "never-ran", "resume": True})


def test_resume_needs_run_name_and_a_strategy_without_client_state() -> None:
    with pytest.raises(ConfigError, match="needs run-name"):
        resolve_config({"resume": True})
    with pytest.raises(ConfigError, match="strategy='scaffold'"):
        resolve_config({"resume": True, "run-name": "x", "strategy": "scaffold"})


def test_an_existing_run_name_is_refused_without_resume(tmp_path: Path) -> None:
    """A second run under the same run-name stops before it writes anything: the first run's
    metrics and checkpoint stay as they were."""
    first = _run(tmp_path, **{"num-rounds": 1, "run-name": "taken"})
    before = {p.name: p.read_bytes() for p in first.path.iterdir() if p.is_file()}
    with pytest.raises(FileExistsError, match="run-name='taken'.*resume=true"):
        _run(tmp_path, **{"num-rounds": 2, "run-name": "taken", "seed": 5})
    assert {p.name: p.read_bytes() for p in first.path.iterdir() if p.is_file()} == before


@pytest.mark.slow
def test_resume_with_client_sampling_picks_the_same_clients(tmp_path: Path) -> None:
    """fraction-train < 1: round r's cohort is the ``cohort`` stream's draw at (seed, r), so two
    runs of one seed train the same clients each round, the resumed rounds 3 and 4 train the
    clients the uninterrupted ones do (no generator state in the checkpoint), and no run touches
    Python's global ``random``."""
    sampled = {"fraction-train": 0.5, "num-rounds": 4}
    random.seed(99)
    before = random.getstate()
    full = _run(tmp_path, clients=4, **{**sampled, "run-name": "full"})
    part = _run(tmp_path, clients=4, **{**sampled, "num-rounds": 2, "run-name": "part"})
    assert "random_state" not in torch.load(part.path / CHECKPOINT_FILE, weights_only=True)
    resumed = _run(tmp_path, clients=4, **{**sampled, "run-name": "part", "resume": True})
    assert random.getstate() == before
    final_full = torch.load(full.path / "model.pt", weights_only=True)
    final_resumed = torch.load(resumed.path / "model.pt", weights_only=True)
    for key in final_full:
        assert torch.equal(final_full[key], final_resumed[key]), key
    assert read_metrics(resumed.path)[-1]["wall-time"] >= read_metrics(resumed.path)[2]["wall-time"]
    full_cohorts, resumed_cohorts = ([row["trained-nodes"] for row in read_metrics(run.path)[1:]] for run in (full, resumed))
    assert full_cohorts == resumed_cohorts == [fixed_size_draw([1, 2, 3, 4], 2, 4, r) for r in range(1, 5)]


def test_a_checkpoint_holding_pythons_random_state_still_loads(tmp_path: Path) -> None:
    """Checkpoints written when the server sampled from Python's ``random`` hold its state and no
    ``node_draws``: they load, the state is ignored, and they say their rounds drew otherwise."""
    path = save_checkpoint(tmp_path, 2, {"f.weight": torch.ones(2, 3)}, {"seed": 4})
    assert load_checkpoint(tmp_path).node_draws == NODE_DRAWS
    payload = torch.load(path, weights_only=True)
    del payload["node_draws"]
    torch.save({**payload, "random_state": random.getstate()}, path)
    old = load_checkpoint(tmp_path)
    assert old.round == 2 and old.node_draws is None and torch.equal(old.state_dict["f.weight"], torch.ones(2, 3))


def test_each_checkpoint_comes_with_its_rounds_train_metrics(tmp_path: Path, monkeypatch) -> None:
    """A run killed after round r keeps round r's train and test metrics: they are in
    metrics.json by the time the checkpoint of round r is written, not only when the run ends."""
    from fedul_flwr import server_app

    seen: dict[int, dict] = {}
    original = server_app.save_checkpoint

    def spy(run_dir, server_round, *args, **kwargs):
        rows = {int(r["round"]): r for r in read_metrics(Path(run_dir))} if (Path(run_dir) / "metrics.json").is_file() else {}
        seen[server_round] = rows.get(server_round, {})
        return original(run_dir, server_round, *args, **kwargs)

    monkeypatch.setattr(server_app, "save_checkpoint", spy)
    _run(tmp_path, **{"num-rounds": 2, "run-name": "spied"})
    assert sorted(seen) == [1, 2]
    assert all("train-loss" in row and "test-error" in row for row in seen.values()), seen


def test_running_time_is_the_largest_wall_time_of_a_stopped_run() -> None:
    """A run stopped between its checkpoint and that round's metric row still reports the
    running time of its last written row."""
    from fedul_flwr.outputs import running_time

    assert running_time([{"round": 0, "wall-time": 1.5}, {"round": 1, "wall-time": 7.0}, {"round": 2}]) == 7.0
    assert running_time([]) == 0.0
