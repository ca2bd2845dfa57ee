"""FixMatch, FedDB's debiased pseudo-labels (DPL) and debiased model aggregation (DMA), and
the labels-at-clients setting they train on."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedul_flwr.client_app import app as client_app
from fedul_flwr.preflight import resolve_config
from fedul_flwr.data import simulated
from fedul_flwr.data.labels_at_clients import draw_labeled_pool, split_to_clients
from fedul_flwr.data.partition import dirichlet_partition, iid_partition
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods.feddb.dpl import debias, debiased_pseudo_labels
from fedul_flwr.methods.fixmatch.fixmatch import unlabeled_loss
from fedul_flwr.server_app import run_federation
from fedul_flwr.strategies.dma import dma_weights
from fedul_flwr.experiments.tables import table_rows


def test_debiased_posterior_is_eq14_by_hand() -> None:
    """ptilde[y] = (p[y] / pbar[y]) / sum_k p[k] / pbar[k]; a class the clients over-predict
    loses its pseudo-labels to the others."""
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.5, 0.1, 0.4], [0.96, 0.02, 0.02]])
    app_u = torch.tensor([0.6, 0.2, 0.2])
    got = debias(probs, app_u)
    for row, p in zip(got.tolist(), probs.tolist(), strict=True):
        ratios = [p[k] / float(app_u[k]) for k in range(3)]
        assert row == pytest.approx([r / sum(ratios) for r in ratios], rel=1e-6)
    targets, mask = debiased_pseudo_labels(probs, app_u, tau=0.8)
    assert targets.tolist() == [0, 2, 0]  # row 1: 0.5 / 0.6 < 0.4 / 0.2, class 2 wins after debiasing
    assert mask.tolist() == [False, False, True]  # 0.96/0.6 / (1.6 + 0.1 + 0.1) = 0.889 > 0.8
    with pytest.raises(ValueError, match="APP-U must be > 0"):
        debias(probs, torch.tensor([0.5, 0.5, 0.0]))


def _hand_dma(p: np.ndarray, loss: str, steps: int, lr: float) -> np.ndarray:
    """DMA by hand: gradients of ||beta P - u||_2 (P^T d / ||d||) or mean((beta P - u)^2) (2 P^T d / K)."""
    s, k = p.shape
    beta = np.full(s, 1.0 / s)
    for _ in range(steps):
        d = beta @ p - 1.0 / k
        grad = p @ d / np.linalg.norm(d) if loss == "l2" else 2 * p @ d / k
        z = beta - lr * grad
        beta = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    return beta


@pytest.mark.parametrize("loss", ["l2", "mse"])
def test_dma_weights_equal_the_hand_iteration_sum_to_one_and_lower_the_loss(loss: str) -> None:
    rng = np.random.default_rng(0)
    for _ in range(5):
        p = rng.dirichlet(np.full(10, 0.3), size=8)  # 8 clients' APP-U, strongly skewed
        beta, start, end = dma_weights(p, loss=loss, steps=100, lr=1.0)
        assert beta == pytest.approx(_hand_dma(p, loss, 100, 1.0), rel=1e-9)
        assert beta.sum() == pytest.approx(1.0) and (beta > 0).all()
        assert end <= start
    # a client whose APP-U alone is uniform gets the largest weight
    p = np.vstack([np.full(4, 0.25), [0.7, 0.1, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1]])
    beta, _, _ = dma_weights(p, loss="l2")
    assert int(np.argmax(beta)) == 0
    with pytest.raises(ValueError, match="dma-loss"):
        dma_weights(p, loss="l1")


def test_unlabeled_loss_masks_and_divides_by_the_whole_batch() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    targets, mask = torch.tensor([0, 1, 0]), torch.tensor([True, False, True])
    ce = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    assert float(unlabeled_loss(logits, targets, mask)) == pytest.approx(float(ce[0] + ce[2]) / 3)


def test_labeled_pool_is_class_balanced_and_partitioned_apart_from_the_unlabeled_pool() -> None:
    labels = np.repeat(np.arange(10), 300)
    pool = draw_labeled_pool(labels, 105, 10, np.random.default_rng(0))
    assert np.bincount(labels[pool]).tolist() == [11] * 5 + [10] * 5
    splits = split_to_clients(labels, 200, 10, lambda y, seed: dirichlet_partition(y, 4, 0.3, seed, min_partition_size=5),
                              (1, 2, 3))  # fmt: skip
    labeled = np.concatenate([s.labeled for s in splits])
    assert len(labeled) == len(set(labeled)) == 200
    assert np.bincount(labels[labeled]).tolist() == [20] * 10
    for s in splits:  # the unlabeled part holds the client's labeled images too
        assert set(s.labeled) <= set(s.unlabeled)
    unlabeled_only = np.concatenate([np.setdiff1d(s.unlabeled, s.labeled) for s in splits])
    assert len(unlabeled_only) == len(set(unlabeled_only)) == 3000 - 200
    # independent partitions: a client's labeled and unlabeled class mixes differ
    mixes = [(np.bincount(labels[s.labeled], minlength=10), np.bincount(labels[s.unlabeled], minlength=10)) for s in splits]
    assert any(np.argmax(a) != np.argmax(b) for a, b in mixes)
    with pytest.raises(ValueError, match="num-labeled=5 must be >= the 10 classes"):
        draw_labeled_pool(labels, 5, 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="class 0 has 300 images, fewer than its 301 labels"):
        draw_labeled_pool(labels, 3010, 10, np.random.default_rng(0))
    same = split_to_clients(labels, 200, 10, lambda y, seed: iid_partition(y, 4, seed), (1, 2, 3))
    again = split_to_clients(labels, 200, 10, lambda y, seed: iid_partition(y, 4, seed), (1, 2, 3))
    assert all(np.array_equal(a.unlabeled, b.unlabeled) for a, b in zip(same, again, strict=True))


def test_simulated_labels_at_clients_clients_of_the_embedded_sample() -> None:
    cfg = resolve_config({"client-setting": "labels-at-clients", "num-labeled": 100})
    client = simulated.load_client(cfg, 1, 4, frozenset({"labeled", "unlabeled"}))
    assert client.labeled is not None and client.unlabeled is not None
    assert len(client.labeled) == 25 and len(client.unlabeled) > 10 * len(client.labeled)
    capped = resolve_config({"client-setting": "labels-at-clients", "num-labeled": 100, "samples-per-client": 300,
                             "client-test-fraction": 0.1})  # fmt: skip
    small = simulated.load_client(capped, 1, 4, frozenset({"labeled", "unlabeled"}))
    assert small.test is not None and len(small.test) == 30 and len(small.unlabeled) == 270 + 25
    # a cap: a client holding fewer unlabeled images keeps them all (the small clients of a Dirichlet split)
    whole = simulated.load_client(cfg, 0, 4, frozenset({"labeled", "unlabeled"}))
    above = resolve_config({"client-setting": "labels-at-clients", "num-labeled": 100, "samples-per-client": 10**6})
    assert torch.equal(simulated.load_client(above, 0, 4, frozenset({"labeled", "unlabeled"})).unlabeled, whole.unlabeled)


def test_pseudo_label_correct_share_counts_kept_pseudo_labels_of_the_true_class() -> None:
    """A model whose weak-view logits are set per image: kept and right, kept and wrong, not
    kept. The diagnostic counts only the first; no loss reads the true classes."""
    from torch import nn

    from fedul_flwr.methods.base import method_class

    cfg = resolve_config({"client-setting": "labels-at-clients", "num-labeled": 100, "method": "fixmatch"})
    client = simulated.load_client(cfg, 1, 4, frozenset({"labeled", "unlabeled"}))
    assert client.unlabeled_classes is not None and client.unlabeled is not None
    assert len(client.unlabeled_classes) == len(client.unlabeled)

    class SetLogits(nn.Module):  # logits = scale * one_hot(class), both read from the image
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, 0, 0, 1:2] * torch.nn.functional.one_hot(x[:, 0, 0, 0].long(), 10).float()

    def images(rows: list[tuple[int, float]]) -> torch.Tensor:
        x = torch.zeros(len(rows), 1, 28, 28)
        for i, (cls, scale) in enumerate(rows):
            x[i, 0, 0, 0], x[i, 0, 0, 1] = cls, scale
        return x

    method = method_class("fixmatch")(cfg)
    models = nn.ModuleDict({"f": SetLogits()})
    task = method.local_task(client, models, None)  # type: ignore[arg-type]
    weak = images([(3, 20.0), (1, 20.0), (4, 0.1)])  # kept + right, kept + wrong, not kept
    batch = {"labeled": {"weak": images([(0, 1.0)]), "y": torch.tensor([0])},
             "unlabeled": {"weak": weak, "strong": weak.clone(), "classes": torch.tensor([3, 2, 4])}}  # fmt: skip
    task.loss(models, batch)
    sent = method.uploads(client, models, None)  # type: ignore[arg-type]
    assert sent["pseudo-label-share"] == pytest.approx(2 / 3)
    assert sent["pseudo-label-correct-share"] == pytest.approx(1 / 3)
    without = method_class("fixmatch")(cfg)  # a deployed node: the classes are unknown
    node = dataclasses.replace(client, unlabeled_classes=None)
    without.local_task(node, models, None).loss(models, {**batch, "unlabeled": {"weak": weak, "strong": weak}})  # type: ignore[arg-type]
    assert set(without.uploads(node, models, None)) == {"pseudo-label-share"}  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="true classes for"):
        dataclasses.replace(client, unlabeled_classes=client.unlabeled_classes[:3])


class _ReplyGrid(InProcessGrid):
    """Keeps every reply the clients send."""

    def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
        replies = list(super().pull_messages(message_ids))
        self.replies.extend(replies)
        return replies


def test_feddb_federation_records_app_u_and_the_dma_weights(tmp_path: Path, small_test_set: None) -> None:
    """Two rounds of FedDB on the embedded sample: a reply holds only f's arrays, APP-U and
    scalar metrics; the round's aggregated APP-U is a distribution, beta has one weight per
    client and sums to 1, DMA lowered L_aggr."""
    rc = {"output-dir": str(tmp_path), "run-name": "feddb", "num-rounds": 2, "method": "feddb",
          "client-setting": "labels-at-clients", "num-labeled": 60, "batch-size": 8, "fixmatch-mu": 2,
          "min-available-nodes": 3, "min-train-nodes": 3}  # fmt: skip
    grid = _ReplyGrid(client_app, 3, rc)
    grid.replies = []
    run_federation(grid, resolve_config(rc))
    assert len(grid.replies) == 6
    for reply in grid.replies:
        assert set(reply.content.array_records) == {"arrays"}
        assert all(key.startswith("f.") for key in reply.content["arrays"])
        lists = {k for k, v in reply.content["metrics"].items() if isinstance(v, list)}
        assert lists == {"app-u"} and len(reply.content["metrics"]["app-u"]) == 10
    rows = json.loads((tmp_path / "feddb" / "metrics.json").read_text())
    for row in rows[1:]:
        assert len(row["app-u"]) == 10 and sum(row["app-u"]) == pytest.approx(1.0, abs=1e-5)
        assert len(row["dma-beta"]) == 3 and sum(row["dma-beta"]) == pytest.approx(1.0)
        assert row["dma-loss"] <= row["dma-loss-uniform"]
        assert 0.0 <= row["pseudo-label-correct-share"] <= row["pseudo-label-share"] <= 1.0



def test_feddb_diagnostics_by_hand() -> None:
    """The ablation's 'why' tables: share in %, APP-U max/min, 1/sum(beta^2), DMA losses;
    a round a record lacks is left out of the mean and the cell says so."""
    from fedul_flwr.experiments.feddb_diagnostics import diagnostics_of, render_diagnostics

    row = {"round": 10, "pseudo-label-share": 0.25, "app-u": [0.2, 0.4, 0.4], "dma-beta": [0.5, 0.25, 0.25],
           "dma-loss-uniform": 0.3, "dma-loss": 0.1, "pseudo-label-correct-share": 0.2}  # fmt: skip
    got = diagnostics_of(row)
    assert got["share"] == pytest.approx(25.0) and got["app-u-ratio"] == pytest.approx(2.0)
    assert got["pseudo-label-accuracy"] == pytest.approx(80.0)  # 0.2 of the images kept and right, of 0.25 kept
    assert got["effective-clients"] == pytest.approx(1 / (0.25 + 0.0625 + 0.0625))
    assert (got["dma-loss-uniform"], got["dma-loss"]) == (0.3, 0.1)
    assert diagnostics_of({"round": 3, "test-error": 0.2}) == {}
    # HASSLE's class mix: kept shares per class 0.5, 0.3, 0.1, 0.1 -> 80% in the two largest
    assert diagnostics_of({"round": 1, "pseudo-label-classes": [0.1, 0.5, 0.1, 0.3]})["top2-classes"] == pytest.approx(80.0)
    spec = {"row": "IID", "column": "FedDB"}
    records = [{"spec": spec, "metrics": [row]}, {"spec": spec, "metrics": [{**row, "round": 50, "pseudo-label-share": 0.75}]}]
    text = render_diagnostics(records, rounds=(10, 50))
    assert ["IID", "FedDB", "25.0 (1 of 2 seeds)", "75.0 (1 of 2 seeds)"] in table_rows(text)
    assert ["IID", "FedDB", "2.67 (1 of 2 seeds)", "2.67 (1 of 2 seeds)"] in table_rows(text)  # effective clients
    assert render_diagnostics([{"spec": spec, "metrics": [{"round": 10, "test-error": 0.1}]}]) == ""


def _local_round(overrides: dict, partition: int = 1, clients: int = 4, epochs: int = 1, lr: float = 0.05):  # type: ignore[no-untyped-def]
    """One real local round of a FixMatch-family method on simulated client ``partition``:
    (method, client, the received models, the trained models, the TrainResult)."""
    import copy

    from torch import nn

    from fedul_flwr.methods.base import RoundContext, method_class
    from fedul_flwr.models import build_model
    from fedul_flwr.training import LocalLoop

    cfg = resolve_config({"client-setting": "labels-at-clients", "num-labeled": 100, "samples-per-client": 300,
                          "batch-size": 16, "fixmatch-mu": 2, "eval-batch-size": 64, **overrides})  # fmt: skip
    client = simulated.load_client(cfg, partition, clients, frozenset({"labeled", "unlabeled"}))
    method = method_class(cfg.method)(cfg)
    channels, side = client.image_shape[0], client.image_shape[1]
    models = nn.ModuleDict({"f": build_model("small-cnn", channels, client.num_classes, side, seed=0)})
    received = copy.deepcopy(models)
    ctx = RoundContext(seed=0, server_round=1, node_key=partition)
    loop = LocalLoop(epochs=epochs, lr=lr, l1_weight=0.0, optimizer="sgd", seed=ctx.batch_seed,
                     device=torch.device("cpu"), to_input=client.to_input)  # fmt: skip
    result = method.local_update(client, models, ctx, loop)
    return method, client, received, models, result


@pytest.mark.parametrize("weight", ["epoch", "all", "used"])
def test_fixmatch_weight_counts_by_hand(weight: str) -> None:
    """One epoch of a client with n_L labeled and n_U unlabeled images: ``epoch`` counts the
    n_L rows the epoch passes over, ``all`` n_L + n_U; ``used`` the labeled rows plus the
    kept pseudo-labels -- with tau = 1 (a softmax never reaches it here) only the n_L labeled
    rows, with tau = 0 also every unlabeled row drawn: mu B per step, ceil(n_L / B) steps."""
    method, client, _, _, result = _local_round({"method": "fixmatch", "fixmatch-weight": weight, "fixmatch-threshold": 1.0})
    n_l, n_u = len(client.labeled), len(client.unlabeled)
    assert n_l > 0 and n_u > 0
    assert result.num_examples == {"epoch": n_l, "all": n_l + n_u, "used": n_l}[weight]
    assert method.sent_models(client, None) == ("f",)  # type: ignore[arg-type]
    if weight == "used":
        *_, result = _local_round({"method": "fixmatch", "fixmatch-weight": "used", "fixmatch-threshold": 0.0})
        steps = -(-n_l // 16)
        assert result.num_steps == steps
        assert result.num_examples == n_l + steps * 2 * 16


def test_fixmatch_weight_used_sends_no_model_from_a_client_without_used_examples() -> None:
    """An unlabeled client of the annotation-heterogeneity setting whose pseudo-labels all fall
    below tau trained on nothing: under ``used`` it counts 0 and sends no model (the
    aggregation leaves it out); under ``epoch`` it sends the model with its n_U."""
    from torch import nn

    from fedul_flwr.methods.base import RoundContext, method_class
    from fedul_flwr.models import build_model
    from fedul_flwr.training import LocalLoop

    for weight, count, sent in (("used", 0, ()), ("epoch", None, ("f",))):
        cfg = resolve_config({"client-setting": "annotation-heterogeneity", "label-layout": "L,U", "samples-per-client": 200,
                              "method": "fixmatch", "fixmatch-threshold": 1.0, "fixmatch-weight": weight, "batch-size": 16})  # fmt: skip
        client = simulated.load_client(cfg, 1, 2, frozenset({"labeled", "unlabeled"}))
        assert client.labeled is None and client.unlabeled is not None
        method = method_class("fixmatch")(cfg)
        models = nn.ModuleDict({"f": build_model("small-cnn", 1, 10, 28, seed=0)})
        loop = LocalLoop(epochs=1, lr=0.05, l1_weight=0.0, optimizer="sgd", seed=0, device=torch.device("cpu"),
                         to_input=client.to_input)  # fmt: skip
        result = method.local_update(client, models, RoundContext(0, 1, 1), loop)
        assert result.num_examples == (len(client.unlabeled) if count is None else count)
        assert method.sent_models(client, None) == sent  # type: ignore[arg-type]


def test_app_u_average_takes_each_epochs_prediction_before_its_update() -> None:
    """Alg. 3 on two local epochs with gamma = 0.5: pbar = 0.25 pbar_DPL + 0.25 pbar^1 +
    0.5 pbar^2, where pbar^1 is the received model's mean prediction and pbar^2 that of the
    weights after the first epoch (w^1) -- not those after the second (w^2). The weak views
    of the three passes are drawn in turn from the round's generator, replayed here."""
    from fedul_flwr.augment import Augmentation
    from fedul_flwr.methods.base import RoundContext
    from fedul_flwr.methods.feddb.dpl import predict_weak

    over = {"method": "fixmatch-dpl", "dpl-ema": 0.5, "dpl-app-u-update": "epoch"}
    method, client, w0, w2, _ = _local_round(over, epochs=2)
    *_, w1, _ = _local_round(over, epochs=1)  # the first epoch is the same: same batches, same views
    weak = Augmentation("weak", client.image_shape[1], client.flip)
    generator = RoundContext(seed=0, server_round=1, node_key=1).generator

    def mean(models) -> torch.Tensor:  # type: ignore[no-untyped-def]
        f = models["f"]
        return predict_weak(f, f, client.unlabeled, weak, generator, client.to_input, torch.device("cpu"), 64).mean(dim=0)

    p_dpl, p1 = mean(w0), mean(w0)
    state = generator.get_state()
    p2 = mean(w1)
    torch.testing.assert_close(method.dpl.app_u, 0.25 * p_dpl + 0.25 * p1 + 0.5 * p2)
    generator.set_state(state)
    after = mean(w2)  # the order before: the weights after the epoch
    assert not torch.allclose(method.dpl.app_u, 0.25 * p_dpl + 0.25 * p1 + 0.5 * after, atol=1e-4)
