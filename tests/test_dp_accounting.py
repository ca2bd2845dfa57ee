"""The recorded epsilon against the sampling a run really does (``participation``): a fixed-size
cohort of m < N nodes (replace-one adjacency, sampling without replacement), every node every
round (add-or-remove), Poisson sampling (add-or-remove with amplification, the mean divided by
qN). The figures are checked against numbers computed here without the project: a concrete
neighbouring pair integrated with scipy and composed with dp-accounting's privacy loss
distributions, and dp-accounting's RDP accountant."""

from __future__ import annotations

import json
import math
import uuid
import warnings
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.pld import privacy_loss_distribution
from dp_accounting.rdp import RdpAccountant
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from scipy import integrate, optimize, stats

from fedul_flwr import wire
from fedul_flwr.check_cli import main as fedul_check
from fedul_flwr.preflight import resolve_config
from fedul_flwr.client_app import app as client_app
from fedul_flwr.config import ConfigError
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.privacy.accounting import neighbours, privacy_spent
from fedul_flwr.server_app import run_federation
from fedul_flwr.strategies import build_strategy
from fedul_flwr.strategies.participation import poisson_draw

REPO = Path(__file__).resolve().parent.parent
DELTA = 1e-5
# the federation of the finding: N = 5 nodes, 3 a round, z = 0.8
FIXED = {"differential-privacy": "server-fixed", "dp-noise-multiplier": 0.8, "fraction-train": 0.6,
         "min-train-nodes": 2, "min-available-nodes": 5}  # fmt: skip
CHEAP = {"samples-per-client": 200, "batch-size": 64}


def _pair_epsilon_one_round(z: float, q: float) -> float:
    """The exact epsilon of one round for a concrete neighbouring pair, by numerical integration:
    every client's update is -C e except one, whose update is +C e in D and -C e in D' (a
    replacement). A round samples it with probability q = m / N; then the noised sum moves by 2C,
    else not: P = (1 - q) N(0, (zC)^2) + q N(2C, (zC)^2) against Q = N(0, (zC)^2) (C = 1, shifted
    by the others' sum). delta(eps) = max over both orders of the integral of (p - e^eps q)+."""

    x = np.linspace(-12 * z - 2, 12 * z + 4, 600_001)
    dx = x[1] - x[0]
    p = (1 - q) * stats.norm.pdf(x, 0, z) + q * stats.norm.pdf(x, 2, z)
    r = stats.norm.pdf(x, 0, z)

    def delta(eps: float) -> float:  # the integrals of (p - e^eps r)+ and (r - e^eps p)+, by the trapezoid rule
        return max(float(integrate.trapezoid(np.maximum(0.0, p - math.exp(eps) * r), dx=dx)),
                   float(integrate.trapezoid(np.maximum(0.0, r - math.exp(eps) * p), dx=dx)))  # fmt: skip

    return optimize.brentq(lambda e: delta(e) - DELTA, 0.0, 100.0, xtol=1e-6)


def _pair_epsilons(z: float, q: float, rounds: int) -> list[float]:
    """The same pair over 1..rounds rounds: dp-accounting's privacy loss distribution of the
    sensitivity-2 mixture, composed (pessimistic discretisation: an upper bound of the pair's
    exact epsilon within the discretisation)."""
    pld = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=z, sensitivity=2.0, sampling_prob=q, value_discretization_interval=1e-2
    )
    out, composed = [], pld
    for _ in range(rounds):
        out.append(composed.get_epsilon_for_delta(DELTA))
        composed = composed.compose(pld)
    return out


def test_fixed_size_record_is_at_least_the_worst_neighbouring_pair() -> None:
    cfg = resolve_config(FIXED)
    recorded = [privacy_spent(cfg, r, 5)[wire.PRIVACY_EPSILON] for r in (1, 2, 3)]
    integrated = _pair_epsilon_one_round(0.8, 3 / 5)
    pair = _pair_epsilons(0.8, 3 / 5, 3)
    assert integrated == pytest.approx(12.40, abs=0.01)  # the finding's pair
    assert pair[0] == pytest.approx(integrated, rel=1e-3)
    assert recorded[0] >= integrated and recorded[0] >= 12.40
    assert all(rec >= exact for rec, exact in zip(recorded, pair, strict=True))
    # the record is dp-accounting's bound for replace-one, m of N without replacement, multiplier z / 2
    for rounds, rec in zip((1, 2, 3), recorded, strict=True):
        accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        accountant.compose(dp_accounting.SampledWithoutReplacementDpEvent(5, 3, dp_accounting.GaussianDpEvent(0.4)), rounds)
        assert rec == pytest.approx(accountant.get_epsilon(DELTA), rel=1e-12)
    # one round's tight figure is the pair's
    assert privacy_spent(cfg, 1, 5)[wire.PRIVACY_EPSILON_ROUND] == pytest.approx(integrated, rel=1e-4)
    assert neighbours(cfg, 5) == "client-level,replace-one-client,sampled-without-replacement(3/5)"


def test_every_node_every_round_keeps_add_or_remove_accounting() -> None:
    cfg = resolve_config({**FIXED, "fraction-train": 1.0})
    accountant = RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(0.8), 3)
    assert privacy_spent(cfg, 3, 5)[wire.PRIVACY_EPSILON] == pytest.approx(accountant.get_epsilon(DELTA), rel=1e-12)
    assert neighbours(cfg, 5) == "client-level,add-or-remove-one-client,every-client-every-round"


@pytest.mark.parametrize(("q", "z", "nodes"), [(0.6, 0.8, 5), (0.1, 1.0, 100)])
def test_poisson_records_what_dp_accounting_gives(q: float, z: float, nodes: int) -> None:
    cfg = resolve_config({**FIXED, "participation": "poisson", "fraction-train": q, "dp-noise-multiplier": z})
    for rounds in (1, 3):
        accountant = RdpAccountant()
        accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds)
        assert privacy_spent(cfg, rounds, nodes)[wire.PRIVACY_EPSILON] == accountant.get_epsilon(DELTA)
    # one round's tight figure: the Poisson subsampled Gaussian's privacy loss distribution
    pld = privacy_loss_distribution.from_gaussian_mechanism(standard_deviation=z, sampling_prob=q,
                                                            value_discretization_interval=1e-2)  # fmt: skip
    assert privacy_spent(cfg, 1, nodes)[wire.PRIVACY_EPSILON_ROUND] == pytest.approx(pld.get_epsilon_for_delta(DELTA),
                                                                                     rel=2e-3)  # fmt: skip
    assert neighbours(cfg, nodes) == f"client-level,add-or-remove-one-client,poisson({q:g})"


def test_poisson_draw_is_seeded_outside_dp_and_secret_under_it() -> None:
    nodes = list(range(1, 2001))
    seeded = poisson_draw(nodes, 0.3, 7, 4)
    assert seeded == poisson_draw(list(reversed(nodes)), 0.3, 7, 4)  # a function of (seed, round)
    assert seeded != poisson_draw(nodes, 0.3, 7, 5)
    assert abs(len(seeded) - 600) < 5 * math.sqrt(2000 * 0.3 * 0.7)
    secret = [poisson_draw(nodes, 0.3, None, 4) for _ in range(2)]
    assert secret[0] != secret[1] and all(abs(len(s) - 600) < 5 * math.sqrt(420) for s in secret)
    assert poisson_draw(nodes, 0.0, None, 1) == [] and poisson_draw(nodes, 1.0, None, 1) == nodes


def _one_round(cfg_values: dict, nodes: int, update: float) -> tuple[ArrayRecord | None, list[int], ArrayRecord]:
    """One round of the real strategy (``build_strategy``, the DP wrapper included) on ``nodes``
    in-process nodes whose replies are crafted: node i sends w + i * ``update`` in every
    coordinate. Returns the aggregate, the nodes instructed and w."""
    cfg = resolve_config(cfg_values)
    strategy = build_strategy(cfg, None, num_nodes=nodes)
    grid = InProcessGrid(client_app, nodes, cfg_values)
    w = ArrayRecord({"f.w": Array(np.zeros(20000, np.float32))})
    instructions = list(strategy.configure_train(1, w, ConfigRecord({wire.RUN_CONFIG: cfg.to_json()}), grid))
    replies = []
    for m in instructions:
        m.metadata.__dict__["_message_id"] = uuid.uuid4().hex
        node = m.metadata.dst_node_id
        content = RecordDict({
            wire.ARRAYS: ArrayRecord({"f.w": Array(np.full(20000, node * update, np.float32))}),
            wire.METRICS: MetricRecord({wire.TRAIN_LOSS: 0.5, wire.NUM_EXAMPLES: 10, wire.UNIFORM_WEIGHT: 1,
                                        wire.NUM_STEPS: 2}),
            wire.NODE_RECORD: ConfigRecord({wire.NODE_KEY: node})})  # fmt: skip
        replies.append(Message(content, reply_to=m))
    arrays, _ = strategy.aggregate_train(1, replies)
    return arrays, sorted(m.metadata.dst_node_id for m in instructions), w


def test_poisson_round_divides_by_the_expected_cohort() -> None:
    """With k sampled nodes the noiseless release is w + (sum of their clipped updates) / (qN),
    not / k (DP-FedAvg's fixed denominator)."""
    values = {**FIXED, "participation": "poisson", "fraction-train": 0.5, "dp-clipping-norm": 10.0,
              "min-available-nodes": 6, "dp-noise-multiplier": 1e-9}  # fmt: skip
    for _ in range(5):  # the draw is secret: a few rounds, until one samples someone
        arrays, sampled, _ = _one_round(values, 6, 1e-4)
        if sampled:
            break
    assert sampled and arrays is not None
    expected = sum(node * 1e-4 for node in sampled) / (0.5 * 6)
    assert np.allclose(arrays["f.w"].numpy(), expected, rtol=1e-4)


def test_poisson_round_with_no_node_releases_the_model_plus_noise() -> None:
    """q = 1e-6 of one node: the round samples nobody, does not stop the run, and releases w plus
    noise of standard deviation z C / (qN), the mechanism on an empty sum."""
    values = {**FIXED, "participation": "poisson", "fraction-train": 1e-6, "dp-clipping-norm": 1.0,
              "dp-noise-multiplier": 1.0, "min-available-nodes": 1, "min-train-nodes": 1}  # fmt: skip
    arrays, sampled, w = _one_round(values, 1, 1.0)
    assert sampled == [] and arrays is not None
    released = arrays["f.w"].numpy().astype(np.float64)
    assert np.std(released) == pytest.approx(1.0 * 1.0 / 1e-6, rel=0.05) and abs(np.mean(released)) < 1e5


@pytest.mark.parametrize("mode", ["server-fixed", "server-adaptive"])
def test_a_poisson_round_that_samples_nobody_releases_noise_end_to_end(
    mode: str, tmp_path: Path, small_test_set: None
) -> None:
    """q = 1e-9 of 3 nodes (the draw is secret, but a draw of anyone is a 3e-9 chance): the round
    trains nobody, is no failure even with min-train-nodes = 3 and max-failure-fraction = 0, and
    releases the global model plus noise of standard deviation z C / (qN) (adaptive: z_Delta C / (qN)),
    with its epsilon on record."""
    rc = {"samples-per-client": 60, "batch-size": 64, "differential-privacy": mode, "participation": "poisson",
          "fraction-train": 1e-9, "dp-noise-multiplier": 1.0, "dp-clipping-norm": 1.0, "num-rounds": 1,
          "min-train-nodes": 3, "min-available-nodes": 3, "max-failure-fraction": 0.0,
          "output-dir": str(tmp_path), "run-name": "empty"}  # fmt: skip
    outputs = run_federation(InProcessGrid(client_app, 3, rc), resolve_config(rc))
    assert "status=ok" in outputs.summary()
    rows = json.loads((tmp_path / "empty" / "metrics.json").read_text())
    assert [row["round"] for row in rows] == [0, 1] and rows[1]["trained-nodes"] == [] and rows[1]["failed-nodes"] == []
    assert math.isfinite(rows[1][wire.PRIVACY_EPSILON]) and rows[1][wire.PRIVACY_DELTA] == DELTA
    model = torch.load(tmp_path / "empty" / "model.pt", weights_only=True)
    std = float(np.std(np.concatenate([v.double().numpy().ravel() for v in model.values() if v.is_floating_point()])))
    assert 0.9 / 3e-9 < std < (1.5 if mode == "server-adaptive" else 1.1) / 3e-9  # the initial model's weights are < 1


def test_a_poisson_run_records_dp_accounting_and_names_its_neighbours(tmp_path: Path, small_test_set: None) -> None:
    rc = {**CHEAP, **FIXED, "participation": "poisson", "fraction-train": 0.5, "num-rounds": 3, "min-available-nodes": 4,
          "min-train-nodes": 2, "output-dir": str(tmp_path), "run-name": "poisson"}  # fmt: skip
    outputs = run_federation(InProcessGrid(client_app, 4, rc), resolve_config(rc))
    rows = [row for row in json.loads((tmp_path / "poisson" / "metrics.json").read_text()) if row["round"] >= 1]
    assert [row["round"] for row in rows] == [1, 2, 3]
    for row in rows:
        accountant = RdpAccountant()
        accountant.compose(dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(0.8)), row["round"])
        assert row[wire.PRIVACY_EPSILON] == accountant.get_epsilon(DELTA)
    summary = outputs.summary()
    assert "status=ok" in summary and "neighbours=client-level,add-or-remove-one-client,poisson(0.5) " in summary


@pytest.mark.parametrize("value", ["uniform", "Poisson", ""])
def test_fedul_check_refuses_a_bad_participation_in_one_line(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert fedul_check(["--run-config", f"participation='{value}'", "--no-simulation"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"error: participation={value!r} is not one of ('fixed-size', 'poisson')")
    with pytest.raises(ConfigError, match="^participation="):
        resolve_config({"participation": value})


@pytest.mark.parametrize("value", ["Poisson", "POISSON", "poisso"])
def test_a_mistyped_participation_gets_the_closest_choice_whatever_its_case(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fedul_check(["--run-config", f"participation='{value}'", "--no-simulation"]) == 1
    assert capsys.readouterr().err.strip().endswith("(did you mean 'poisson'?)")


@pytest.mark.parametrize(("values", "start"), [
    ("participation='poisson' fraction-train=1e-20", "error: fraction-train=1e-20 with participation='poisson' and "
                                                     "differential-privacy='server-fixed': "),
    ("dp-noise-multiplier=1e-250", "error: dp-noise-multiplier=1e-250: the accountant cannot compute its epsilon"),
    ("dp-noise-multiplier=nan", "error: dp-noise-multiplier=nan is not a finite number"),
])  # fmt: skip
def test_fedul_check_refuses_numbers_the_accountant_cannot_take_in_one_line_naming_the_key(
    values: str, start: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with warnings.catch_warnings(record=True) as warned:  # a warning would print its own lines before the error
        warnings.simplefilter("always")
        assert fedul_check(["--run-config", f"differential-privacy='server-fixed' {values}", "--no-simulation"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(start) and not warned, (err, [str(w.message) for w in warned])


def test_a_tiny_poisson_rate_is_accounted() -> None:
    """q = 1e-12, the smallest accepted: the accountant gives a finite epsilon."""
    cfg = resolve_config({"differential-privacy": "server-fixed", "participation": "poisson", "fraction-train": 1e-12})
    assert all(math.isfinite(v) for v in privacy_spent(cfg, 3, 3).values())


@pytest.mark.slow
def test_docs_participation_table_is_rendered_from_the_accountant() -> None:
    """docs/privacy.md's table of what each participation mode costs is what
    scripts/participation_table.py renders now (no number typed by hand)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("participation_table", REPO / "scripts" / "participation_table.py")
    assert spec is not None and spec.loader is not None
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    assert table.OUTPUT.read_text() == table.render(), "stale: run python scripts/participation_table.py"
    assert '--8<-- "docs/reproduce/privacy/participation.md"' in (REPO / "docs" / "privacy.md").read_text()


def test_poisson_with_a_robust_strategy_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^participation='poisson' with strategy='krum': a Poisson round may draw "
                       r"fewer nodes than the 3 replies it needs .* use participation='fixed-size'$"):  # fmt: skip
        resolve_config({"participation": "poisson", "strategy": "krum", "num-malicious-nodes": 0, "min-train-nodes": 3,
                        "min-available-nodes": 3})  # fmt: skip


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_flwr_run_with_poisson_participation_records_dp_accounting(tmp_path: Path) -> None:
    """``flwr run .`` through a real SuperLink (simulation, Ray), 4 nodes, Poisson sampling at
    q = 0.5 under server-fixed DP: the run completes (a round may draw nobody) and records the
    epsilon dp-accounting gives for q, z and the rounds, naming its neighbours."""
    from tests.flower_harness import superlink

    out = tmp_path / "runs"
    run_config = (f"differential-privacy='server-fixed' dp-noise-multiplier=0.8 participation='poisson' "
                  f"fraction-train=0.5 min-available-nodes=4 min-train-nodes=2 num-rounds=2 samples-per-client=200 "
                  f"batch-size=256 output-dir='{out}' run-name='poisson'")  # fmt: skip
    with superlink(tmp_path) as link:
        link.run_to_completion(run_config, "num-supernodes=4 client-resources-num-cpus=1", out / "poisson")
    rows = [row for row in json.loads((out / "poisson" / "metrics.json").read_text()) if row["round"] >= 1]
    assert [row["round"] for row in rows] == [1, 2]
    for row in rows:
        accountant = RdpAccountant()
        accountant.compose(dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(0.8)), row["round"])
        assert row[wire.PRIVACY_EPSILON] == accountant.get_epsilon(DELTA)
    summary = (out / "poisson" / "summary.txt").read_text()
    assert "status=ok" in summary and "neighbours=client-level,add-or-remove-one-client,poisson(0.5) " in summary
