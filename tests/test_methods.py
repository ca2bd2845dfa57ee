"""Baselines (FedPL, FedLLP, FedLLP-VAT, supervised FedAvg), their data path (labels only for
the supervised reference, noisy priors, per-client budgets), validation-based selection and
the reproduction runner (determinism, resumable records, tables)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
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
import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr import server_app
from fedul_flwr.client_app import app as client_app
from fedul_flwr.config import ConfigError, resolve_config
from fedul_flwr.data.client_data import client_usets, load_client, load_run_dataset
from fedul_flwr.data.prior_noise import noisy_priors
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import METHODS, FedPL, Supervised
from fedul_flwr.methods.base import LocalTask
from fedul_flwr.methods.fedllp import proportion_loss, set_stratified_batches
from fedul_flwr.methods.fedllp_vat import vat_loss
from fedul_flwr.methods.fedpl import set_pseudo_labels
from fedul_flwr.methods.supervised import labeled_subset
from fedul_flwr.training import train_local

SPEC = importlib.util.spec_from_file_location("reproduce", Path(__file__).parent.parent / "scripts" / "reproduce.py")
reproduce = importlib.util.module_from_spec(SPEC)
sys.modules["reproduce"] = reproduce  # dataclasses look their module up
SPEC.loader.exec_module(reproduce)

TINY = {"samples-per-client": 200, "num-rounds": 1}  # 2 clients x 200 images of the embedded sample
VAL = 0.05  # 600 labeled validation images of the embedded sample


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
    model = nn.Linear(k, k)
    task = LocalTask(
        inputs=x, targets=s, loss=lambda f, xb, sb: proportion_loss(f(xb), sb, pi_emp), batches=set_stratified_batches(s, 64)
    )
    train_local(model, task, epochs=60, batch_size=64, lr=0.05)
    accuracy = (model(x).argmax(1) == y).float().mean().item()
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


# --------------------------------------------------------------------------- FedPL


def test_fedpl_pseudo_labels_are_the_argmax_of_the_set_prior() -> None:
    priors = np.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3], [0.2, 0.2, 0.6]])
    s = torch.tensor([2, 0, 0, 1, 2])
    assert set_pseudo_labels(priors, s).tolist() == [2, 1, 1, 0, 2]


def _fedpl_loss(**cfg: object):
    client = load_client(resolve_config(TINY), 0, 2)  # the loss closure only reads the config
    return FedPL(resolve_config({**TINY, **cfg})).local_task(client, torch.device("cpu")).loss


def test_fedpl_loss_warm_start_fix_and_mix_terms() -> None:
    loss = _fedpl_loss(**{"fedpl-mixup-alpha": 1e6})  # Beta(a, a) ~ 0.5
    identity = nn.Identity()  # f(x) = x: the inputs are the logits
    y = torch.tensor([0, 1])
    # nobody confident (uniform predictions, tau = 0.4): warm start = CE on all rows
    uniform = torch.zeros(2, 3)
    assert loss(identity, uniform, y).item() == pytest.approx(math.log(3), rel=1e-6)
    # everybody confident: plain CE, no mix term
    sure = torch.tensor([[5.0, 0.0, 0.0], [0.0, 5.0, 0.0]])
    assert loss(identity, sure, y).item() == pytest.approx(F.cross_entropy(sure, y).item(), rel=1e-6)
    # row 0 confident in its pseudo label, row 1 not: fix on row 0 + 0.3 * mixup(row 0, row 1)
    mixed = torch.tensor([[5.0, 0.0, 0.0], [3.0, 0.0, 0.0]])
    xm = 0.5 * (mixed[0] + mixed[1])[None]
    expected = F.cross_entropy(mixed[:1], y[:1]) + 0.3 * (
        0.5 * F.cross_entropy(xm, y[:1]) + 0.5 * F.cross_entropy(xm, y[1:])
    )
    assert loss(identity, mixed, y).item() == pytest.approx(expected.item(), abs=1e-3)
    no_mix = _fedpl_loss(**{"fedpl-mix-weight": 0.0})
    assert no_mix(identity, mixed, y).item() == pytest.approx(F.cross_entropy(mixed[:1], y[:1]).item(), rel=1e-6)


# --------------------------------------------------------------------------- labels


def test_labels_reach_only_the_supervised_method() -> None:
    assert [n for n, cls in METHODS.items() if cls.needs_labels] == ["supervised"]
    cfg = resolve_config(TINY)
    plain = load_client(cfg, 0, 2)
    assert plain.labels is None  # what FedUL and the weak baselines get
    labeled = load_client(cfg, 0, 2, with_labels=True)
    assert load_client(cfg, 0, 2).labels is None  # the cache keeps both apart
    assert torch.equal(labeled.x, plain.x) and torch.equal(labeled.set_index, plain.set_index)
    usets, _ = client_usets(cfg, 0, 2)
    counts = np.stack([np.bincount(labeled.labels[labeled.set_index == m].numpy(), minlength=10) for m in range(10)])
    assert np.array_equal(counts, usets.class_counts)  # labels are the true labels of x, in order
    with pytest.raises(ValueError, match="needs ClientData.labels"):
        Supervised(cfg).local_task(plain, torch.device("cpu"))
    task = Supervised(resolve_config({**TINY, "label-fraction": 0.1})).local_task(labeled, torch.device("cpu"))
    rows = labeled_subset(200, 0.1, 0)
    assert task.num_examples == 20 and torch.equal(task.targets, labeled.labels[rows])


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
    clean = load_client(resolve_config(TINY), 1, 2)
    seen = load_client(resolve_config({**TINY, "prior-noise": 0.8}), 1, 2)
    assert torch.equal(clean.x, seen.x) and torch.equal(clean.set_index, seen.set_index)
    assert not np.allclose(clean.priors, seen.priors) and np.allclose(seen.priors.sum(1), 1)
    assert np.array_equal(seen.priors, load_client(resolve_config({**TINY, "prior-noise": 0.8}), 1, 2).priors)


def test_told_priors_are_checked_for_rank(monkeypatch, caplog) -> None:
    """Noise that leaves Pi~_c column-rank deficient (f not identifiable) is warned about."""
    from fedul_flwr.data import client_data

    cfg = resolve_config({**TINY, "prior-noise": 0.3})
    load_client.cache_clear()
    with caplog.at_level(logging.INFO, logger=client_data.__name__):
        load_client(cfg, 0, 2)
    told = [r for r in caplog.records if "told priors" in r.getMessage()]
    assert len(told) == 1 and told[0].levelno == logging.INFO and "cond(Pi~_c)=inf" not in told[0].getMessage()
    flat = lambda pi, eps, rng: np.full_like(pi, 1 / pi.shape[1])  # noqa: E731  every set told the same mix
    monkeypatch.setattr(client_data, "noisy_priors", flat)
    load_client.cache_clear()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=client_data.__name__):
        load_client(cfg, 0, 2)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "column-rank deficient" in warned[0].getMessage()
    load_client.cache_clear()


def test_samples_per_client_and_knob_validation() -> None:
    assert load_client(resolve_config(TINY), 0, 2).num_examples == 200
    with pytest.raises(ValueError, match="samples-per-client"):
        load_client(resolve_config({"samples-per-client": 7000}), 0, 2)
    for bad in ({"label-fraction": 0.0}, {"prior-noise": -1.0}, {"method": "nope"}, {"llp-batches": "x"}):
        with pytest.raises(ConfigError):
            resolve_config(bad)


# --------------------------------------------------------------------------- federations


@pytest.fixture
def small_test_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Central evaluation on the first 500 test images, to keep the federations fast."""

    def load(cfg):
        data = load_run_dataset(cfg)
        return dataclasses.replace(data, test_x=data.test_x[:500], test_y=data.test_y[:500])

    monkeypatch.setattr(server_app, "load_run_dataset", load)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_runs_a_round_and_records_validation(method: str, tmp_path: Path, small_test_set: None) -> None:
    rc = {**TINY, "method": method, "val-fraction": VAL, "output-dir": str(tmp_path), "run-name": method,
          "label-fraction": 0.5}  # fmt: skip
    outputs = server_app.run_federation(InProcessGrid(client_app, 2, rc), resolve_config(rc))
    rows = [outputs.rows[r] for r in sorted(outputs.rows)]
    assert [r["round"] for r in rows] == [0, 1]
    assert math.isfinite(rows[1]["train-loss"])
    assert 0 <= rows[1]["val-error"] <= 1 and rows[1]["val-accuracy"] == pytest.approx(1 - rows[1]["val-error"])
    assert rows[1]["test-loss"] != rows[0]["test-loss"]  # f was trained and aggregated


def test_runner_is_deterministic_resumable_and_renders(tmp_path: Path, small_test_set: None, capsys) -> None:
    profile = reproduce.PROFILES["cpu"]
    # 3 clients and 2 rounds: with 2 clients a weighted sum cannot depend on the order of its
    # terms, and with 1 round no aggregate is ever trained on
    spec = reproduce.RunSpec("smoke", "MNIST-sample IID", "FedPL", "10", 0, 3, "",
                             {"dataset": "mnist-sample", "method": "fedpl", "val-fraction": VAL, **TINY, "num-rounds": 2})  # fmt: skip
    rc = reproduce.run_config_of(spec, profile, "", tmp_path / "a", {})
    assert rc["num-rounds"] == 2 and rc["model"] == "small-cnn" and rc["preset"] == ""
    first = reproduce.execute(spec, rc)
    second = reproduce.execute(spec, {**rc, "output-dir": str(tmp_path / "b" / "runs")})
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall-time"} for r in rows]  # noqa: E731
    assert strip(first["metrics"]) == strip(second["metrics"])  # same preset + seed -> identical
    assert first["last-round"] == 2 and first["best-val-round"] in (1, 2)
    best = first["best-val-round"]
    assert first["best-val-test-error"] == first["metrics"][best]["test-error"]
    # resume: an existing record is not run again
    records = tmp_path / "a" / "records"
    records.mkdir(parents=True)
    (records / f"{spec.run_id}.json").write_text(json.dumps(first))
    done = reproduce.run_grid([spec], profile, tmp_path / "a", "", {})
    assert "skip (record exists)" in capsys.readouterr().out and done == [first]


def _children(pid: int) -> set[int]:
    """Live child pids of ``pid`` (Linux ``/proc``)."""
    kids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.add(int(stat.parent.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
def test_runner_sigterm_stops_its_worker_processes(tmp_path: Path) -> None:
    """``kill <runner>`` must not leave ``--jobs`` workers running (and writing records) orphaned."""
    script = Path(reproduce.__file__)
    cmd = [sys.executable, str(script), "--grid", "smoke", "--jobs", "2", "--threads", "1",
           "--out", str(tmp_path), "--set", "num-rounds=50"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        runs = tmp_path / "cpu" / "runs"
        deadline = time.monotonic() + 120
        while not (runs.exists() and len(list(runs.iterdir())) >= 2):  # both workers are in a run
            assert proc.poll() is None and time.monotonic() < deadline, "the runner never started its runs"
            time.sleep(0.2)
        workers = _children(proc.pid)
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
    assert "| MNIST IID | 1.00 [0.78] / 2.00 [1.12] | 3.00 [1.79] | 0.50 | +0.50 / +1.50 |" in table
