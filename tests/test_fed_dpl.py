"""FedDB's debiased pseudo-labels as a plug-in (``dpl = true``) for the methods that pseudo-label:
the threshold applies to Eq. 14's debiased posterior, APP-U starts from the received model and is
updated before every local epoch, the clients upload it, and without ``dpl`` nothing changes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedul_flwr import server_app
from fedul_flwr.client_app import app as client_app
from fedul_flwr.config import ConfigError
from fedul_flwr.data.simulated import load_client
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import get_method
from fedul_flwr.methods.base import RoundContext
from fedul_flwr.methods.feddb.debias import APP_U, DebiasedPseudoLabels
from fedul_flwr.models import build_model
from fedul_flwr.preflight import resolve_config
from torch import nn

SSL = {"client-setting": "labels-at-clients", "num-labeled": 100, "samples-per-client": 120, "batch-size": 32,
       "fixmatch-mu": 2, "eval-batch-size": 64}  # fmt: skip


def _method(name: str, dpl: bool):
    cfg = resolve_config({**SSL, "method": name, "dpl": dpl})
    return get_method(name)(cfg), cfg


@pytest.mark.parametrize("name", ["semifl", "fedrgd"])
def test_the_threshold_applies_to_the_debiased_posterior(name: str) -> None:
    method, cfg = _method(name, True)
    client = load_client(cfg, 0, 2, frozenset({"labeled", "unlabeled"}))
    models = nn.ModuleDict({"f": build_model("small-cnn", 1, 10, 28, seed=0)})
    method.begin_dpl(client, models, RoundContext(cfg.seed, 1, 0))
    app_u = method.dpl.app_u
    assert app_u.shape == (10,) and float(app_u.sum()) == pytest.approx(1.0, abs=1e-5)
    probs = torch.softmax(torch.randn(6, 10, generator=torch.Generator().manual_seed(1)) * 4, dim=1)
    ratio = probs / app_u
    by_hand = ratio / ratio.sum(dim=1, keepdim=True)  # Eq. 14
    targets, mask = method.pseudo_labels_from(probs)
    assert torch.equal(targets, by_hand.argmax(dim=1))
    assert torch.equal(mask, by_hand.max(dim=1).values >= cfg.option("fixmatch-threshold"))
    assert list(method.dpl_uploads()) == [APP_U]
    plain, _ = _method(name, False)
    plain.begin_dpl(client, models, RoundContext(cfg.seed, 1, 0))
    assert torch.equal(plain.pseudo_labels_from(probs)[0], probs.argmax(dim=1)) and plain.dpl_uploads() == {}


def test_app_u_is_updated_before_each_epoch_with_the_weights_it_starts_from() -> None:
    method, cfg = _method("semifl", True)
    client = load_client(cfg, 0, 2, frozenset({"labeled", "unlabeled"}))
    f = build_model("small-cnn", 1, 10, 28, seed=0)
    plugin = DebiasedPseudoLabels(method, client, nn.ModuleDict({"f": f}), RoundContext(cfg.seed, 1, 0))
    start = plugin.app_u.clone()
    constant = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))  # predicts softmax(bias) whatever the view
    with torch.no_grad():
        constant[1].weight.zero_()
        constant[1].bias.copy_(torch.arange(10.0) / 5)
    fresh = torch.softmax(torch.arange(10.0) / 5, dim=0)
    plugin.before_epoch(nn.ModuleDict({"f": constant}))
    gamma = cfg.option("dpl-ema")
    assert torch.allclose(plugin.app_u, gamma * start + (1 - gamma) * fresh, atol=1e-6)


@pytest.mark.parametrize("name", ["semifl", "fedrgd", "fedmatch"])
def test_a_federation_uploads_app_u_only_with_dpl(name: str, tmp_path: Path) -> None:
    rows = {}
    for dpl in (False, True):
        rc = {**SSL, "method": name, "dpl": dpl, "num-rounds": 1, "output-dir": str(tmp_path), "run-name": f"{name}-{dpl}"}
        rows[dpl] = server_app.run_federation(InProcessGrid(client_app, 2, rc), resolve_config(rc)).rows[1]
    assert APP_U not in rows[False] and len(rows[True][APP_U]) == 10


def test_a_method_without_the_plug_in_refuses_dpl_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^dpl=true: method='fixmatch' takes no debiased pseudo-labels plug-in; .*"
                                          r"'fedmatch', 'fedrgd', 'semifl'.*method='fixmatch-dpl'\)$"):
        resolve_config({**SSL, "method": "fixmatch", "dpl": True})
    resolve_config({**SSL, "method": "fixmatch", "dpl": False})


def test_semifl_debiases_by_the_mean_of_its_own_pseudo_labelling_pass() -> None:
    """SemiFL-FedDPL: APP-U is the mean of the round's one pass that pseudo-labels (Eq. 8), so
    SemiFL and SemiFL-FedDPL see the same weak views for one seed, and no extra pass or
    per-epoch update is made (the pseudo-labels are fixed for the round)."""
    from fedul_flwr.augment import Augmentation
    from fedul_flwr.methods.feddb.debias import predict_weak

    tasks, apps = {}, {}
    for dpl in (False, True):
        method, cfg = _method("semifl", dpl)
        client = load_client(cfg, 0, 2, frozenset({"labeled", "unlabeled"}))
        models = nn.ModuleDict({"f": build_model("small-cnn", 1, 10, 28, seed=0)})
        ctx = RoundContext(cfg.seed, 1, 0)
        tasks[dpl] = method.local_task(client, models, ctx)
        apps[dpl] = method.dpl_uploads().get(APP_U)
        after = torch.rand(3, generator=ctx.generator)  # the generator's state after the task was built
        again = RoundContext(cfg.seed, 1, 0)
        probs = predict_weak(models["f"], models["f"], client.unlabeled, Augmentation("weak", 28, client.flip),
                             again.generator, client.to_input, again.device, cfg.eval_batch_size)  # fmt: skip
        assert torch.equal(after, torch.rand(3, generator=again.generator))  # one pass, no draw besides it
        if dpl:
            assert torch.allclose(torch.tensor(apps[dpl]), probs.mean(dim=0), atol=1e-6)
    assert apps[False] is None and tasks[True].before_epoch is None and tasks[False].before_epoch is None
