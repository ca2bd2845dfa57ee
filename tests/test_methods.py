"""Baselines (FedPL, FedLLP, FedLLP-VAT, supervised FedAvg), their data path (labels only for
the supervised reference, noisy priors, per-client budgets), validation-based selection and
the reproduction runner (determinism, resumable records, tables)."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.flower_harness import children
import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr import server_app
from fedul_flwr.client_app import app as client_app
from fedul_flwr.preflight import resolve_config
from fedul_flwr.config import ConfigError
from fedul_flwr.data import simulated
from fedul_flwr.data.client_data import MissingPartError
from fedul_flwr.data.prior_noise import noisy_priors
from fedul_flwr.data.simulated import client_usets, load_client
from fedul_flwr.data.sources import client_from_node_config
from fedul_flwr.experiments import reproduce, runner
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import METHODS, get_method
from fedul_flwr.methods.base import Batch, LocalTask, RoundContext, Stream
from fedul_flwr.methods.fedllp import proportion_loss, set_stratified_batches
from fedul_flwr.methods.fedllp_vat import FedLLPVAT, vat_loss
from fedul_flwr.methods.fedpl import FedPL, mixup_loss, set_pseudo_labels
from fedul_flwr.methods.fedul import FedUL
from fedul_flwr.methods.supervised import Supervised, labeled_subset
from fedul_flwr.registry import UnknownChoiceError
from fedul_flwr.training import train_local
from fedul_flwr.experiments.tables import table_rows

TINY = {"samples-per-client": 200, "num-rounds": 1}  # 2 clients x 200 images of the embedded sample
VAL = 0.05  # 600 labeled validation images of the embedded sample
UNLABELED = frozenset(FedUL.requires)  # the parts every label-free method asks for
IDENTITY = nn.ModuleDict({"f": nn.Identity()})  # f(x) = x: the inputs are the logits


def _identity(x: torch.Tensor) -> torch.Tensor:
    """``to_input`` of float (non-image) test inputs."""
    return x


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: one torch thread is faster and immune to a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _entropy(p: torch.Tensor) -> float:
    return float(-(p * p.log()).sum())


# --------------------------------------------------------------------------- FedLLP


def test_proportion_loss_is_minimal_when_mean_prediction_equals_the_prior() -> None:
    pi = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])
    s = torch.zeros(4, dtype=torch.long)
    # rows whose softmax mean is exactly pi[0] (identical rows = log pi)
    at_prior = pi[0].log().expand(4, 3).clone()
    assert proportion_loss(at_prior, s, pi).item() == pytest.approx(_entropy(pi[0]), abs=1e-6)
    # heterogeneous rows with the same mean are equally optimal: only the bag mean counts
    rows = torch.tensor([[0.9, 0.05, 0.05], [0.3, 0.55, 0.15], [0.6, 0.3, 0.1], [0.6, 0.3, 0.1]])
    assert torch.allclose(rows.mean(0), pi[0])
    assert proportion_loss(rows.log(), s, pi).item() == pytest.approx(_entropy(pi[0]), abs=1e-6)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):  # any other batch mean is worse (Gibbs' inequality)
        other = torch.randn(4, 3, generator=gen)
        assert proportion_loss(other, s, pi).item() > _entropy(pi[0])
    # gradient vanishes at the optimum
    logits = at_prior.clone().requires_grad_()
    proportion_loss(logits, s, pi).backward()
    assert logits.grad.abs().max() < 1e-6


def test_proportion_loss_averages_over_the_sets_in_the_batch() -> None:
    pi = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])
    logits = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))
    s = torch.tensor([0, 1, 1, 0, 1, 1])
    per_set = [proportion_loss(logits[s == m], s[s == m], pi).item() for m in (0, 1)]
    assert proportion_loss(logits, s, pi).item() == pytest.approx(sum(per_set) / 2, rel=1e-6)
    # saturated predictions stay finite
    assert math.isfinite(proportion_loss(1e4 * logits, s, pi).item())
    with pytest.raises(ValueError, match="set_index"):
        proportion_loss(logits, torch.full((6,), 2), pi)


def test_llp_batches_cover_every_row_once_in_each_mode() -> None:
    s = torch.tensor([0] * 300 + [1] * 10 + [2] * 129)
    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    for mode in ("stratified", "single-set", "whole-set"):
        batches = list(set_stratified_batches(s, 128, mode)(gen()))
        assert sorted(torch.cat(batches).tolist()) == list(range(len(s))), mode
        again = list(set_stratified_batches(s, 128, mode)(gen()))
        assert all(torch.equal(a, b) for a, b in zip(batches, again))  # same generator, same order
    # stratified: ceil(439 / 128) = 4 batches, each with a proportional share of every set
    strat = list(set_stratified_batches(s, 128)(gen()))
    assert len(strat) == 4
    for b in strat:
        counts = torch.bincount(s[b], minlength=3).tolist()
        assert counts[0] == 75 and counts[1] in (2, 3) and counts[2] in (32, 33)
    # single-set: one set per batch, near-equal chunks (no tiny leftovers)
    single = list(set_stratified_batches(s, 128, "single-set")(gen()))
    assert all(len(s[b].unique()) == 1 for b in single)
    assert sorted(len(b) for b in single) == sorted([100, 100, 100, 10, 65, 64])
    whole = list(set_stratified_batches(s, 128, "whole-set")(gen()))
    assert sorted(len(b) for b in whole) == [10, 129, 300]
    with pytest.raises(ValueError, match="LLP batch mode"):
        set_stratified_batches(s, 128, "nope")


def test_proportion_loss_alone_learns_a_classifier_from_bags() -> None:
    # 3 separable Gaussian classes, 6 bags with skewed known proportions, no labels used
    gen = torch.Generator().manual_seed(0)
    k, m, n = 3, 6, 120
    pi = torch.full((m, k), 0.1)
    pi[torch.arange(m), torch.arange(m) % k] = 0.8
    centres = 4 * torch.eye(k)
    y = torch.cat([torch.multinomial(pi[j], n, replacement=True, generator=gen) for j in range(m)])
    s = torch.arange(m).repeat_interleave(n)
    x = centres[y] + torch.randn(m * n, k, generator=gen)
    pi_emp = torch.stack([torch.bincount(y[s == j], minlength=k) / n for j in range(m)])
    torch.manual_seed(0)
    models = nn.ModuleDict({"f": nn.Linear(k, k)})

    def loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
        return proportion_loss(models["f"](batch["bags"]["x"]), batch["bags"]["s"], pi_emp)

    bags = Stream({"x": x, "s": s}, 64, batches=set_stratified_batches(s, 64), images=())
    train_local(models, LocalTask({"bags": bags}, loss), epochs=60, lr=0.05, to_input=_identity)
    accuracy = (models["f"](x).argmax(1) == y).float().mean().item()
    assert accuracy > 0.9


def test_vat_loss_is_zero_without_perturbation_and_leaves_bn_statistics_alone() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    x = torch.randn(10, 1, 4, 4)
    model.train()
    logits = model(x)
    before = [b.clone() for b in model[2].buffers()]
    assert vat_loss(model, x, logits, epsilon=0.0).item() == pytest.approx(0.0, abs=1e-6)
    value = vat_loss(model, x, logits, epsilon=1.0)
    assert value.item() > 0 and value.requires_grad
    after = list(model[2].buffers())
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert model[2].track_running_stats


def _vat_setup() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    x = torch.randn(10, 1, 4, 4)
    model.train()
    return model, x, model(x)


def test_vat_loss_draws_its_direction_only_from_the_given_generator() -> None:
    model, x, logits = _vat_setup()

    def value(node_key: int, global_seed: int, server_round: int = 1) -> float:
        torch.manual_seed(global_seed)  # torch's global RNG in another state every call
        before = torch.get_rng_state()
        generator = RoundContext(seed=0, server_round=server_round, node_key=node_key).generator
        out = vat_loss(model, x, logits, epsilon=1.0, generator=generator).item()
        assert torch.equal(torch.get_rng_state(), before)  # the global RNG was not touched
        return out

    reference = value(0, global_seed=1)
    assert value(0, global_seed=2) == reference  # same (seed, round, node): the same d, bit for bit
    assert value(1, global_seed=1) != reference  # another node: another direction
    assert value(0, global_seed=1, server_round=2) != reference  # another round: another direction
    # without a generator d comes from torch's global RNG: the draw really changes the value
    torch.manual_seed(1)
    first = vat_loss(model, x, logits, epsilon=1.0).item()
    torch.manual_seed(2)
    assert vat_loss(model, x, logits, epsilon=1.0).item() != first


def test_fedllp_vat_loss_draws_from_the_round_context() -> None:
    cfg = resolve_config({**TINY, "method": "fedllp-vat", "vat-weight": 1.0, "vat-epsilon": 3.0})
    client = load_client(cfg, 0, 2, frozenset(FedLLPVAT.requires))
    torch.manual_seed(0)
    models = nn.ModuleDict({"f": nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))})
    rows = torch.arange(0, 200, 5)  # 40 rows of several sets
    batch = {"usets": {"x": client.to_input(client.unlabeled[rows]), "set": client.usets.set_index[rows]}}
    assert len(batch["usets"]["set"].unique()) > 1

    def value(node_key: int, global_seed: int) -> float:
        ctx = RoundContext(seed=cfg.seed, server_round=1, node_key=node_key)
        loss = FedLLPVAT(cfg).local_task(client, models, ctx).loss
        torch.manual_seed(global_seed)
        before = torch.get_rng_state()
        out = loss(models, batch).item()
        assert torch.equal(torch.get_rng_state(), before)
        return out

    reference = value(0, global_seed=1)
    assert value(0, global_seed=2) == reference
    assert value(1, global_seed=1) != reference
    # proportion loss + vat-weight * VAT with d from the context's generator
    ctx = RoundContext(seed=cfg.seed, server_round=1, node_key=0)
    x, s = batch["usets"]["x"], batch["usets"]["set"]
    logits = models["f"](x)
    priors = torch.as_tensor(client.usets.priors, dtype=torch.float32)
    expected = proportion_loss(logits, s, priors) + vat_loss(models["f"], x, logits, 3.0, cfg.option("vat-xi"), ctx.generator)
    assert reference == pytest.approx(expected.item(), rel=1e-6)


# --------------------------------------------------------------------------- FedPL


def test_fedpl_pseudo_labels_are_the_argmax_of_the_set_prior() -> None:
    priors = np.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3], [0.2, 0.2, 0.6]])
    s = torch.tensor([2, 0, 0, 1, 2])
    assert set_pseudo_labels(priors, s).tolist() == [2, 1, 1, 0, 2]


def _fedpl_loss(ctx: RoundContext | None = None, **cfg: object):
    """FedPL's loss closure ``loss(models, batch)`` for client 0 (it reads only the config and ctx)."""
    client = load_client(resolve_config(TINY), 0, 2, frozenset(FedPL.requires))
    ctx = RoundContext(seed=0, server_round=1, node_key=0) if ctx is None else ctx
    return FedPL(resolve_config({**TINY, "method": "fedpl", **cfg})).local_task(client, IDENTITY, ctx).loss


def _usets(x: torch.Tensor, y: torch.Tensor) -> Batch:
    return {"usets": {"x": x, "y": y}}


def test_fedpl_task_targets_the_pseudo_labels_of_the_client_sets() -> None:
    cfg = resolve_config({**TINY, "method": "fedpl"})
    client = load_client(cfg, 0, 2, frozenset(FedPL.requires))
    task = FedPL(cfg).local_task(client, IDENTITY, RoundContext(seed=0, server_round=1, node_key=0))
    stream = task.streams["usets"]
    assert torch.equal(stream.tensors["x"], client.unlabeled) and stream.batch_size == cfg.batch_size
    assert torch.equal(stream.tensors["y"], set_pseudo_labels(client.usets.priors, client.usets.set_index))


def test_fedpl_loss_warm_start_fix_and_mix_terms() -> None:
    loss = _fedpl_loss(**{"fedpl-mixup-alpha": 1e6})  # Beta(a, a) ~ 0.5
    y = torch.tensor([0, 1])
    # nobody confident (uniform predictions, tau = 0.4): warm start = CE on all rows
    uniform = torch.zeros(2, 3)
    assert loss(IDENTITY, _usets(uniform, y)).item() == pytest.approx(math.log(3), rel=1e-6)
    # everybody confident: plain CE, no mix term
    sure = torch.tensor([[5.0, 0.0, 0.0], [0.0, 5.0, 0.0]])
    assert loss(IDENTITY, _usets(sure, y)).item() == pytest.approx(F.cross_entropy(sure, y).item(), rel=1e-6)
    # row 0 confident in its pseudo label, row 1 not: fix on row 0 + 0.3 * mixup(row 0, row 1)
    mixed = torch.tensor([[5.0, 0.0, 0.0], [3.0, 0.0, 0.0]])
    xm = 0.5 * (mixed[0] + mixed[1])[None]
    expected = F.cross_entropy(mixed[:1], y[:1]) + 0.3 * (
        0.5 * F.cross_entropy(xm, y[:1]) + 0.5 * F.cross_entropy(xm, y[1:])
    )
    assert loss(IDENTITY, _usets(mixed, y)).item() == pytest.approx(expected.item(), abs=1e-3)
    no_mix = _fedpl_loss(**{"fedpl-mix-weight": 0.0})
    assert no_mix(IDENTITY, _usets(mixed, y)).item() == pytest.approx(F.cross_entropy(mixed[:1], y[:1]).item(), rel=1e-6)


# 4 confident rows (softmax of the pseudo label >= tau = 0.4) and 4 unsure ones: the mixup
# partners (4 draws from 4) and lam ~ Beta(0.75, 0.75) both change the loss
_PL_X = torch.tensor([[4.0, 0, 0], [0, 3, 0], [0, 0, 5], [2, 0, 0], [0, 3, 0], [3, 0, 0], [0, 0, 2], [1, 1, 1]])
_PL_Y = torch.tensor([0, 1, 2, 0, 0, 2, 1, 0])


def test_fedpl_loss_draws_only_from_the_round_context() -> None:
    def value(node_key: int = 1, global_seed: int = 1, server_round: int = 3, seed: int = 0) -> float:
        loss = _fedpl_loss(RoundContext(seed=seed, server_round=server_round, node_key=node_key))
        torch.manual_seed(global_seed)  # torch's and numpy's global RNGs in another state every call
        np.random.seed(global_seed)
        torch_before, numpy_before = torch.get_rng_state(), np.random.get_state()
        out = loss(IDENTITY, _usets(_PL_X, _PL_Y)).item()
        assert torch.equal(torch.get_rng_state(), torch_before)  # the global RNGs were not touched
        assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), numpy_before))
        return out

    reference = value()
    assert value(global_seed=2) == reference  # same (seed, round, node): the same draws, bit for bit
    assert value(node_key=2) != reference  # another node: another mixup draw
    assert value(server_round=4) != reference and value(seed=1) != reference

    # the draws are those of the context: partners uniform with replacement from its torch
    # generator, lam from its numpy generator (module doc of fedpl)
    fresh = RoundContext(seed=0, server_round=3, node_key=1)
    confident = torch.tensor([True, True, True, True, False, False, False, False])
    assert torch.equal(F.softmax(_PL_X, 1).gather(1, _PL_Y[:, None]).squeeze(1) >= 0.4, confident)
    pos, neg = torch.nonzero(confident).flatten(), torch.nonzero(~confident).flatten()
    partner = pos[torch.randint(len(pos), (len(neg),), generator=fresh.generator)]
    lam = float(fresh.rng.beta(0.75, 0.75))
    expected = F.cross_entropy(_PL_X[pos], _PL_Y[pos]) + 0.3 * mixup_loss(
        nn.Identity(), _PL_X[partner], _PL_Y[partner], _PL_X[neg], _PL_Y[neg], lam
    )
    assert reference == pytest.approx(expected.item(), rel=1e-6)

    # within one round the context's generators advance: every batch gets new draws
    loss = _fedpl_loss(RoundContext(seed=0, server_round=3, node_key=1))
    first, second = (loss(IDENTITY, _usets(_PL_X, _PL_Y)).item() for _ in range(2))
    assert first == reference and second != first


# --------------------------------------------------------------------------- labels


def test_labels_reach_only_the_supervised_method_and_the_methods_of_labeled_settings() -> None:
    # FedPU requires the labeled positives of the PU setting, FixMatch and FedDB the labeled
    # images of the labels-at-clients setting, HASSLE and the compared methods those of the
    # clients that have labels; every U-set method is label-free
    labeled = [n for n, cls in METHODS.items() if "labeled" in cls.requires + cls.uses]
    assert sorted(labeled) == ["feddb", "fedmatch", "fedpu", "fedrgd", "fixmatch", "fixmatch-dpl", "hassle", "mixmatch",
                               "rscfed", "semifl", "supervised", "uda"]  # fmt: skip
    assert all(METHODS.get(n).setting != "usets" for n in labeled if n != "supervised")
    label_free = [n for n in METHODS.names() if n not in labeled and METHODS.get(n).setting == "usets"]
    assert label_free and all({"unlabeled", "usets"} <= set(METHODS.get(n).requires) for n in label_free)
    cfg = resolve_config(TINY)
    plain = load_client(cfg, 0, 2, UNLABELED)
    assert plain.labeled is None and plain.parts() == ("unlabeled", "usets")  # what FedUL and the weak baselines get
    labeled = load_client(cfg, 0, 2, frozenset(Supervised.requires))
    assert load_client(cfg, 0, 2, UNLABELED).labeled is None  # the cache keeps both apart
    assert "labeled" in labeled.parts()
    assert torch.equal(labeled.labeled.x, plain.unlabeled) and torch.equal(labeled.usets.set_index, plain.usets.set_index)
    usets, _ = client_usets(cfg, 0, 2)
    y, s = labeled.labeled.y, labeled.usets.set_index
    counts = np.stack([np.bincount(y[s == m].numpy(), minlength=10) for m in range(10)])
    assert np.array_equal(counts, usets.class_counts)  # labels are the true labels of x, in order
    # the boundary the ClientApp uses: each method gets the parts it requires, and no more
    node = {"partition-id": 0, "num-partitions": 2}
    assert client_from_node_config(cfg, node, method="fedul", parts=FedUL.requires).labeled is None
    assert client_from_node_config(cfg, node, method="supervised", parts=Supervised.requires).labeled is not None
    plain.require("fedul", FedUL.requires)  # holds all FedUL needs: no error
    with pytest.raises(MissingPartError) as missing:
        plain.require("supervised", Supervised.requires)
    message = str(missing.value)
    assert "'supervised'" in message and "'labeled'" in message and plain.node in message
    assert plain.node == "simulated partition 0 of 2"
    sup_cfg = resolve_config({**TINY, "method": "supervised", "label-fraction": 0.1})
    task = Supervised(sup_cfg).local_task(labeled, IDENTITY, RoundContext(seed=0, server_round=1, node_key=0))
    rows = labeled_subset(200, 0.1, 0)
    stream = task.streams["labeled"]
    assert task.num_examples == 20 and torch.equal(stream.tensors["y"], labeled.labeled.y[rows])
    assert torch.equal(stream.tensors["x"], labeled.labeled.x[rows])


# --------------------------------------------------------------------------- data knobs


def test_noisy_priors_follow_the_formula_and_leave_the_sets_alone() -> None:
    pi = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    assert np.array_equal(noisy_priors(pi, 0.0, np.random.default_rng(0)), pi)
    noisy = noisy_priors(pi, 0.4, np.random.default_rng(0))
    gamma = np.random.default_rng(0).uniform(0, 1, size=pi.shape)
    raw = np.clip(pi * (1 + 0.4 * (2 * gamma - 1)), 0, 1)
    assert np.allclose(noisy, raw / raw.sum(1, keepdims=True))
    heavy = noisy_priors(pi, 1.6, np.random.default_rng(1))
    assert np.all(heavy >= 0) and np.allclose(heavy.sum(1), 1)
    clean = load_client(resolve_config(TINY), 1, 2, UNLABELED)
    seen = load_client(resolve_config({**TINY, "prior-noise": 0.8}), 1, 2, UNLABELED)
    assert torch.equal(clean.unlabeled, seen.unlabeled) and torch.equal(clean.usets.set_index, seen.usets.set_index)
    assert not np.allclose(clean.usets.priors, seen.usets.priors) and np.allclose(seen.usets.priors.sum(1), 1)
    again = load_client(resolve_config({**TINY, "prior-noise": 0.8}), 1, 2, UNLABELED)
    assert np.array_equal(seen.usets.priors, again.usets.priors)


def test_told_priors_are_checked_for_rank(monkeypatch, caplog) -> None:
    """Noise that leaves Pi~_c column-rank deficient (f not identifiable) is warned about."""
    cfg = resolve_config({**TINY, "prior-noise": 0.3})
    load_client.cache_clear()
    with caplog.at_level(logging.INFO, logger=simulated.__name__):
        load_client(cfg, 0, 2, UNLABELED)
    told = [r for r in caplog.records if "told priors" in r.getMessage()]
    assert len(told) == 1 and told[0].levelno == logging.INFO and "cond(Pi~_c)=inf" not in told[0].getMessage()
    flat = lambda pi, eps, rng: np.full_like(pi, 1 / pi.shape[1])  # noqa: E731  every set told the same mix
    monkeypatch.setattr(simulated, "noisy_priors", flat)
    load_client.cache_clear()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=simulated.__name__):
        load_client(cfg, 0, 2, UNLABELED)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "column-rank deficient" in warned[0].getMessage()
    load_client.cache_clear()


def test_samples_per_client_and_knob_validation() -> None:
    client = load_client(resolve_config(TINY), 0, 2, UNLABELED)
    assert len(client.unlabeled) == 200 and len(client.usets.set_index) == 200
    with pytest.raises(ValueError, match="samples-per-client"):
        load_client(resolve_config({"samples-per-client": 7000}), 0, 2, UNLABELED)
    for bad in ({"prior-noise": -1.0}, {"method": "nope"}):
        with pytest.raises(ConfigError):
            resolve_config(bad)
    with pytest.raises(UnknownChoiceError, match="fedul"):  # lists the registered methods
        get_method("nope")
    # a method validates its own options, and the error names the key and the method
    for method, bad in (
        ("supervised", {"label-fraction": 0.0}),
        ("fedllp", {"llp-batches": "x"}),
        ("fedllp-vat", {"llp-batches": "x"}),
        ("fedllp-vat", {"vat-xi": 0.0}),
        ("fedpl", {"fedpl-threshold": 1.5}),
        ("fedpl", {"fedpl-mixup-alpha": 0.0}),
        ("fedul", {"loss": "x"}),
    ):
        (key,) = bad
        with pytest.raises(ConfigError, match=f"{key}=.*method '{method}'"):
            resolve_config({"method": method, **bad})
    assert resolve_config({"method": "supervised", "label-fraction": 0.5}).option("label-fraction") == 0.5
    with pytest.raises(KeyError):
        resolve_config({}).option("no-such-option")


# --------------------------------------------------------------------------- federations


@pytest.mark.parametrize("method", sorted(METHODS.names()))
def test_every_method_runs_a_round_and_records_validation(method: str, tmp_path: Path, small_test_set: None) -> None:
    rc = {**TINY, "method": method, "val-fraction": VAL, "output-dir": str(tmp_path), "run-name": method,
          "label-fraction": 0.5, "client-setting": METHODS.get(method).setting, "positive-classes": "5",
          "label-layout": "P,U"}  # fmt: skip
    outputs = server_app.run_federation(InProcessGrid(client_app, 2, rc), resolve_config(rc))
    rows = [outputs.rows[r] for r in sorted(outputs.rows)]
    assert [r["round"] for r in rows] == [0, 1]
    assert math.isfinite(rows[1]["train-loss"])
    assert 0 <= rows[1]["val-error"] <= 1 and rows[1]["val-accuracy"] == pytest.approx(1 - rows[1]["val-error"])
    assert rows[1]["test-loss"] != rows[0]["test-loss"]  # f was trained and aggregated


def test_runner_is_deterministic_resumable_and_logs_to_the_run_folder(tmp_path: Path, small_test_set: None, capsys) -> None:
    profile = reproduce.PROFILES["cpu"]
    # 3 clients and 2 rounds: with 2 clients a weighted sum cannot depend on the order of its
    # terms, and with 1 round no aggregate is ever trained on
    spec = reproduce.RunSpec("smoke", "MNIST-sample IID", "FedPL", "10", 0, 3, "",
                             {"dataset": "mnist-sample", "method": "fedpl", "val-fraction": VAL, **TINY, "num-rounds": 2})  # fmt: skip
    rc = reproduce.run_config_of(spec, profile, "", tmp_path / "a", {})
    assert rc["num-rounds"] == 2 and rc["model"] == "small-cnn" and rc["preset"] == ""
    records = tmp_path / "a" / "records"
    [first] = runner.run_grid([(spec, rc)], records, name="smoke")
    terminal = capsys.readouterr()
    assert "[1/1 " in terminal.out and f"{spec.run_id}: last-round test error" in terminal.out
    assert "[ROUND" not in terminal.out + terminal.err  # Flower's log went to the run folder
    log = Path(first["run-dir"]) / "flower.log"
    assert first["log"] == str(log) and "[ROUND 2/2]" in log.read_text()
    second = runner.execute(spec, {**rc, "output-dir": str(tmp_path / "b" / "runs")})
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall-time"} for r in rows]  # noqa: E731
    assert strip(first["metrics"]) == strip(second["metrics"])  # same preset + seed -> identical
    assert first["last-round"] == 2 and first["best-val-round"] in (1, 2)
    best = first["best-val-round"]
    assert first["best-val-test-error"] == first["metrics"][best]["test-error"]
    # resume: an existing record is not run again
    assert runner.run_grid([(spec, rc)], records, name="smoke") == [first]
    assert "1 of 1 runs have records; running 0" in capsys.readouterr().out
    # the same run in another grid (same settings, another name) shares the record, untrained
    twin = dataclasses.replace(spec, grid="other")
    [shared] = runner.run_grid([(twin, {**rc, "run-name": twin.run_id})], records, name="other")
    assert shared["same-run-as"] == spec.run_id and shared["run-id"] == twin.run_id
    assert shared["metrics"] == first["metrics"] and not (tmp_path / "a" / "runs" / twin.run_id).exists()
    assert "record shared" in capsys.readouterr().out
    assert reproduce.total_run_time([first, shared]) == first["wall-time-s"]  # one run trained, counted once
    assert reproduce.total_run_time([shared]) == first["wall-time-s"]  # its original on another page
    other_lr = dataclasses.replace(spec, grid="lr")  # other settings, or other clients: trained
    fewer = dataclasses.replace(spec, grid="fewer", clients=2)
    trained = runner.run_grid([(other_lr, {**rc, "run-name": other_lr.run_id, "lr": 2 * rc["lr"]}),
                               (fewer, {**rc, "run-name": fewer.run_id})], records)  # fmt: skip
    assert [("same-run-as" in r, Path(r["run-dir"]).name) for r in trained] == [(False, s.run_id) for s in (other_lr, fewer)]
    # a run stopped after round 1 (checkpoint, no record) goes on from there: same metrics
    stopped = {**rc, "output-dir": str(tmp_path / "c" / "runs")}
    part = runner.execute(spec, {**stopped, "num-rounds": 1})
    assert runner.resumable_round(stopped) == 1
    assert runner.resumable_round({**stopped, "lr": 2 * stopped["lr"]}) == 0  # other settings: afresh
    # a checkpoint written before another method gained an option still continues
    path = tmp_path / "c" / "runs" / spec.run_id / "checkpoint.pt"
    payload = torch.load(path, weights_only=False)
    payload["config"].pop("hassle-pairing")
    torch.save(payload, path)
    assert runner.resumable_round(stopped) == 1
    [continued] = runner.run_grid([(spec, stopped)], tmp_path / "c" / "records", name="smoke")
    assert continued["resumed-after-round"] == 1 and continued["run-config"]["resume"] is True
    stopped_time = max(r["wall-time"] for r in part["metrics"])
    assert continued["wall-time-s"] > stopped_time  # the stopped part's running time is counted
    assert continued["metrics"][-1]["wall-time"] > stopped_time  # and the metric table's clock goes on
    assert strip(continued["metrics"]) == strip(first["metrics"])
    assert "[ROUND 1/1]" in Path(continued["log"]).read_text()  # the stopped part's log is kept
    # a stopped run that cannot be continued (other settings) starts afresh, its log too
    runner.execute(spec, {**stopped, "run-name": "afresh", "num-rounds": 1, "lr": 2 * rc["lr"]})
    (tmp_path / "c" / "runs" / f"afresh.{runner.LOG_FILE}").write_text("the discarded attempt\n")
    [afresh] = runner.run_grid([(spec, {**stopped, "run-name": "afresh"})], tmp_path / "d" / "records", name="smoke")
    assert "resumed-after-round" not in afresh and strip(afresh["metrics"]) == strip(first["metrics"])
    assert "discarded" not in Path(afresh["log"]).read_text()


def test_run_settings_leave_out_only_the_options_of_other_methods() -> None:
    """An option of another method cannot change a run: records and checkpoints written before
    it existed still match; the run's own options and the common settings always count."""
    fedpl = resolve_config({"method": "fedpl"}).as_dict()
    settings = runner.run_settings(fedpl)
    assert {"fedpl-threshold", "lr", "seed"} <= set(settings) and not {"hassle-pairing", "dma-steps"} & set(settings)
    assert runner.run_settings({k: v for k, v in fedpl.items() if k != "hassle-pairing"}) == settings
    hassle = resolve_config({"method": "hassle", "client-setting": "annotation-heterogeneity"}).as_dict()
    assert runner.run_settings(hassle)["hassle-pairing"] == "previous"
    assert runner.run_settings({**hassle, "hassle-pairing": "current"}) != runner.run_settings(hassle)


def test_a_record_is_shared_across_grids_when_only_keys_added_since_sit_at_their_default(tmp_path: Path) -> None:
    """A record written before a key existed holds the run that key's default gives: another
    grid's run with the default shares it (nothing trained), one with another value does not;
    the run folder's place never matters."""
    import json

    from tests.test_grid_runner import record_of

    spec = reproduce.RunSpec("grid-a", "row", "FixMatch", "*", 0, 20, "", {})
    requested = {"method": "fixmatch", "client-setting": "labels-at-clients", "seed": 0}
    old = resolve_config({**requested, "output-dir": "elsewhere/runs"}).as_dict()
    del old["fixmatch-weight"]  # the record predates the key
    records = tmp_path / "records"
    records.mkdir()
    (records / "old.json").write_text(json.dumps(record_of(spec, old, **{"run-id": "old"})))
    recorded = runner._recorded_runs(records)
    other = dataclasses.replace(spec, grid="grid-b")
    assert runner._share_record(other, {**requested, "fixmatch-weight": "epoch", "output-dir": str(tmp_path)},
                                records / "b.json", recorded)  # fmt: skip
    assert json.loads((records / "b.json").read_text())["same-run-as"] == "old"
    assert not runner._share_record(other, {**requested, "fixmatch-weight": "used"}, records / "c.json", recorded)
    assert not runner._share_record(dataclasses.replace(other, clients=5), requested, records / "d.json", recorded)
    assert not (records / "c.json").exists() and not (records / "d.json").exists()


def test_fedul_command_shares_flag_conventions_and_shows_defaults(capsys) -> None:
    from fedul_flwr import cli

    for command in ("reproduce", "compare", "benchmark", "node-data"):
        with pytest.raises(SystemExit) as exit_info:
            cli.main([command, "--help"])
        assert exit_info.value.code == 0
        usage = capsys.readouterr().out
        if command in ("reproduce", "compare"):
            assert "--seeds SEEDS" in usage and "--jobs JOBS" in usage and "(default: 1)" in usage
    assert runner.parse_seeds("0,1, 2") == (0, 1, 2)
    with pytest.raises(SystemExit, match="comma list of integers"):
        runner.parse_seeds("0 1")
    assert runner.parse_overrides(["lr=0.05", "fedprox:proximal-mu=0.1", "augment=weak"]) == (
        {"lr": 0.05, "augment": "weak"}, {"fedprox": {"proximal-mu": 0.1}})  # fmt: skip
    for bad in ("no-such-key=1", "num-rounds=two", "lr"):
        with pytest.raises(SystemExit, match="--set"):
            runner.parse_overrides([bad])
    with pytest.raises(SystemExit, match=r"--set 'lrr=0.1': unknown run-config key\(s\) 'lrr' \(did you mean 'lr'\?\)"):
        runner.parse_overrides(["lrr=0.1"])


def test_reproduce_runs_selects_runs_in_pattern_order(capsys) -> None:
    from fedul_flwr import cli

    listing = ["reproduce", "--grid", "feddb-ablation", "--seeds", "0,1", "--list"]
    assert cli.main([*listing, "--runs", "*Dir-0.1-__FixMatch__-__s1,*Dir-0.1-__FixMatch__*,*IID__FedDB__*"]) == 0
    ids = [line.split()[0] for line in capsys.readouterr().out.splitlines()[:-1]]
    assert ids == ["feddb-ablation__Dir-0.1-__FixMatch__-__s1", "feddb-ablation__Dir-0.1-__FixMatch__-__s0",
                   "feddb-ablation__IID__FedDB__-__s0", "feddb-ablation__IID__FedDB__-__s1"]  # fmt: skip
    with pytest.raises(SystemExit, match="'\\*FedPU\\*': matches no run"):
        cli.main([*listing, "--runs", "*FedDB*,*FedPU*"])


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
def test_runner_sigterm_stops_its_worker_processes(tmp_path: Path) -> None:
    """``kill <runner>`` must not leave ``--jobs`` workers running (and writing records) orphaned."""
    cmd = [sys.executable, "-m", "fedul_flwr.cli", "reproduce", "--grid", "smoke", "--jobs", "2", "--threads", "1",
           "--out", str(tmp_path), "--set", "num-rounds=50"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        runs = tmp_path / "cpu" / "runs"
        deadline = time.monotonic() + 120
        while not (runs.exists() and len([d for d in runs.iterdir() if not d.name.startswith(".")]) >= 2):  # both workers in a run
            assert proc.poll() is None and time.monotonic() < deadline, "the runner never started its runs"
            time.sleep(0.2)
        workers = children(proc.pid)
        assert len(workers) >= 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
        deadline = time.monotonic() + 30
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [w for w in workers if _alive(w)], "worker processes outlived the runner"
        assert not list((tmp_path / "cpu" / "records").glob("*.json"))  # no run finished
    finally:  # on failure, leave nothing running
        for pid in [proc.pid, *workers]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def test_table_puts_the_papers_numbers_in_brackets() -> None:
    specs = [reproduce.RunSpec("table1", "MNIST IID", c, sub, 0, 5, "table1", {})
             for c, sub in (("FedUL", "10"), ("FedUL", "20"), ("FedAvg 10%", "*"), ("FedAvg 100%", "*"))]  # fmt: skip
    records = [{"spec": dataclasses.asdict(s), "last-test-error": e} for s, e in zip(specs, (0.01, 0.02, 0.03, 0.005))]
    table = reproduce.render_table("table1", specs, records, "last-test-error")
    assert ["MNIST IID", "1.00 [0.78] / 2.00 [1.12]", "3.00 [1.79]", "0.50", "+0.50 / +1.50"] in table_rows(table)


def test_table_cell_gives_each_seed_in_seed_order_and_pages_mark_their_sections(tmp_path: Path) -> None:
    """Several seeds: mean (std; seed 0, seed 1) whatever the records' order; the page wraps each
    table in named snippet markers (the docs include them) and gives seconds per round."""
    specs = [reproduce.RunSpec("feddb-ablation", "IID", "FedDB", "*", s, 20, "feddb-cpu", {}) for s in (0, 1)]
    records = [
        {"spec": dataclasses.asdict(spec), "run-id": f"run-{spec.seed}", "last-test-error": e, "last-round": 3,
         "wall-time-s": 30.0, "config": {"device": "cpu"},
         "metrics": [{"round": n, "test-accuracy": 1 - e, "wall-time": t} for n, t in enumerate((1.0, 9.0, 19.0, 26.0))]}
        for spec, e in zip(reversed(specs), (0.3, 0.2), strict=True)
    ]  # fmt: skip
    table = reproduce.render_table("feddb-ablation", specs, records, "last-test-error")
    assert table_rows(table)[1][1].startswith("75.00 (7.07; 80.00, 70.00)")  # seed 0: 80, seed 1: 70
    assert reproduce.seconds_per_round(records[0]) == 8.0  # steps 8, 10, 7: the median
    assert reproduce.seconds_per_round({"metrics": [{"round": 0}]}) is None
    page = reproduce.render("feddb-ablation", "cpu", specs, records, tmp_path).read_text()
    for name in ("last", "tail", "best", "windows", "wall-time"):
        start, end = page.index(f"<!-- --8<-- [start:{name}] -->"), page.index(f"<!-- --8<-- [end:{name}] -->")
        assert len(table_rows(page[start:end])) >= 2
    assert ["run-0", "30", "8.0"] in [row[:3] for row in table_rows(page)]


def test_hassle_pages_show_the_fixmatch_baselines_pseudo_labels(tmp_path: Path) -> None:
    """On a HASSLE grid's page, FedAvg+FixMatch's pseudo-label share and accuracy by round (the
    runs of other methods, whose pseudo-labels are all kept, are left out of that table)."""
    specs = [reproduce.RunSpec("hassle-table1", "10%", c, "*", 0, 20, "hassle", {}) for c in ("FedAvg+FixMatch", "HASSLE")]
    rows = [{"round": n, "test-accuracy": 0.5, "wall-time": float(n), "pseudo-label-share": 0.4,
             "pseudo-label-correct-share": 0.1} for n in range(11)]  # fmt: skip
    records = [{"spec": dataclasses.asdict(spec), "run-id": spec.column, "last-test-error": 0.5, "last-round": 10,
                "wall-time-s": 10.0, "config": {"method": method}, "metrics": rows}
               for spec, method in zip(specs, ("fixmatch", "hassle"), strict=True)]  # fmt: skip
    page = reproduce.render("hassle-table1", "cpu", specs, records, tmp_path).read_text()
    table = page[page.index("FedAvg+FixMatch's pseudo-labels"):page.index("<!-- --8<-- [end:diagnostics] -->")]
    rows = [row[:3] for row in table_rows(table)]
    assert ["10%", "FedAvg+FixMatch", "40.0"] in rows and ["10%", "FedAvg+FixMatch", "25.0"] in rows
    assert not [row for row in rows if "HASSLE" in row]


def test_table_shows_one_column_per_predictor_headline_last() -> None:
    specs = [reproduce.RunSpec("g", "r", c, "*", 0, 20, "hassle", {}) for c in ("FedAvg", "HASSLE")]
    records = [
        {"spec": dataclasses.asdict(specs[0]), "last-test-error": 0.3},  # a method with one predictor
        {"spec": dataclasses.asdict(specs[1]), "predictors": ["EM", "SM", "UM"], "last-test-error": 0.1,
         "last-test-error-SM": 0.2, "last-test-error-UM": 0.25},
    ]  # fmt: skip
    table = reproduce.render_table("g", specs, records, "last-test-error")
    assert table_rows(table) == [["setting", "FedAvg", "HASSLE SM", "HASSLE UM", "HASSLE EM"],
                                 ["r", "30.00", "20.00", "25.00", "10.00"]]  # fmt: skip


def test_tail_measure_is_the_mean_over_the_last_rounds_per_predictor() -> None:
    rounds = range(0, 13)  # round 0 (before training) never counts
    rows = [{"round": r, "test-accuracy": r / 100, "test-accuracy-SM": r / 50} for r in rounds]
    record = {"metrics": rows}
    n = reproduce.TAIL_ROUNDS
    assert reproduce.record_value(record, "tail-test-error") == pytest.approx(1 - sum(range(13 - n, 13)) / n / 100)
    assert reproduce.record_value(record, "tail-test-error-SM") == pytest.approx(1 - sum(range(13 - n, 13)) / n / 50)
    short = {"metrics": rows[:3]}  # fewer trained rounds than TAIL_ROUNDS: all of them
    assert reproduce.record_value(short, "tail-test-error") == pytest.approx(1 - 0.015)
    assert reproduce.record_value({"metrics": rows[:1]}, "tail-test-error") is None
    assert reproduce.record_value({"last-test-error": 0.2}, "last-test-error") == 0.2
