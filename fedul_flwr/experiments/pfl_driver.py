"""pfl-research's simulator on the peer benchmark's workload, run step by step by a parent.

This file runs under *pfl-research's own Python* (``pfl[pytorch]==0.6.0``, which pins
``dp-accounting<0.6`` while fedul-flwr needs 0.6, so the two cannot share an environment); it
imports only torch, numpy and pfl, never fedul-flwr. :mod:`fedul_flwr.experiments.peers`
starts it as a subprocess::

    <pfl-python> pfl_driver.py <spec.json>

and talks to it in JSON lines: the driver answers ``{"ready": ..., "probe-logits": ...}``
once it has built everything, then runs one central iteration for every ``go`` line it
reads, answering ``{"iteration": i, "seconds": s}`` (the wall time of that iteration, from
the ``go`` to pfl's ``after_central_iteration``); ``eval`` answers ``{"test-accuracy": a}``
(the central model on the test arrays), and ``stop`` ends it. Between iterations it blocks
on its standard input, so the parent can interleave the iterations with another system's
rounds on the same cores.

What pfl runs is its image-classification benchmark set-up
(``benchmarks/image_classification/pytorch/train.py`` of pfl-research with
``configs/baseline.yaml``): ``PyTorchModel`` with local ``torch.optim.SGD`` and a central
``SGD`` at the central learning rate, ``FederatedAveraging``, ``SimulatedBackend`` with
``WeightByUser`` (uniform weights), users drawn at random, ``NNTrainHyperParams`` (local lr,
epochs, batch). The model is pfl's ``simple_cnn`` as fedul-flwr registers it
(``simple-cnn``): the parent sends its initial weights (loaded strictly, so every layer's
name and shape must match) and a probe batch whose logits it compares with its own model's.
Another model of the parent's workload comes as TorchScript (``"model": "torchscript"`` in
the spec), loaded with ``torch.jit.load`` (:func:`build_model`).
"""

from __future__ import annotations

import json
import sys
import time
import types

import numpy as np
import torch
from torch import nn


def simple_cnn(in_channels: int, num_classes: int, image_size: int) -> nn.Sequential:
    """pfl-research's ``simple_cnn`` on NCHW inputs (its ``Transpose2D`` of NHWC left out)."""
    side = (image_size - 4) // 2
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, kernel_size=3), nn.ReLU(), nn.Conv2d(32, 64, kernel_size=3), nn.ReLU(),
        nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(), nn.Linear(side * side * 64, 128), nn.ReLU(),
        nn.Dropout(0.5), nn.Linear(128, num_classes),
    )  # fmt: skip


class Scripted(nn.Module):
    """A TorchScript model as a plain module (pfl's model gets ``loss`` and ``metrics`` methods)."""

    def __init__(self, inner: torch.jit.ScriptModule) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def build_model(spec: dict, in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    """The spec's initial model: pfl's ``simple_cnn`` with the parent's weights (``"model":
    "simple-cnn"``, the default) or the parent's TorchScript model (``"torchscript"``)."""
    if spec.get("model", "simple-cnn") == "simple-cnn":
        model = simple_cnn(in_channels, num_classes, image_size)
        model.load_state_dict(torch.load(spec["initial"]), strict=True)
        return model
    return Scripted(torch.jit.load(spec["initial"]))


def _say(value: dict) -> None:
    print(json.dumps(value), flush=True)


def main(spec_path: str) -> None:
    """Build pfl's simulation from the spec, then serve ``go`` / ``stop`` lines."""
    # deferred: optional dependency pfl (only pfl-research's own environment has it; the parent imports this file too)
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByUser
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel

    spec = json.loads(open(spec_path).read())
    torch.set_num_threads(int(spec["threads"]))
    torch.manual_seed(int(spec["seed"]))
    np.random.seed(int(spec["seed"]))
    data = np.load(spec["data"])
    mean = np.asarray(spec["mean"], np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(spec["std"], np.float32).reshape(1, -1, 1, 1)
    as_input = lambda x: ((x.astype(np.float32) / 255.0 - mean) / std).astype(np.float32)  # noqa: E731
    train_x, train_y = as_input(data["train_x"]), data["train_y"].astype(np.int64)
    users = [np.asarray(rows) for rows in spec["users"]]

    model = build_model(spec, train_x.shape[1], int(spec["num_classes"]), train_x.shape[2])

    def loss(self: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, eval: bool = False) -> torch.Tensor:
        self.eval() if eval else self.train()
        return nn.functional.cross_entropy(self(inputs), targets.long())

    @torch.no_grad()
    def metrics(self: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, eval: bool = True) -> dict:
        self.eval() if eval else self.train()
        logits = self(inputs)
        correct = float((logits.argmax(-1) == targets.long()).float().sum())
        return {"loss": Weighted(float(nn.functional.cross_entropy(logits, targets.long(), reduction="sum")), len(inputs)),
                "accuracy": Weighted(correct, len(inputs))}  # fmt: skip

    model.loss = types.MethodType(loss, model)
    model.metrics = types.MethodType(metrics, model)
    probe = torch.from_numpy(as_input(data["probe_x"]))
    model.eval()
    with torch.no_grad():
        probe_logits = model(probe).tolist()

    params = [p for p in model.parameters() if p.requires_grad]
    pfl_model = PyTorchModel(model=model, local_optimizer_create=torch.optim.SGD,
                             central_optimizer=torch.optim.SGD(params, float(spec["central_lr"])))  # fmt: skip
    federated = FederatedDataset(
        make_dataset_fn=lambda user: Dataset((train_x[users[user]], train_y[users[user]])),
        user_sampler=get_user_sampler("random", list(range(len(users)))),
    )
    backend = SimulatedBackend(training_data=federated, val_data=federated, postprocessors=[WeightByUser()])

    class Pacer(TrainingProcessCallback):
        """Blocks before every central iteration until the parent says ``go``."""

        def __init__(self) -> None:
            self.started = 0.0

        def _wait(self) -> bool:
            line = sys.stdin.readline().strip()
            while line == "eval":
                _say({"test-accuracy": accuracy()})
                line = sys.stdin.readline().strip()
            self.started = time.perf_counter()
            return line == "go"

        def on_train_begin(self, *, model: object) -> Metrics:
            if not self._wait():
                raise SystemExit(0)
            return Metrics()

        def after_central_iteration(self, aggregate_metrics: Metrics, model: object, *, central_iteration: int) -> tuple[bool, Metrics]:
            _say({"iteration": central_iteration, "seconds": time.perf_counter() - self.started})
            return (not self._wait()), Metrics()

    test_x = torch.from_numpy(as_input(data["test_x"]))
    test_y = torch.from_numpy(data["test_y"].astype(np.int64))

    def accuracy() -> float:
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(test_x[i : i + 512]).argmax(-1) == test_y[i : i + 512]).sum()) for i in range(0, len(test_y), 512))
        return correct / len(test_y)

    _say({"ready": True, "probe-logits": probe_logits, "torch": torch.__version__, "threads": torch.get_num_threads()})
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=10**9, evaluation_frequency=10**9,
                                           train_cohort_size=int(spec["cohort"]), val_cohort_size=0),
        backend=backend,
        model=pfl_model,
        model_train_params=NNTrainHyperParams(local_learning_rate=float(spec["lr"]), local_num_epochs=int(spec["local_epochs"]),
                                              local_batch_size=int(spec["batch_size"])),
        model_eval_params=NNEvalHyperParams(local_batch_size=256),
        callbacks=[Pacer()],
    )  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
