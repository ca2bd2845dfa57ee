"""RSCFed (:mod:`fedul_flwr.methods.rscfed`): the distance-reweighted sub-consensus by hand, the
seeded sub-sets, the mean teacher's EMA and sharpening by hand, the consensus through the
strategy, ``fedul check``, and a short federation on the embedded sample."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg, FedAvgM
from torch import nn

from fedul_flwr import server_app
from fedul_flwr.cli import main as fedul
from fedul_flwr.client_app import app as client_app
from fedul_flwr.config import ConfigError
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import RoundContext, get_method
from fedul_flwr.methods.rscfed.consensus import ConsensusAggregation, consensus_weights, draw_subsets, subset_weights
from fedul_flwr.methods.mixmatch import sharpen
from fedul_flwr.methods.rscfed.teacher import consistency_loss, ema_update, teacher_decay
from fedul_flwr.models import build_model
from fedul_flwr.preflight import resolve_config
from fedul_flwr.rng import model_seed
from fedul_flwr.strategies import strict

LN2 = math.log(2.0)
# three one-array clients: n = 1, 1, 2; p = 1/4, 1/4, 1/2; their average is [1, 0]; d = 1, 1, 0
MODELS = [[np.array([0.0, 0.0])], [np.array([2.0, 0.0])], [np.array([1.0, 0.0])]]
SIZES = np.array([1.0, 1.0, 2.0])


def test_subset_weights_are_n_times_exp_of_minus_beta_distance_over_n_by_hand() -> None:
    """a_i = p_i exp(-beta d_i / n_i): with beta = ln 2, a = (1/4 * 1/2, 1/4 * 1/2, 1/2 * 1),
    alpha = (1/6, 1/6, 2/3). With a labeled client 0 in the sub-set: beta_labeled = ln 4 gives
    exp(-ln 4) = 1/4 and the factor c = 3 on client 0: a = (3/16, 1/16, 1/2), alpha = (1/4, 1/12, 2/3)."""
    unlabeled = np.zeros(3, dtype=bool)
    alpha, d = subset_weights(MODELS, SIZES, unlabeled, beta=LN2, beta_labeled=99.0, labeled_factor=3.0)
    assert d == pytest.approx([1.0, 1.0, 0.0])
    assert alpha == pytest.approx([1 / 6, 1 / 6, 2 / 3])
    labeled = np.array([True, False, False])
    alpha, _ = subset_weights(MODELS, SIZES, labeled, beta=99.0, beta_labeled=2 * LN2, labeled_factor=3.0)
    assert alpha == pytest.approx([1 / 4, 1 / 12, 2 / 3])
    alpha, _ = subset_weights(MODELS, SIZES, unlabeled, beta=0.0, beta_labeled=0.0, labeled_factor=1.0)
    assert alpha == pytest.approx(SIZES / SIZES.sum())  # beta = 0: FedAvg's weights
    far = subset_weights(MODELS, SIZES, unlabeled, beta=1e9, beta_labeled=0.0, labeled_factor=1.0)[0]
    assert far == pytest.approx([0.0, 0.0, 1.0])  # log domain: no 0 / 0


def test_distance_is_the_whole_model_norm_or_the_code_s_sum_of_array_norms() -> None:
    """Two two-array clients of equal size: each is ([3], [4]) away from the average, so
    d = 5 as one vector (the paper) and 3 + 4 = 7 summed per array (the authors' code)."""
    models = [[np.array([0.0]), np.array([0.0])], [np.array([6.0]), np.array([8.0])]]
    sizes, none = np.array([1.0, 1.0]), np.zeros(2, dtype=bool)
    _, d = subset_weights(models, sizes, none, beta=1.0, beta_labeled=1.0, labeled_factor=1.0, distance="l2")
    assert d == pytest.approx([5.0, 5.0])
    _, d = subset_weights(models, sizes, none, beta=1.0, beta_labeled=1.0, labeled_factor=1.0, distance="layer-sum")
    assert d == pytest.approx([7.0, 7.0])


def test_consensus_weights_average_the_sub_sets_and_leave_out_undrawn_clients() -> None:
    """omega = (1/M) sum_m alpha_m: sub-sets {0, 2} and {1, 2} (beta = 0, so alpha is n_i / sum n)
    give client 0 (1/3) / 2, client 1 the same, client 2 (2/3 + 2/3) / 2; a fourth client in no
    sub-set weighs 0."""
    models = [*MODELS, [np.array([9.0, 9.0])]]
    omega, alphas = consensus_weights(models, np.array([1.0, 1.0, 2.0, 5.0]), np.zeros(4, dtype=bool),
                                      np.array([[0, 2], [1, 2]]), beta=0.0, beta_labeled=0.0, labeled_factor=1.0)  # fmt: skip
    assert alphas == pytest.approx(np.array([[1 / 3, 2 / 3], [1 / 3, 2 / 3]]))
    assert omega == pytest.approx([1 / 6, 1 / 6, 2 / 3, 0.0])


def test_sub_sets_are_seeded_by_run_and_round() -> None:
    """Same (seed, round): the same sub-sets; another round or seed: others. Each sub-set holds
    K distinct clients, or all of them where fewer replied."""
    first = draw_subsets(7, 1, 8, 3, 5)
    assert first.shape == (3, 5) and all(len(set(row)) == 5 and set(row) <= set(range(8)) for row in first.tolist())
    assert np.array_equal(first, draw_subsets(7, 1, 8, 3, 5))
    assert not np.array_equal(first, draw_subsets(7, 2, 8, 3, 5))
    assert not np.array_equal(first, draw_subsets(8, 1, 8, 3, 5))
    few = draw_subsets(7, 1, 3, 2, 5)
    assert few.shape == (2, 3) and all(sorted(row) == [0, 1, 2] for row in few.tolist())
    with pytest.raises(ValueError, match="K >= 1"):
        draw_subsets(7, 1, 3, 2, 0)


def _aggregate(strategy_class: type, settings: dict, replies: dict[int, RecordDict], current: ArrayRecord) -> ArrayRecord:
    """The strict strategy with RSCFed's mixin on these replies (node id -> content)."""
    app = ClientApp()

    @app.train()
    def _reply(msg: Message, context: Context) -> Message:
        return Message(replies[context.node_id], reply_to=msg)

    mixin = type("ConsensusAggregation", (ConsensusAggregation,), settings)
    strategy = strict(strategy_class, mixin)(min_available_nodes=len(replies), min_train_nodes=1)
    grid = InProcessGrid(app, len(replies), {})
    msgs = list(grid.send_and_receive(strategy.configure_train(1, current, ConfigRecord(), grid)))
    arrays, _ = strategy.aggregate_train(1, msgs)
    return arrays


def _reply(node: int, value: list[float], n: float, n_labeled: float = 0.0) -> RecordDict:
    arrays = ArrayRecord({"f.w": Array(np.array(value, dtype=np.float32))})
    metrics = MetricRecord({"num-examples": n, "uniform-weight": 1, "num-labeled": n_labeled})
    return RecordDict({"arrays": arrays, "metrics": metrics, "node": ConfigRecord({"node-key": node})})


def test_the_strategy_averages_with_the_consensus_weights() -> None:
    """One sub-set of all three clients ([0, 0], [4, 0], [1, 0] with n = 1, 1, 2), beta = ln 2:
    their plain average is [3/2, 0], d = 3/2, 5/2, 1/2, a_i = p_i 2^(-d_i / n_i), and FedAvg's
    release is sum alpha_i w_i, away from FedAvg's [3/2, 0]. FedAvgM at its defaults (server lr
    1, no momentum) releases the same model."""
    settings = {"subsets": 1, "subset_size": 3, "beta": LN2, "beta_labeled": LN2, "labeled_factor": 1.0}
    current = ArrayRecord({"f.w": Array(np.zeros(2, dtype=np.float32))})
    replies = {1: _reply(1, [0.0, 0.0], 1), 2: _reply(2, [4.0, 0.0], 1), 3: _reply(3, [1.0, 0.0], 2)}
    # plain average [6/4, 0]; d = 3/2, 5/2, 1/2; a = 1/4 e^{-3/2 ln2}, 1/4 e^{-5/2 ln2}, 1/2 e^{-1/4 ln2}
    a = np.array([0.25 * 2**-1.5, 0.25 * 2**-2.5, 0.5 * 2**-0.25])
    expected = (a / a.sum()) @ np.array([0.0, 4.0, 1.0])
    got = _aggregate(FedAvg, settings, replies, current)["f.w"].numpy()
    assert got == pytest.approx([expected, 0.0], rel=1e-6) and abs(expected - 1.5) > 0.1
    momentum = _aggregate(FedAvgM, settings, replies, current)["f.w"].numpy()
    assert momentum == pytest.approx(got, rel=1e-6)


@pytest.mark.parametrize("strategy", ["fedprox", "fednova", "fedavgm", "fedadam", "fedyogi", "fedadagrad"])
def test_every_averaging_strategy_releases_from_the_consensus_weights(strategy: str) -> None:
    """The run's strategy does the arithmetic on the consensus weights: FedProx and FedNova (all
    clients took the same steps) release sum alpha_i w_i as FedAvg does; the server optimizers
    step from the global model towards it (its pseudo-gradient has the consensus' sign)."""
    from fedul_flwr.methods.rscfed.consensus import ConsensusAggregation as _Mixin
    from fedul_flwr.strategies import build_strategy

    settings = {"subsets": 2, "subset_size": 3, "beta": LN2, "beta_labeled": LN2, "labeled_factor": 1.0}
    cfg = resolve_config({"method": "rscfed", "client-setting": "annotation-heterogeneity", "strategy": strategy,
                          "min-train-nodes": 1, "min-available-nodes": 3})  # fmt: skip
    strategy_object = build_strategy(cfg, type("ConsensusAggregation", (_Mixin,), settings), 3)
    current = ArrayRecord({"f.w": Array(np.zeros(2, dtype=np.float32))})
    replies = {1: _reply(1, [0.0, 0.0], 1), 2: _reply(2, [4.0, 0.0], 1), 3: _reply(3, [1.0, 0.0], 2)}
    for content in replies.values():  # what the run's reply door asks of every rscfed reply
        content["metrics"].update({"num-steps": 5, "train-loss": 1.0, "pseudo-label-share": 1.0})

    app = ClientApp()

    @app.train()
    def _answer(msg: Message, context: Context) -> Message:
        return Message(replies[context.node_id], reply_to=msg)

    grid = InProcessGrid(app, 3, {})
    msgs = list(grid.send_and_receive(strategy_object.configure_train(1, current, ConfigRecord(), grid)))
    got = strategy_object.aggregate_train(1, msgs)[0]["f.w"].numpy()
    fedavg = _aggregate(FedAvg, settings, replies, current)["f.w"].numpy()
    assert fedavg[0] > 1.0  # the consensus: the far client [4, 0] weighs less than n_i / sum n says (3/2)
    if strategy in ("fedprox", "fednova"):
        assert got == pytest.approx(fedavg, rel=1e-5)
    else:
        assert got[0] > 0 and got[1] == pytest.approx(0.0)


def test_teacher_ema_and_sharpening_by_hand() -> None:
    """d_s = min(d, 1 - 1/(s+1)): 0 at s = 0 (the teacher becomes the student), 1/2 at s = 1,
    d from s = 1/(1-d) - 1 on. theta' = [1, 1], theta = [3, 5], d = 0.75: [1.5, 2]. sharpen([0.6,
    0.4], T = 0.5) = [0.36, 0.16] / 0.52; the loss is the squared error summed over classes,
    averaged over the batch, masked images counting 0."""
    assert teacher_decay(0.999, 0) == 0.0 and teacher_decay(0.999, 1) == 0.5 and teacher_decay(0.9, 50) == 0.9
    teacher, student = nn.Linear(2, 1, bias=False), nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        teacher.weight.copy_(torch.tensor([[1.0, 1.0]]))
        student.weight.copy_(torch.tensor([[3.0, 5.0]]))
    ema_update(teacher, student, 0.75)
    assert torch.allclose(teacher.weight, torch.tensor([[1.5, 2.0]]))
    assert torch.allclose(student.weight, torch.tensor([[3.0, 5.0]]))
    q = sharpen(torch.tensor([[0.6, 0.4]]), 0.5)
    assert torch.allclose(q, torch.tensor([[0.36 / 0.52, 0.16 / 0.52]]))
    logits = torch.tensor([[0.0, 0.0], [5.0, -5.0]])  # softmax: [1/2, 1/2] and ~[1, 0]
    targets = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    loss = consistency_loss(logits, targets, torch.tensor([True, False]))
    assert float(loss) == pytest.approx((0.25 + 0.25) / 2)


def test_a_new_teacher_is_told_by_its_seeded_weights() -> None:
    """The node's kept teacher holds its seeded initial weights until it is stored:
    :meth:`fresh_teacher` is true then, and false after one EMA step towards a trained student."""
    cfg = resolve_config({"method": "rscfed", "client-setting": "annotation-heterogeneity", "seed": 3})
    method = get_method("rscfed")(cfg)

    class _Client:  # the two facts fresh_teacher reads
        image_shape, num_classes = (1, 28, 28), 10

    ctx = RoundContext(3, 1, node_key=5)
    models = nn.ModuleDict({"f": build_model(cfg.model, 1, 10, 28, seed=3),
                            "teacher": build_model(cfg.model, 1, 10, 28, seed=model_seed(3, 1, 5))})  # fmt: skip
    assert method.fresh_teacher(_Client(), models, ctx)  # type: ignore[arg-type]
    assert not method.fresh_teacher(_Client(), models, RoundContext(3, 1, node_key=6))  # type: ignore[arg-type]
    ema_update(models["teacher"], models["f"], 0.5)
    assert not method.fresh_teacher(_Client(), models, ctx)  # type: ignore[arg-type]


def test_fedul_check_accepts_rscfed_in_its_setting_and_refuses_robust_strategies_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    values = 'method="rscfed" client-setting="annotation-heterogeneity" label-layout="L,P,U" labeled-share=0.5 min-available-nodes=3'
    assert fedul(["check", "--run-config", values, "--federation-config", "num-supernodes=3"]) == 0
    assert capsys.readouterr().out.startswith("ok: run configuration:")
    for strategy in ("fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fednova", "scaffold"):
        assert fedul(["check", "--run-config", f'{values} strategy="{strategy}"', "--federation-config", "num-supernodes=3"]) == 0
    capsys.readouterr()
    assert fedul(["check", "--run-config", f'{values} strategy="fedmedian"', "--federation-config", "num-supernodes=3"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: strategy='fedmedian' with method='rscfed':")
    with pytest.raises(ConfigError, match="strategy='fedtrimmedavg' with method='rscfed'"):
        resolve_config({"method": "rscfed", "client-setting": "annotation-heterogeneity", "strategy": "fedtrimmedavg"})
    with pytest.raises(ConfigError, match="differential-privacy='server-fixed' with method='rscfed'"):
        resolve_config({"method": "rscfed", "client-setting": "annotation-heterogeneity",
                        "differential-privacy": "server-fixed"})  # fmt: skip


def test_three_rounds_on_the_embedded_sample_train_above_chance(
    tmp_path: Path, small_test_set: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fully labeled, a partially labeled and an unlabeled client, 3 rounds: the test accuracy
    passes 0.2 (chance: 0.1) and the teacher's predictions are recorded. The two clients with
    unlabeled images start their teacher from the global model in round 1 only: the node keeps
    it across rounds."""
    fresh: list[tuple[int, int, bool]] = []
    original = get_method("rscfed").fresh_teacher

    def recording(self, client, models, ctx):  # type: ignore[no-untyped-def]
        fresh.append((ctx.server_round, ctx.node_key, original(self, client, models, ctx)))
        return fresh[-1][2]

    monkeypatch.setattr(get_method("rscfed"), "fresh_teacher", recording)
    rc = {"method": "rscfed", "client-setting": "annotation-heterogeneity", "label-layout": "L,P,U", "labeled-share": 0.4,
          "samples-per-client": 200, "batch-size": 32, "num-rounds": 3, "min-available-nodes": 3, "min-train-nodes": 3,
          "lr": 0.05, "local-optimizer": "sgd", "local-momentum": 0.9, "rscfed-subset-size": 2,
          "output-dir": str(tmp_path), "run-name": "rscfed", "device": "cpu"}  # fmt: skip
    outputs = server_app.run_federation(InProcessGrid(client_app, 3, rc), resolve_config(rc))
    rows = [outputs.rows[r] for r in sorted(outputs.rows)]
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert rows[-1]["test-accuracy"] > 0.2
    assert all(math.isfinite(r["train-loss"]) and 0 < r["pseudo-label-share"] <= 1 for r in rows[1:])
    assert sorted(fresh) == [(1, 1, True), (1, 2, True), (2, 1, False), (2, 2, False), (3, 1, False), (3, 2, False)]


def test_the_teacher_counts_every_earlier_update_of_its_node_when_clients_skip_rounds(
    tmp_path: Path, small_test_set: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four clients, two a round, four rounds: a kept teacher's warm-up counts the updates it
    had in the rounds its node trained, whichever rounds those were. In every round a node
    trains, the count it starts from (s of the round's first update) is the sum of the steps of
    its earlier trained rounds of the run, 0 in its first; at least one node skips a round after
    training, where the expected share (t - 1) * fraction-train * steps would be off."""
    seen: list[tuple[int, int, float, int]] = []  # (node key, round, updates before the round, updates in it)
    original = get_method("rscfed").local_update

    def recording(self, client, models, ctx, loop):  # type: ignore[no-untyped-def]
        result = original(self, client, models, ctx, loop)
        if "unlabeled" in client.parts():
            seen.append((ctx.node_key, ctx.server_round, self._earlier, self._steps))
        return result

    monkeypatch.setattr(get_method("rscfed"), "local_update", recording)
    rc = {"method": "rscfed", "client-setting": "annotation-heterogeneity", "label-layout": "L,P,U,U", "labeled-share": 0.4,
          "samples-per-client": 120, "batch-size": 32, "num-rounds": 4, "fraction-train": 0.5, "min-available-nodes": 4,
          "min-train-nodes": 1, "lr": 0.05, "local-optimizer": "sgd", "rscfed-subset-size": 2,
          "output-dir": str(tmp_path), "run-name": "skips", "device": "cpu"}  # fmt: skip
    server_app.run_federation(InProcessGrid(client_app, 4, rc), resolve_config(rc))
    by_node: dict[int, list[tuple[int, float, int]]] = {}
    for node, server_round, earlier, steps in sorted(seen):
        by_node.setdefault(node, []).append((server_round, earlier, steps))
    skipped = False
    for rounds in by_node.values():
        done = 0
        for i, (server_round, earlier, steps) in enumerate(rounds):
            assert earlier == done, (rounds, server_round)
            assert steps > 0
            done += steps
            skipped |= i > 0 and server_round - rounds[i - 1][0] > 1 or i == 0 and server_round > 1
    assert skipped, by_node
