"""HASSLE / SUMA: the losses of Eqs. 7-9 and 11 by hand, what each client type sends, and the
per-model aggregation (weights, models nobody sent); its baselines on the same split, where a
client without the data a method trains on sits the round out."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedul_flwr.client_app import app as client_app
from fedul_flwr.preflight import resolve_config
from fedul_flwr.config import ConfigError
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods.hassle.losses import pseudo_labels, residual_loss
from fedul_flwr.server_app import run_federation
from fedul_flwr.experiments.tables import table_rows

pytestmark = pytest.mark.usefixtures("small_test_set")  # central evaluation on 500 test images (tests/conftest.py)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def test_residual_loss_is_eqs_7_to_9_by_hand() -> None:
    """CE(base + r, y) + lambda T^2 KL(softmax((other - base)/T) || softmax(r/T)), row mean."""
    r = torch.tensor([[0.5, -0.2, 0.1], [1.0, 0.0, -1.0]])
    base = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.5, 0.2]])
    other = torch.tensor([[1.0, 1.0, 0.0], [0.3, 0.1, 0.9]])
    y = torch.tensor([0, 2])
    t, lam = 2.0, 0.7
    rows = []
    for i in range(2):
        ce = -_log_softmax((base[i] + r[i]).numpy())[y[i]]
        target = _log_softmax(((other[i] - base[i]) / t).numpy())
        student = _log_softmax((r[i] / t).numpy())
        rows.append(ce + lam * t**2 * float((np.exp(target) * (target - student)).sum()))
    assert float(residual_loss(r, base, other, y, t, lam)) == pytest.approx(np.mean(rows), rel=1e-5)
    masked = residual_loss(r, base, other, y, t, lam, torch.tensor([False, True]))
    assert float(masked) == pytest.approx(rows[1], rel=1e-5)
    # a residual equal to the tempered target difference has no KL left
    exact = residual_loss(other - base, base, other, y, 1.0, 5.0)
    assert float(exact) == pytest.approx(float(torch.nn.functional.cross_entropy(other, y)), rel=1e-5)


def test_pseudo_labels_argmax_and_threshold() -> None:
    logits = torch.tensor([[3.0, 0.0], [0.1, 0.0], [0.0, 4.0]])
    targets, mask = pseudo_labels(logits, 0.0)
    assert targets.tolist() == [0, 0, 1] and mask.all()
    _, mask = pseudo_labels(logits, 0.95)
    assert mask.tolist() == [True, False, True]


def test_sm_um_em_in_one_pass_equal_each_alone_and_run_each_model_once_per_batch() -> None:
    from torch import nn

    from fedul_flwr.methods.base import method_class
    from fedul_flwr.models import build_model
    from fedul_flwr.evaluation import evaluate, evaluate_predictors

    cfg = resolve_config({"method": "hassle", "client-setting": "annotation-heterogeneity"})
    hassle = method_class("hassle")(cfg)
    torch.manual_seed(0)
    models = nn.ModuleDict({s.name: build_model("small-cnn", 1, 10, 28, width=s.width) for s in hassle.model_specs()})
    calls = {name: 0 for name in models}
    for name, model in models.items():
        model.register_forward_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 256, (70, 1, 28, 28), dtype=torch.uint8, generator=g), torch.randint(0, 10, (70,), generator=g)
    to_input = lambda u: u.float() / 255  # noqa: E731
    together = evaluate_predictors(models, hassle.predictors(), x, y, to_input=to_input, batch_size=32)
    # 3 batches; EM reuses SM's and UM's forwards, w_S_prev alone SM's; SM and UM use the
    # paired copies of w_S, w_U; the newest w_S and w_U run for the diagnostics alone
    assert calls == {name: 3 for name in models}
    for name, predict in hassle.predictors().items():
        assert together[name] == evaluate(models, predict, x, y, to_input=to_input, batch_size=32)
    assert together["EM"] != together["SM"] != together["UM"]


class _ReplyGrid(InProcessGrid):
    """Keeps (round, arrays) of every message sent to the nodes, as sent, and every reply."""

    def push_messages(self, messages):  # type: ignore[no-untyped-def]
        messages = list(messages)
        for m in messages:
            arrays = m.content["arrays"]
            self.sent.append((int(m.content["config"]["server-round"]), {k: arrays[k].numpy().copy() for k in arrays}))
        return super().push_messages(messages)

    def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
        replies = list(super().pull_messages(message_ids))
        self.replies.extend(replies)
        return replies


def _run(tmp_path: Path, name: str, layout: str, rounds: int = 2, method: str = "hassle",
         extra: dict | None = None) -> tuple[_ReplyGrid, list[dict], str]:  # fmt: skip
    rc = {"output-dir": str(tmp_path), "run-name": name, "num-rounds": rounds, "method": method,
          "client-setting": "annotation-heterogeneity", "label-layout": layout, "labeled-share": 0.5,
          "samples-per-client": 300, "batch-size": 32, "min-available-nodes": 3, "min-train-nodes": 3, **(extra or {})}  # fmt: skip
    grid = _ReplyGrid(client_app, 3, rc)
    grid.replies, grid.sent = [], []
    outputs = run_federation(grid, resolve_config(rc))
    return grid, json.loads((tmp_path / name / "metrics.json").read_text()), outputs.summary()


def _models_of(reply) -> set[str]:  # type: ignore[no-untyped-def]
    return {k.split(".")[0] for k in reply.content["arrays"]}


def test_each_client_type_sends_only_what_its_data_trains(tmp_path: Path) -> None:
    """Fully labeled: w_S and r_US; partially labeled: all four; unlabeled: w_U and r_SU. SM, UM
    and EM are evaluated every round."""
    grid, rows, summary = _run(tmp_path, "lpu", "L,P,U")
    by_node = {r.metadata.src_node_id: _models_of(r) for r in grid.replies}
    assert by_node == {1: {"w_S", "r_US"}, 2: {"w_S", "r_US", "w_U", "r_SU"}, 3: {"w_U", "r_SU"}}
    assert all({"test-accuracy", "test-accuracy-SM", "test-accuracy-UM"} <= set(r) for r in rows)
    assert f"final-test-accuracy={100 * rows[-1]['test-accuracy']:.2f}%" in summary  # EM, the headline
    assert f"final-test-accuracy-SM={100 * rows[-1]['test-accuracy-SM']:.2f}%" in summary
    assert f"final-test-accuracy-UM={100 * rows[-1]['test-accuracy-UM']:.2f}%" in summary
    assert (tmp_path / "lpu" / "accuracy.png").is_file()
    for reply in grid.replies:
        metrics = reply.content["metrics"]
        assert metrics["num-labeled"] > 0 if "w_S" in _models_of(reply) else metrics["num-labeled"] == 0


def test_components_of_a_checkpoint_match_the_runs_metrics_and_pseudo_labels_by_hand(tmp_path: Path) -> None:
    """hassle_components: SM / UM / EM from the checkpoint equal the run's last metrics; the
    pseudo-label accuracy of w_S alone equals the saved final w_S (model.pt) on every client's
    unlabeled images, counted here."""
    from fedul_flwr.data.image_dataset import normalize
    from fedul_flwr.data.simulated import load_client, load_run_dataset
    from fedul_flwr.experiments.hassle_components import (
        AGREE, PSEUDO_TEACHER, PSEUDO_W_S, components, main, read_components, render_components,
    )
    from fedul_flwr.models import build_model

    _, rows, _ = _run(tmp_path, "parts", "L,P,U")
    got = components(tmp_path / "parts", 3)
    assert got["round"] == 2
    for name, key in (("EM", "test-accuracy"), ("SM", "test-accuracy-SM"), ("UM", "test-accuracy-UM")):
        assert got[name] == pytest.approx(100 * rows[-1][key], abs=1e-9)
    cfg = resolve_config(json.loads((tmp_path / "parts" / "config.json").read_text()))
    data = load_run_dataset(cfg)
    w_s = build_model(cfg.model, data.in_channels, data.num_classes, data.image_size)
    w_s.load_state_dict(torch.load(tmp_path / "parts" / "model.pt"))
    w_s.eval()
    correct = total = 0
    for pid in range(3):
        client = load_client(cfg, pid, 3, frozenset({"labeled", "unlabeled"}))
        if client.unlabeled is not None:
            with torch.no_grad():
                pred = w_s(normalize(client.unlabeled, data.mean, data.std)).argmax(1)
            correct += int((pred == client.unlabeled_classes).sum())
            total += len(client.unlabeled)
    assert total > 0 and got[PSEUDO_W_S] == pytest.approx(100 * correct / total)
    assert 0 <= got[PSEUDO_TEACHER] <= 100 and {"w_S", "w_U", "w_S_prev", "w_S + r_US"} <= set(got)
    # SM's agreement with each dual copy, by hand from the saved final models (the run's last
    # global models: the checkpoint's): SM = f(w_S_prev) + f(r_US)
    saved = {}
    for name, width in (("w_S_prev", 1.0), ("w_U_prev", 1.0), ("r_US", float(cfg.option("hassle-residual-width")))):
        saved[name] = build_model(cfg.model, data.in_channels, data.num_classes, data.image_size, width=width)
        saved[name].load_state_dict(torch.load(tmp_path / "parts" / f"model-{name}.pt"))
        saved[name].eval()
    with torch.no_grad():
        x = normalize(data.test_x, data.mean, data.std)
        sm = (saved["w_S_prev"](x) + saved["r_US"](x)).argmax(1)
        for name, column in AGREE.items():
            assert got[column] == pytest.approx(100 * float((saved[name](x).argmax(1) == sm).double().mean()))
    table = table_rows(render_components({"parts": got}))
    assert table[0][:5] == ["run", "round", "EM", "SM", "UM"] and table[1][:2] == ["parts", "2"]
    # a page keeps the rows of runs measured before (their folders may be gone); a run
    # measured again replaces its row
    page = tmp_path / "components.md"
    earlier = {"gone-run": {"round": 200.0, "EM": 61.5, "w_S": 70.25}, "parts": {"round": 1.0, "EM": 1.0}}
    page.write_text(f"# t\n<!-- --8<-- [start:components] -->\n{render_components(earlier)}\n<!-- --8<-- [end:components] -->\n")
    assert main([str(tmp_path / "parts"), "--clients", "3", "--out", str(page)]) == 0
    rows_on_page = read_components(page)
    assert list(rows_on_page) == ["gone-run", "parts"] and rows_on_page["gone-run"] == earlier["gone-run"]
    assert rows_on_page["parts"] == {k: round(v, 2) for k, v in got.items()}
    page.write_text("no table here")
    with pytest.raises(ValueError, match="components.md: no components table"):
        read_components(page)
    (tmp_path / "fedavg").mkdir()
    (tmp_path / "fedavg" / "config.json").write_text(json.dumps({"method": "supervised"}))
    with pytest.raises(ValueError, match="expected 'hassle'"):
        components(tmp_path / "fedavg", 3)


def _model_arrays(arrays: dict[str, np.ndarray], model: str) -> dict[str, np.ndarray]:
    """``model``'s arrays, keyed by parameter name."""
    return {k.split(".", 1)[1]: v for k, v in arrays.items() if k.split(".")[0] == model}


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_residuals_pair_with_the_dual_model_they_were_trained_against(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The paper after Eq. 10: SM = f(w_S^(t-1)) + f(r_US^(t)) and Eq. 11's pseudo-labels alike.
    The clients receive w_S_prev / w_U_prev (copies of the initial w_S / w_U in round 1, the
    previous round's broadcast w_S / w_U after a round that aggregated their residual), make
    their pseudo-labels with w_S_prev and never send the copies back."""
    import fedul_flwr.methods.hassle as hassle

    teachers: list[dict[str, np.ndarray]] = []
    unlabeled_logits = hassle.Hassle._unlabeled_logits

    def spy(self, name, frozen, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name != "w_S":  # Eq. 11's dual model (r_SU's target is w_S; the other passes run elsewhere)
            teachers.append({k: v.detach().cpu().numpy().copy() for k, v in frozen[name].state_dict().items()})
        return unlabeled_logits(self, name, frozen, *args, **kwargs)

    monkeypatch.setattr(hassle.Hassle, "_unlabeled_logits", spy)
    grid, _, _ = _run(tmp_path, "pairs", "P,P,U")
    b1, b2 = (next(arrays for r, arrays in grid.sent if r == server_round) for server_round in (1, 2))
    for dual, copy in (("w_S", "w_S_prev"), ("w_U", "w_U_prev")):
        assert _same(_model_arrays(b1, copy), _model_arrays(b1, dual))  # round 1: the initial model
        assert _same(_model_arrays(b2, copy), _model_arrays(b1, dual))  # round 2: round 1's broadcast
        assert not _same(_model_arrays(b2, copy), _model_arrays(b2, dual))
    assert len(teachers) == 6  # the three clients hold unlabeled images, two rounds
    assert all(_same(t, _model_arrays(b2, "w_S_prev")) for t in teachers[3:])
    assert all(_same(t, _model_arrays(b1, "w_S")) for t in teachers[:3])
    assert not any("_prev" in model for reply in grid.replies for model in _models_of(reply))


def test_sm_and_um_add_each_residual_to_its_paired_copy_or_to_the_current_model() -> None:
    """hassle-pairing: "previous" (default) adds r_US to w_S_prev; "current" to w_S, with
    four models only."""
    from torch import nn

    from fedul_flwr.methods.base import method_class
    from fedul_flwr.models import build_model

    base = {"method": "hassle", "client-setting": "annotation-heterogeneity"}
    paper = method_class("hassle")(resolve_config(base))
    same_round = method_class("hassle")(resolve_config({**base, "hassle-pairing": "current"}))
    assert [s.name for s in paper.model_specs()] == ["w_S", "w_U", "r_US", "r_SU", "w_S_prev", "w_U_prev"]
    assert [s.name for s in same_round.model_specs()] == ["w_S", "w_U", "r_US", "r_SU"]
    models = nn.ModuleDict({s.name: build_model("small-cnn", 1, 10, 28, seed=i, width=s.width)
                            for i, s in enumerate(paper.model_specs())}).eval()  # fmt: skip
    x = torch.rand(4, 1, 28, 28)
    with torch.no_grad():
        for method, s, u in ((paper, "w_S_prev", "w_U_prev"), (same_round, "w_S", "w_U")):
            sm, um = models[s](x) + models["r_US"](x), models[u](x) + models["r_SU"](x)
            got = {k: p(models, x) for k, p in method.predictors().items()}
            assert torch.equal(got["SM"], sm) and torch.equal(got["UM"], um)
            assert torch.allclose(got["EM"], (sm + um) / 2)
    with pytest.raises(ConfigError, match="hassle-pairing"):
        method_class("hassle").check_options(resolve_config({**base, "hassle-pairing": "next"}))


def test_aggregation_weights_each_model_by_its_counts_and_keeps_unsent_models() -> None:
    """w_S over the clients that sent it by n_L, w_U by n_U; a round where no client has
    labels leaves w_S (and r_US) as they were."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp.strategy import FedAvg

    from fedul_flwr.methods.hassle import HassleAggregation
    from fedul_flwr.strategies import strict

    keys = {"w_S.p": 1.0, "r_US.p": 2.0, "w_U.p": 3.0, "r_SU.p": 4.0}
    current = ArrayRecord({k: Array(np.full(2, v, dtype=np.float32)) for k, v in keys.items()})

    def reply(node: int, models: dict[str, float], n_l: float, n_u: float) -> RecordDict:
        arrays = ArrayRecord({k: Array(np.full(2, v, dtype=np.float32)) for k, v in models.items()})
        metrics = MetricRecord({"num-examples": n_l + n_u, "num-labeled": n_l, "num-unlabeled": n_u})
        return RecordDict({"arrays": arrays, "metrics": metrics, "node": ConfigRecord({"node-key": node})})

    def aggregate(replies: dict[int, RecordDict]) -> dict[str, float]:
        app = ClientApp()

        @app.train()
        def _reply(msg: Message, context: Context) -> Message:
            return Message(replies[context.node_id], reply_to=msg)

        strategy = strict(FedAvg, HassleAggregation)(min_available_nodes=len(replies), min_train_nodes=1)
        grid = InProcessGrid(app, len(replies), {})
        msgs = list(grid.send_and_receive(strategy.configure_train(1, current, ConfigRecord(), grid)))
        arrays, _ = strategy.aggregate_train(1, msgs)
        return {k: float(arrays[k].numpy()[0]) for k in keys}

    got = aggregate({1: reply(1, {"w_S.p": 10.0, "r_US.p": 20.0}, 100, 0),
                     2: reply(2, {"w_S.p": 0.0, "r_US.p": 0.0, "w_U.p": 30.0, "r_SU.p": 40.0}, 300, 100),
                     3: reply(3, {"w_U.p": 70.0, "r_SU.p": 80.0}, 0, 300)})  # fmt: skip
    assert got["w_S.p"] == pytest.approx(10.0 * 100 / 400)  # n_L: 100 and 300
    assert got["r_US.p"] == pytest.approx(20.0 * 100 / 400)
    assert got["w_U.p"] == pytest.approx((30.0 * 100 + 70.0 * 300) / 400)  # n_U: 100 and 300
    assert got["r_SU.p"] == pytest.approx((40.0 * 100 + 80.0 * 300) / 400)
    got = aggregate({1: reply(1, {"w_U.p": 70.0, "r_SU.p": 80.0}, 0, 300)})  # no client with labels
    assert (got["w_S.p"], got["r_US.p"]) == (1.0, 2.0)  # kept
    assert (got["w_U.p"], got["r_SU.p"]) == (70.0, 80.0)


@pytest.mark.parametrize(("method", "trains"), [("supervised", {1, 2}), ("fixmatch", {1, 2, 3}), ("fixmatch-dpl", {2})])
def test_baselines_leave_out_clients_without_their_data(tmp_path: Path, method: str, trains: set[int]) -> None:
    """FedAvg on the labels trains on the fully and the partially labeled client; FixMatch on
    every client (L_s, L_u or both); FixMatch-DPL (labels and unlabeled images) on the partially
    labeled one only. The others sit the round out: no array in the reply, no step, and the
    train metrics come from those that trained."""
    grid, rows, _ = _run(tmp_path, method, "L,P,U", method=method)
    for reply in grid.replies:
        metrics = reply.content["metrics"]
        if reply.metadata.src_node_id in trains:
            assert _models_of(reply) == {"f"} and metrics["num-steps"] > 0
        else:
            assert len(reply.content["arrays"]) == 0 and metrics["num-steps"] == 0 and metrics["num-examples"] == 0
    assert all(r["train-loss"] > 0 for r in rows if r["round"] >= 1)


def test_a_round_without_any_training_client_keeps_the_global_model() -> None:
    """Every method's default aggregation (PerModelAggregation): replies without arrays are
    left out of the model and of the metrics; when every client sat out, the strategy returns
    no arrays and the model stays."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp.strategy import FedAvg

    from fedul_flwr.methods.supervised import Supervised
    from fedul_flwr.strategies import strict

    current = ArrayRecord({"f.p": Array(np.full(2, 1.0, dtype=np.float32))})

    def reply(value: float | None, n: int, loss: float) -> RecordDict:
        arrays = ArrayRecord() if value is None else ArrayRecord({"f.p": Array(np.full(2, value, dtype=np.float32))})
        metrics = MetricRecord({"num-examples": n, "train-loss": loss, "num-steps": int(n > 0)})
        return RecordDict({"arrays": arrays, "metrics": metrics})

    def aggregate(replies: dict[int, RecordDict]) -> tuple[ArrayRecord, MetricRecord | None]:
        app = ClientApp()

        @app.train()
        def _reply(msg: Message, context: Context) -> Message:
            return Message(replies[context.node_id], reply_to=msg)

        mixin = Supervised(resolve_config({"method": "supervised"})).aggregation()
        strategy = strict(FedAvg, mixin)(min_available_nodes=len(replies), min_train_nodes=1)
        grid = InProcessGrid(app, len(replies), {})
        return strategy.aggregate_train(1, list(grid.send_and_receive(strategy.configure_train(1, current, ConfigRecord(), grid))))

    arrays, metrics = aggregate({1: reply(3.0, 100, 0.5), 2: reply(None, 0, 0.0), 3: reply(9.0, 300, 1.5)})
    assert float(arrays["f.p"].numpy()[0]) == pytest.approx((3.0 * 100 + 9.0 * 300) / 400)
    assert metrics is not None and metrics["train-loss"] == pytest.approx((0.5 * 100 + 1.5 * 300) / 400)
    arrays, metrics = aggregate({1: reply(None, 0, 0.0), 2: reply(None, 0, 0.0)})
    assert arrays is None and metrics is None  # no model to aggregate: Flower keeps the global one


def test_predictor_windows_range_and_rounds_at_chance_by_hand() -> None:
    """The "why" table of the HASSLE and FedDB pages: window means of each predictor (with
    each seed, in seed order, when there are several), the range over the last rounds and
    the rounds at chance."""
    from fedul_flwr.experiments.round_windows import at_chance, format_seeds, missing_seeds, render_windows

    def record(column: str, rows: list[dict[str, float]], predictors: list[str], seed: int = 0) -> dict:
        metrics = [{"round": 0, "test-accuracy": 0.1}] + [{"round": i + 1, **m} for i, m in enumerate(rows)]
        return {"spec": {"row": "10%", "column": column, "seed": seed}, "metrics": metrics, "last-round": len(rows),
                "predictors": predictors}  # fmt: skip

    hassle = record("HASSLE", [{"test-accuracy": a, "test-accuracy-SM": s, "test-accuracy-UM": u}
                               for a, s, u in [(0.5, 0.6, 0.1), (0.7, 0.8, 0.105), (0.9, 0.4, 0.3)]],
                    ["EM", "SM", "UM"])  # fmt: skip
    fedavg_1 = record("FedAvg", [{"test-accuracy": a} for a in (0.3, 0.5, 0.5)], [], seed=1)
    fedavg_0 = record("FedAvg", [{"test-accuracy": a} for a in (0.2, 0.4, 0.6)], [], seed=0)
    table = render_windows([hassle, fedavg_1, fedavg_0], num_classes=10, window=2, range_rounds=2).splitlines()
    assert table_rows(table[0]) == [["setting", "method", "predictor", "rounds 1-2", "rounds 3-3", "range, last 2 rounds",
                                     "rounds at chance"]]  # fmt: skip
    rows = {tuple(c.strip() for c in line.split("|")[2:4]): [c.strip() for c in line.split("|")[4:-1]] for line in table[2:]}
    assert rows[("HASSLE", "EM")] == ["60.00", "90.00", "70.0-90.0", "0 of 3"]
    assert rows[("HASSLE", "SM")] == ["70.00", "40.00", "40.0-80.0", "0 of 3"]
    assert rows[("HASSLE", "UM")] == ["10.25", "30.00", "10.5-30.0", "2 of 3"]  # 0.1 and 0.105 <= 1/10 + 0.01
    # two seeds: mean (std; seed 0, seed 1), whatever order the records come in
    assert rows[("FedAvg", "-")] == ["35.00 (7.07; 30.00, 40.00)", "55.00 (7.07; 60.00, 50.00)",
                                     "40.0-60.0 / 50.0-50.0", "0 of 3 / 0 of 3"]  # fmt: skip
    assert format_seeds([]) == "-" and format_seeds([12.345]) == "12.35"
    assert at_chance(0.11, 10) and not at_chance(0.111, 10)
    # a predictor that an older record of the setting lacks: its cells say which seeds they hold
    newer = record("HASSLE", [{"test-accuracy": a, "test-accuracy-SM": a, "test-accuracy-UM": a, "test-accuracy-w_S": 0.8}
                              for a in (0.5, 0.6, 0.7)], ["EM", "SM", "UM", "w_S"], seed=1)  # fmt: skip
    table = render_windows([newer, hassle], num_classes=10, window=2, range_rounds=2).splitlines()
    rows = {tuple(c.strip() for c in line.split("|")[2:4]): [c.strip() for c in line.split("|")[4:-1]] for line in table[2:]}
    assert rows[("HASSLE", "w_S (seed 1; not recorded at seed 0)")] == ["80.00", "80.00", "80.0-80.0", "0 of 3"]
    assert rows[("HASSLE", "EM")][0] == "57.50 (3.54; 60.00, 55.00)"  # both seeds: no note
    assert missing_seeds([1], [0, 1]) == " (seed 1; not recorded at seed 0)"
    assert missing_seeds([1, 2], [0, 1, 2, 3]) == " (seeds 1, 2; not recorded at seeds 0, 3)"
    assert missing_seeds([0, 1], [1, 0]) == "" and missing_seeds([], [0]) == ""
    with pytest.raises(ValueError, match="window"):
        render_windows([hassle], window=0)
    with pytest.raises(ValueError, match="range_rounds"):
        render_windows([hassle], range_rounds=0)


def test_proximity_weight_is_eq12_in_its_sum_form_by_hand() -> None:
    """Eq. 12 as written: sum_i CE_i + gamma ||w - w'||^2 over the client's n examples. One
    full-batch step of the batch-mean loss with the gradient term mu (w - w') follows the
    gradient of that sum divided by n exactly when mu = 2 gamma / n; the mean form keeps
    FedProx's mu = gamma."""
    from fedul_flwr.strategy_hooks import ProximalTerm
    from fedul_flwr.methods.hassle import proximity_weight

    assert proximity_weight(10.0, "sum", 100) == pytest.approx(0.2)
    assert proximity_weight(10.0, "mean", 100) == 10.0
    assert proximity_weight(10.0, "sum", 0) == 0.0
    with pytest.raises(ValueError, match="hassle-gamma-form"):
        proximity_weight(1.0, "max", 3)
    torch.manual_seed(0)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    w = torch.randn(2, 3, requires_grad=True)
    anchor, gamma = torch.randn(2, 3), 0.7
    objective = torch.nn.functional.cross_entropy(x @ w.T, y, reduction="sum") + gamma * ((w - anchor) ** 2).sum()
    (expected,) = torch.autograd.grad(objective / 5, w)
    torch.nn.functional.cross_entropy(x @ w.T, y).backward()
    ProximalTerm(proximity_weight(gamma, "sum", 5), {"w": w}, {"w": anchor}).after_backward()
    torch.testing.assert_close(w.grad, expected)


def _hassle_round(overrides: dict, layout: str = "L,U") -> tuple[torch.nn.ModuleDict, torch.nn.ModuleDict, object, object]:  # type: ignore[type-arg]
    """One real local round of HASSLE on client 0 of a two-client layout: (received models,
    trained models, the method, the client)."""
    import copy

    from torch import nn

    from fedul_flwr.data import simulated
    from fedul_flwr.methods.base import RoundContext, method_class
    from fedul_flwr.models import build_model
    from fedul_flwr.training import LocalLoop

    cfg = resolve_config({"method": "hassle", "client-setting": "annotation-heterogeneity", "label-layout": layout,
                          "labeled-share": 0.5, "samples-per-client": 200, "batch-size": 32, **overrides})  # fmt: skip
    client = simulated.load_client(cfg, 0, 2, frozenset({"labeled", "unlabeled"}))
    method = method_class("hassle")(cfg)
    models = nn.ModuleDict({s.name: build_model("small-cnn", 1, 10, 28, seed=i, width=s.width)
                            for i, s in enumerate(method.model_specs())})  # fmt: skip
    received = copy.deepcopy(models)
    loop = LocalLoop(epochs=1, lr=0.05, l1_weight=0.0, optimizer="sgd", seed=0, device=torch.device("cpu"),
                     to_input=client.to_input)  # fmt: skip
    method.local_update(client, models, RoundContext(0, 1, 0), loop)
    return received, models, method, client


def test_phase_order_residual_first_fits_the_received_dual_model_dual_first_the_updated_one() -> None:
    """A fully labeled client. residual-first (Eqs. 7-8): r_US fits the received w_S, so it
    is the same whatever w_S's own phase does (gamma 0 or 1 changes w_S); dual-first (Alg. 1):
    r_US fits the w_S just trained, so it changes with gamma."""
    def r_us(order: str, gamma: float) -> dict[str, torch.Tensor]:
        _, models, _, _ = _hassle_round({"hassle-phase-order": order, "hassle-gamma": gamma})
        return {k: v.clone() for k, v in models["r_US"].state_dict().items()}

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return all(torch.equal(a[k], b[k]) for k in a)

    assert same(r_us("residual-first", 0.0), r_us("residual-first", 1.0))
    assert not same(r_us("dual-first", 0.0), r_us("dual-first", 1.0))
    assert not same(r_us("dual-first", 0.0), r_us("residual-first", 0.0))


def test_shared_init_starts_w_u_from_w_s() -> None:
    from fedul_flwr.methods.base import method_class
    from fedul_flwr.server_app import global_models

    for shared in (False, True):
        cfg = resolve_config({"method": "hassle", "client-setting": "annotation-heterogeneity", "hassle-shared-init": shared})
        models = global_models(cfg, method_class("hassle")(cfg), 1, 10, 28)
        equal = all(torch.equal(a, b) for a, b in zip(models["w_S"].state_dict().values(), models["w_U"].state_dict().values()))
        assert equal == shared
        assert all(torch.equal(a, b) for a, b in zip(models["w_U"].state_dict().values(), models["w_U_prev"].state_dict().values()))


def test_pseudo_label_diagnostics_by_hand() -> None:
    """An unlabeled client: the kept pseudo-labels of Eq. 11 (teacher w_S_prev + r_US, as
    received) counted per class and against the true classes, as shares of its unlabeled
    images."""
    from fedul_flwr.methods.hassle import _logits

    received, models, method, client = _hassle_round({}, layout="U,L")
    teacher = _logits([received["w_S_prev"], received["r_US"]], client.unlabeled, client, torch.device("cpu"), 64)
    targets = teacher.argmax(dim=1)
    n = len(client.unlabeled)
    sent = method.uploads(client, models, None)
    expected = torch.bincount(targets, minlength=10).float() / n
    assert sent["pseudo-label-classes"] == pytest.approx(expected.tolist())
    assert sent["pseudo-label-correct-share"] == pytest.approx(float((targets == client.unlabeled_classes).float().mean()))
    assert sent["pseudo-label-share"] == 1.0


def test_warmup_rounds_keep_w_u_from_pseudo_labels(tmp_path: Path) -> None:
    """hassle-warmup-rounds = 1: in round 1 the unlabeled client sends nothing and nobody sends
    w_U or r_SU; in round 2 they train. The dual models alone are evaluated every round."""
    grid, rows, _ = _run(tmp_path, "warm", "L,P,U", extra={"hassle-warmup-rounds": 1})
    by_round = [{r.metadata.src_node_id: _models_of(r) for r in grid.replies[i : i + 3]} for i in (0, 3)]
    assert by_round[0] == {1: {"w_S", "r_US"}, 2: {"w_S", "r_US"}, 3: set()}
    assert by_round[1] == {1: {"w_S", "r_US"}, 2: {"w_S", "r_US", "w_U", "r_SU"}, 3: {"w_U", "r_SU"}}
    assert all({"test-accuracy-w_S", "test-accuracy-w_U", "test-accuracy-w_S_prev"} <= set(r) for r in rows)
    share = {r["round"]: r["pseudo-label-share"] for r in rows if "pseudo-label-share" in r}
    assert share[1] == 0.0 and share[2] > 0
