"""FedMatch's sigma + psi forward (:class:`fedul_flwr.methods.fedmatch.losses.Decomposed`) runs
sigma in the ``Decomposed``'s own mode: sigma is no child of it, so ``train()``/``eval()`` of the
``Decomposed`` would otherwise not reach it. Before, a client that trained psi alone (sigma not
among the loop's trained models, so in eval mode) trained on frozen batch-norm statistics with no
dropout, and the debiased pseudo-labels' evaluation pass (``dpl=true``) ran sigma in training
mode: it moved sigma's batch-norm statistics, and with dropout it raised."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from fedul_flwr.augment import Augmentation
from fedul_flwr.client_app import app as client_app
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods.feddb.debias import predict_weak
from fedul_flwr.methods.fedmatch.losses import Decomposed
from fedul_flwr.models import build_model
from fedul_flwr.preflight import resolve_config
from fedul_flwr.server_app import run_federation


def _pair(model: str, channels: int, size: int) -> tuple[nn.Module, nn.Module]:
    return build_model(model, channels, 10, size, seed=0), build_model(model, channels, 10, size, seed=1)


def _batch_norm(module: nn.Module) -> nn.BatchNorm2d:
    return next(m for m in module.modules() if isinstance(m, nn.BatchNorm2d))


def test_an_evaluation_pass_leaves_sigmas_statistics_and_mode_alone() -> None:
    sigma, psi = _pair("resnet8", 3, 32)
    sigma.train()  # as a loop that trained it last left it
    decomposed = Decomposed(sigma, psi)
    before = _batch_norm(sigma).running_mean.clone()
    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    probs = predict_weak(decomposed, decomposed, images, Augmentation("weak", 32, True), torch.Generator().manual_seed(0),
                         lambda x: x.float() / 255, torch.device("cpu"), 8)  # fmt: skip
    assert probs.shape == (16, 10) and torch.allclose(probs.sum(1), torch.ones(16))
    assert torch.equal(_batch_norm(sigma).running_mean, before)  # evaluated with the running statistics
    assert sigma.training  # its own mode is given back


def test_training_psi_alone_runs_sigma_in_training_mode() -> None:
    sigma, psi = _pair("resnet8", 3, 32)
    sigma.eval()  # the loop's mode for a model it does not train
    decomposed = Decomposed(sigma, psi).train()
    before = _batch_norm(sigma).running_mean.clone()
    logits = decomposed(torch.rand(8, 3, 32, 32), frozen="sigma")
    logits.sum().backward()
    assert not torch.equal(_batch_norm(sigma).running_mean, before)  # batch statistics, as in training
    assert all(p.grad is None for p in sigma.parameters()) and any(p.grad is not None for p in psi.parameters())
    assert not sigma.training


def test_fedmatch_with_debiased_pseudo_labels_trains_a_model_with_dropout(tmp_path: Path) -> None:
    """simple-cnn has dropout: before, every client's APP-U pass raised "Dropout in training
    mode needs a generator"."""
    rc = {"method": "fedmatch", "dpl": True, "model": "simple-cnn", "client-setting": "labels-at-clients",
          "num-labeled": 60, "samples-per-client": 120, "batch-size": 16, "num-rounds": 1, "device": "cpu",
          "output-dir": str(tmp_path), "run-name": "dropout"}  # fmt: skip
    outputs = run_federation(InProcessGrid(client_app, 2, rc), resolve_config(rc))
    row = outputs.rows[1]
    assert row["failed-replies"] == 0 and len(row["trained-nodes"]) == 2, row
    assert torch.isfinite(torch.tensor(row["test-loss"]))
