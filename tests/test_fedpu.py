"""FedPU's local risks (fedul_flwr.methods.fedpu.risk) against hand computations, their bounds
and gradients, and the method in an in-process federation of PU clients."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedul_flwr.client_app import app as client_app
from fedul_flwr.preflight import resolve_config
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.data import simulated
from fedul_flwr.methods.fedpu.broadcast import BROADCAST
from fedul_flwr.methods.fedpu.risk import PU_LOSSES, cross_client_term, cross_client_weights, log_not
from fedul_flwr.server_app import run_federation

PRIOR = torch.tensor([0.2, 0.3, 0.5])
POSITIVES = torch.tensor([0])  # K = 3, CP = {0}, CN = {1, 2}
LOGITS_P = torch.tensor([[2.0, 0.5, -1.0], [0.3, 0.1, 0.2]])
Y_P = torch.tensor([0, 0])
LOGITS_U = torch.tensor([[0.0, 1.0, 2.0], [1.5, -0.5, 0.0]])


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def test_eq10_equals_the_risk_of_eq10_by_hand() -> None:
    """Eq. 10 without the cross-client term, P(f != m) ~ 1 - s_m, written out term by term:
    pi_0 * mean_{x in P_0}[(1 - s_0) - (1 - s_1) - (1 - s_2)] + sum_{m in {1, 2}} mean_{x in U}[1 - s_m]."""
    p = [_softmax(z) for z in LOGITS_P.numpy()]
    u = [_softmax(z) for z in LOGITS_U.numpy()]
    labeled = 0.2 * np.mean([(1 - s[0]) - (1 - s[1]) - (1 - s[2]) for s in p])
    unlabeled = sum(np.mean([1 - s[m] for s in u]) for m in (1, 2))
    got = PU_LOSSES.get("eq10")(LOGITS_P, Y_P, LOGITS_U, POSITIVES, PRIOR)
    assert float(got) == pytest.approx(labeled + unlabeled, rel=1e-6)


def test_nnpu_by_hand_and_its_clamp() -> None:
    """pi_0 E_0[-log s_0] + max(0, E_U[-log(1 - s_0)] - pi_0 E_0[-log(1 - s_0)])."""
    p = [_softmax(z) for z in LOGITS_P.numpy()]
    u = [_softmax(z) for z in LOGITS_U.numpy()]
    ce = np.mean([-np.log(s[0]) for s in p])
    negative = np.mean([-np.log(1 - s[0]) for s in u]) - 0.2 * np.mean([-np.log(1 - s[0]) for s in p])
    got = PU_LOSSES.get("nnpu")(LOGITS_P, Y_P, LOGITS_U, POSITIVES, PRIOR)
    assert float(got) == pytest.approx(0.2 * ce + max(0.0, negative), rel=1e-6)
    # unlabeled data that the model already puts far from class 0, positives that it puts near
    # 0 too: the corrected negative risk estimate goes below zero and is clamped
    far = torch.tensor([[-8.0, 4.0, 4.0]])
    clamped = PU_LOSSES.get("nnpu")(LOGITS_P * 0 + far, Y_P, far.repeat(2, 1), POSITIVES, torch.tensor([0.99, 0.0, 0.01]))
    s0 = float(torch.softmax(far, 1)[0, 0])
    assert float(clamped) == pytest.approx(0.99 * -np.log(s0), rel=1e-5)


def test_eq10_nn_is_eq10_with_cross_entropy_by_hand_where_no_clamp_acts() -> None:
    """Two positive classes of three (CP = {0, 1}, CN = {2}), two labeled rows of each class,
    one unlabeled row; P(f != m) ~ -log s_m. Eq. 10 term by term:
    sum_{i in {0,1}} pi_i mean_{x in P_i}[-log s_i + log s_2] + mean_{x in U}[-log s_2];
    the negative class's corrected risk is positive here, so no clamp acts."""
    prior = torch.tensor([0.25, 0.25, 0.5])
    logits_p = torch.tensor([[1.0, 0.0, 0.0], [2.0, 1.0, 0.0], [0.0, 1.0, 0.5], [0.0, 0.0, 0.0]])
    y_p = torch.tensor([0, 0, 1, 1])
    logits_u = torch.tensor([[2.0, 0.0, -1.0]])
    s = [_softmax(z) for z in logits_p.numpy()]
    su = _softmax(logits_u.numpy()[0])
    eq10 = (0.25 * np.mean([-np.log(s[r][0]) + np.log(s[r][2]) for r in (0, 1)])
            + 0.25 * np.mean([-np.log(s[r][1]) + np.log(s[r][2]) for r in (2, 3)])
            - np.log(su[2]))  # fmt: skip
    corrected = -np.log(su[2]) - 0.25 * np.mean([-np.log(s[r][2]) for r in (0, 1)]) - 0.25 * np.mean([-np.log(s[r][2]) for r in (2, 3)])
    assert corrected > 0  # the case without the clamp
    got = PU_LOSSES.get("eq10-nn")(logits_p, y_p, logits_u, torch.tensor([0, 1]), prior)
    assert float(got) == pytest.approx(eq10, rel=1e-6)
    # the same with unlabeled data confidently of the negative class ... and positives that
    # put it far lower: E_U[-log s_2] - sum_i pi_i E_i[-log s_2] < 0 is clamped, leaving
    # the labeled term sum_i pi_i E_i[-log s_i]
    far = torch.tensor([[4.0, 4.0, -8.0]]).repeat(4, 1)
    sf = _softmax(far.numpy()[0])
    got = PU_LOSSES.get("eq10-nn")(far, y_p, logits_u, torch.tensor([0, 1]), torch.tensor([0.45, 0.45, 0.1]))
    assert float(got) == pytest.approx(0.45 * -np.log(sf[0]) + 0.45 * -np.log(sf[1]), rel=1e-5)


@pytest.mark.parametrize("name", sorted(PU_LOSSES.names()))
def test_losses_are_bounded_below_where_an_adversary_minimises_them(name: str) -> None:
    """Free logits minimised by Adam for 300 steps: the risk settles at a finite value at or
    above its bound (nnpu >= 0; eq10 >= -sum_{i in CP} pi_i |CN|); the authors' loss, which
    subtracts an unclamped term, and uPU are only checked to stay finite."""
    torch.manual_seed(0)
    logits_p = torch.randn(8, 4, requires_grad=True)
    logits_u = torch.randn(16, 4, requires_grad=True)
    y_p = torch.tensor([0, 1] * 4)
    positives, prior = torch.tensor([0, 1]), torch.full((4,), 0.25)
    opt = torch.optim.Adam([logits_p, logits_u], lr=0.5)
    for _ in range(300):
        loss = PU_LOSSES.get(name)(logits_p, y_p, logits_u, positives, prior)
        opt.zero_grad()
        loss.backward()
        opt.step()
    value = float(PU_LOSSES.get(name)(logits_p, y_p, logits_u, positives, prior))
    assert np.isfinite(value)
    bound = {"eq10-nn": 0.0, "nnpu": 0.0, "eq10": -(0.25 + 0.25) * 2}.get(name)
    if bound is not None:
        assert value >= bound - 1e-6
    if name == "upu":  # without the clamp the estimate runs below zero: what nnPU prevents
        assert value < 0


@pytest.mark.parametrize("name", sorted(PU_LOSSES.names()))
def test_gradients_stay_finite_where_classes_have_zero_probability(name: str) -> None:
    big = torch.tensor([[1e4, -1e4, 0.0], [-1e4, 1e4, -1e4]], requires_grad=True)  # s in {0, 1} in float32
    unl = torch.tensor([[1e4, 0.0, -1e4], [0.0, 0.0, 0.0]], requires_grad=True)
    loss = PU_LOSSES.get(name)(big, torch.tensor([0, 1]), unl, torch.tensor([0, 1]), PRIOR)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(big.grad).all() and torch.isfinite(unl.grad).all()


def test_log_not_matches_log_one_minus_softmax() -> None:
    z = torch.randn(5, 7)
    torch.testing.assert_close(log_not(z), torch.log(1 - torch.softmax(z, 1)), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_fedpu_beats_training_on_the_labeled_positives_alone(tmp_path: Path) -> None:
    """5 clients x 2 positive classes, no overlap (the paper's Table 1 row), embedded sample:
    FedPU against Baseline-1 (supervised FedAvg on the labeled positives only) after 3 rounds."""
    accuracy = {}
    for method in ("fedpu", "supervised"):
        rc = {"output-dir": str(tmp_path), "run-name": method, "num-rounds": 3, "method": method,
              "client-setting": "pu", "positive-classes": "2", "samples-per-client": 800, "batch-size": 64}  # fmt: skip
        run_federation(InProcessGrid(client_app, 5, rc), resolve_config(rc))
        rows = json.loads((tmp_path / method / "metrics.json").read_text())
        accuracy[method] = rows[-1]["test-accuracy"]
    assert accuracy["fedpu"] > accuracy["supervised"] + 0.1, accuracy
    assert accuracy["fedpu"] > 0.7, accuracy


def test_cross_client_weights_count_the_other_clients_lacking_both_classes() -> None:
    """CP_k = {0, 1}; client q1 labels {0} (lacks 1, 2), q2 labels {2} (lacks 0, 1):
    W[0, 1] = 1 (q2), W[1, 0] = 1 (q2), W[1, 2] = 1 (q1); row 2 is not a positive class of k."""
    weights = cross_client_weights((0, 1), [(0,), (2,)], 3)
    assert weights.tolist() == [[0, 1, 0], [1, 0, 1], [0, 0, 0]]


def test_cross_client_term_by_hand() -> None:
    """-sum_i pi_i E_i[sum_m W[i, m] (1 - s_m)] (eq10) and sum_i pi_i E_i[sum_m W[i, m] (-log(1 - s_m))]."""
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.3, 0.1, 0.2], [-1.0, 1.0, 0.0]])
    y = torch.tensor([0, 0, 1])
    weights = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 2.0], [0.0, 0.0, 0.0]])
    s = [_softmax(z) for z in logits.numpy()]
    for literal, loss in ((True, lambda v: 1 - v), (False, lambda v: -np.log(1 - v))):
        class0 = np.mean([loss(s[0][1]), loss(s[1][1])])
        class1 = loss(s[2][0]) + 2 * loss(s[2][2])
        expected = PRIOR[0].item() * class0 + PRIOR[1].item() * class1
        got = float(cross_client_term(logits, y, weights, PRIOR, literal=literal))
        assert got == pytest.approx(-expected if literal else expected, rel=1e-6)


class _RecordingGrid(InProcessGrid):
    """Records each message's type and the positive-class broadcast of its config."""

    def push_messages(self, messages):  # type: ignore[no-untyped-def]
        messages = list(messages)
        for m in messages:
            self.sent.append((m.metadata.message_type, m.metadata.dst_node_id, m.content["config"].get(BROADCAST)))
        return super().push_messages(messages)


def test_cross_client_switch_queries_every_node_once_and_broadcasts_their_sets(tmp_path: Path) -> None:
    """Under fedpu-cross-client the server asks each node for its positive classes before
    round 1 (only then), every train message carries all nodes' sets, and the clients'
    loss changes by the term; off, no query is sent and no set travels."""
    losses, sent = {}, {}
    for switch in (False, True):
        rc = {"output-dir": str(tmp_path), "run-name": f"cross-{switch}", "num-rounds": 2, "method": "fedpu",
              "client-setting": "pu", "positive-classes": "4", "samples-per-client": 300, "batch-size": 64,
              "fedpu-cross-client": switch}  # fmt: skip
        grid = _RecordingGrid(client_app, 3, rc)
        grid.sent = []
        cfg = resolve_config(rc)
        run_federation(grid, cfg)
        rows = json.loads((tmp_path / f"cross-{switch}" / "metrics.json").read_text())
        losses[switch] = rows[1]["train-loss"]
        sent[switch] = grid.sent
    expected = sorted(",".join(map(str, s)) for s in simulated.positive_class_sets(cfg, 3))
    queries = [(node, b) for kind, node, b in sent[True] if kind == "query"]
    assert sorted(node for node, _ in queries) == [1, 2, 3] and all(b is None for _, b in queries)
    trains = [b for kind, _, b in sent[True] if kind == "train"]
    assert len(trains) == 6 and all(sorted(b) == expected for b in trains)
    assert all(kind != "query" and b is None for kind, _, b in sent[False])
    assert losses[True] != pytest.approx(losses[False], rel=1e-3)


def test_a_reply_counts_all_its_images_as_in_alg_1() -> None:
    """Alg. 1, line 7: w <- sum_k n_k / n w^k with n_k = |P_k| + |U_k|. One real local round of
    a PU client: the reply's count is its labeled positives plus its unlabeled images, not the
    unlabeled stream that drives the epoch."""
    from torch import nn

    from fedul_flwr.methods.base import RoundContext, method_class
    from fedul_flwr.methods.fedpu import aggregation_weight
    from fedul_flwr.models import build_model
    from fedul_flwr.training import LocalLoop

    cfg = resolve_config({"method": "fedpu", "client-setting": "pu", "positive-classes": "2", "samples-per-client": 300,
                          "batch-size": 64})  # fmt: skip
    client = simulated.load_client(cfg, 0, 5, frozenset({"labeled", "unlabeled", "positive-classes", "class-prior"}))
    n_p, n_u = len(client.labeled), len(client.unlabeled)
    assert n_p > 0 and n_u > 0
    models = nn.ModuleDict({"f": build_model("small-cnn", 1, 10, 28, seed=0)})
    loop = LocalLoop(epochs=1, lr=0.01, l1_weight=0.0, optimizer="sgd", seed=0, device=torch.device("cpu"),
                     to_input=client.to_input)  # fmt: skip
    result = method_class("fedpu")(cfg).local_update(client, models, RoundContext(0, 1, 0), loop)
    assert result.num_examples == aggregation_weight(client) == n_p + n_u
    assert result.num_steps == -(-n_u // 64)  # the unlabeled stream still drives the epoch
