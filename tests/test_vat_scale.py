"""scripts/vat_scale.py: the size of FedLLP-VAT's VAT term on real batches of the embedded
sample, at App. D's MNIST values (negligible) and at the values where it starts to matter."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from fedul_flwr.methods import get_method
from fedul_flwr.methods.base import RoundContext
from fedul_flwr.methods.fedllp import proportion_loss
from fedul_flwr.data.simulated import load_run_dataset
from fedul_flwr.preflight import resolve_config
from fedul_flwr.server_app import global_models

REPO = Path(__file__).resolve().parent.parent
_SPEC = importlib.util.spec_from_file_location("vat_scale", REPO / "scripts" / "vat_scale.py")
vat_scale = importlib.util.module_from_spec(_SPEC)
sys.modules["vat_scale"] = vat_scale  # its dataclass resolves its module's annotations there
_SPEC.loader.exec_module(vat_scale)


from tests.test_methods import _one_thread  # noqa: F401,E402 (the module-wide one-thread fixture)


@pytest.fixture(scope="module")
def trained() -> tuple:
    """LeNet after 24 Adam steps (lr 1e-3) of FedLLP's proportion loss on client 0's
    set-stratified batches (about what 3 rounds of 2 clients x 1000 images give), and a batch of
    client 1 it never trained on."""
    cfg = resolve_config(vat_scale.run_config("fedllp-vat", samples=1000, rounds=1, seed=0, threads=1))
    data = load_run_dataset(cfg)
    model = global_models(cfg, get_method("fedllp-vat")(cfg), data.in_channels, data.num_classes, data.image_size)["f"]
    batches = vat_scale.client_batches(cfg, 8)
    own = [b for b in batches if b[0] == 0]
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(3):
        for _, x, s, priors in own:
            optimiser.zero_grad()
            proportion_loss(model(x), s, priors).backward()
            optimiser.step()
    held_out = next(b for b in batches if b[0] == 1)
    return cfg, model, held_out


def test_vat_term_is_rounding_noise_at_app_d_mnist_values_and_matters_at_cifar_values(trained) -> None:
    cfg, model, (node, x, s, priors) = trained
    ctx = lambda: RoundContext(seed=cfg.seed, server_round=1, node_key=node)  # noqa: E731
    xi = cfg.option("vat-xi")
    alpha, mu = vat_scale.APP_D_MNIST
    small = vat_scale.batch_scale(model, x, s, priors, mu, xi, ctx())
    assert math.isfinite(small.loss) and small.loss > 1.0
    assert abs(alpha * small.kl) < 1e-6 * small.loss  # a share of the loss below float32's resolution
    assert alpha * small.grad_ratio < 1e-5  # and of the gradient
    alpha, mu = vat_scale.APP_D_CIFAR
    large = vat_scale.batch_scale(model, x, s, priors, mu, xi, ctx())
    assert large.kl > 1e3 * abs(small.kl)  # KL grows ~ mu^2
    assert large.kl > 10 * large.kl_random  # the power iteration finds a far worse direction than chance
    assert alpha * large.grad_ratio > 1e-2  # VAT's gradient: more than 1% of the proportion loss's
    assert alpha * large.kl > 1e-3 * large.loss  # of the loss: 1e-3 to 1e-2
    assert 0.5 * large.kl > 1e-2 * large.loss  # more than 1% from alpha = 0.5 on


def test_first_difference_names_the_first_round_that_differs() -> None:
    rows = [{"round": 0, "test-loss": 2.0}, {"round": 1, "test-loss": 1.5, "train-loss": 2.2}]
    assert vat_scale.first_difference(rows, [dict(r) for r in rows]) == "none (bit-identical)"
    other = [dict(rows[0]), {**rows[1], "test-loss": 1.5 * (1 + 1e-7)}]
    assert vat_scale.first_difference(other, rows) == "round 1 (max rel. diff. 1e-07)"


def test_pairs_are_parsed_and_bad_ones_refused() -> None:
    assert vat_scale.parse_pair("0.05:6") == (0.05, 6.0)
    for bad in ("0.05", "a:b", "-1:2"):
        with pytest.raises(Exception, match="--pairs"):
            vat_scale.parse_pair(bad)
