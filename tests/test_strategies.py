"""Swappable server strategies (issue #4): FedProx, SCAFFOLD, FedNova and Flower's server
optimisers, with their client-side work in :mod:`fedul_flwr.client_update`.

Most tests run a tiny linear-regression federation (4 clients with different least-squares
optima and different Hessians, full-batch local SGD) through the real strategies, the real
client-update code, the real local loop and the in-process Flower grid; one slow test runs
every strategy name through the real FedUL ClientApp on the embedded MNIST sample.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from torch import nn

from fedul_flwr.client_update import (
    CLIENT_CV_STATE_KEY,
    CV_ROUNDS_KEY,
    ProximalTerm,
    full_gradient,
    prepare_client_update,
)
from fedul_flwr.config import CHOICES, ConfigError, resolve_config
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods.base import LocalTask
from fedul_flwr.strategies import NODE_RECORD, build_strategy, reply_order, strict
from fedul_flwr.strategies.fednova import FedNova, is_statistic
from fedul_flwr.strategies.scaffold import CV_DELTA_KEY, SERVER_CV_KEY
from fedul_flwr.training import train_local

DIM, ROWS, LR = 4, 16, 0.1


# --------------------------------------------------------------------------- linear problem
def _problem(partition_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client data: X ``[ROWS, DIM]`` with client-specific feature scales, y = X w_i*."""
    g = torch.Generator().manual_seed(100 + partition_id)
    scale = torch.tensor([1.0 + 0.5 * partition_id, 1.0, 0.5, 2.0 - 0.4 * partition_id])
    x = torch.randn(ROWS, DIM, generator=g) * scale
    w_star = 3.0 * torch.randn(DIM, generator=g)
    return x, x @ w_star


def _half_mse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((model(x).squeeze(-1) - y) ** 2).mean()


def _task(partition_id: int) -> LocalTask:
    x, y = _problem(partition_id)
    return LocalTask(inputs=x, targets=y, loss=_half_mse)


def _linear() -> nn.Module:
    model = nn.Linear(DIM, 1, bias=False)
    nn.init.zeros_(model.weight)
    return model


def _global_gap(w: torch.Tensor, num_clients: int) -> float:
    """F(w) - F*, F = mean of the clients' local objectives (equal sizes)."""
    xs, ys = zip(*(_problem(i) for i in range(num_clients)))
    x, y = torch.cat(xs).double(), torch.cat(ys).double()
    w_opt = torch.linalg.lstsq(x, y.unsqueeze(1)).solution.squeeze(1)
    f = lambda v: float(0.5 * ((x @ v - y) ** 2).mean())  # noqa: E731
    return f(w.double().reshape(-1)) - f(w_opt)


linear_app = ClientApp()


@linear_app.train()
def _linear_train(msg: Message, context: Context) -> Message:
    """A ClientApp like ours (prepare_client_update + train_local) on the linear problem."""
    pid = int(context.node_config["partition-id"])
    task = _task(pid)
    model = _linear()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    update = prepare_client_update(msg.content, context.state, model, task, lr=LR, batch_size=ROWS, device="cpu")
    result = train_local(
        model, task, epochs=int(context.node_config["epochs"]), batch_size=ROWS, lr=LR, hooks=update.hooks, optimizer="sgd"
    )
    extra = update.reply_records(model, result)
    metrics = MetricRecord(
        {"num-examples": result.num_examples, "uniform-weight": 1, "num-steps": result.num_steps, **update.metrics}
    )
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics, **extra}), reply_to=msg)


def _grid(epochs: Sequence[int], app: ClientApp = linear_app) -> InProcessGrid:
    n = len(epochs)
    configs = [{"partition-id": i, "num-partitions": n, "epochs": e} for i, e in enumerate(epochs)]
    return InProcessGrid(app, n, {}, node_configs=configs)


def _strategy(**knobs: object):
    return build_strategy(resolve_config({"min-available-nodes": 2, **knobs}))


def _federate(strategy, rounds: int, epochs: Sequence[int] = (10, 10, 10, 10)) -> tuple[torch.Tensor, InProcessGrid]:
    random.seed(0)  # Flower samples nodes with the global `random`
    grid = _grid(epochs)
    initial = ArrayRecord(_linear().state_dict())
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds, train_config=ConfigRecord())
    return torch.as_tensor(result.arrays["weight"].numpy()), grid


def _weight(record: ArrayRecord) -> np.ndarray:
    return record["weight"].numpy().astype(np.float64)


# --------------------------------------------------------------------------- config + factory
def test_every_strategy_name_builds_a_strict_flower_strategy() -> None:
    for name in CHOICES["strategy"]:
        strategy = build_strategy(resolve_config({"strategy": name}))
        assert type(strategy).__name__.startswith("Strict")
        assert type(strategy) is strict(type(strategy).__mro__[4])  # one cached class per strategy (Strict, 3 mixins, base)
    assert _strategy(strategy="fedprox", **{"proximal-mu": 0.1}).proximal_mu == 0.1
    fedadam = _strategy(strategy="fedadam")
    assert (fedadam.eta, fedadam.beta_1, fedadam.beta_2, fedadam.tau) == (0.1, 0.9, 0.99, 1e-3)  # Flower's defaults
    assert _strategy(strategy="fedyogi").eta == 0.01 and _strategy(strategy="fedyogi", **{"server-lr": 0.3}).eta == 0.3
    avgm = _strategy(strategy="fedavgm", **{"server-momentum": 0.9})
    assert (avgm.server_learning_rate, avgm.server_momentum) == (1.0, 0.9)
    scaffold = _strategy(strategy="scaffold", **{"scaffold-option": "I", "server-lr": 0.5})
    assert (scaffold.option, scaffold.global_learning_rate) == ("I", 0.5)
    sampled = _strategy(**{"fraction-train": 0.5, "min-train-nodes": 1})
    assert (sampled.fraction_train, sampled.min_train_nodes) == (0.5, 1)


def test_strategy_knobs_are_validated() -> None:
    for bad in (
        {"strategy": "fedsgd"},
        {"scaffold-option": "III"},
        {"min-train-nodes": 3},  # > min-available-nodes: Flower would wait forever
        {"server-momentum": 1.0},
        {"tau": 0.0},
        {"local-epochs-per-client": "1,0"},
        {"local-optimizer": "rmsprop"},
    ):
        with pytest.raises(ConfigError):
            resolve_config(bad)
    cfg = resolve_config({"local-epochs-per-client": "1, 2,5", "local-epochs": 3})
    assert [cfg.local_epochs_of(i) for i in range(4)] == [1, 2, 5, 1]
    assert resolve_config({"local-epochs": 3}).local_epochs_of(7) == 3


# --------------------------------------------------------------------------- equivalences
def test_fedprox_with_mu_zero_reproduces_fedavg_exactly() -> None:
    fedavg, _ = _federate(_strategy(strategy="fedavg"), rounds=2)
    fedprox, _ = _federate(_strategy(strategy="fedprox", **{"proximal-mu": 0.0}), rounds=2)
    assert torch.equal(fedavg, fedprox)
    pulled, _ = _federate(_strategy(strategy="fedprox", **{"proximal-mu": 1.0}), rounds=2)
    assert not torch.allclose(fedavg, pulled)  # the prox term is really applied when mu > 0


def test_fednova_with_equal_local_steps_reproduces_fedavg() -> None:
    fedavg, _ = _federate(_strategy(strategy="fedavg"), rounds=2, epochs=(5, 5, 5, 5))
    fednova, _ = _federate(_strategy(strategy="fednova"), rounds=2, epochs=(5, 5, 5, 5))
    np.testing.assert_allclose(fednova.numpy(), fedavg.numpy(), rtol=1e-6, atol=1e-6)  # float32 rounding only
    fedavg_u, _ = _federate(_strategy(strategy="fedavg"), rounds=2, epochs=(1, 2, 5, 10))
    fednova_u, _ = _federate(_strategy(strategy="fednova"), rounds=2, epochs=(1, 2, 5, 10))
    assert not np.allclose(fednova_u.numpy(), fedavg_u.numpy(), atol=1e-3)  # unequal steps: different rule


def _scripted_app(replies: dict[int, RecordDict]) -> ClientApp:
    app = ClientApp()

    @app.train()
    def _reply(msg: Message, context: Context) -> Message:
        return Message(replies[context.node_id], reply_to=msg)

    return app


def test_aggregation_does_not_depend_on_reply_order_or_node_ids() -> None:
    # float32 sums depend on the order of their terms; a reply order that changes from run
    # to run (Flower's random node sampling, network arrival) or node ids that do (Flower's
    # simulation engine draws new ones per run) would make a seeded run drift
    rng = np.random.default_rng(3)
    values = [(rng.normal(size=64) * 10.0 ** rng.integers(-3, 4, size=64)).astype(np.float32) for _ in range(5)]

    def reply(key: int) -> RecordDict:  # what client ``node-key`` = key sends
        return RecordDict({"arrays": ArrayRecord({"w": Array(values[key])}), "m": MetricRecord({"num-examples": 7 + key}),
                           NODE_RECORD: ConfigRecord({"node-key": key})})  # fmt: skip

    zero = ArrayRecord({"w": Array(np.zeros(64, dtype=np.float32))})
    plain, ordered = FedAvg(min_available_nodes=5), strict(FedAvg)(min_available_nodes=5)
    received = []
    for node_of_key in (lambda k: k + 1, lambda k: 5 - k):  # two runs: the same clients under other node ids
        grid = InProcessGrid(_scripted_app({node_of_key(k): reply(k) for k in range(5)}), 5, {})
        msgs = list(grid.send_and_receive(plain.configure_train(1, zero, ConfigRecord(), grid)))
        received += [sorted(msgs, key=lambda m: m.metadata.src_node_id)]  # each run in node-id order
        received += [[msgs[i] for i in np.random.default_rng(s).permutation(5)] for s in range(3)]
    as_bytes = lambda strategy, msgs: strategy.aggregate_train(1, msgs)[0]["w"].numpy().tobytes()  # noqa: E731
    assert as_bytes(plain, received[0]) != as_bytes(plain, received[4])  # node-id order differs between runs
    assert len({as_bytes(plain, o) for o in received}) > 2  # Flower's FedAvg alone: order matters
    assert len({as_bytes(ordered, o) for o in received}) == 1  # ours: one result, in node-key order
    assert [reply_order(m)[1] for m in sorted(received[5], key=reply_order)] == [0, 1, 2, 3, 4]


def test_fednova_aggregation_follows_its_update_rule() -> None:
    x = {
        "w": np.array([1.0, -2.0, 0.5], dtype=np.float32),
        "bn.running_mean": np.array([0.1, 0.2], dtype=np.float32),
        "bn.num_batches_tracked": np.array(7, dtype=np.int64),
    }
    rng = np.random.default_rng(0)
    steps, sizes = [2, 6, 12], [10, 30, 20]
    ys = [{k: (v + rng.normal(size=v.shape)).astype(v.dtype) if v.dtype.kind == "f" else np.asarray(v + s) for k, v in x.items()} for s in steps]
    replies = {
        node: RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in y.items()}), "m": MetricRecord({"num-examples": n, "num-steps": t})})
        for node, (y, n, t) in enumerate(zip(ys, sizes, steps), start=1)
    }
    grid = InProcessGrid(_scripted_app(replies), 3, {})
    strategy = strict(FedNova)(min_available_nodes=3, min_train_nodes=3)
    arrays = ArrayRecord({k: Array(v.copy()) for k, v in x.items()})
    out, metrics = strategy.aggregate_train(1, grid.send_and_receive(strategy.configure_train(1, arrays, ConfigRecord(), grid)))
    p = np.array(sizes) / sum(sizes)
    tau_eff = p @ np.array(steps)
    expected_w = x["w"] - tau_eff * sum(pi * (x["w"] - y["w"]) / t for pi, y, t in zip(p, ys, steps))
    np.testing.assert_allclose(out["w"].numpy(), expected_w, rtol=1e-6)
    for key in ("bn.running_mean", "bn.num_batches_tracked"):  # statistics: plain weighted average
        np.testing.assert_allclose(out[key].numpy(), sum(pi * y[key] for pi, y in zip(p, ys)), rtol=1e-6)
    assert metrics["num-steps"] == pytest.approx(tau_eff)
    assert is_statistic("bn.running_var", x["w"]) and not is_statistic("conv.weight", x["w"])


# --------------------------------------------------------------------------- SCAFFOLD
def test_scaffold_beats_fedavg_on_heterogeneous_least_squares() -> None:
    rounds = 15
    fedavg, _ = _federate(_strategy(strategy="fedavg"), rounds=rounds)
    gaps = {"fedavg": _global_gap(fedavg, 4)}
    for option in ("I", "II"):
        w, _ = _federate(_strategy(strategy="scaffold", **{"scaffold-option": option}), rounds=rounds)
        gaps[option] = _global_gap(w, 4)
    assert gaps["fedavg"] > 0.05  # client drift: FedAvg's fixed point is not the global optimum
    assert gaps["I"] < 0.05 * gaps["fedavg"] and gaps["II"] < 0.05 * gaps["fedavg"], gaps


def _scaffold_content(x: torch.Tensor, c: torch.Tensor, option: str) -> RecordDict:
    return RecordDict(
        {
            "arrays": ArrayRecord({"weight": x.clone()}),
            SERVER_CV_KEY: ArrayRecord({"weight": c.clone()}),
            "config": ConfigRecord({"server-round": 2, "scaffold-option": option}),
        }
    )


@pytest.mark.parametrize("option", ["I", "II"])
def test_scaffold_client_update_equations(option: str) -> None:
    g = torch.Generator().manual_seed(1)
    x, c, c_i = (torch.randn(1, DIM, generator=g) for _ in range(3))
    state = RecordDict({CLIENT_CV_STATE_KEY: ArrayRecord({"weight": c_i.clone()})})
    task, k = _task(1), 7
    model = _linear()
    model.load_state_dict({"weight": x.clone()})
    update = prepare_client_update(_scaffold_content(x, c, option), state, model, task, lr=LR, batch_size=5, device="cpu")
    result = train_local(model, task, epochs=k, batch_size=ROWS, lr=LR, hooks=update.hooks, optimizer="sgd")
    records = update.reply_records(model, result)

    # local steps follow y <- y - lr (g_i(y) + c - c_i)
    inputs, targets = _problem(1)
    y = x.clone()
    for _ in range(k):
        grad = ((inputs @ y.T).squeeze(1) - targets) @ inputs / ROWS
        y = y - LR * (grad + c - c_i)
    torch.testing.assert_close(model.weight.detach(), y, rtol=1e-5, atol=1e-5)

    if option == "II":  # c_i+ = c_i - c + (x - y_i) / (K lr)
        expected = c_i - c + (x - model.weight.detach()) / (result.num_steps * LR)
    else:  # c_i+ = g_i(x), over all local data
        expected = (((inputs @ x.T).squeeze(1) - targets) @ inputs / ROWS).unsqueeze(0)
    new_c_i = state[CLIENT_CV_STATE_KEY]["weight"].numpy()
    np.testing.assert_allclose(new_c_i, expected.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(records[CV_DELTA_KEY]["weight"].numpy(), new_c_i - c_i.numpy(), rtol=1e-5, atol=1e-6)


def test_scaffold_server_update_equations_with_partial_participation() -> None:
    strategy = _strategy(strategy="scaffold", **{"server-lr": 0.5, "fraction-train": 0.5, "aggregation-weights": "uniform"})
    grid = _grid((3, 3, 3, 3))
    random.seed(1)
    x = ArrayRecord(_linear().state_dict())
    c = np.zeros((1, DIM))
    for server_round in (1, 2):
        messages = list(strategy.configure_train(server_round, x, ConfigRecord(), grid))
        assert len(messages) == 2
        sent_c = messages[0].content[SERVER_CV_KEY]
        np.testing.assert_allclose(sent_c["weight"].numpy() if len(sent_c) else np.zeros((1, DIM)), c, atol=1e-7)
        replies = list(grid.send_and_receive(messages))
        new_x, _ = strategy.aggregate_train(server_round, replies)
        mean_dy = np.mean([_weight(r.content["arrays"]) - _weight(x) for r in replies], axis=0)
        mean_dc = np.mean([_weight(r.content[CV_DELTA_KEY]) for r in replies], axis=0)
        np.testing.assert_allclose(_weight(new_x), _weight(x) + 0.5 * mean_dy, rtol=1e-5, atol=1e-6)  # eta_g = 0.5
        c = c + (2 / 4) * mean_dc  # |S| / N = 2 / 4
        np.testing.assert_allclose(_weight(strategy.server_cv), c, rtol=1e-5, atol=1e-6)
        x = new_x


def test_client_control_variate_survives_rounds_in_the_inprocess_grid() -> None:
    strategy = _strategy(strategy="scaffold")
    _, grid = _federate(strategy, rounds=1, epochs=(3, 3))
    after_1 = {n: _weight(ctx.state[CLIENT_CV_STATE_KEY]) for n, ctx in grid.contexts.items()}
    # round 2 on the same grid: each node starts from its stored c_i
    x = ArrayRecord({"weight": torch.as_tensor(strategy.current_arrays["weight"].numpy())})
    replies = list(grid.send_and_receive(strategy.configure_train(2, x, ConfigRecord(), grid)))
    for reply in replies:
        node = reply.metadata.src_node_id
        after_2 = _weight(grid.contexts[node].state[CLIENT_CV_STATE_KEY])
        assert not np.allclose(after_2, after_1[node])
        # the reply's delta is relative to the stored round-1 c_i: it was read back, not reset
        np.testing.assert_allclose(_weight(reply.content[CV_DELTA_KEY]), after_2 - after_1[node], rtol=1e-5, atol=1e-6)
        assert reply.content["metrics"][CV_ROUNDS_KEY] == 2.0  # the node's round counter, from its state


def test_proximal_term_adds_mu_times_distance_to_the_gradient() -> None:
    model = _linear()
    model.load_state_dict({"weight": torch.ones(1, DIM)})
    hook = ProximalTerm(0.3, model)
    with torch.no_grad():
        model.weight.add_(torch.arange(DIM, dtype=torch.float32))
    model.weight.grad = torch.full((1, DIM), 2.0)
    hook.after_backward(model)
    torch.testing.assert_close(model.weight.grad, 2.0 + 0.3 * torch.arange(DIM, dtype=torch.float32).unsqueeze(0))


def test_full_gradient_leaves_the_model_and_batchnorm_statistics_alone() -> None:
    model = nn.Sequential(nn.Linear(DIM, 3), nn.BatchNorm1d(3), nn.Linear(3, 1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grads = full_gradient(model, _task(0), batch_size=4, device="cpu")
    assert set(grads) == {name for name, _ in model.named_parameters()}
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


# --------------------------------------------------------------------------- the real app
@pytest.mark.slow
@pytest.mark.parametrize("name", CHOICES["strategy"])
def test_every_strategy_trains_fedul_through_the_real_client_app(name: str) -> None:
    """One round of the real FedUL ClientApp per strategy (one config change each) on 2
    nodes; ``samples-per-client`` keeps it cheap (500 embedded-sample images per client)."""
    from fedul_flwr.client_app import app as client_app
    from fedul_flwr.models import build_model

    rc = {"strategy": name, "samples-per-client": 500}
    cfg = resolve_config(rc)
    grid = InProcessGrid(client_app, 2, rc)
    torch.manual_seed(0)
    model = build_model(cfg.model, 1, 10, 28)
    initial = ArrayRecord(model.state_dict())
    random.seed(0)
    result = build_strategy(cfg).start(grid=grid, initial_arrays=initial, num_rounds=1, train_config=ConfigRecord())
    model.load_state_dict(result.arrays.to_torch_state_dict())  # loads back into f
    changed = [k for k in initial if not np.allclose(initial[k].numpy(), result.arrays[k].numpy())]
    assert changed and all(np.isfinite(result.arrays[k].numpy()).all() for k in result.arrays)
    assert result.train_metrics_clientapp[1]["num-steps"] > 0
    stored = [ctx.state for ctx in grid.contexts.values() if CLIENT_CV_STATE_KEY in ctx.state]
    if name == "scaffold":  # c_i of every sampled node, one array per trainable parameter of f
        assert len(stored) == 2
        assert set(stored[0][CLIENT_CV_STATE_KEY].keys()) == {n for n, _ in model.named_parameters()}
    else:
        assert not stored


# --------------------------------------------------------------------------- comparison script
def test_compare_script_parses_overrides_and_renders_the_table() -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "compare_strategies.py"
    spec = importlib.util.spec_from_file_location("compare_strategies", path)
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    common, per = script._parse_sets(["lr=0.05", "fedprox:proximal-mu=0.1", "local-epochs-per-client=1,2,5"])
    assert common == {"lr": "0.05", "local-epochs-per-client": "1,2,5"} and per == {"fedprox": {"proximal-mu": "0.1"}}
    with pytest.raises(SystemExit):
        script._parse_sets(["no-such-key=1"])
    records = [
        {"strategy": "fedavg", "strategy-settings": {}, "final-error": e, "best-error": e - 0.01} for e in (0.10, 0.12)
    ] + [{"strategy": "fedprox", "strategy-settings": {"proximal-mu": 0.01}, "final-error": 0.2, "best-error": 0.15}]
    table = script.render(records, "title")
    assert "| fedavg | - | 11.00 (1.41) | 10.00 (1.41) | 2 |" in table
    assert "| fedprox | proximal-mu=0.01 | 20.00 | 15.00 | 1 |" in table


@pytest.mark.slow
def test_scaffold_client_state_survives_rounds_under_flwr_run(tmp_path) -> None:
    """Ray simulation through a real SuperLink: each node's c_i round counter, read back
    from its ``context.state``, is 1 in round 1 and 2 in round 2 (2 nodes, both sampled)."""
    import re

    from tests.flower_harness import superlink

    out = tmp_path / "runs"
    run_config = (
        f"strategy='scaffold' scaffold-option='I' num-rounds=2 samples-per-client=300 "
        f"output-dir='{out}' run-name='scaffold'"
    )
    with superlink(tmp_path) as link:
        record, log = link.run_app(
            run_config, "num-supernodes=2 client-resources-num-cpus=1", timeout=420, done_file=out / "scaffold" / "model.pt"
        )
    assert record.get("status") == "finished:completed", (record, log[-3000:])
    aggregated = re.findall(r"Aggregated MetricRecord: \{[^}]*'scaffold-cv-rounds': ([0-9.e+]+)", log)
    assert [float(v) for v in aggregated] == [1.0, 2.0], log[-3000:]
