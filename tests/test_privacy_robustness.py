"""Flower's privacy and robustness switches, selected by config, run through the real apps:
the robust aggregators and each differential-privacy mode for 2 rounds in the in-process
federation, with the clipping they promise checked on the global model."""

from __future__ import annotations

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
from fedul_flwr.checks import resolve_config
from fedul_flwr.config import ConfigError
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import get_method
from fedul_flwr.privacy import privacy_spent
from fedul_flwr.server_app import global_models, run_federation
from fedul_flwr.strategies import build_strategy, inner_strategy

CHEAP = {"samples-per-client": 200, "batch-size": 64, "min-available-nodes": 3, "min-train-nodes": 3}


def _two_rounds(run_config: dict) -> tuple[ArrayRecord, ArrayRecord, object, InProcessGrid]:
    """Two rounds of the real ClientApp on 3 nodes through ``build_strategy``; the initial and
    the final global arrays, the strategy and the grid."""
    rc = {**CHEAP, **run_config}
    cfg = resolve_config(rc)
    grid = InProcessGrid(client_app, 3, rc)
    initial = ArrayRecord(global_models(cfg, get_method(cfg.method)(cfg), 1, 10, 28).state_dict())
    random.seed(0)
    strategy = build_strategy(cfg, get_method(cfg.method)(cfg).aggregation())
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
    initial, final, strategy, _ = _two_rounds(
        {"differential-privacy": "server-fixed", "dp-noise-multiplier": 0.0, "dp-clipping-norm": clip}
    )
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
    _, final, strategy, _ = _two_rounds(
        {"differential-privacy": "server-adaptive", "dp-noise-multiplier": 0.0, "dp-clipping-norm": 1e-3}
    )
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
    """HASSLE's clients send only some of the models they receive: LocalDpMod clips each reply against
    the received copy of just those; Flower's server-side clipping cannot, and says so."""
    rc = {**CHEAP, "method": "hassle", "client-setting": "annotation-heterogeneity", "label-layout": "L,P,U",
          "labeled-share": 0.5, "samples-per-client": 100, "batch-size": 32, "num-rounds": 2, "output-dir": str(tmp_path),
          "differential-privacy": "client-local", "dp-clipping-norm": 0.05, "dp-sensitivity": 1e-12}  # fmt: skip
    outputs = run_federation(InProcessGrid(client_app, 3, {**rc, "run-name": "local"}), resolve_config({**rc, "run-name": "local"}))
    assert re.search(r" epsilon=[0-9.e+]+ delta=1e-05 ", outputs.summary())
    rows = json.loads((tmp_path / "local" / "metrics.json").read_text())
    assert [r["round"] for r in rows] == [0, 1, 2]
    # the privacy spent is recorded every round (0 before any reply left a node), and grows
    spent = [r[wire.PRIVACY_EPSILON] for r in rows]
    assert spent[0] == 0 and 0 < spent[1] < spent[2] and {r[wire.PRIVACY_DELTA] for r in rows} == {rc.get("dp-delta", 1e-5)}
    assert "privacy-epsilon" in (tmp_path / "local" / "metrics.csv").read_text().splitlines()[0]
    server = {**rc, "differential-privacy": "server-fixed", "run-name": "server"}
    # six models go out (w_S_prev, w_U_prev only to be read); every node sends back some of them
    with pytest.raises(ValueError, match=r"sent (16|32) of the 48 global arrays \(models missing: \[.*'w_S_prev', 'w_U_prev'\]\)"):
        run_federation(InProcessGrid(client_app, 3, server), resolve_config(server))


def test_privacy_spent_follows_the_gaussian_mechanism_and_composes() -> None:
    """server-fixed: one round with all nodes is the Gaussian mechanism with noise multiplier z,
    so its RDP epsilon stays within the classic bound sqrt(2 ln(1.25 / delta)) / z (valid below 1);
    more rounds spend more, more noise and sampling fewer nodes spend less. client-local with
    dp-sensitivity = 2C (two clipped updates differ by at most 2C) spends at most the
    configured dp-epsilon per round. Modes that are not accounted record nothing."""
    delta = 1e-5
    fixed = resolve_config({"differential-privacy": "server-fixed", "dp-noise-multiplier": 5.0, "dp-delta": delta})
    one = privacy_spent(fixed, 1, num_nodes=5)
    assert one[wire.PRIVACY_DELTA] == delta
    assert 0.5 < one[wire.PRIVACY_EPSILON] <= math.sqrt(2 * math.log(1.25 / delta)) / 5.0
    assert privacy_spent(fixed, 0, 5)[wire.PRIVACY_EPSILON] == 0
    ten = privacy_spent(fixed, 10, 5)[wire.PRIVACY_EPSILON]
    assert one[wire.PRIVACY_EPSILON] < ten < 10 * one[wire.PRIVACY_EPSILON]
    noisier = resolve_config({"differential-privacy": "server-fixed", "dp-noise-multiplier": 10.0})
    assert privacy_spent(noisier, 10, 5)[wire.PRIVACY_EPSILON] < ten
    sampled = resolve_config({"differential-privacy": "server-fixed", "dp-noise-multiplier": 5.0, "fraction-train": 0.1,
                              "min-train-nodes": 2})  # fmt: skip
    assert privacy_spent(sampled, 10, 100)[wire.PRIVACY_EPSILON] < ten  # 10 of 100 nodes a round
    local = resolve_config({"differential-privacy": "client-local", "dp-epsilon": 0.9, "dp-sensitivity": 2.0,
                            "dp-clipping-norm": 1.0, "dp-delta": delta})  # fmt: skip
    assert 0.5 < privacy_spent(local, 1, 5)[wire.PRIVACY_EPSILON] <= 0.9
    for mode in ("none", "server-adaptive"):
        assert privacy_spent(resolve_config({"differential-privacy": mode}), 3, 5) == {}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"strategy": "bulyan", "min-train-nodes": 2}, r"needs at least 3 replies .* min-train-nodes=2 must be >= 3"),
        ({"strategy": "krum", "num-malicious-nodes": 1, **CHEAP}, r"needs at least 5 replies"),
        ({"strategy": "scaffold", "differential-privacy": "server-fixed"}, r"use differential-privacy=client-local"),
        ({"differential-privacy": "central"}, r"differential-privacy='central' is not one of"),
        ({"dp-delta": 1.0}, r"dp-delta=1.0 must be in \(0, 1\)"),
        ({"dp-epsilon": 0}, r"dp-epsilon=0(\.0)? must be > 0"),
    ],
)
def test_privacy_and_robustness_keys_are_validated(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_config(values)
