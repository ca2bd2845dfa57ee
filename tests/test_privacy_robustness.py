"""Flower's privacy and robustness switches, selected by config, run through the real apps:
the robust aggregators and each differential-privacy mode for 2 rounds in the in-process
federation, with the clipping they promise checked on the global model."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord

from fedul_flwr import wire
from fedul_flwr.client_app import app as client_app
from fedul_flwr.preflight import resolve_config
from fedul_flwr.config import SERVER_DP, ConfigError, RunConfig, compose_config, describe_sources
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import get_method
from fedul_flwr.privacy.accounting import privacy_spent
from fedul_flwr.server_app import global_models, run_federation
from fedul_flwr.strategies import build_strategy, inner_strategy

CHEAP = {"samples-per-client": 200, "batch-size": 64, "min-available-nodes": 3, "min-train-nodes": 3}


def _resolved(rc: dict, noiseless: bool) -> RunConfig:
    """The checked configuration; ``noiseless``: its dp-noise-multiplier set to 0 after the checks
    (which refuse z = 0 to users), to measure what the clipping alone does."""
    cfg = resolve_config(rc)
    return dataclasses.replace(cfg, dp_noise_multiplier=0.0) if noiseless else cfg


def _two_rounds(run_config: dict, noiseless: bool = False) -> tuple[ArrayRecord, ArrayRecord, object, InProcessGrid]:
    """Two rounds of the real ClientApp on 3 nodes through ``build_strategy``; the initial and
    the final global arrays, the strategy and the grid."""
    rc = {**CHEAP, **run_config}
    cfg = _resolved(rc, noiseless)
    grid = InProcessGrid(client_app, 3, rc)
    initial = ArrayRecord(global_models(cfg, get_method(cfg.method)(cfg), 1, 10, 28).state_dict())
    random.seed(0)
    strategy = build_strategy(cfg, get_method(cfg.method)(cfg).aggregation(), num_nodes=3)
    settings = ConfigRecord({wire.RUN_CONFIG: cfg.to_json()})
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=2, train_config=settings)
    return initial, result.arrays, strategy, grid


def _distance(a: ArrayRecord, b: ArrayRecord) -> float:
    return float(np.sqrt(sum(np.sum((a[k].numpy().astype(np.float64) - b[k].numpy()) ** 2) for k in a.keys())))


@pytest.mark.parametrize("name", ["fedmedian", "fedtrimmedavg", "krum", "multikrum", "bulyan"])
def test_robust_aggregators_train_two_rounds(name: str) -> None:
    initial, final, _, _ = _two_rounds({"strategy": name, "num-nodes-to-select": 2})
    assert _distance(initial, final) > 0
    assert all(np.isfinite(final[k].numpy()).all() for k in final.keys())


def test_krum_returns_one_clients_model() -> None:
    """Krum (f = 0, 3 replies) picks the reply closest to the others: the new global model is
    exactly one client's, not an average."""

    class Keep(InProcessGrid):
        def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
            replies = list(super().pull_messages(message_ids))
            self.sent.extend(r.content[wire.ARRAYS] for r in replies)
            return replies

    rc = {**CHEAP, "strategy": "krum", "num-rounds": 1}
    cfg = resolve_config(rc)
    grid = Keep(client_app, 3, rc)
    grid.sent = []
    initial = ArrayRecord(global_models(cfg, get_method(cfg.method)(cfg), 1, 10, 28).state_dict())
    random.seed(0)
    result = build_strategy(cfg).start(grid=grid, initial_arrays=initial, num_rounds=1,
                                       train_config=ConfigRecord({wire.RUN_CONFIG: cfg.to_json()}))  # fmt: skip
    assert min(_distance(result.arrays, s) for s in grid.sent) == 0.0


def test_server_side_fixed_clipping_bounds_each_round_update_by_the_norm() -> None:
    """No noise, C = 1e-3: every client's update is clipped to norm C before averaging, so the
    global model moves by at most C per round (at most 2C in 2 rounds); without DP it moves
    far more."""
    clip = 1e-3
    initial, final, strategy, _ = _two_rounds({"differential-privacy": "server-fixed", "dp-clipping-norm": clip}, noiseless=True)
    assert type(strategy).__name__ == "ClippableDifferentialPrivacyServerSideFixedClipping"
    assert 0 < _distance(initial, final) <= 2 * clip * (1 + 1e-6)
    assert strategy.num_sampled_clients == 3  # the noise's divisor: the updates actually clipped
    plain_initial, plain_final, _, _ = _two_rounds({})
    assert _distance(plain_initial, plain_final) > 100 * clip


def test_server_side_fixed_clipping_adds_noise_of_the_configured_scale() -> None:
    """z = 1, C = 1e-3, n = 3 clients: after 2 rounds each coordinate carries Gaussian noise of
    variance 2 (zC/n)^2 on top of the clipped mean (whose norm is at most 2C)."""
    clip = 1e-3
    initial, final, _, _ = _two_rounds(
        {"differential-privacy": "server-fixed", "dp-noise-multiplier": 1.0, "dp-clipping-norm": clip}
    )
    delta = np.concatenate([(final[k].numpy().astype(np.float64) - initial[k].numpy()).ravel() for k in final.keys()])
    expected = np.sqrt(2) * clip / 3
    assert 0.9 * expected < delta.std() < 1.1 * expected  # ~ 10^4 coordinates: a 10% band holds


def test_server_side_adaptive_clipping_moves_its_norm_toward_the_target_quantile() -> None:
    """C = 1e-3 clips every update (their norms are ~1): with q = 0.5 and eta = 0.2 the norm
    grows by exp(0.2 * (1 - 0.5)) per round (Andrew et al., Alg. 1; Flower's own rule shrinks it)."""
    _, final, strategy, _ = _two_rounds({"differential-privacy": "server-adaptive", "dp-clipping-norm": 1e-3},
                                        noiseless=True)  # fmt: skip
    assert all(np.isfinite(final[k].numpy()).all() for k in final.keys())
    assert strategy.clipping_norm == pytest.approx(1e-3 * np.exp(2 * 0.2 * 0.5), rel=1e-9)
    assert inner_strategy(strategy) is strategy.strategy


def test_client_local_dp_clips_each_update_on_the_node() -> None:
    """LocalDpMod with C = 1e-3 and negligible noise: every node's update has norm <= C, so
    the average moves by at most C per round."""
    clip = 1e-3
    initial, final, strategy, _ = _two_rounds(
        {"differential-privacy": "client-local", "dp-clipping-norm": clip, "dp-sensitivity": 1e-12}
    )
    assert type(strategy).__name__.startswith("Strict")  # no server-side wrapper
    assert 0 < _distance(initial, final) <= 2 * clip * (1 + 1e-5)


def test_client_local_dp_composes_with_hassle_and_server_dp_refuses_it_clearly(tmp_path: Path, small_test_set: None) -> None:
    """HASSLE's clients send only some of the models they receive: client-local DP clips each reply
    against the received copy of just those; server-side DP is refused before round 1, in one line."""
    rc = {**CHEAP, "method": "hassle", "client-setting": "annotation-heterogeneity", "label-layout": "L,P,U",
          "labeled-share": 0.5, "samples-per-client": 100, "batch-size": 32, "num-rounds": 2, "output-dir": str(tmp_path),
          "differential-privacy": "client-local", "dp-clipping-norm": 0.05, "dp-sensitivity": 1e-12}  # fmt: skip
    outputs = run_federation(InProcessGrid(client_app, 3, {**rc, "run-name": "local"}), resolve_config({**rc, "run-name": "local"}))
    assert re.search(r" epsilon=[0-9.e+]+ delta=1e-05 epsilon-round=[0-9.e+]+ neighbours=local,any-two-datasets-of-a-node ",
                     outputs.summary())  # fmt: skip
    rows = json.loads((tmp_path / "local" / "metrics.json").read_text())
    assert [r["round"] for r in rows] == [0, 1, 2]
    # the privacy spent is recorded every round (0 before any reply left a node), and grows
    spent = [r[wire.PRIVACY_EPSILON] for r in rows]
    assert spent[0] == 0 and 0 < spent[1] < spent[2] and {r[wire.PRIVACY_DELTA] for r in rows} == {rc.get("dp-delta", 1e-5)}
    assert "privacy-epsilon" in (tmp_path / "local" / "metrics.csv").read_text().splitlines()[0]
    server = {**rc, "differential-privacy": "server-fixed", "run-name": "server"}
    # HASSLE's aggregation contract (partial replies, reweighted) refuses server-side DP before round 1
    with pytest.raises(ConfigError, match=r"differential-privacy='server-fixed' with method='hassle': hassle's clients "
                       r"send only the models .*\(partial replies\).* use differential-privacy=client-local"):  # fmt: skip
        resolve_config(server)
    assert not (tmp_path / "server").exists()


# Reference epsilons, computed once outside fedul_flwr (dp-accounting 0.6.0, scipy 1.17.1) and pasted:
# - "rdp": dp_accounting.rdp.RdpAccountant() (default orders), GaussianDpEvent(m) self-composed over the
#   rounds, get_epsilon(delta) -- no amplification by sampling, whatever q;
# - "exact": the exact epsilon of those rounds. T Gaussian releases of noise multiplier m are one Gaussian
#   release of multiplier m / sqrt(T) (mu = sqrt(T) / m), whose epsilon at delta solves Balle & Wang
#   (ICML 2018, Thm. 8) delta = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu), evaluated with
#   scipy.special.log_ndtr and solved with scipy.optimize.brentq (xtol 1e-12);
# - "one round": that exact epsilon for T = 1.
# m = z (server-fixed) or sigma / (2C) with sigma = dp-sensitivity sqrt(2 ln(1.25 / delta)) / dp-epsilon
# (client-local). q = the share of the N = 100 nodes a round samples (fraction-train).
SERVER_FIXED_REFERENCE = [
    # q, z, rounds, delta, rdp, exact, one round
    (1.0, 5.0, 1, 1e-5, 0.794522032537103, 0.7255217508578085, 0.7255217508578085),
    (1.0, 1.0, 10, 1e-5, 19.05359753163139, 17.85658683010763, 4.377178095681232),
    (1.0, 0.05, 5, 1e-5, 1211.7782575788603, 1189.7766984122504, 284.3918494977892),
]  # fmt: skip
# q < 1 (a fixed-size cohort of m = qN of the N = 100 nodes): replace-one adjacency, multiplier z / 2,
# sampled without replacement (tests/test_dp_accounting.py has the finding's N = 5 in full)
SAMPLED_REFERENCE = [(0.1, 1.0, 100, 1e-5), (0.01, 1.5, 200, 1e-5)]  # q, z, rounds, delta
CLIENT_LOCAL_REFERENCE = [
    # q, dp-epsilon, dp-sensitivity, C, rounds, delta, rdp, exact, one round
    (1.0, 0.9, 2.0, 1.0, 1, 1e-5, 0.7331940613623855, 0.6692746052827478, 0.6692746052827478),
    (1.0, 8.4, 2.0, 1.0, 1, 1e-5, 9.020970115756594, 8.395786779587771, 8.395786779587771),
    (1.0, 1000.0, 2.0, 1.0, 5, 1e-5, 117271.96179877249, 108476.67702406575, 22181.16355162104),
    (0.5, 1.0, 2.0, 1.0, 20, 1e-5, 4.314078519548396, 3.990775913169949, 0.7509769568672038),
    (1.0, 10.0, 0.5, 0.1, 3, 1e-6, 7.092209576189856, 6.649777660727242, 3.55824573726405),
]  # fmt: skip


def _check_against(spent: dict, rdp: float, exact: float, one_round: float) -> None:
    """The recorded epsilon is the RDP figure, an upper bound of the exact one (within 15% of
    it); the per-round figure is the exact one, from above."""
    assert spent[wire.PRIVACY_EPSILON] == pytest.approx(rdp, rel=1e-9)
    assert exact <= spent[wire.PRIVACY_EPSILON] <= 1.15 * exact
    assert one_round <= spent[wire.PRIVACY_EPSILON_ROUND] <= one_round * (1 + 1e-6)


@pytest.mark.parametrize("mode", ["server-fixed", "server-adaptive"])
@pytest.mark.parametrize(("q", "z", "rounds", "delta", "rdp", "exact", "one_round"), SERVER_FIXED_REFERENCE)
def test_server_side_epsilon_matches_independent_values_without_amplification(
    mode: str, q: float, z: float, rounds: int, delta: float, rdp: float, exact: float, one_round: float
) -> None:
    """Every node every round: add-or-remove adjacency, the Gaussian mechanism of multiplier z
    composed, no sampling to credit. server-adaptive's two queries together have the multiplier
    z of server-fixed."""
    cfg = resolve_config({"differential-privacy": mode, "dp-noise-multiplier": z, "dp-delta": delta,
                          "fraction-train": q, "min-train-nodes": 1})  # fmt: skip
    spent = privacy_spent(cfg, rounds, num_nodes=100)
    assert spent[wire.PRIVACY_DELTA] == delta
    _check_against(spent, rdp, exact, one_round)
    assert privacy_spent(cfg, 0, 100)[wire.PRIVACY_EPSILON] == 0


@pytest.mark.parametrize("mode", ["server-fixed", "server-adaptive"])
@pytest.mark.parametrize(("q", "z", "rounds", "delta"), SAMPLED_REFERENCE)
def test_server_side_epsilon_of_a_fixed_size_cohort_covers_the_replace_one_pair(
    mode: str, q: float, z: float, rounds: int, delta: float
) -> None:
    """m = qN of N = 100 nodes a round: the record is dp-accounting's replace-one bound for m of
    N without replacement at z / 2 (or the unsampled one where smaller), at least the epsilon of
    the pair whose replaced client moves the sum by 2C whenever sampled (privacy loss
    distribution, composed)."""
    import dp_accounting
    from dp_accounting.pld import privacy_loss_distribution
    from dp_accounting.rdp import RdpAccountant

    cfg = resolve_config({"differential-privacy": mode, "dp-noise-multiplier": z, "dp-delta": delta,
                          "fraction-train": q, "min-train-nodes": 1})  # fmt: skip
    spent = privacy_spent(cfg, rounds, num_nodes=100)
    bounds = []
    for event in (dp_accounting.SampledWithoutReplacementDpEvent(100, round(100 * q), dp_accounting.GaussianDpEvent(z / 2)),
                  dp_accounting.GaussianDpEvent(z / 2)):  # fmt: skip
        accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        accountant.compose(event, rounds)
        bounds.append(accountant.get_epsilon(delta))
    assert spent[wire.PRIVACY_EPSILON] == pytest.approx(min(bounds), rel=1e-12)
    pair = privacy_loss_distribution.from_gaussian_mechanism(standard_deviation=z, sensitivity=2.0, sampling_prob=q,
                                                             value_discretization_interval=1e-2)  # fmt: skip
    assert pair.self_compose(rounds).get_epsilon_for_delta(delta) <= spent[wire.PRIVACY_EPSILON]
    assert pair.get_epsilon_for_delta(delta) == pytest.approx(spent[wire.PRIVACY_EPSILON_ROUND], rel=2e-3)


@pytest.mark.parametrize(("q", "eps", "sensitivity", "clip", "rounds", "delta", "rdp", "exact", "one_round"),
                         CLIENT_LOCAL_REFERENCE)  # fmt: skip
def test_client_local_epsilon_matches_independent_values_and_states_one_reply_exactly(
    q: float, eps: float, sensitivity: float, clip: float, rounds: int, delta: float, rdp: float, exact: float,
    one_round: float,
) -> None:
    """One reply's exact epsilon is recorded beside the composed bound: below dp-epsilon for
    dp-epsilon < 1 (0.67 at 0.9), above it beyond about 8.4 (2.2e4 at dp-epsilon = 1000)."""
    cfg = resolve_config({"differential-privacy": "client-local", "dp-epsilon": eps, "dp-sensitivity": sensitivity,
                          "dp-clipping-norm": clip, "dp-delta": delta, "fraction-train": q, "min-train-nodes": 1})  # fmt: skip
    _check_against(privacy_spent(cfg, rounds, num_nodes=100), rdp, exact, one_round)


def test_runs_without_dp_record_no_epsilon() -> None:
    assert privacy_spent(resolve_config({"differential-privacy": "none"}), 3, 5) == {}


def test_server_side_dp_aggregates_with_equal_weights() -> None:
    """Flower's noise z C / n protects each client with multiplier z only under equal weights:
    server-side DP sets aggregation-weights=uniform where it was not typed (and says so in the
    run's configuration line); a typed num-examples is refused (see the validation cases)."""
    values, sources = compose_config({"differential-privacy": "server-fixed"})
    assert values["aggregation-weights"] == "uniform" and sources["aggregation-weights"] == SERVER_DP
    assert "set for server-side DP (its noise assumes equal client weights): aggregation-weights='uniform'" in (
        describe_sources(values, sources))  # fmt: skip
    assert build_strategy(resolve_config({"differential-privacy": "server-fixed"})).strategy.weighted_by_key == (
        wire.UNIFORM_WEIGHT)  # fmt: skip
    assert compose_config({"differential-privacy": "client-local"})[0]["aggregation-weights"] == "num-examples"


def _first_round(run_config: dict, noiseless: bool = False) -> tuple[ArrayRecord, ArrayRecord, dict[int, ArrayRecord]]:
    """One round of the real ClientApp on 3 nodes: the initial and the released global arrays,
    and each node's reply arrays as they left the node."""

    class Keep(InProcessGrid):
        def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
            replies = list(super().pull_messages(message_ids))
            self.sent.update({r.metadata.src_node_id: r.content[wire.ARRAYS] for r in replies})
            return replies

    rc = {**CHEAP, **run_config}
    cfg = _resolved(rc, noiseless)
    grid = Keep(client_app, 3, rc)
    grid.sent = {}
    initial = ArrayRecord(global_models(cfg, get_method(cfg.method)(cfg), 1, 10, 28).state_dict())
    random.seed(0)
    result = build_strategy(cfg, get_method(cfg.method)(cfg).aggregation()).start(
        grid=grid, initial_arrays=initial, num_rounds=1, train_config=ConfigRecord({wire.RUN_CONFIG: cfg.to_json()})
    )  # fmt: skip
    return initial, result.arrays, grid.sent


def _recovered(released: ArrayRecord, seed: int, std: float) -> dict[str, np.ndarray]:
    """The attack: ``released`` minus the Gaussian noise Flower draws for it (one
    np.random.normal per array, in order, cast to the array's dtype) from numpy's global
    generator seeded with ``seed``."""
    np.random.seed(seed)
    out = {}
    for key, value in zip(released.keys(), released.to_numpy_ndarrays(), strict=True):
        out[key] = value.astype(np.float64) - np.random.normal(0, std, value.shape).astype(value.dtype)
    return out


def _relative_error(recovered: dict[str, np.ndarray], exact: ArrayRecord, reference: ArrayRecord) -> float:
    """||recovered - exact|| / ||exact - reference||."""
    off = math.sqrt(sum(float(np.sum((recovered[k] - exact[k].numpy()) ** 2)) for k in exact.keys()))
    return off / _distance(exact, reference)


def test_local_dp_noise_cannot_be_regenerated_from_the_seed() -> None:
    """With noise 10^3 times a node's update, regenerating it from (seed, round, node) -- how it was
    drawn before, 'seeded so a run repeats itself' -- and subtracting it gave back the node's exact
    update (relative error ~1e-4); drawn from the OS CSPRNG, the same attack is off by the noise.
    Two runs with the same seed release different replies; without noise they are identical."""
    seed = 7
    exact_run = {"differential-privacy": "client-local", "dp-clipping-norm": 1.0, "dp-sensitivity": 1e-12, "seed": seed}
    noisy_run = {**exact_run, "dp-sensitivity": 2.0, "dp-epsilon": 1.0}
    initial, _, exact = _first_round(exact_run)
    assert _distance(_first_round(exact_run)[2][1], exact[1]) < 1e-6  # training is seeded: the same without noise
    _, _, noisy = _first_round(noisy_run)
    std = 2.0 * math.sqrt(2 * math.log(1.25 / 1e-5)) / 1.0
    for node, released in noisy.items():
        old_seed = int(np.random.SeedSequence([seed, 1, node - 1, 0x1DB]).generate_state(1)[0])
        assert _relative_error(_recovered(released, old_seed, std), exact[node], initial) > 100
    _, _, again = _first_round(noisy_run)
    assert _distance(noisy[1], again[1]) > 100 * _distance(exact[1], initial)  # different noise, same seed


def test_server_dp_noise_cannot_be_regenerated_from_the_seed() -> None:
    """The server's noise was drawn after seeding numpy with the run's seed: regenerating it gave
    back the clipped mean of the round; now the attack is off by the noise, and two runs with the
    same seed release different models (the same one without noise)."""
    seed = 7
    clip, z = 1e-3, 1.0
    noisy_run = {"differential-privacy": "server-fixed", "dp-clipping-norm": clip, "dp-noise-multiplier": z, "seed": seed}
    initial, exact, _ = _first_round(noisy_run, noiseless=True)
    assert _distance(_first_round(noisy_run, noiseless=True)[1], exact) == 0.0  # training and clipping are seeded
    _, released, _ = _first_round(noisy_run)
    assert _relative_error(_recovered(released, seed, z * clip / 3), exact, initial) > 10
    _, again, _ = _first_round(noisy_run)
    assert _distance(released, again) > 10 * _distance(exact, initial)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"strategy": "bulyan", "min-train-nodes": 2}, r"needs at least 3 replies .* min-train-nodes=2 must be >= 3"),
        ({"strategy": "krum", "num-malicious-nodes": 1, **CHEAP}, r"needs at least 5 replies"),
        # a strategy the method's aggregation refuses is named before the replies it would need
        ({"strategy": "krum", "method": "fedrgd", "min-train-nodes": 2}, r"^strategy='krum' with method='fedrgd': "),
        ({"strategy": "bulyan", "method": "feddb", "min-train-nodes": 5, "min-available-nodes": 5},
         r"^strategy='bulyan' with method='feddb': .*debiased model aggregation"),
        ({"strategy": "bulyan", "participation": "poisson", "min-train-nodes": 3, "min-available-nodes": 3},
         r"participation='poisson' with strategy='bulyan'"),
        ({"strategy": "scaffold", "differential-privacy": "server-fixed"}, r"use differential-privacy='none'"),
        ({"differential-privacy": "central"}, r"differential-privacy='central' is not one of"),
        ({"dp-delta": 1.0}, r"dp-delta=1.0 must be in \(0, 1\)"),
        ({"dp-epsilon": 0}, r"dp-epsilon=0(\.0)? must be > 0"),
        ({"differential-privacy": "server-fixed", "aggregation-weights": "num-examples"},
         r"aggregation-weights='num-examples' with differential-privacy='server-fixed': .* use aggregation-weights='uniform'"),
    ],
)
def test_privacy_and_robustness_keys_are_validated(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_config(values)
