"""Differential privacy against how the server combines replies: the declared aggregation contract
decides which strategy x method x DP mode a run may combine (refused before round 1 in one line);
for each accepted server-DP strategy one client moves the noiseless release by at most C/n
(measured on the real ClientApp); zero and non-finite updates; the noise generator; unnoised
client metrics; typed versus pinned settings."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from fedul_flwr import wire
from fedul_flwr.preflight import resolve_config
from fedul_flwr.client_app import app as client_app
from fedul_flwr.config import ConfigError, RunConfig
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import METHODS, get_method
from fedul_flwr.privacy.accounting import privacy_spent
from fedul_flwr.privacy.mechanism import DP_MODES, add_noise, release_generator
from fedul_flwr.server_app import global_models, run_federation
from fedul_flwr.strategies import STRATEGIES, build_strategy
from fedul_flwr.strategies.contract import STRATEGY_CONTRACTS, contract_table

REPO = Path(__file__).resolve().parent.parent
CHEAP = {"samples-per-client": 200, "batch-size": 64, "min-available-nodes": 3, "min-train-nodes": 3}
# Written out by hand from how each strategy combines replies (not read from the contract): the
# strategies whose release is a uniform mean of clipped updates, or a server step on it.
SERVER_DP_STRATEGIES = {"fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad"}
SERVER_DP_REFUSING_METHODS = {"feddb": "reweighted", "hassle": "partial replies", "fedmatch": "partial replies",
                              "fedrgd": "reweighted", "rscfed": "reweighted"}  # fmt: skip
# what no DP mode covers: SCAFFOLD's control variates, FedDB's APP-U that DMA weighs the clients by
NO_DP_STRATEGIES = {"scaffold"}
NO_DP_METHODS = {"feddb"}
ROBUST = {"num-malicious-nodes": 0, "min-available-nodes": 7, "min-train-nodes": 7, "dp-noise-multiplier": 0.05}


def test_every_registered_strategy_declares_a_contract() -> None:
    assert set(STRATEGY_CONTRACTS) == set(STRATEGIES.names())


@pytest.mark.parametrize("mode", DP_MODES)
@pytest.mark.parametrize("strategy", STRATEGIES.names())
def test_strategy_and_dp_mode_accepted_or_refused_in_one_line(strategy: str, mode: str) -> None:
    values = {**ROBUST, "strategy": strategy, "differential-privacy": mode}
    if mode != "none" and strategy in NO_DP_STRATEGIES:
        with pytest.raises(ConfigError, match=rf"^differential-privacy='{mode}' with strategy='{strategy}': .*outside "
                           r"every DP mode's epsilon; use differential-privacy='none'$"):  # fmt: skip
            resolve_config(values)
    elif mode.startswith("server") and strategy not in SERVER_DP_STRATEGIES:
        with pytest.raises(ConfigError) as err:
            resolve_config(values)
        line = str(err.value)
        assert "\n" not in line
        assert line.startswith(f"differential-privacy={mode!r} with strategy={strategy!r}: ")
        assert "C/n" in line and line.endswith("use differential-privacy=client-local")
    else:
        cfg = resolve_config(values)
        assert cfg.aggregation_weights == ("uniform" if mode.startswith("server") else "num-examples")


@pytest.mark.parametrize("mode", DP_MODES)
@pytest.mark.parametrize("method", METHODS.names())
def test_method_and_dp_mode_accepted_or_refused_in_one_line(method: str, mode: str) -> None:
    values = {"method": method, "differential-privacy": mode, "dp-noise-multiplier": 0.05}
    if mode == "client-local" and method in NO_DP_METHODS:
        with pytest.raises(ConfigError, match=rf"^differential-privacy='{mode}' with method='{method}': .* use "
                           r"differential-privacy='none'$"):  # fmt: skip
            resolve_config(values)
    elif mode.startswith("server") and method in SERVER_DP_REFUSING_METHODS:
        suggested = "'none'" if method in NO_DP_METHODS else "client-local"  # only a mode the run accepts
        with pytest.raises(ConfigError, match=rf"^differential-privacy='{mode}' with method='{method}': .*"
                           rf"\({SERVER_DP_REFUSING_METHODS[method]}\).* use differential-privacy={suggested}$"):  # fmt: skip
            resolve_config(values)
    else:
        resolve_config(values)


@pytest.mark.parametrize("mode", ["server-fixed", "server-adaptive"])
def test_a_refusal_suggests_only_a_mode_the_run_accepts(mode: str) -> None:
    """Every method with every strategy: where a server mode is refused with "use
    differential-privacy=client-local", client-local is accepted for the same run."""
    suggested = 0
    for method in METHODS.names():
        for strategy in STRATEGIES.names():
            values = {**ROBUST, "method": method, "strategy": strategy, "differential-privacy": mode}
            try:
                resolve_config(values)
                continue
            except ConfigError as refused:
                if not str(refused).endswith("use differential-privacy=client-local"):
                    continue
            suggested += 1
            resolve_config({**values, "differential-privacy": "client-local"})  # raises if the suggestion is refused
    assert suggested > 0


@pytest.mark.parametrize("strategy", sorted(SERVER_DP_STRATEGIES))
def test_typed_num_examples_weights_are_refused_under_server_dp(strategy: str) -> None:
    with pytest.raises(ConfigError, match=r"^aggregation-weights='num-examples' with differential-privacy='server-fixed': "):
        resolve_config({"strategy": strategy, "differential-privacy": "server-fixed", "aggregation-weights": "num-examples"})


@pytest.mark.parametrize("mode", ["server-fixed", "server-adaptive"])
def test_no_noise_with_a_server_dp_mode_is_refused_in_one_line(mode: str) -> None:
    with pytest.raises(ConfigError, match=rf"^dp-noise-multiplier=0 with differential-privacy='{mode}' adds no noise: "
                       r".*epsilon = inf.*differential-privacy='none'$"):  # fmt: skip
        resolve_config({"differential-privacy": mode, "dp-noise-multiplier": 0.0})


def test_docs_hold_the_contract_table() -> None:
    assert contract_table(DP_MODES) in (REPO / "docs" / "privacy.md").read_text()


class Tamper(InProcessGrid):
    """The in-process federation whose node 1 replies with ``global + update(global)`` instead of
    what it trained (``update=None``: as trained); every reply's arrays are kept."""

    def __init__(self, *args, update=None, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.update = update
        self.globals: dict[str, ArrayRecord] = {}

    def push_messages(self, messages):  # type: ignore[no-untyped-def]
        messages = list(messages)
        ids = list(super().push_messages(messages))
        for msg, i in zip(messages, ids, strict=True):
            if wire.ARRAYS in msg.content.array_records:
                self.globals[i] = msg.content[wire.ARRAYS]
        return ids

    def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
        replies = list(super().pull_messages(message_ids))
        for reply in replies:
            sent = self.globals.get(reply.metadata.reply_to_message_id)
            if self.update is not None and reply.metadata.src_node_id == 1 and sent is not None and not reply.has_error():
                reply.content[wire.ARRAYS] = ArrayRecord(
                    {k: Array(np.asarray(sent[k].numpy() + self.update(sent[k].numpy()))) for k in sent.keys()}
                )
        return replies


def _round(run_config: dict, update=None, noiseless: bool = False, rounds: int = 1):  # type: ignore[no-untyped-def]
    """``rounds`` rounds on 3 nodes (node 1 tampered with by ``update``): the initial arrays,
    the result and the strategy."""
    rc = {**CHEAP, **run_config}
    cfg: RunConfig = resolve_config(rc)
    if noiseless:
        cfg = dataclasses.replace(cfg, dp_noise_multiplier=0.0)
    grid = Tamper(client_app, 3, rc, update=update)
    initial = ArrayRecord(global_models(cfg, get_method(cfg.method)(cfg), 1, 10, 28).state_dict())
    random.seed(0)
    strategy = build_strategy(cfg, get_method(cfg.method)(cfg).aggregation(), num_nodes=3)
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds,
                            train_config=ConfigRecord({wire.RUN_CONFIG: cfg.to_json()}))  # fmt: skip
    return initial, result, strategy


def _norm(a: ArrayRecord, b: ArrayRecord) -> float:
    return float(np.sqrt(sum(np.sum((a[k].numpy().astype(np.float64) - b[k].numpy()) ** 2) for k in a.keys())))


@pytest.mark.parametrize("strategy", sorted(SERVER_DP_STRATEGIES))
def test_one_client_moves_the_noiseless_release_by_at_most_c_over_n(strategy: str) -> None:
    """Node 1 sends back the global model (a zero update), then an update 10^3 times the clipping
    norm: the release the epsilon covers (the clipped mean, before any server step) moves by
    C / n with n = 3, whatever the server optimizer does afterwards."""
    clip = 0.05
    run = {"strategy": strategy, "differential-privacy": "server-fixed", "dp-clipping-norm": clip, "seed": 3}
    _, _, quiet = _round(run, update=np.zeros_like, noiseless=True)
    _, _, loud = _round(run, update=lambda a: np.full_like(a, 50.0), noiseless=True)
    moved = _norm(quiet.strategy.dp_release, loud.strategy.dp_release)
    assert clip / 3 * (1 - 1e-4) <= moved <= clip / 3 * (1 + 1e-4)


@pytest.mark.parametrize("strategy", ["fedavgm", "fedadam"])
def test_server_optimizer_steps_on_the_noised_mean(strategy: str) -> None:
    """The noise z C / n goes on the mean before the optimizer: the release minus the noiseless
    mean has that standard deviation, and the model the optimizer makes differs from it."""
    clip, z = 1e-3, 1.0
    run = {"strategy": strategy, "differential-privacy": "server-fixed", "dp-clipping-norm": clip,
           "dp-noise-multiplier": z, "seed": 3, "server-lr": 3.0}  # fmt: skip
    _, _, exact = _round(run, noiseless=True)
    _, result, noisy = _round(run)
    noise = np.concatenate([(noisy.strategy.dp_release[k].numpy().astype(np.float64)
                             - exact.strategy.dp_release[k].numpy()).ravel() for k in result.arrays.keys()])  # fmt: skip
    assert 0.9 * z * clip / 3 < noise.std() < 1.1 * z * clip / 3
    assert _norm(result.arrays, noisy.strategy.dp_release) > 0


@pytest.mark.parametrize("mode", ["server-fixed", "server-adaptive"])
def test_a_zero_update_stays_zero_and_a_nan_update_is_a_named_failed_reply(mode: str) -> None:
    run = {"differential-privacy": mode, "dp-noise-multiplier": 0.05, "dp-clipping-norm": 0.05, "min-train-nodes": 2}
    initial, result, strategy = _round(run, update=np.zeros_like, rounds=2)  # a client that trained nothing
    assert strategy.strategy.last_replies.trained == [1, 2, 3] and not strategy.strategy.last_replies.failed
    assert all(np.isfinite(result.arrays[k].numpy()).all() for k in result.arrays.keys())
    _, result, strategy = _round(run, update=lambda a: np.full_like(a, np.nan), rounds=2)
    replies = strategy.strategy.last_replies
    assert replies.failed == [(1, "MalformedReplyError")] and replies.trained == [2, 3]  # the reply door's NaN check
    assert all(np.isfinite(result.arrays[k].numpy()).all() for k in result.arrays.keys())


def test_client_local_dp_survives_a_zero_update_and_names_a_nan_one() -> None:
    from fedul_flwr.privacy.mechanism import NonFiniteUpdateError, clip_update

    zero = [np.zeros((3, 2), np.float32), np.zeros(4, np.float32)]
    clipped, was = clip_update(zero, 1.0)
    assert not was and all(np.array_equal(a, b) for a, b in zip(clipped, zero, strict=True))
    big, was = clip_update([np.full(4, 3.0, np.float32)], 1.0)
    assert was and np.linalg.norm(big[0]) == pytest.approx(1.0, rel=1e-6)
    with pytest.raises(NonFiniteUpdateError, match=r"1 non-finite values \(NaN or inf\) of 4"):
        clip_update([np.array([0.0, np.inf, 1.0, 2.0])], 1.0)


def test_noise_does_not_come_from_numpy_global_generator() -> None:
    """Seeding numpy's global generator changes nothing in the noise, and the noise leaves the
    global generator's state as it was."""
    np.random.seed(0)
    state = np.random.get_state()
    first = add_noise([np.zeros(1000)], 1.0, release_generator())[0]
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), state))
    np.random.seed(0)
    second = add_noise([np.zeros(1000)], 1.0, release_generator())[0]
    np.random.seed(0)
    seeded = np.random.normal(0.0, 1.0, 1000)
    assert not np.allclose(first, second) and not np.allclose(first, seeded)
    assert 0.9 < first.std() < 1.1


def test_server_dp_release_ignores_numpy_global_seed() -> None:
    run = {"differential-privacy": "server-fixed", "dp-clipping-norm": 1e-3, "dp-noise-multiplier": 1.0, "seed": 5}
    np.random.seed(0)
    _, one, _ = _round(run)
    np.random.seed(0)
    _, two, _ = _round(run)
    assert _norm(one.arrays, two.arrays) > 0


@pytest.mark.parametrize("publish", [False, True])
def test_server_dp_records_no_client_metric_unless_opted_in(tmp_path: Path, small_test_set: None, publish: bool) -> None:
    rc = {**CHEAP, "num-rounds": 2, "output-dir": str(tmp_path), "run-name": "dp", "differential-privacy": "server-fixed",
          "dp-noise-multiplier": 0.5, "dp-publish-unnoised-train-metrics": publish}  # fmt: skip
    outputs = run_federation(InProcessGrid(client_app, 3, rc), resolve_config(rc))
    rows = json.loads((tmp_path / "dp" / "metrics.json").read_text())
    recorded = {k for row in rows for k in row}
    assert (wire.TRAIN_LOSS in recorded) is publish
    assert ("unnoised-train-metrics=published" in outputs.summary()) is publish


def test_reproduce_set_server_dp_on_a_grid_pinning_num_examples_gets_uniform_weights() -> None:
    """The grid's complete run config pins aggregation-weights='num-examples' (its default); the
    user typed only --set differential-privacy=server-fixed: the run aggregates uniformly."""
    from fedul_flwr.experiments.reproduce import Profile, run_config_of
    from fedul_flwr.experiments.runner import RunSpec

    spec = RunSpec(grid="g", row="r", column="c", sub="*", seed=0, clients=5, preset="", overrides={})
    values = run_config_of(spec, Profile(overrides={}, seeds=(0,)), "", Path("/tmp/x"), {"differential-privacy": "server-fixed"})
    assert values["aggregation-weights"] == "uniform"
    assert resolve_config(values).aggregation_weights == "uniform"
    typed = run_config_of(spec, Profile(overrides={}, seeds=(0,)), "", Path("/tmp/x"),
                          {"differential-privacy": "server-fixed", "aggregation-weights": "num-examples"})  # fmt: skip
    with pytest.raises(ConfigError, match=r"^aggregation-weights='num-examples' with differential-privacy="):
        resolve_config(typed)


def test_server_adaptive_at_the_default_multiplier_trains_three_rounds_of_four_nodes_and_records_epsilon(
    tmp_path: Path, small_test_set: None
) -> None:
    """The default z = 1 with 4 of 5 nodes per round: sigma_b = max(4 / 20, 1) = 1, the update
    carries z_Delta = 2 / sqrt(3), and the recorded epsilon is that of z for both queries
    together, the one server-fixed records at the same z."""
    rc = {**CHEAP, "num-rounds": 3, "output-dir": str(tmp_path), "run-name": "adaptive", "fraction-train": 0.8,
          "min-available-nodes": 5, "min-train-nodes": 4, "differential-privacy": "server-adaptive"}  # fmt: skip
    cfg = resolve_config(rc)
    assert cfg.dp_noise_multiplier == 1.0 and cfg.dp_clipped_count_stddev == 0  # the defaults
    outputs = run_federation(InProcessGrid(client_app, 5, rc), cfg)
    rows = json.loads((tmp_path / "adaptive" / "metrics.json").read_text())
    trained = [row for row in rows if row["round"] >= 1]
    assert [row["round"] for row in trained] == [1, 2, 3]
    assert all(len(row["trained-nodes"]) == 4 for row in trained)
    fixed = resolve_config({**rc, "differential-privacy": "server-fixed"})
    for row in trained:
        assert row[wire.PRIVACY_EPSILON] == privacy_spent(fixed, row["round"], 5)[wire.PRIVACY_EPSILON]
        assert row[wire.PRIVACY_CLIPPING_NORM] > 0
    assert trained[0][wire.PRIVACY_CLIPPING_NORM] == cfg.dp_clipping_norm  # round 1 clips to the initial C
    summary = outputs.summary()
    assert "status=ok" in summary and f"epsilon={trained[-1][wire.PRIVACY_EPSILON]:.4g}" in summary
    assert "neighbours=client-level,replace-one-client,sampled-without-replacement(4/5)" in summary


@pytest.mark.parametrize(("z", "nodes"), [(1.0, 4), (1.0, 40), (1.0, 400), (0.3, 5), (8.0, 1000)])
def test_server_adaptive_noise_composes_to_the_recorded_multiplier(z: float, nodes: int) -> None:
    """The wrapper's two queries -- the clipped sum (multiplier z_Delta) and the clipped count
    (sigma_b, sensitivity 1/2, so multiplier 2 sigma_b) -- composed by dp-accounting's RDP
    accountant spend what one Gaussian mechanism of multiplier z spends, the figure recorded."""
    import dp_accounting

    cfg = resolve_config({"differential-privacy": "server-adaptive", "dp-noise-multiplier": z,
                          "min-available-nodes": nodes, "min-train-nodes": min(nodes, 2)})  # fmt: skip
    wrapper = build_strategy(cfg, num_nodes=nodes)
    assert wrapper.num_sampled_clients == nodes
    assert wrapper.clipped_count_stddev == max(nodes / 20, z)
    assert 1.0 < wrapper.noise_multiplier / z <= 2 / np.sqrt(3) + 1e-12
    both = dp_accounting.rdp.RdpAccountant()
    both.compose(dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(wrapper.noise_multiplier),
                                                dp_accounting.GaussianDpEvent(2 * wrapper.clipped_count_stddev)]), 10)  # fmt: skip
    one = dp_accounting.rdp.RdpAccountant()
    one.compose(dp_accounting.GaussianDpEvent(z), 10)
    recorded = privacy_spent(cfg, 10, nodes)[wire.PRIVACY_EPSILON]
    assert both.get_epsilon(1e-5) == pytest.approx(one.get_epsilon(1e-5), rel=1e-9)
    assert recorded == pytest.approx(one.get_epsilon(1e-5), rel=1e-9)


@pytest.mark.parametrize("z", [0.3, 1.0, 8.0])
@pytest.mark.parametrize("stddev", [0.0, 0.1, 0.5, 4.0])
@pytest.mark.parametrize("nodes", [1, 3, 1000])
def test_fedul_check_refuses_every_adaptive_setting_flower_would_refuse(z: float, stddev: float, nodes: int) -> None:
    """What the checks accept, Flower's adaptive wrapper builds; what it would refuse (the
    count's noise at or below z / 2), the checks refuse in one line naming the key."""
    values = {"differential-privacy": "server-adaptive", "dp-noise-multiplier": z, "dp-clipped-count-stddev": stddev}
    if 0 < stddev <= z / 2:
        with pytest.raises(ConfigError, match=rf"^dp-clipped-count-stddev={stddev} must exceed dp-noise-multiplier/2"):
            resolve_config(values)
        return
    wrapper = build_strategy(resolve_config(values), num_nodes=nodes)
    assert wrapper.clipped_count_stddev == (stddev or max(nodes / 20, z))  # fraction-train=1: the cohort is every node


def test_a_zero_clip_norm_step_is_refused_as_flower_would() -> None:
    with pytest.raises(ConfigError, match=r"^dp-clip-norm-lr=0(\.0)? must be > 0"):
        resolve_config({"differential-privacy": "server-adaptive", "dp-clip-norm-lr": 0})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"differential-privacy": "server-adaptive", "dp-noise-multiplier": 1e200}, r"^dp-noise-multiplier=1e\+200 x dp-clipping-norm=1: noise .* overflows"),
        ({"differential-privacy": "server-fixed", "dp-noise-multiplier": float("inf")}, r"^dp-noise-multiplier=inf is not a finite number$"),
        ({"lr": float("nan")}, r"^lr=nan is not a finite number$"),
        ({"differential-privacy": "server-fixed", "dp-noise-multiplier": 1e50}, r"^dp-noise-multiplier=1e\+50 x dp-clipping-norm=1"),
        ({"differential-privacy": "server-fixed", "dp-noise-multiplier": 1e-300}, r"^dp-noise-multiplier=1e-300: the accountant cannot compute"),
        ({"differential-privacy": "client-local", "dp-epsilon": 1e-300}, r"^dp-epsilon=1e-300: the accountant cannot compute"),
        ({"differential-privacy": "client-local", "dp-epsilon": 1e300}, r"^dp-epsilon=1e\+300: the accountant cannot compute"),
        ({"differential-privacy": "server-adaptive", "dp-clip-norm-lr": 1e6}, r"^dp-clip-norm-lr=1e\+06 must be at most 10"),
    ],
)
def test_numbers_the_run_cannot_compute_with_are_refused_in_one_line(values: dict, message: str) -> None:
    """Each of these passed the checks and then crashed the run (a traceback, an OverflowError
    with no key named, or a non-finite model blamed on the clients)."""
    with pytest.raises(ConfigError, match=message) as refused:
        resolve_config(values)
    assert "\n" not in str(refused.value)


def test_round_zero_records_no_epsilon_spent() -> None:
    cfg = resolve_config({"differential-privacy": "server-fixed", "dp-noise-multiplier": 1.0})
    assert privacy_spent(cfg, 0, 5)[wire.PRIVACY_EPSILON] == 0 and privacy_spent(cfg, 0, 5)[wire.PRIVACY_EPSILON_ROUND] == 0
    assert privacy_spent(cfg, 1, 5)[wire.PRIVACY_EPSILON_ROUND] > 0
