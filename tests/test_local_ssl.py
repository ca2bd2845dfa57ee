"""MixMatch and UDA (local semi-supervised learning inside FedAvg, :mod:`fedul_flwr.methods.local_ssl`):
their losses by hand on tiny tensors, their random draws, their one-part clients, ``fedul check``
in their settings, and short federations on the embedded sample that train above chance."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr import server_app
from fedul_flwr.cli import main as fedul
from fedul_flwr.client_app import app as client_app
from fedul_flwr.data import simulated
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods.base import NothingToTrain, RoundContext, method_class
from fedul_flwr.methods.local_ssl import mixup
from fedul_flwr.methods.mixmatch import draw_mixup, guess_labels, mixmatch_loss, ramp_weight, sharpen
from fedul_flwr.methods.uda import masked_kl, sharpened_targets
from fedul_flwr.models import build_model
from fedul_flwr.preflight import resolve_config
from fedul_flwr.strategies.contract import train_metric_keys
from fedul_flwr.training import LocalLoop

# --------------------------------------------------------------------------- MixMatch by hand


def test_sharpen_is_eq7_by_hand() -> None:
    """Sharpen(p, T)_i = p_i^(1/T) / sum_j p_j^(1/T): T = 0.5 squares and renormalises, T = 1
    leaves p, a small T tends to the one-hot argmax (no underflow to NaN)."""
    p = torch.tensor([[0.6, 0.3, 0.1], [0.25, 0.25, 0.5]])
    squares = p**2
    torch.testing.assert_close(sharpen(p, 0.5), squares / squares.sum(dim=1, keepdim=True))
    torch.testing.assert_close(sharpen(p, 1.0), p)
    cold = sharpen(p, 1e-3)
    assert torch.isfinite(cold).all() and cold.argmax(dim=1).tolist() == [0, 2] and float(cold.max()) == pytest.approx(1.0)
    torch.testing.assert_close(sharpen(torch.tensor([[1.0, 0.0]]), 0.5), torch.tensor([[1.0, 0.0]]))


def test_guess_labels_average_the_k_views_then_sharpen() -> None:
    """Eq. 6-7 on 2 images x K = 2 views (view-major rows): qbar = mean of the views' softmax,
    q = Sharpen(qbar, T)."""
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0],    # view 0 of images 0, 1
                           [0.0, 0.0, 0.0], [0.0, 3.0, 1.0]])  # view 1 of images 0, 1  # fmt: skip
    probs = F.softmax(logits, dim=1)
    qbar = torch.stack([(probs[0] + probs[2]) / 2, (probs[1] + probs[3]) / 2])
    powered = qbar**2
    torch.testing.assert_close(guess_labels(logits, 2, 0.5), powered / powered.sum(dim=1, keepdim=True))
    assert not guess_labels(logits.requires_grad_(True), 2, 0.5).requires_grad  # a target, no gradient


def test_mixup_mixes_each_row_with_its_own_weight() -> None:
    a, b = torch.ones(3, 1, 2, 2), torch.zeros(3, 1, 2, 2)
    lam = torch.tensor([1.0, 0.75, 0.5])
    mixed = mixup(a, b, lam)
    assert [float(mixed[i].unique()) for i in range(3)] == [1.0, 0.75, 0.5]
    p, q = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    torch.testing.assert_close(mixup(p, q, torch.tensor([0.6, 0.9])), torch.tensor([[0.6, 0.4], [0.05, 0.95]]))
    torch.testing.assert_close(mixup(p, q, 0.5), (p + q) / 2)  # one weight for all rows (FedPL's)


def test_draw_mixup_draws_from_the_given_generators_only() -> None:
    """Partners: a permutation from the torch generator; weights lambda' = max(lambda, 1 -
    lambda) in [0.5, 1] from the numpy one, Beta(alpha, alpha) before the max. Same seeds, same
    draws; torch's and numpy's global generators are neither read nor moved."""
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()
    ctx = RoundContext(seed=3, server_round=2, node_key=5)
    partner, lam = draw_mixup(4000, 0.75, ctx.generator, ctx.rng)
    again = RoundContext(seed=3, server_round=2, node_key=5)
    partner2, lam2 = draw_mixup(4000, 0.75, again.generator, again.rng)
    assert torch.equal(partner, partner2) and torch.equal(lam, lam2)
    assert sorted(partner.tolist()) == list(range(4000))
    assert float(lam.min()) >= 0.5 and float(lam.max()) <= 1.0
    # lambda' of Beta(0.75, 0.75): E[max(l, 1 - l)] = 1/2 + E|l - 1/2|; a sample of 4000 by numpy's own Beta
    reference = np.random.default_rng(1).beta(0.75, 0.75, 200_000)
    assert float(lam.mean()) == pytest.approx(float(np.maximum(reference, 1 - reference).mean()), abs=0.01)
    other = RoundContext(seed=3, server_round=3, node_key=5)
    assert not torch.equal(draw_mixup(4000, 0.75, other.generator, other.rng)[0], partner)  # another round
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert all(np.array_equal(x, y) for x, y in zip(np.random.get_state()[1:2], numpy_state[1:2], strict=True))


def test_mixmatch_loss_is_eqs_3_and_4_by_hand() -> None:
    """L_X = mean_b -sum_k p'_bk log softmax(z_b)_k; L_U = mean over rows and classes of
    (q' - softmax(z))^2; a part without rows is 0."""
    logits = torch.tensor([[1.0, 0.0, -1.0], [0.0, 2.0, 0.0], [0.5, 0.5, 0.0]])
    targets = torch.tensor([[0.7, 0.3, 0.0], [0.0, 1.0, 0.0], [0.2, 0.2, 0.6]])
    log_p, p = F.log_softmax(logits, dim=1), F.softmax(logits, dim=1)
    loss_x, loss_u = mixmatch_loss(logits, targets, 2)
    assert float(loss_x) == pytest.approx(float(-(targets[:2] * log_p[:2]).sum() / 2))
    assert float(loss_u) == pytest.approx(float(((targets[2] - p[2]) ** 2).sum() / 3))
    only_u = mixmatch_loss(logits, targets, 0)
    assert float(only_u[0]) == 0.0 and float(only_u[1]) == pytest.approx(float(((targets - p) ** 2).mean()))
    assert float(mixmatch_loss(logits, targets, 3)[1]) == 0.0


def test_ramp_weight_rises_linearly_from_zero() -> None:
    assert [ramp_weight(100.0, r, 10, 0.5) for r in (1, 2, 4, 6, 10)] == [0.0, 20.0, 60.0, 100.0, 100.0]
    assert ramp_weight(100.0, 1, 10, 0.0) == 100.0


# --------------------------------------------------------------------------- UDA by hand


def test_uda_targets_and_masked_kl_by_hand() -> None:
    """q = softmax(z / tau); mask = max softmax(z) > beta (strict, on the unsharpened
    prediction); the term = 1/n sum_b mask_b KL(q_b || softmax(strong_b)), masked rows in n."""
    weak = torch.tensor([[3.0, 0.0, 0.0], [0.1, 0.0, 0.0], [0.0, 0.0, math.log(9.0)]])
    strong = torch.tensor([[1.0, 1.0, 0.0], [0.0, 2.0, 0.0], [0.0, 1.0, 2.0]])
    q, hard, mask = sharpened_targets(weak, 0.4, 0.8)
    torch.testing.assert_close(q, F.softmax(weak / 0.4, dim=1))
    assert hard.tolist() == [0, 0, 2]
    assert mask.tolist() == [True, False, True]  # 0.91, 0.36, 9 / 11 = 0.82 against beta = 0.8
    p = F.softmax(strong, dim=1)
    kl = [float((q[b] * (q[b].log() - p[b].log())).sum()) for b in range(3)]
    assert float(masked_kl(q, strong, mask)) == pytest.approx((kl[0] + kl[2]) / 3, rel=1e-5)
    # a one-hot target: KL = -log p[target] (0 log 0 = 0, no NaN)
    one_hot = torch.tensor([[0.0, 1.0, 0.0]])
    assert float(masked_kl(one_hot, strong[:1], torch.tensor([True]))) == pytest.approx(-float(p[0, 1].log()), rel=1e-5)
    assert float(masked_kl(q[:0], strong[:0], mask[:0])) == 0.0


def test_uda_mask_is_strict_at_the_threshold() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.5 + 1e-3, 0.25, 0.25 - 1e-3]]))
    assert sharpened_targets(logits, 1.0, 0.5)[2].tolist() == [False, True]


# --------------------------------------------------------------------------- the local step


def _client(setting: dict, partition: int, clients: int):  # type: ignore[no-untyped-def]
    cfg = resolve_config({"samples-per-client": 200, "batch-size": 8, **setting})
    return cfg, simulated.load_client(cfg, partition, clients, frozenset({"labeled", "unlabeled"}))


def _models(client) -> nn.ModuleDict:  # type: ignore[no-untyped-def]
    return nn.ModuleDict({"f": build_model("small-cnn", client.image_shape[0], client.num_classes, client.image_shape[1], seed=0)})


def test_mixmatch_step_is_alg1_by_hand() -> None:
    """One step on a labeled batch and an unlabeled batch of K = 2 views: guess, sharpen,
    MixUp over the concatenation with the partners and weights drawn from the round's
    generators, then L_X + lambda_U L_U: computed again here from the same draws."""
    cfg, client = _client({"method": "mixmatch", "client-setting": "labels-at-clients", "num-labeled": 100,
                           "mixmatch-ramp-up": 0.0, "mixmatch-lambda-u": 7.0}, 1, 4)  # fmt: skip
    method = method_class("mixmatch")(cfg)
    models = _models(client).eval()  # eval: batch norm's running statistics stay as they are between the passes
    ctx = RoundContext(seed=0, server_round=1, node_key=1)
    task = method.local_task(client, models, ctx)
    assert list(task.streams) == ["labeled", "unlabeled"]
    assert set(task.streams["unlabeled"].views) == {"weak0", "weak1"} and task.streams["unlabeled"].batch_size == 8
    gen = torch.Generator().manual_seed(0)
    xl, y = torch.rand(3, 1, 28, 28, generator=gen), torch.tensor([1, 4, 9])
    u0, u1 = torch.rand(2, 1, 28, 28, generator=gen), torch.rand(2, 1, 28, 28, generator=gen)
    got = task.loss(models, {"labeled": {"weak": xl, "y": y}, "unlabeled": {"weak0": u0, "weak1": u1}})

    f = models["f"]
    with torch.no_grad():
        q = sharpen((F.softmax(f(u0), dim=1) + F.softmax(f(u1), dim=1)) / 2, 0.5)
    x = torch.cat([xl, u0, u1])
    p = torch.cat([F.one_hot(y, 10).float(), q, q])
    replay = RoundContext(seed=0, server_round=1, node_key=1)
    partner, lam = draw_mixup(7, 0.75, replay.generator, replay.rng)
    mixed_x = torch.stack([lam[i] * x[i] + (1 - lam[i]) * x[partner[i]] for i in range(7)])
    mixed_p = torch.stack([lam[i] * p[i] + (1 - lam[i]) * p[partner[i]] for i in range(7)])
    logits = f(mixed_x)
    loss_x = -(mixed_p[:3] * F.log_softmax(logits[:3], dim=1)).sum(dim=1).mean()
    loss_u = ((mixed_p[3:] - F.softmax(logits[3:], dim=1)) ** 2).mean()
    assert float(got) == pytest.approx(float(loss_x + 7.0 * loss_u), rel=1e-5)


def test_uda_step_forwards_once_and_counts_the_mask() -> None:
    """UDA's step: one forward of [labeled weak, unlabeled target views, strong views], CE +
    lambda * masked KL; the uploads count the rows that passed beta."""
    cfg, client = _client({"method": "uda", "client-setting": "labels-at-clients", "num-labeled": 100, "uda-lambda": 2.0,
                           "uda-threshold": 0.0, "uda-mu": 1}, 1, 4)  # fmt: skip
    method = method_class("uda")(cfg)
    models = _models(client).eval()
    calls: list[int] = []
    models["f"].register_forward_hook(lambda module, args, out: calls.append(len(args[0])))
    task = method.local_task(client, models, RoundContext(0, 1, 1))
    assert task.streams["unlabeled"].batch_size == 8 and set(task.streams["unlabeled"].views) == {"weak", "strong"}
    gen = torch.Generator().manual_seed(1)
    xl, y, w, s = (torch.rand(3, 1, 28, 28, generator=gen), torch.tensor([0, 1, 2]), torch.rand(2, 1, 28, 28, generator=gen),
                   torch.rand(2, 1, 28, 28, generator=gen))  # fmt: skip
    got = task.loss(models, {"labeled": {"weak": xl, "y": y}, "unlabeled": {"weak": w, "strong": s, "classes": torch.tensor([5, 5])}})
    assert calls == [7]
    with torch.no_grad():
        logits = models["f"](torch.cat([xl, w, s]))
        q, hard, mask = sharpened_targets(logits[3:5], 0.4, 0.0)
        want = F.cross_entropy(logits[:3], y) + 2.0 * masked_kl(q, logits[5:], mask)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    sent = method.uploads(client, models, None)  # type: ignore[arg-type]
    assert sent["pseudo-label-share"] == 1.0  # beta = 0: every row passes
    assert sent["pseudo-label-correct-share"] == pytest.approx(float((hard == 5).float().mean()))
    declared, always = train_metric_keys("fedavg", "uda")
    assert set(sent) <= declared and "pseudo-label-share" in always


def test_uda_target_view_original_is_the_image_itself() -> None:
    """``uda-target-view = "original"``: the target view is the unaugmented image (Eq. 1's
    p(y | x)), ``weak``: a random crop of it; the strong view is RandAugment in both."""
    for view, same in (("original", True), ("weak", False)):
        cfg, client = _client({"method": "uda", "client-setting": "labels-at-clients", "num-labeled": 100,
                               "uda-target-view": view}, 1, 4)  # fmt: skip
        stream = method_class("uda")(cfg).unlabeled_stream(client)
        images = client.unlabeled[:64]
        target = stream.views["weak"][1](images, torch.Generator().manual_seed(0))
        assert torch.equal(target, images) == same
        assert not torch.equal(stream.views["strong"][1](images, torch.Generator().manual_seed(0)), images)


@pytest.mark.parametrize("method", ["mixmatch", "uda"])
def test_one_part_clients_train_what_they_hold(method: str) -> None:
    """annotation-heterogeneity with a labeled and an unlabeled client: the labeled one trains
    on its labeled stream alone (its n_L examples), the unlabeled one on its unlabeled stream
    alone (n_U), each a finite loss and a changed model; a client with neither part sits out."""
    over = {"method": method, "client-setting": "annotation-heterogeneity", "label-layout": "L,U", "mixmatch-ramp-up": 0.0,
            "uda-threshold": 0.0}  # every unlabeled row counts from the first step  # fmt: skip
    for partition, part in ((0, "labeled"), (1, "unlabeled")):
        cfg, client = _client(over, partition, 2)
        assert client.parts() == (part,) or set(client.parts()) == {part}
        algo = method_class(method)(cfg)
        models = _models(client)
        before = [p.detach().clone() for p in models.parameters()]
        ctx = RoundContext(seed=0, server_round=2, node_key=partition)
        streams = algo.local_task(client, models, ctx).streams
        assert list(streams) == [part]
        loop = LocalLoop(epochs=1, lr=0.001, l1_weight=0.0, optimizer="adam", seed=ctx.batch_seed,
                         device=torch.device("cpu"), to_input=client.to_input)  # fmt: skip
        result = algo.local_update(client, models, ctx, loop)
        n = len(client.labeled) if part == "labeled" else len(client.unlabeled)
        assert result.num_examples == n and math.isfinite(result.loss) and result.num_steps == -(-n // streams[part].batch_size)
        assert any(not torch.equal(a, b) for a, b in zip(before, models.parameters(), strict=True))
        assert not algo.sits_out(client)
        assert algo.sits_out(dataclasses.replace(client, labeled=None, unlabeled=None, unlabeled_classes=None))


def test_mixmatch_sit_out_idles_only_the_clients_without_labels() -> None:
    """``mixmatch-unlabeled-clients = sit-out``: the unlabeled-only client is idle, the labeled
    one still trains; ``train`` (the default) trains both."""
    over = {"method": "mixmatch", "client-setting": "annotation-heterogeneity", "label-layout": "L,U"}
    for choice, idle in (("train", (False, False)), ("sit-out", (False, True))):
        for partition in (0, 1):
            cfg, client = _client({**over, "mixmatch-unlabeled-clients": choice}, partition, 2)
            assert method_class("mixmatch")(cfg).sits_out(client) is idle[partition]


def test_mixmatch_client_without_labels_is_idle_where_lambda_u_is_zero() -> None:
    """Round 1 of the ramp (lambda_U = 0): the unlabeled-only client has nothing to train
    (NothingToTrain: an idle reply, not the received model back as a trained one); round 2
    trains it, and the labeled client trains in round 1."""
    over = {"method": "mixmatch", "client-setting": "annotation-heterogeneity", "label-layout": "L,U", "num-rounds": 4,
            "mixmatch-ramp-up": 0.5}  # fmt: skip
    cfg, client = _client(over, 1, 2)
    algo = method_class("mixmatch")(cfg)
    with pytest.raises(NothingToTrain, match="lambda_U is 0 in round 1"):
        algo.local_task(client, _models(client), RoundContext(seed=0, server_round=1, node_key=1))
    assert algo.local_task(client, _models(client), RoundContext(seed=0, server_round=2, node_key=1)).streams
    cfg, labeled = _client(over, 0, 2)
    assert method_class("mixmatch")(cfg).local_task(labeled, _models(labeled), RoundContext(seed=0, server_round=1, node_key=0)).streams


def test_mixmatch_sit_out_is_refused_where_no_client_holds_labels(capsys: pytest.CaptureFixture[str]) -> None:
    values = "method='mixmatch' client-setting='labels-at-server' mixmatch-unlabeled-clients='sit-out'"
    assert fedul(["check", "--run-config", values]) == 1
    assert "every one would sit out" in capsys.readouterr().err
    assert fedul(["check", "--run-config", values.replace("sit-out", "train")]) == 0


def test_a_choice_typed_as_a_toml_bool_is_echoed_as_typed(capsys: pytest.CaptureFixture[str]) -> None:
    """``--run-config`` parses ``key=true`` as TOML's bool: the refusal of a text key shows
    ``'true'``, what the user typed, not Python's ``'True'``."""
    assert fedul(["check", "--run-config", "method='mixmatch' mixmatch-unlabeled-clients=true"]) == 1
    assert "mixmatch-unlabeled-clients='true' must be one of ('train', 'sit-out')" in capsys.readouterr().err


@pytest.mark.parametrize(("values", "echo"), [
    ("method='fedpu' client-setting='pu' positive-classes=3", "positive-classes='3'"),
    ("method='fedul' mixmatch-unlabeled-clients=true", "mixmatch-unlabeled-clients='true'"),
    ("label-layout=1.5", "label-layout='1.5'"),
])
def test_a_number_or_bool_typed_for_a_text_key_is_echoed_as_the_text_the_run_reads(
    values: str, echo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """TOML types ``key=3`` and ``key=true``; a text key reads them as ``'3'`` and ``'true'``,
    and the configuration line and the unread-option warning say so (not ``3`` or ``True``)."""
    assert fedul(["check", "--run-config", values]) == 0
    captured = capsys.readouterr()
    assert echo in captured.out and "True" not in captured.out + captured.err
    assert all(echo in line for line in captured.err.splitlines() if "does not read it" in line)


@pytest.mark.parametrize(("values", "says"), [("lr=true", "lr=true is not a valid float"),
                                              ("lr=false", "lr=false is not a valid float"),
                                              ("seed=true", "seed=true is not a valid int")])
def test_a_toml_bool_is_no_number(values: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``float(True)`` is 1.0: without this refusal ``lr=true`` trained at lr 1.0 and ``lr=false``
    was refused as ``lr=0.0``, a value nobody typed."""
    assert fedul(["check", "--run-config", values]) == 1
    assert capsys.readouterr().err.strip() == f"error: {says}"


@pytest.mark.parametrize("value", ["true", "'abc'", "'0'", "'2,x'"])
def test_a_malformed_positive_classes_is_refused_without_a_federation_size(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its form and classes need no node count: ``fedul check`` refuses them as they are."""
    assert fedul(["check", "--run-config", f"method='fedpu' client-setting='pu' positive-classes={value}"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: positive-classes='") and "\n" not in err


def test_fedul_check_accepts_each_method_in_its_settings(capsys: pytest.CaptureFixture[str]) -> None:
    for method in ("mixmatch", "uda"):
        assert fedul(["check", "--run-config", f"method='{method}' client-setting='labels-at-clients'"]) == 0
        values = f"method='{method}' client-setting='annotation-heterogeneity' label-layout='L,U'"
        assert fedul(["check", "--run-config", values, "--federation-config", "num-supernodes=2"]) == 0
        capsys.readouterr()
        assert fedul(["check", "--run-config", f"method='{method}' client-setting='usets'"]) == 1
        assert ("is defined for client-setting in ('labels-at-clients', 'annotation-heterogeneity', 'labels-at-server')"
                in capsys.readouterr().err)  # fmt: skip
        assert fedul(["check", "--run-config", f"method='{method}' client-setting='labels-at-server'"]) == 0


# --------------------------------------------------------------------------- federations


@pytest.mark.parametrize(("method", "extra"), [
    # lambda_U = 10 ramped over the 3 rounds: the paper's 100 after one round makes this 3-round
    # federation of 100-image clients collapse to one class (docs/baselines/mixmatch.md)
    ("mixmatch", {"mixmatch-lambda-u": 10.0, "mixmatch-ramp-up": 1.0}),
    ("uda", {"uda-threshold": 0.3, "uda-mu": 2}),  # beta = 0.3: the KL term counts within 3 rounds
])  # fmt: skip
def test_three_rounds_train_above_chance(method: str, extra: dict, tmp_path: Path, small_test_set: None) -> None:
    rc = {"method": method, "client-setting": "labels-at-clients", "num-labeled": 200, "samples-per-client": 200,
          "num-rounds": 3, "batch-size": 16, "output-dir": str(tmp_path), "run-name": method, **extra}  # fmt: skip
    out = server_app.run_federation(InProcessGrid(client_app, 2, rc), resolve_config(rc))
    rows = [out.rows[r] for r in sorted(out.rows)]
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert rows[-1]["test-accuracy"] > 0.2 and all(math.isfinite(r["train-loss"]) for r in rows[1:])
    if method == "uda":
        assert all(0.0 <= r["pseudo-label-share"] <= 1.0 for r in rows[1:]) and rows[-1]["pseudo-label-share"] > 0
        assert all(0.0 <= r["pseudo-label-correct-share"] <= r["pseudo-label-share"] for r in rows[1:])


@pytest.mark.parametrize("method", ["mixmatch", "uda"])
def test_labels_at_server_the_server_trains_and_the_clients_train_their_unlabeled_term(
    method: str, tmp_path: Path, small_test_set: None
) -> None:
    """labels-at-server: the clients hold unlabeled images only (the unlabeled stream alone), the
    server trains on its labels before round 1 and after every aggregation; the round-0 model
    is already above chance, and the clients' replies change the model."""
    rc = {"method": method, "client-setting": "labels-at-server", "num-labeled": 100, "samples-per-client": 100,
          "batch-size": 16, "num-rounds": 2, "uda-mu": 2, "output-dir": str(tmp_path), "run-name": method}  # fmt: skip
    cfg = resolve_config(rc)
    client = simulated.load_client(cfg, 1, 2, frozenset({"unlabeled"}))
    assert client.parts() == ("unlabeled",)
    assert list(method_class(method)(cfg).local_task(client, _models(client), RoundContext(0, 2, 1)).streams) == ["unlabeled"]
    out = server_app.run_federation(InProcessGrid(client_app, 2, rc), cfg)
    rows = [out.rows[r] for r in sorted(out.rows)]
    assert rows[0]["test-accuracy"] > 0.2 and all(math.isfinite(r["server-train-loss"]) for r in rows[1:])
    trained = rows[2:] if method == "mixmatch" else rows[1:]  # MixMatch's round 1: lambda_U = 0, the clients idle
    assert all(math.isfinite(r["train-loss"]) for r in trained) and all(r["idle-replies"] == 0 for r in trained)
    if method == "mixmatch":
        assert rows[1]["idle-replies"] == 2 and "train-loss" not in rows[1]
