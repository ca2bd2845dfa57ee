"""FedMatch (fedul_flwr/methods/fedmatch): the decomposition and its losses by hand on tiny
tensors, the helpers' choice by hand, the server's helpers per client and theta = sigma + psi
in real train messages, and short federations on the embedded sample in each setting that
train above chance (a resumed run: tests/test_baselines_resume.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from torch import nn

from fedul_flwr import wire
from fedul_flwr.cli import main as fedul
from fedul_flwr.client_app import app as client_app
from fedul_flwr.data.datasets import run_dataset_info
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import get_method
from fedul_flwr.methods.fedmatch.helpers import HELPERS_SENT, choose_helpers, helper_name, probe_image
from fedul_flwr.methods.fedmatch.losses import (
    Decomposed, agreement_pseudo_labels, consistency, masked_mean, sparsify, sparsity_and_distance, theta_state,
)  # fmt: skip
from fedul_flwr.models import build_model
from fedul_flwr.preflight import resolve_config
from fedul_flwr.server_app import global_models, run_federation
from fedul_flwr.strategies import build_strategy

SMALL = {"method": "fedmatch", "samples-per-client": 100, "num-labeled": 200, "num-rounds": 3,
         "fedmatch-helper-interval": 1}  # fmt: skip


def _linear(weight: list[list[float]], bias: list[float]) -> nn.Linear:
    layer = nn.Linear(len(weight[0]), len(weight))
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
        layer.bias.copy_(torch.tensor(bias))
    return layer


# --------------------------------------------------------------------------- losses by hand


def test_decomposed_forward_is_the_sum_and_freezes_one_half() -> None:
    sigma, psi = _linear([[1.0, 2.0]], [0.5]), _linear([[0.25, -1.0]], [0.5])
    x = torch.tensor([[2.0, 1.0]])
    dec = Decomposed(sigma, psi)
    assert list(dec.parameters()) == []  # the halves are not its children
    out = dec(x, frozen="psi")
    assert out.item() == pytest.approx(1.25 * 2 + 1.0 * 1 + 1.0)  # (sigma + psi) . x + bias sum
    out.sum().backward()
    assert sigma.weight.grad is not None and psi.weight.grad is None
    assert sigma.weight.grad.tolist() == [[2.0, 1.0]]
    sigma.zero_grad(set_to_none=True)
    dec(x, frozen="sigma").sum().backward()
    assert psi.weight.grad.tolist() == [[2.0, 1.0]] and sigma.weight.grad is None
    with pytest.raises(ValueError, match="frozen"):
        dec(x, frozen="theta")
    with pytest.raises(ValueError, match="one architecture"):
        Decomposed(sigma, nn.Linear(3, 1))


def test_sparsity_and_distance_by_hand_reach_psi_only() -> None:
    sigma, psi = _linear([[1.0, -2.0]], [0.0]), _linear([[0.5, 1.0]], [-0.25])
    value = sparsity_and_distance(sigma, psi, lambda_l1=0.1, lambda_l2=2.0)
    l1 = 0.5 + 1.0 + 0.25
    l2 = (1.0 - 0.5) ** 2 + (-2.0 - 1.0) ** 2 + (0.0 + 0.25) ** 2
    assert value.item() == pytest.approx(0.1 * l1 + 2.0 * l2)
    value.backward()
    assert sigma.weight.grad is None
    # d/dpsi: 0.1 sign(psi) + 2 * 2 (psi - sigma)
    assert psi.weight.grad[0].tolist() == pytest.approx([0.1 + 4 * (0.5 - 1.0), 0.1 + 4 * (1.0 + 2.0)])
    assert psi.bias.grad.tolist() == pytest.approx([-0.1 + 4 * (-0.25)])


def test_consistency_is_the_mean_kl_of_the_helpers_to_the_local_prediction() -> None:
    p = torch.tensor([[0.5, 0.5], [0.8, 0.2]])
    q = torch.tensor([[[0.9, 0.1], [0.8, 0.2]], [[0.5, 0.5], [0.2, 0.8]]])  # [H=2, n=2, K=2]
    kl = consistency(p.log(), q)

    def by_hand(a: list[float], b: list[float]) -> float:
        return sum(ai * math.log(ai / bi) for ai, bi in zip(a, b))

    assert kl.tolist() == pytest.approx([
        (by_hand([0.9, 0.1], [0.5, 0.5]) + by_hand([0.5, 0.5], [0.5, 0.5])) / 2,
        (by_hand([0.8, 0.2], [0.8, 0.2]) + by_hand([0.2, 0.8], [0.8, 0.2])) / 2,
    ])  # fmt: skip


def test_agreement_pseudo_labels_vote_with_the_helpers_and_mask_by_local_confidence() -> None:
    probs = torch.tensor([[0.90, 0.05, 0.05], [0.50, 0.40, 0.10], [0.10, 0.05, 0.85], [0.05, 0.05, 0.90]])
    helpers = torch.tensor([
        [[0.1, 0.8, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.1, 0.8, 0.1]],
        [[0.1, 0.8, 0.1], [0.8, 0.1, 0.1], [0.8, 0.1, 0.1], [0.8, 0.1, 0.1]],
    ])  # fmt: skip
    targets, mask = agreement_pseudo_labels(probs, helpers, tau=0.85)
    # row 0: votes (1, 2, 0) -> 1, the helpers outvote; row 1: (2, 1, 0) -> 0; row 2: (1, 0, 2) -> 2;
    # row 3: one vote each -> the tie goes to the lowest class, 0
    assert targets.tolist() == [1, 0, 2, 0]
    assert mask.tolist() == [True, False, True, True]
    alone, mask_alone = agreement_pseudo_labels(probs, None, tau=0.85)
    assert alone.tolist() == [0, 0, 2, 2] and mask_alone.tolist() == mask.tolist()


def test_masked_mean_theta_state_and_sparsify_by_hand() -> None:
    values = torch.tensor([1.0, 2.0, 4.0])
    assert masked_mean(values, torch.tensor([True, False, True])).item() == pytest.approx(2.5)
    assert masked_mean(values, torch.tensor([False, False, False])).item() == 0.0
    sigma = {"w": torch.tensor([1.0, 1.0]), "running": torch.tensor([3.0])}
    psi = {"w": torch.tensor([1e-6, 0.5]), "running": torch.tensor([9.0])}
    theta = theta_state(sigma, psi, {"w"}, threshold=1e-5)
    assert theta["w"].tolist() == [1.0, 1.5] and theta["running"].tolist() == [3.0]  # buffers are sigma's
    layer = _linear([[1e-7, 0.3]], [-2e-6])
    assert sparsify(layer, 5e-6) == pytest.approx(1 / 3)
    assert layer.weight.tolist() == [[0.0, pytest.approx(0.3)]] and layer.bias.tolist() == [0.0]


# --------------------------------------------------------------------------- helpers


def test_helpers_are_the_nearest_other_embeddings_by_hand() -> None:
    e = {1: torch.tensor([0.0, 0.0]), 2: torch.tensor([1.0, 0.0]), 3: torch.tensor([0.0, 2.0]),
         4: torch.tensor([5.0, 5.0]), 5: torch.tensor([-1.0, 0.0])}  # fmt: skip
    assert choose_helpers(e, 1, 2) == [2, 5]  # distances 1 (2), 1 (5), 2 (3): the tie to the smaller id
    assert choose_helpers(e, 1, 3) == [2, 5, 3]
    assert choose_helpers(e, 4, 1) == [3]  # sqrt(34) < sqrt(41) < sqrt(50)
    assert choose_helpers(e, 9, 2) == []  # never heard of: no helpers
    assert choose_helpers({1: e[1]}, 1, 2) == [] and choose_helpers(e, 1, 0) == []


def test_probe_is_fixed_per_seed_and_inside_the_pixel_range() -> None:
    a, b = probe_image(3, 1, 28, [0.5], [0.25]), probe_image(3, 1, 28, [0.5], [0.25])
    assert torch.equal(a, b) and not torch.equal(a, probe_image(4, 1, 28, [0.5], [0.25]))
    pixels = a * 0.25 + 0.5
    assert a.shape == (1, 1, 28, 28) and pixels.min() >= 0 and pixels.max() <= 1


def test_the_server_sends_each_client_its_helpers_and_theta_is_sigma_plus_psi() -> None:
    """One real round of three clients; then round 2's train messages carry, per client, the
    psi of the clients :func:`choose_helpers` names on the embeddings (the softmax of
    theta_c on the probe, recomputed here for every client), and theta = sigma + psi."""
    rc = {**SMALL, "client-setting": "labels-at-clients", "fedmatch-helpers": 2}
    cfg = resolve_config(rc)
    method = get_method("fedmatch")(cfg)
    info = run_dataset_info(cfg.as_dict())
    models = global_models(cfg, method, info.channels, len(info.class_names), info.image_size)
    grid = InProcessGrid(client_app, 3, rc)
    strategy = build_strategy(cfg, method.aggregation(), 3)
    settings = ConfigRecord({wire.RUN_CONFIG: cfg.to_json(), wire.DATASET_FACTS: info.to_json()})
    first = list(strategy.configure_train(1, ArrayRecord(models.state_dict()), settings, grid))
    assert [m.content[wire.CONFIG][HELPERS_SENT] for m in first] == [0, 0, 0]  # nobody heard from yet
    replies = list(grid.send_and_receive(first))
    arrays, _ = strategy.aggregate_train(1, replies)
    state = {k: torch.from_numpy(a.numpy()) for k, a in arrays.items()}

    def part(model: str, source: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k.split(".", 1)[1]: v for k, v in source.items() if wire.model_of(k) == model}

    parameters = {k for k, _ in models["sigma"].named_parameters()}
    expected_theta = theta_state(part("sigma", state), part("psi", state), parameters, 5e-6)
    for k, v in part("theta", state).items():
        assert torch.allclose(v, expected_theta[k], atol=1e-6)
    net = build_model(cfg.model, info.channels, len(info.class_names), info.image_size).double().eval()
    probe = probe_image(cfg.seed, info.channels, info.image_size, info.mean, info.std).double()
    embeddings, psis, keys = {}, {}, {}  # by node key (the partition id), as the server keeps them
    for reply in replies:
        key = int(reply.content[wire.NODE_RECORD][wire.NODE_KEY])
        keys[reply.metadata.src_node_id] = key
        sent = {k: torch.from_numpy(a.numpy()).double() for k, a in reply.content[wire.ARRAYS].items()}
        net.load_state_dict(theta_state(part("sigma", sent), part("psi", sent), parameters))
        with torch.no_grad():
            embeddings[key] = torch.softmax(net(probe), dim=1)[0].float()
        psis[key] = part("psi", sent)
    assert sorted(keys.values()) == [0, 1, 2]
    second = list(strategy.configure_train(2, arrays, settings, grid))
    for msg in second:
        node = keys[msg.metadata.dst_node_id]
        chosen = choose_helpers(embeddings, node, 2)
        assert len(chosen) == 2 and node not in chosen
        assert msg.content[wire.CONFIG][HELPERS_SENT] == 2
        carried = {k: torch.from_numpy(a.numpy()).double() for k, a in msg.content[wire.ARRAYS].items()}
        for j, helper in enumerate(chosen, start=1):
            for k, v in part(helper_name(j), carried).items():
                assert torch.equal(v, psis[helper][k])
        for model in ("sigma", "psi", "theta"):  # the global models, as aggregated
            for k, v in part(model, carried).items():
                assert torch.equal(v.float(), part(model, state)[k].float())
    assert len({id(m.content[wire.ARRAYS]) for m in second}) == 3  # one record per client


# --------------------------------------------------------------------------- federations


@pytest.mark.parametrize("setting", ["labels-at-clients", "labels-at-server", "annotation-heterogeneity"])
def test_fedmatch_trains_above_chance_in_each_setting(setting: str, tmp_path: Path, small_test_set: None) -> None:
    rc = {**SMALL, "client-setting": setting, "output-dir": str(tmp_path), "run-name": setting}
    if setting == "annotation-heterogeneity":  # a fully labeled client (sends sigma) and an unlabeled one (psi)
        rc.update({"label-layout": "L,U", "labeled-share": 0.5, "samples-per-client": 150})
    outputs = run_federation(InProcessGrid(client_app, 2, rc), resolve_config(rc))
    rows = [outputs.rows[r] for r in sorted(outputs.rows)]
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert all(math.isfinite(r["train-loss"]) for r in rows[1:])
    assert rows[-1]["test-accuracy"] > 0.2
    assert 0 < rows[-1]["psi-nonzero-share"] <= 1
    if setting == "labels-at-server":
        assert rows[-1]["server-train-loss"] > 0


def test_fedul_check_accepts_fedmatch_in_its_settings_and_refuses_server_dp(capsys: pytest.CaptureFixture[str]) -> None:
    for setting in ("labels-at-clients", "labels-at-server", "annotation-heterogeneity"):
        assert fedul(["check", "--run-config", f'method="fedmatch" client-setting="{setting}"']) == 0
    assert fedul(["check", "--run-config", 'method="fedmatch" client-setting="pu"']) == 1
    capsys.readouterr()
    assert fedul(["check", "--run-config", 'method="fedmatch" client-setting="labels-at-clients" '
                  'differential-privacy="server-fixed"']) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "method='fedmatch'" in err and "differential-privacy='server-fixed'" in err
    assert fedul(["check", "--run-config", 'method="fedmatch" client-setting="labels-at-clients" '
                  'differential-privacy="client-local"']) == 0
