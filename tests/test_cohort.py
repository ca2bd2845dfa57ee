"""The cohort paths of the in-process engine give the replies of one-after-another training
(:mod:`fedul_flwr.inprocess`, :mod:`fedul_flwr.cohort`, :func:`fedul_flwr.execution.cohort_path`).

Each case sends the same round-1 train messages (the run's initial global models, its resolved
settings) to the 4 nodes of a federation of the embedded MNIST sample through the real ClientApp,
on the sequential path with one torch thread, on the parallel path (2 clients at once, one
thread each) and on the batched path (one batched model), and compares the replies: their
arrays and metrics. The parallel path's are equal bit for bit. The batched path's batched
kernels sum in another order, so its replies may differ from the sequential ones as much as
the sequential path differs from itself with other kernels (``memory-format =
"channels-last"``, the same training), or by 1e-4 of the tensor's largest magnitude (1e-5 of
a metric's), the error of float32 sums of ~10^4 terms in another order (a convolution's weight
gradient), whichever is larger. The cases train with plain SGD: Adam divides by the root of its
second moment, which turns last-bit differences of a near-zero gradient into steps of up to
lr, and FedPL keeps an image when its confidence passes a threshold, which a last-bit
difference can flip: their cases (``supervised-adam``, ``fedpl``) are held to lr per step. Clients a path cannot take
(HASSLE's dual models, FedProx's gradient hook, FedLLP-VAT's inner gradient) train alone and
reply bit for bit as before; a
model with torch's own dropout is refused by :func:`fedul_flwr.cohort.eligible` (the project's
:class:`~fedul_flwr.models.Dropout` takes masks drawn from each client's generator:
``supervised-dropout``)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedul_flwr import wire
from fedul_flwr.preflight import resolve_config
from fedul_flwr.client_app import app
from fedul_flwr.data.datasets import run_dataset_info
from fedul_flwr.data.simulated import load_run_dataset
from fedul_flwr.experiments import runner
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import get_method
from fedul_flwr.execution import cohort_path
from fedul_flwr.server_app import global_models

NODES = 4
BASE = {"dataset": "mnist-sample", "num-rounds": 1, "samples-per-client": 64, "batch-size": 16, "precision": "fp32",
        "memory-format": "contiguous", "val-fraction": 0.0, "local-optimizer": "sgd", "lr": 0.05,
        "min-available-nodes": NODES}  # fmt: skip
CASES: dict[str, dict[str, Any]] = {
    "supervised": {"method": "supervised"},
    "fedul": {"method": "fedul"},
    "fedpu": {"preset": "fedpu", "positive-classes": "3"},
    "fixmatch": {"method": "fixmatch", "client-setting": "labels-at-clients", "num-labeled": 40},
    "feddb": {"method": "feddb", "client-setting": "labels-at-clients", "num-labeled": 40},
    "fedpl": {"method": "fedpl"},
    "fedllp": {"method": "fedllp"},
    "fedllp-vat": {"method": "fedllp-vat"},
    "supervised-adam": {"method": "supervised", "local-optimizer": "adam", "lr": 0.001},
    "supervised-batch-norm": {"method": "supervised", "model": "resnet8", "samples-per-client": 32},
    "supervised-dropout": {"method": "supervised", "model": "simple-cnn", "dataset": "synthetic-cifar", "samples-per-client": 20,
                           "batch-size": 10},  # fmt: skip
    "hassle": {"preset": "hassle", "label-layout": "L,P,P,U", "labeled-share": 0.4},
    "fedprox": {"strategy": "fedprox", "proximal-mu": 0.1},
}
ALONE = {"hassle", "fedprox", "fedllp-vat"}
"""Cases whose clients cannot join the batched model: they train alone, bit for bit as before."""


def _replies(name: str, path: str, **change: Any) -> list[tuple[dict[str, torch.Tensor], dict[str, Any]]]:
    """(arrays, metrics) of the 4 nodes' replies to round 1's train messages on ``path``."""
    values = {**BASE, **CASES[name], **change}
    cfg = resolve_config(values)
    data = load_run_dataset(cfg)
    method = get_method(cfg.method)(cfg)
    state = {f"{wire.model_prefix(n)}{k}": v for n, m in global_models(cfg, method, data.in_channels, data.num_classes,
                                                                     data.image_size).items() for k, v in m.state_dict().items()}  # fmt: skip
    config = {wire.SERVER_ROUND: 1, wire.RUN_CONFIG: cfg.to_json(), wire.DATASET_FACTS: run_dataset_info(cfg.as_dict()).to_json()}
    if cfg.strategy == "fedprox":
        config[wire.PROXIMAL_MU] = cfg.proximal_mu  # what Flower's FedProx adds
    content = RecordDict({wire.ARRAYS: ArrayRecord(state), wire.CONFIG: ConfigRecord(config)})
    grid = InProcessGrid(app, NODES, values, path=path, workers=2)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        replies = list(grid.send_and_receive([grid.create_message(content, "train", node, "cohort") for node in range(1, NODES + 1)]))
    finally:
        grid.close()
        torch.set_num_threads(before)
    out = []
    for reply in replies:
        assert not reply.has_error(), reply.error.reason
        out.append((reply.content[wire.ARRAYS].to_torch_state_dict(), dict(reply.content[wire.METRICS])))
    return out


def _distance(a: Any, b: Any) -> float:
    """Largest absolute difference of two metric values (numbers or lists of numbers)."""
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        return max((_distance(x, y) for x, y in zip(a, b)), default=0.0)
    return abs(float(a) - float(b))


def _magnitude(a: Any) -> float:
    return max((abs(float(x)) for x in a), default=0.0) if isinstance(a, list) else abs(float(a))


@pytest.mark.parametrize("name", list(CASES))
def test_each_path_gives_the_replies_of_one_after_another_training(name: str) -> None:
    """Sequential, parallel and batched replies to one round's train messages: equal bit for
    bit (parallel; a case that trains alone) or within the measured tolerance of the module
    docstring (batched)."""
    seq = _replies(name, "sequential")
    par = _replies(name, "parallel")
    bat = _replies(name, "batched")
    for (s_arrays, s_metrics), (p_arrays, p_metrics) in zip(seq, par):
        assert p_metrics == s_metrics
        assert s_arrays.keys() == p_arrays.keys() and all(torch.equal(p_arrays[k], s_arrays[k]) for k in s_arrays)
    if name in ALONE:
        for (s_arrays, s_metrics), (b_arrays, b_metrics) in zip(seq, bat):
            assert b_metrics == s_metrics
            assert all(torch.equal(b_arrays[k], s_arrays[k]) for k in s_arrays)
        return
    if name in ("supervised-adam", "fedpl"):
        lr, steps = CASES[name].get("lr", BASE["lr"]), 4  # 64 images, batch 16, one epoch
        for (s_arrays, _), (b_arrays, _) in zip(seq, bat):
            assert max(float((s_arrays[k] - b_arrays[k]).abs().max()) for k in s_arrays) <= lr * steps
        return
    other = _replies(name, "sequential", **{"memory-format": "channels-last"})
    for (s_arrays, s_metrics), (b_arrays, b_metrics), (o_arrays, o_metrics) in zip(seq, bat, other):
        assert b_metrics.keys() == s_metrics.keys()
        for key, value in s_metrics.items():
            bound = max(2 * _distance(value, o_metrics[key]), 1e-5 * max(1.0, _magnitude(value)))
            assert _distance(value, b_metrics[key]) <= bound, (key, value, b_metrics[key], o_metrics[key])
        for k, value in s_arrays.items():
            reference = float((value.double() - o_arrays[k].double()).abs().max())
            worst = float((value.double() - b_arrays[k].double()).abs().max())
            scale = float(value.double().abs().max()) if value.is_floating_point() else 0.0
            assert worst <= max(2 * reference, 1e-4 * scale), (k, worst, reference, scale)


def test_a_model_with_torch_dropout_or_two_models_or_a_hook_trains_alone() -> None:
    """:func:`fedul_flwr.cohort.eligible`: one trained model without torch's own dropout, no
    gradient hook, a method that allows it."""
    from torch import nn

    from fedul_flwr.cohort import eligible
    from fedul_flwr.models import build_model

    small = nn.ModuleDict({"f": build_model("small-cnn", 1, 10, 28)})
    assert eligible(small, ["f"], (), True)
    assert not eligible(small, ["f"], (), False)
    assert not eligible(small, ["f"], (object(),), True)
    assert eligible(nn.ModuleDict({"f": build_model("simple-cnn", 3, 10, 32)}), ["f"], (), True)  # the seeded Dropout
    torch_dropout = nn.ModuleDict({"f": nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(784, 10))})
    assert not eligible(torch_dropout, ["f"], (), True)
    two = nn.ModuleDict({"f": build_model("small-cnn", 1, 10, 28), "g": build_model("small-cnn", 1, 10, 28)})
    assert not eligible(two, ["f", "g"], (), True)
    assert not eligible(two, ["f"], (), True)


def test_the_path_is_picked_by_device_and_the_typed_value_wins() -> None:
    """auto: batched on a GPU, parallel on a CPU with 2+ threads, else sequential; a typed
    path is kept; parallel on a GPU is refused in one line."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert cohort_path("auto", cuda, 8) == ("batched", 0)
    assert cohort_path("auto", cpu, 2) == ("parallel", 2)
    assert cohort_path("auto", cpu, 1) == ("sequential", 1)
    assert cohort_path("auto", cpu, 4, client_threads=2) == ("sequential", 1)
    assert cohort_path("sequential", cpu, 4) == ("sequential", 1)
    assert cohort_path("batched", cpu, 4) == ("batched", 0)
    assert cohort_path("parallel", cpu, 1) == ("parallel", 2)
    with pytest.raises(ValueError, match="cohort='parallel'.*cuda"):
        cohort_path("parallel", cuda, 8)


def test_the_record_names_the_path_and_a_failing_client_fails_alike(tmp_path: Path) -> None:
    """A grid run's record names the path that ran and, batched, how many clients joined the
    batched model and how many trained alone (FedProx: all alone). FedPL with an exploding mix weight turns
    one round's losses NaN: on the batched path the run fails with the failure of the
    sequential path, and no client thread is left waiting."""
    bad = {"method": "fedpl", "fedpl-mix-weight": 1e39, "fedpl-threshold": 0.1}
    errors = {}
    for cohort in ("sequential", "batched"):
        spec = runner.RunSpec("cohort", "fedpl", cohort, "", 0, NODES, "", {})
        values = {**BASE, **bad, "cohort": cohort, "output-dir": str(tmp_path), "run-name": f"fedpl-{cohort}"}
        with pytest.raises(Exception) as caught:
            runner.execute(spec, values, 1)
        errors[cohort] = (type(caught.value).__name__, "training loss became nan" in str(caught.value))
    assert errors["batched"] == errors["sequential"] and errors["batched"][1], errors
    assert not [t for t in threading.enumerate() if t.name.startswith("fedul-client") and t.is_alive()]
    spec = runner.RunSpec("cohort", "supervised", "batched", "", 0, NODES, "", {})
    values = {**BASE, "method": "supervised", "cohort": "batched", "output-dir": str(tmp_path), "run-name": "recorded"}
    assert runner.execute(spec, values, 1)["cohort"] == {"path": "batched", "clients-at-once": "all", "trained-batched": NODES,
                                                         "trained-alone": 0}  # fmt: skip
    spec = runner.RunSpec("cohort", "fedprox", "batched", "", 0, NODES, "", {})
    values = {**values, **CASES["fedprox"], "run-name": "recorded-alone"}
    assert runner.execute(spec, values, 1)["cohort"] == {"path": "batched", "clients-at-once": "all", "trained-batched": 0,
                                                         "trained-alone": NODES}  # fmt: skip
