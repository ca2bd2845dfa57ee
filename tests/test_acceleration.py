"""The loop's execution settings (fedul_flwr.acceleration): they change how PyTorch runs the
models, never what is trained -- same batches, same steps, weights back in NCHW, float32
losses -- and every setting stays deterministic."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.acceleration import Acceleration, native_bf16
from fedul_flwr.preflight import resolve_config
from fedul_flwr.config import ConfigError
from fedul_flwr.methods.base import Batch, LocalTask, Stream
from fedul_flwr.models import build_model
from fedul_flwr.execution import loop_acceleration
from fedul_flwr.evaluation import evaluate
from fedul_flwr.training import train_local

CPU = torch.device("cpu")
MEAN, STD = 0.5, 0.25


def _to_input(x: torch.Tensor) -> torch.Tensor:
    return (x.float() / 255 - MEAN) / STD


def _images(n: int = 96, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 ``[n, 1, 16, 16]`` images whose class (0-3) is the bright quadrant."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randint(0, 60, (n, 1, 16, 16), generator=g, dtype=torch.uint8)
    for i, label in enumerate(y.tolist()):
        r, c = divmod(label, 2)
        x[i, 0, 8 * r : 8 * r + 8, 8 * c : 8 * c + 8] += 150
    return x, y


def _seen_dtypes() -> tuple[LocalTask, list[torch.dtype]]:
    x, y = _images()
    dtypes: list[torch.dtype] = []

    def loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
        logits = models["f"](batch["rows"]["x"])
        dtypes.append(logits.dtype)
        return F.cross_entropy(logits, batch["rows"]["y"])

    return LocalTask({"rows": Stream({"x": x, "y": y}, 32)}, loss), dtypes


def _train(acc: Acceleration | None, epochs: int = 2) -> tuple[nn.ModuleDict, float, list[torch.dtype]]:
    models = nn.ModuleDict({"f": build_model("small-cnn", 1, 4, 16, seed=3)})
    task, dtypes = _seen_dtypes()
    result = train_local(models, task, epochs=epochs, lr=1e-3, to_input=_to_input, seed=5, acceleration=acc)
    return models, result.loss, dtypes


def test_resolve_auto_follows_the_hardware_and_rejects_bad_values() -> None:
    acc = Acceleration.resolve(CPU)
    assert acc.precision == ("bf16" if native_bf16(CPU) else "fp32")
    assert acc.channels_last and acc.fused_optimizer and not acc.compile
    assert Acceleration.resolve(CPU, precision="bf16").precision == "bf16"  # forced: emulated where not native
    assert not Acceleration.resolve(CPU, memory_format="contiguous").channels_last
    with pytest.raises(ValueError, match="precision='fp8'"):
        Acceleration.resolve(CPU, precision="fp8")
    with pytest.raises(ValueError, match="memory-format='nhwc'"):
        Acceleration.resolve(CPU, memory_format="nhwc")
    with pytest.raises(ConfigError, match="precision='half'"):
        resolve_config({"precision": "half"})
    cfg = resolve_config({"precision": "fp32", "memory-format": "contiguous", "fused-optimizer": False})
    assert loop_acceleration(cfg, CPU) == Acceleration.plain(CPU)


def test_fast_loop_trains_like_the_plain_loop_and_returns_nchw_weights() -> None:
    plain, plain_loss, plain_dtypes = _train(None)
    fast, fast_loss, _ = _train(Acceleration.resolve(CPU, precision="fp32"))
    assert set(plain_dtypes) == {torch.float32}
    for (name, a), (_, b) in zip(plain.state_dict().items(), fast.state_dict().items(), strict=True):
        assert b.is_contiguous(), name  # channels-last was undone after training
        torch.testing.assert_close(b, a, atol=2e-4, rtol=1e-3)  # other kernels, same training
    assert fast_loss == pytest.approx(plain_loss, rel=1e-3)
    # not a no-op: training moved the weights
    fresh = build_model("small-cnn", 1, 4, 16, seed=3).state_dict()
    assert any(not torch.equal(fresh[k], v) for k, v in fast["f"].state_dict().items())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_setting_is_deterministic(precision: str) -> None:
    acc = Acceleration.resolve(CPU, precision=precision)
    first, loss_1, _ = _train(acc)
    second, loss_2, _ = _train(acc)
    assert loss_1 == loss_2
    for k, v in first.state_dict().items():
        assert torch.equal(v, second.state_dict()[k]), k


def test_bf16_autocasts_the_model_but_hands_the_loss_float32_logits() -> None:
    models, loss, dtypes = _train(Acceleration.resolve(CPU, precision="bf16"), epochs=6)
    assert set(dtypes) == {torch.float32}  # the method's loss never sees bfloat16
    assert all(p.dtype == torch.float32 for p in models.parameters())  # weights and optimiser stay float32
    x, y = _images(200, seed=1)
    acc = Acceleration.resolve(CPU, precision="bf16")
    result = evaluate(models, lambda m, xb: m["f"](xb), x, y, to_input=_to_input, acceleration=acc)
    assert result["test-accuracy"] > 0.9  # the quadrant task is learned under bf16


def test_evaluation_under_the_fast_settings_matches_the_plain_one() -> None:
    models, _, _ = _train(None, epochs=3)
    x, y = _images(300, seed=2)
    predict = lambda m, xb: m["f"](xb)  # noqa: E731
    plain = evaluate(models, predict, x, y, to_input=_to_input, batch_size=64)
    fp32 = Acceleration.resolve(CPU, precision="fp32")  # channels-last; "auto" is bf16 on AVX512-BF16 / AMX CPUs
    fast = evaluate(models, predict, x, y, to_input=_to_input, batch_size=64, acceleration=fp32)
    assert fast["test-accuracy"] == plain["test-accuracy"]
    assert fast["test-loss"] == pytest.approx(plain["test-loss"], rel=1e-4)
    assert all(p.is_contiguous() for p in models.parameters())


def test_fused_optimizer_is_used_and_plain_uses_the_per_parameter_loop() -> None:
    params = list(nn.Linear(3, 2).parameters())
    fused = Acceleration.resolve(CPU).optimizer("adam", params, 0.1)
    assert fused.defaults.get("fused") or fused.defaults.get("foreach")
    plain = Acceleration.plain().optimizer("sgd", params, 0.1)
    assert not plain.defaults.get("fused") and plain.defaults.get("foreach") is False
    with pytest.raises(ValueError, match="optimizer='rmsprop'"):
        Acceleration.plain().optimizer("rmsprop", params, 0.1)


def test_non_finite_loss_is_reported_with_its_epoch() -> None:
    x, y = _images(64)
    models = nn.ModuleDict({"f": build_model("small-cnn", 1, 4, 16, seed=0)})
    task = LocalTask({"rows": Stream({"x": x, "y": y}, 32)}, lambda m, b: m["f"](b["rows"]["x"]).sum() * float("nan"))
    with pytest.raises(ValueError, match="local epoch 1 of 2"):
        train_local(models, task, epochs=2, lr=1e-3, to_input=_to_input, acceleration=Acceleration.resolve(CPU))
    assert all(p.is_contiguous() for p in models.parameters())  # restored even when training fails


def test_loop_settings_travel_in_the_run_config() -> None:
    cfg = resolve_config({"precision": "bf16", "memory-format": "contiguous", "compile": True})
    acc = loop_acceleration(cfg, CPU)
    assert dataclasses.astuple(acc)[1:] == ("bf16", False, True, True)


def test_compile_is_opt_in_and_trains_like_eager() -> None:
    """torch.compile (inductor) needs a C++ toolchain; where it cannot build, the test skips
    with the compiler's error rather than passing."""
    eager, eager_loss, _ = _train(Acceleration(CPU, "fp32", channels_last=True, fused_optimizer=True))
    try:
        compiled, compiled_loss, dtypes = _train(Acceleration(CPU, "fp32", True, True, compile=True))
    except Exception as exc:  # inductor's build errors have no stable public type
        if "Compile" in type(exc).__name__ or "Inductor" in type(exc).__name__:
            pytest.skip(f"torch.compile cannot build here: {type(exc).__name__}: {str(exc)[:300]}")
        raise
    assert set(dtypes) == {torch.float32}
    assert compiled_loss == pytest.approx(eager_loss, rel=1e-3)
    for k, v in compiled.state_dict().items():
        torch.testing.assert_close(v, eager.state_dict()[k], atol=2e-4, rtol=1e-3)


def test_sgd_momentum_and_the_step_size_schedule() -> None:
    opt = Acceleration.resolve(CPU).optimizer("sgd", list(nn.Linear(2, 1).parameters()), 0.01, momentum=0.5)
    assert opt.defaults["momentum"] == 0.5
    with pytest.raises(ValueError, match="local-momentum=0.5 applies to local-optimizer='sgd'"):
        Acceleration.plain().optimizer("adam", list(nn.Linear(2, 1).parameters()), 0.01, momentum=0.5)
    with pytest.raises(ConfigError, match="local-momentum=0.5 needs local-optimizer='sgd'"):
        resolve_config({"local-momentum": 0.5})
    cfg = resolve_config({"local-optimizer": "sgd", "local-momentum": 0.5, "lr": 0.01, "lr-decay": 0.995})
    assert cfg.lr_of(1) == 0.01 and cfg.lr_of(3) == pytest.approx(0.01 * 0.995**2)
    with pytest.raises(ConfigError, match="lr-decay=0.0 must be in"):
        resolve_config({"lr-decay": 0.0})
