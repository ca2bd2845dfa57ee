"""SemiFL (:mod:`fedul_flwr.methods.semifl`) and FedRGD (:mod:`fedul_flwr.methods.fedrgd`): their
losses, static batch norm and grouped averaging by hand on tiny tensors, the seeded group draw,
a 3-round federation of each in each of its settings that trains above chance, and ``fedul
check`` accepting each there."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from torch import nn

from fedul_flwr import server_app, wire
from fedul_flwr.cli import main as fedul
from fedul_flwr.client_app import app as client_app
from fedul_flwr.data.client_data import ClientData, LabeledImages
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import NothingToTrain, RoundContext, get_method
from fedul_flwr.methods.fedrgd.grouping import SERVER_SHARE, GroupedAveraging, blend, draw_groups, group_weights
from fedul_flwr.methods.semifl.sbn import static_batch_norm
from fedul_flwr.methods.semifl.semifl import with_replacement
from fedul_flwr.preflight import resolve_config
from fedul_flwr.rng import numpy_generator

# ----------------------------------------------------------------------------- SemiFL's parts


def test_pseudo_labels_are_the_argmax_kept_at_tau() -> None:
    probs = torch.tensor([[0.96, 0.04], [0.3, 0.7], [0.05, 0.95], [0.5, 0.5]])
    for name in ("semifl", "fedrgd"):
        method = get_method(name)(resolve_config({"method": name, "fixmatch-threshold": 0.95}))
        targets, mask = method.pseudo_labels_from(probs)
        assert targets.tolist() == [0, 1, 1, 0] and mask.tolist() == [True, False, True, False]


def test_mix_partners_are_drawn_with_replacement_and_seeded() -> None:
    order = with_replacement(5, 4)
    first = list(order(torch.Generator().manual_seed(3)))
    assert len(first) == 2 and all(len(b) == 4 and 0 <= int(b.min()) and int(b.max()) < 5 for b in first)
    again = list(order(torch.Generator().manual_seed(3)))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    drawn = torch.cat(list(with_replacement(3, 300)(torch.Generator().manual_seed(0))))
    assert len(drawn) == 300 and len(drawn.unique()) == 3  # with replacement: rows repeat
    with pytest.raises(ValueError, match="rows and a batch size"):
        with_replacement(0, 4)


def _client(n_u: int = 6, labeled: bool = False) -> ClientData:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n_u, 1, 8, 8), dtype=torch.uint8, generator=g)
    part = LabeledImages(images[:4].clone(), torch.tensor([0, 1, 2, 0])) if labeled else None
    return ClientData("test client", ("a", "b", "c"), (0.5,), (0.25,), labeled=part, unlabeled=images)


def test_semifl_client_loss_is_fix_plus_mixup_by_hand() -> None:
    """L = CE(f(A(x_f)), y_f) + lam CE(f(x_mix), y_f) + (1 - lam) CE(f(x_mix), y_m), lam the first
    Beta(a, a) draw of the round's numpy generator."""
    cfg = resolve_config({"method": "semifl", "fixmatch-threshold": 0.0, "semifl-mixup-alpha": 0.5,
                          "batch-size": 4})  # fmt: skip
    method = get_method("semifl")(cfg)
    torch.manual_seed(0)
    models = nn.ModuleDict({"f": nn.Sequential(nn.Flatten(), nn.Linear(64, 3))})
    ctx = RoundContext(seed=7, server_round=2, node_key=1)
    task = method.local_task(_client(), models, ctx)
    assert list(task.streams) == ["fix", "mix"] and task.num_examples == 6  # tau = 0: every image is confident
    g = torch.Generator().manual_seed(1)
    x_f, x_s, x_m = (torch.randn(3, 1, 8, 8, generator=g) for _ in range(3))
    y_f, y_m = torch.tensor([0, 2, 1]), torch.tensor([1, 1, 0])
    batch = {"fix": {"weak": x_f, "strong": x_s, "y": y_f}, "mix": {"weak": x_m, "y": y_m}}
    got = task.loss(models, batch)
    lam = float(numpy_generator("method-numpy", 7, 2, 1).beta(0.5, 0.5))
    f = models["f"]
    mixed = f(lam * x_f + (1 - lam) * x_m)
    want = F.cross_entropy(f(x_s), y_f) + lam * F.cross_entropy(mixed, y_f) + (1 - lam) * F.cross_entropy(mixed, y_m)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    # with labels: the labeled images drive the epoch, their weak views' CE is added
    task = method.local_task(_client(labeled=True), models, RoundContext(seed=7, server_round=2, node_key=1))
    assert list(task.streams) == ["labeled", "fix", "mix"] and task.num_examples == 4
    x_l, y_l = torch.randn(2, 1, 8, 8, generator=g), torch.tensor([2, 0])
    got = task.loss(models, {"labeled": {"weak": x_l, "y": y_l}, **batch})
    assert float(got) == pytest.approx(float(want + F.cross_entropy(f(x_l), y_l)), rel=1e-5)


def test_a_semifl_client_without_labels_or_confident_images_has_nothing_to_train() -> None:
    method = get_method("semifl")(resolve_config({"method": "semifl", "fixmatch-threshold": 1.0}))
    models = nn.ModuleDict({"f": nn.Sequential(nn.Flatten(), nn.Linear(64, 3))})
    with pytest.raises(NothingToTrain, match="no pseudo-label"):
        method.local_task(_client(), models, RoundContext(seed=0, server_round=1, node_key=0))
    # with labels it trains them alone
    task = method.local_task(_client(labeled=True), models, RoundContext(seed=0, server_round=1, node_key=0))
    assert list(task.streams) == ["labeled"]


def test_static_batch_norm_is_the_equal_weight_average_over_batches() -> None:
    """The running mean is the mean of the batch means, the running variance the mean of the
    batches' unbiased variances; the weights, the momentum and the mode are kept."""
    model = nn.Sequential(nn.BatchNorm2d(1, momentum=0.3), nn.Flatten())
    model.eval()
    images = torch.randint(0, 256, (6, 1, 2, 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    to_input = lambda x: x.float() / 255  # noqa: E731
    assert static_batch_norm(model, images, to_input, torch.device("cpu"), 4) == 1
    bn = model[0]
    x = to_input(images)
    batches = [x[:4].flatten(), x[4:].flatten()]
    assert float(bn.running_mean) == pytest.approx(float(sum(b.mean() for b in batches) / 2), rel=1e-5)
    assert float(bn.running_var) == pytest.approx(float(sum(b.var() for b in batches) / 2), rel=1e-5)
    assert bn.momentum == 0.3 and not model.training and float(bn.weight) == 1.0
    assert static_batch_norm(nn.Sequential(nn.Flatten()), images, to_input, torch.device("cpu"), 4) == 0


# ----------------------------------------------------------------------------- FedRGD's groups


def test_groups_are_seeded_by_seed_and_round_and_split_evenly() -> None:
    a = draw_groups(3, 5, 7, 2)
    assert [g.tolist() for g in a] == [g.tolist() for g in draw_groups(3, 5, 7, 2)]  # same seed, same groups
    assert sorted(np.concatenate(a).tolist()) == list(range(7)) and sorted(len(g) for g in a) == [3, 4]
    others = [draw_groups(3, r, 7, 2) for r in range(6, 12)] + [draw_groups(4, 5, 7, 2)]
    assert any([g.tolist() for g in o] != [g.tolist() for g in a] for o in others)
    assert len(draw_groups(0, 1, 2, 5)) == 2  # fewer replies than groups: one each
    with pytest.raises(ValueError, match="groups need"):
        draw_groups(0, 1, 0, 2)


def test_group_weights_by_hand() -> None:
    groups = [np.array([2, 0]), np.array([1])]
    omega, share = group_weights(groups, 3, with_server=True)
    assert omega.tolist() == pytest.approx([1 / 6, 1 / 4, 1 / 6]) and share == pytest.approx(5 / 12)
    assert omega.sum() + share == pytest.approx(1.0)
    omega, share = group_weights(groups, 3, with_server=False)
    assert omega.tolist() == pytest.approx([1 / 4, 1 / 2, 1 / 4]) and share == 0.0


def test_grouped_averaging_by_hand_on_fedavg() -> None:
    """Three replies w_k = 1, 2, 4 and the server's model 10: the mean over the groups of (w_s +
    the group's models) / (|G| + 1), whatever weights the clients sent."""
    strategy_class = type("Grouped", (GroupedAveraging, FedAvg), {"groups": 2, "seed": 11})
    strategy = strategy_class(weighted_by_key=wire.NUM_EXAMPLES, min_available_nodes=3, min_train_nodes=3)
    server = ArrayRecord({"f.w": Array(np.array([10.0, -10.0], dtype=np.float32))})
    asked = list(strategy.configure_train(1, server, ConfigRecord(), InProcessGrid(client_app, 3, {})))
    values = [1.0, 2.0, 4.0]
    replies = [
        Message(RecordDict({wire.ARRAYS: ArrayRecord({"f.w": Array(np.array([v, -v], dtype=np.float32))}),
                            wire.METRICS: MetricRecord({wire.NUM_EXAMPLES: 10 * (i + 1), wire.TRAIN_LOSS: 0.0})}),
                reply_to=m)
        for i, (v, m) in enumerate(zip(values, asked, strict=True))
    ]  # fmt: skip
    groups = draw_groups(11, 1, 3, 2)
    for with_server in (False, True):
        strategy.server_step = (lambda a, r: (a, {})) if with_server else None
        arrays, metrics = strategy.aggregate_train(1, replies)
        means = [(10.0 * with_server + sum(values[i] for i in g)) / (len(g) + with_server) for g in groups]
        assert arrays is not None and metrics is not None
        assert arrays["f.w"].numpy().tolist() == pytest.approx([np.mean(means), -np.mean(means)], rel=1e-6)
        assert metrics[SERVER_SHARE] == pytest.approx(group_weights(groups, 3, with_server)[1])


def test_blend_keeps_integer_arrays_and_dtypes() -> None:
    agg = ArrayRecord({"a": Array(np.array([1.0], dtype=np.float32)), "n": Array(np.array(4, dtype=np.int64))})
    srv = ArrayRecord({"a": Array(np.array([3.0], dtype=np.float32)), "n": Array(np.array(9, dtype=np.int64))})
    out = blend(agg, srv, 0.25)
    assert out["a"].numpy().tolist() == [1.5] and out["a"].numpy().dtype == np.float32 and out["n"].numpy().shape == () and int(out["n"].numpy()) == 4


# ----------------------------------------------------------------------------- federations

SETTINGS = [(m, s) for m in ("semifl", "fedrgd") for s in ("labels-at-server", "labels-at-clients")]


@pytest.mark.parametrize(("method", "setting"), SETTINGS)
def test_three_rounds_train_above_chance(method: str, setting: str, tmp_path: Path, small_test_set: None) -> None:
    rc = {"method": method, "client-setting": setting, "samples-per-client": 100, "num-rounds": 3, "batch-size": 16,
          "fixmatch-mu": 2, "fixmatch-threshold": 0.7, "output-dir": str(tmp_path), "run-name": "run"}  # fmt: skip
    rc.update({"num-labeled": 150, "server-epochs": 3} if setting == "labels-at-server" else {"num-labeled": 150})
    outputs = server_app.run_federation(InProcessGrid(client_app, 3, rc), resolve_config(rc))
    rows = [outputs.rows[r] for r in sorted(outputs.rows)]
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert rows[-1]["test-accuracy"] > 0.2
    trained = [r for r in rows[1:] if "train-loss" in r]
    assert trained and all(math.isfinite(r["train-loss"]) and 0 <= r["pseudo-label-share"] <= 1 for r in trained)
    if setting == "labels-at-server":
        assert all(math.isfinite(r["server-train-loss"]) for r in trained)
    if method == "fedrgd":  # 3 replies in 2 groups of 2 and 1: a = (1/3 + 1/2) / 2 with the server's model
        assert all(r[SERVER_SHARE] == pytest.approx(5 / 12 if setting == "labels-at-server" else 0.0) for r in trained)


@pytest.mark.parametrize(("method", "setting"), SETTINGS)
def test_fedul_check_accepts_each_in_its_settings(method: str, setting: str, capsys: pytest.CaptureFixture[str]) -> None:
    values = f'method="{method}" client-setting="{setting}" num-labeled=200'
    assert fedul(["check", "--run-config", values]) == 0, capsys.readouterr().err
    assert fedul(["check", "--run-config", f'method="{method}" client-setting="usets"']) == 1
    if method == "fedrgd":  # a strategy that ignores the replies' weights would drop the groups
        assert fedul(["check", "--run-config", f'{values} strategy="fedmedian"']) == 1
        assert "ignores the replies' weights" in capsys.readouterr().err
    if setting == "labels-at-clients":  # and the annotation-heterogeneity setting's 20 clients
        values = f'method="{method}" client-setting="annotation-heterogeneity"'
        assert fedul(["check", "--run-config", values, "--federation-config", "num-supernodes=20"]) == 0


def test_a_semifl_client_with_nothing_to_train_under_scaffold_option_one_sits_out(tmp_path: Path) -> None:
    """SCAFFOLD's option I builds the local task before the update (its control variate is the
    gradient at the global model), and SemiFL's task has nothing to train when no pseudo-label
    reaches tau = 1: the client is idle there too, not failed (before, each such client counted
    against max-failure-fraction and stopped the run)."""
    rc = {"method": "semifl", "client-setting": "labels-at-server", "num-labeled": 100, "samples-per-client": 100,
          "batch-size": 16, "fixmatch-threshold": 1.0, "strategy": "scaffold", "scaffold-option": "I",
          "num-rounds": 1, "output-dir": str(tmp_path), "run-name": "idle"}  # fmt: skip
    outputs = server_app.run_federation(InProcessGrid(client_app, 2, rc), resolve_config(rc))
    assert outputs.rows[1]["failed-replies"] == 0 and outputs.rows[1]["idle-replies"] == 2, outputs.rows[1]
