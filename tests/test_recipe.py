"""The semi-supervised training recipe: each setting does what it names.

EMA of the global weights (``ema-decay``), the cosine schedule (``lr-schedule``), weight decay,
Nesterov, gradient-norm clipping, the clients' kept optimiser state
(``local-optimizer-state = "kept"``, resumed exactly after a kill) and RandAugment's random
magnitudes with Cutout (``strong-random``).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from fedul_flwr import server_app
from fedul_flwr.acceleration import PLAIN
from fedul_flwr.augment import Augmentation, Cutout, RandAugment
from fedul_flwr.checkpoint import CheckpointError, load_checkpoint
from fedul_flwr.preflight import resolve_config
from fedul_flwr.client_app import app as client_app
from fedul_flwr.config import ConfigError, load_preset
from fedul_flwr.ema import WeightEMA
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.optimizer_state import OptimizerStates
from fedul_flwr.outputs import read_metrics
from fedul_flwr.server_app import run_federation

from .conftest import use_small_test_set

FIXMATCH = {"method": "fixmatch", "client-setting": "labels-at-clients", "num-labeled": 60, "batch-size": 8,
            "fixmatch-mu": 2, "device": "cpu", "seed": 3, "local-optimizer": "sgd", "lr": 0.05}  # fmt: skip


def _run(tmp_path: Path, clients: int = 2, **overrides: object):
    rc = {**FIXMATCH, "output-dir": str(tmp_path), "min-available-nodes": clients, "min-train-nodes": 1, **overrides}
    return run_federation(InProcessGrid(client_app, clients, rc), resolve_config(rc))


def test_ema_equals_the_hand_computed_average_after_three_rounds(tmp_path: Path, small_test_set: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """EMA_r = d_r EMA_{r-1} + (1 - d_r) w_r with d_r = min(d, (1 + r) / (10 + r)) over the
    global weights w_0..w_3 the server saw; the headline accuracy is the EMA's, the global
    weights' beside it."""
    seen: list[dict[str, torch.Tensor]] = []
    call = server_app.RoundEnd.__call__

    def spy(self, server_round, arrays):  # type: ignore[no-untyped-def]
        seen.append({k: v.clone() for k, v in arrays.to_torch_state_dict().items()})
        return call(self, server_round, arrays)

    monkeypatch.setattr(server_app.RoundEnd, "__call__", spy)
    d = 0.3  # below the warm-up from round 3 on: d_3 = 0.3
    out = _run(tmp_path, **{"num-rounds": 3, "run-name": "ema", "ema-decay": d})
    assert len(seen) == 4
    ema = load_checkpoint(out.path).ema_state
    saved = torch.load(out.path / "model.pt", weights_only=True)  # the evaluated models: the EMA
    for key, w0 in seen[0].items():
        if not w0.is_floating_point() or "running" in key:
            continue  # buffers are copied from w_3
        by_hand = w0
        for r in (1, 2, 3):
            d_r = min(d, (1 + r) / (10 + r))  # 2/11, 3/12, 4/13
            by_hand = d_r * by_hand + (1 - d_r) * seen[r][key]
        torch.testing.assert_close(ema[f"module.{key}"], by_hand, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(saved[key.split(".", 1)[1]], by_hand, rtol=1e-5, atol=1e-6)
    assert int(ema["n_averaged"]) == 4
    rows = read_metrics(out.path)
    assert rows[0]["test-accuracy"] == rows[0]["test-accuracy-without-ema"]  # EMA_0 = w_0
    assert rows[-1]["test-loss"] != rows[-1]["test-loss-without-ema"]


def test_ema_continues_exactly_after_a_resume(tmp_path: Path, small_test_set: None) -> None:
    full = _run(tmp_path, **{"num-rounds": 3, "run-name": "full", "ema-decay": 0.5})
    _run(tmp_path, **{"num-rounds": 2, "run-name": "part", "ema-decay": 0.5})
    resumed = _run(tmp_path, **{"num-rounds": 3, "run-name": "part", "ema-decay": 0.5, "resume": True})
    a, b = load_checkpoint(full.path).ema_state, load_checkpoint(resumed.path).ema_state
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_weight_ema_unit() -> None:
    model = nn.ModuleDict({"f": nn.Linear(2, 1)})
    ema = WeightEMA(model, 0.9)
    w0 = model["f"].weight.detach().clone()
    ema.update(model)
    with torch.no_grad():
        model["f"].weight.add_(1.0)
    ema.update(model)
    d_1 = 2 / 11  # the warm-up: min(0.9, (1 + 1) / (10 + 1))
    torch.testing.assert_close(ema.models["f"].weight, d_1 * w0 + (1 - d_1) * (w0 + 1.0))
    assert ema.decay_at(1000) == 0.9
    assert ema.rounds == 2


def test_cosine_schedule_gives_fixmatchs_lr_per_round() -> None:
    cfg = resolve_config({"lr": 0.03, "num-rounds": 4, "lr-schedule": "cosine"})
    assert [cfg.lr_of(r) for r in (1, 2, 3, 4)] == pytest.approx([0.03 * math.cos(7 * math.pi * k / 64) for k in range(4)])
    assert cfg.lr_of(4) > 0.03 * math.cos(7 * math.pi / 16) - 1e-12  # never below the last step's
    decayed = resolve_config({"lr": 0.03, "num-rounds": 4, "lr-schedule": "cosine", "lr-decay": 0.5})
    assert decayed.lr_of(3) == pytest.approx(0.03 * 0.25 * math.cos(7 * math.pi * 2 / 64))
    assert resolve_config({"lr": 0.03, "lr-decay": 0.5}).lr_of(3) == pytest.approx(0.0075)  # exponential, as before
    annealed = resolve_config({"lr": 0.03, "num-rounds": 4, "lr-schedule": "cosine-annealing"})
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.03)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4)  # FedDB's code, one step a round
    for r in (1, 2, 3, 4):
        assert annealed.lr_of(r) == pytest.approx(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()


def test_weight_decay_and_nesterov_reach_the_optimizer_and_momentum_is_checked() -> None:
    p = [nn.Parameter(torch.ones(3))]
    opt = PLAIN.optimizer("sgd", p, 0.1, 0.9, weight_decay=5e-4, nesterov=True)
    assert opt.param_groups[0]["weight_decay"] == 5e-4 and opt.param_groups[0]["nesterov"] is True
    with pytest.raises(ConfigError, match="nesterov=true needs local-optimizer='sgd' with local-momentum > 0"):
        resolve_config({"nesterov": True, "local-optimizer": "sgd"})
    with pytest.raises(ConfigError, match="weight-decay=-1"):
        resolve_config({"weight-decay": -1.0})
    with pytest.raises(ConfigError, match="ema-decay=1"):
        resolve_config({"ema-decay": 1.0})
    with pytest.raises(ConfigError, match="grad-clip-norm=inf is not a finite number"):
        resolve_config({"grad-clip-norm": float("inf")})


def test_gradient_clipping_bounds_each_step() -> None:
    """One plain SGD step of lr 1 moves the weights by the clipped gradient: norm <= the clip."""
    from fedul_flwr.methods.base import LocalTask, Stream
    from fedul_flwr.training import train_local

    torch.manual_seed(0)
    models = nn.ModuleDict({"f": nn.Linear(4, 2)})
    x = torch.randint(0, 255, (8, 1, 2, 2), dtype=torch.uint8)
    task = LocalTask({"data": Stream({"x": x, "y": torch.zeros(8, dtype=torch.int64)}, 8)},
                     lambda m, b: 100 * nn.functional.cross_entropy(m["f"](b["data"]["x"]), b["data"]["y"]))  # fmt: skip
    for clip in (0.0, 0.5):
        before = torch.cat([p.detach().flatten().clone() for p in models.parameters()])
        train_local(models, task, epochs=1, lr=1.0, optimizer="sgd", to_input=lambda v: v.float().flatten(1) / 255,
                    grad_clip_norm=clip)  # fmt: skip
        moved = float((torch.cat([p.detach().flatten() for p in models.parameters()]) - before).norm())
        assert moved <= 0.5 + 1e-5 if clip else moved > 0.5


KEPT = {"local-momentum": 0.9, "nesterov": True, "weight-decay": 5e-4, "local-optimizer-state": "kept",
        "fraction-train": 0.5, "num-rounds": 6}  # fmt: skip


def _train_in_child(tmp_path: str, run_name: str) -> None:
    """The kept-state run of :func:`test_kept_state_is_each_clients_own_and_resumed_exactly_after_a_kill`,
    in a child process that the test kills."""
    use_small_test_set()
    _run(Path(tmp_path), 4, **{**KEPT, "run-name": run_name})


def test_kept_state_is_each_clients_own_and_resumed_exactly_after_a_kill(tmp_path: Path, small_test_set: None) -> None:
    """4 clients, 2 a round: a run SIGKILLed once round 2 is checkpointed, then resumed, ends
    with the weights and every client's optimiser state of the uninterrupted 6-round run;
    keeping the state changes the run (the momentum carries over)."""
    child = multiprocessing.get_context("spawn").Process(target=_train_in_child, args=(str(tmp_path), "killed"))
    child.start()
    try:
        deadline = time.monotonic() + 300
        while not _checkpointed_round(tmp_path / "killed") >= 2:
            assert child.is_alive() and time.monotonic() < deadline, "the child ended before round 2"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.join(60)
        child.kill()
    killed = load_checkpoint(tmp_path / "killed")
    assert 2 <= killed.round < 6, killed.round
    stopped = killed.strategy_state["client_states"]["items"]
    assert set(stopped) <= {"0", "1", "2", "3"} and len(stopped) >= 2
    assert all(key.startswith("f/") and key.endswith("/momentum_buffer") for s in stopped.values() for key in s)
    resumed = _run(tmp_path, 4, **{**KEPT, "run-name": "killed", "resume": True})
    full = _run(tmp_path, 4, **{**KEPT, "run-name": "full"})
    a = torch.load(full.path / "model.pt", weights_only=True)
    b = torch.load(resumed.path / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    states_full = load_checkpoint(full.path).strategy_state["client_states"]["items"]
    states_resumed = load_checkpoint(resumed.path).strategy_state["client_states"]["items"]
    assert states_full.keys() == states_resumed.keys()
    for node, state in states_full.items():
        assert all(torch.equal(state[k], states_resumed[node][k]) for k in state)
    fresh = _run(tmp_path, 4, **{**KEPT, "local-optimizer-state": "fresh", "run-name": "fresh"})
    c = torch.load(fresh.path / "model.pt", weights_only=True)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def _checkpointed_round(run_dir: Path) -> int:
    """The last round ``run_dir``'s checkpoint holds; 0 before the first."""
    try:
        return load_checkpoint(run_dir).round
    except CheckpointError:
        return 0


def test_kept_state_resume_needs_the_same_simulated_federation(tmp_path: Path, small_test_set: None) -> None:
    """Another num-supernodes partitions the data otherwise: the kept states are refused to it."""
    from fedul_flwr.checkpoint import CheckpointError

    kept = {"local-momentum": 0.9, "local-optimizer-state": "kept", "num-rounds": 1, "run-name": "k", "min-available-nodes": 3}
    _run(tmp_path, 4, **kept)
    assert load_checkpoint(tmp_path / "k").num_nodes == 4
    before = sorted(p.name for p in (tmp_path / "k").iterdir())
    with pytest.raises(CheckpointError, match="the run had 4 simulated nodes, this federation has 3"):
        _run(tmp_path, 3, **{**kept, "num-rounds": 2, "resume": True})
    assert sorted(p.name for p in (tmp_path / "k").iterdir()) == before
    assert load_checkpoint(tmp_path / "k").round == 1


def test_optimizer_states_round_trip_into_a_fresh_optimizer() -> None:
    p = [nn.Parameter(torch.randn(2, 3)), nn.Parameter(torch.randn(3))]
    opt = torch.optim.SGD(p, lr=0.1, momentum=0.9)
    sum((q**2).sum() for q in p).backward()
    opt.step()
    states = OptimizerStates()
    states.save(["f"], opt, p)
    again = OptimizerStates.from_record(states.to_record())
    fresh = torch.optim.SGD(p, lr=0.1, momentum=0.9)
    assert again.load(["f"], fresh, p) == 2
    assert all(torch.equal(fresh.state[q]["momentum_buffer"], opt.state[q]["momentum_buffer"]) for q in p)
    assert again.load(["g"], torch.optim.SGD(p, lr=0.1), p) == 0  # another optimiser's models: nothing
    with pytest.raises(ValueError, match="has shape"):
        OptimizerStates({"f/0/momentum_buffer": torch.zeros(5)}).load(["f"], fresh, p)


def test_kept_state_is_refused_with_differential_privacy() -> None:
    with pytest.raises(ConfigError, match="local-optimizer-state='kept' with differential-privacy='server-fixed'"):
        resolve_config({"local-optimizer-state": "kept", "differential-privacy": "server-fixed"})


def test_randaugment_draws_random_magnitudes_over_the_full_range_seeded() -> None:
    ra = RandAugment(num_ops=2, random_magnitude=True)
    ops, signs, levels = ra.draw(20_000, torch.Generator().manual_seed(1))
    assert levels.min() < 0.001 and levels.max() > 0.999 and abs(float(levels.mean()) - 0.5) < 0.01
    _, _, same = ra.draw(20_000, torch.Generator().manual_seed(1))
    assert torch.equal(levels, same)
    assert (ra.magnitude("rotate", 28, 1.0), ra.magnitude("shear-x", 28, 1.0), ra.magnitude("translate-x", 28, 1.0)) == (30.0, 0.3, 8.0)
    assert ra.magnitude("posterize", 28, 1.0) == 4.0 and ra.magnitude("solarize", 28, 1.0) == 0.0
    fixed = RandAugment(num_ops=2, magnitude=10)
    assert set(fixed.draw(100, torch.Generator().manual_seed(1))[2].flatten().tolist()) == {10 / 30}  # float64
    box = Cutout(0.5).draw(20_000, 28, torch.Generator().manual_seed(2))
    widths = box[1] - box[0]
    assert widths.min() == 0 and widths.max() == 13  # side v < 14 pixels, floored as USB's int()
    assert (box[0] >= 0).all() and (box[1] <= 28).all()
    images = torch.randint(0, 256, (32, 1, 28, 28), dtype=torch.uint8)
    strong = Augmentation("strong-random", 28, True)
    one = strong(images, torch.Generator().manual_seed(5))
    two = strong(images, torch.Generator().manual_seed(5))
    assert torch.equal(one, two) and not torch.equal(one, strong(images, torch.Generator().manual_seed(6)))


def test_presets_carry_the_recipes() -> None:
    authors, feddb = load_preset("feddb-authors"), load_preset("feddb")
    added = {k: v for k, v in authors.items() if feddb.get(k) != v}
    assert added == {"nesterov": True, "weight-decay": 0.0005, "grad-clip-norm": 1.0, "lr-schedule": "cosine-annealing",
                     "local-optimizer-state": "kept", "strategy": "fedavgm", "server-lr": 1.0, "server-momentum": 0.5,
                     "fixmatch-strong-augment": "strong-random"}  # fmt: skip
    fixmatch = resolve_config({"preset": "fixmatch"})
    assert (fixmatch.ema_decay, fixmatch.lr_schedule, fixmatch.weight_decay, fixmatch.nesterov) == (0.984, "cosine", 5e-4, True)
    assert fixmatch.option("fixmatch-strong-augment") == "strong-random"
