"""Swappable server strategies: FedProx, SCAFFOLD, FedNova, Flower's server
optimisers and robust aggregators, with their client-side work in
:mod:`fedul_flwr.strategy_hooks`.

Most tests run a tiny linear-regression federation (4 clients with different least-squares
optima and different Hessians, full-batch local SGD) through the real strategies, the real
client-update code, the real local loop and the in-process Flower grid; one slow test runs
every strategy name through the real FedUL ClientApp on the embedded MNIST sample.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from torch import nn

from fedul_flwr import wire
from fedul_flwr.strategy_hooks import (
    ProximalTerm,
    full_gradient,
    prepare_client_update,
    shared_parameters,
)
from fedul_flwr.preflight import resolve_config
from fedul_flwr.config import ConfigError
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods.base import Batch, LocalTask, Stream
from fedul_flwr.strategies import STRATEGIES, build_strategy, reply_order, strict
from fedul_flwr.strategies.fednova import FedNova, is_statistic
from fedul_flwr.strategies.participation import fixed_size_draw
from fedul_flwr.training import train_local
from fedul_flwr.experiments.tables import table_rows

DIM, ROWS, LR = 4, 16, 0.1
CPU = torch.device("cpu")


def _identity(x: torch.Tensor) -> torch.Tensor:
    """``to_input`` of the linear problem: its inputs are float features, not uint8 images."""
    return x


# --------------------------------------------------------------------------- linear problem
def _problem(partition_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client data: X ``[ROWS, DIM]`` with client-specific feature scales, y = X w_i*."""
    g = torch.Generator().manual_seed(100 + partition_id)
    scale = torch.tensor([1.0 + 0.5 * partition_id, 1.0, 0.5, 2.0 - 0.4 * partition_id])
    x = torch.randn(ROWS, DIM, generator=g) * scale
    w_star = 3.0 * torch.randn(DIM, generator=g)
    return x, x @ w_star


def _half_mse(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
    b = batch["rows"]
    return 0.5 * ((models["f"](b["x"]).squeeze(-1) - b["y"]) ** 2).mean()


def _task(partition_id: int, batch_size: int = ROWS) -> LocalTask:
    x, y = _problem(partition_id)
    return LocalTask({"rows": Stream({"x": x, "y": y}, batch_size, images=())}, _half_mse)


def _linear() -> nn.ModuleDict:
    """The method's models as the apps hold them: one exchanged model ``f`` (wire keys ``f.*``)."""
    model = nn.Linear(DIM, 1, bias=False)
    nn.init.zeros_(model.weight)
    return nn.ModuleDict({"f": model})


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
    models = _linear()
    models.load_state_dict(msg.content[wire.ARRAYS].to_torch_state_dict())
    update = prepare_client_update(
        msg.content, context.state, models, ["f"], lambda: task, lr=LR, device=CPU, to_input=_identity
    )
    result = train_local(
        models, task, epochs=int(context.node_config["epochs"]), lr=LR, to_input=_identity, hooks=update.hooks,
        optimizer="sgd",
    )  # fmt: skip
    extra = update.reply_records(result, ("f",))
    metrics = MetricRecord(
        {wire.NUM_EXAMPLES: result.num_examples, wire.UNIFORM_WEIGHT: 1, wire.NUM_STEPS: result.num_steps,
         wire.TRAIN_LOSS: float(result.loss), **update.metrics}
    )
    content = {wire.ARRAYS: ArrayRecord(models.state_dict()), wire.METRICS: metrics,
               wire.NODE_RECORD: ConfigRecord({wire.NODE_KEY: pid}), **extra}  # fmt: skip
    return Message(RecordDict(content), reply_to=msg)


def _grid(epochs: Sequence[int], app: ClientApp = linear_app) -> InProcessGrid:
    n = len(epochs)
    configs = [{"partition-id": i, "num-partitions": n, "epochs": e} for i, e in enumerate(epochs)]
    return InProcessGrid(app, n, {}, node_configs=configs)


def _named(name: str):
    """The config of strategy ``name``; Krum, MultiKrum and Bulyan need 3 replies a round."""
    robust = {"min-available-nodes": 3, "min-train-nodes": 3} if name in ("krum", "multikrum", "bulyan") else {}
    return resolve_config({"strategy": name, **robust})


def _strategy(**knobs: object):
    return build_strategy(resolve_config({"min-available-nodes": 2, **knobs}))


def _federate(strategy, rounds: int, epochs: Sequence[int] = (10, 10, 10, 10)) -> tuple[torch.Tensor, InProcessGrid]:
    random.seed(0)  # Flower samples nodes with the global `random`
    grid = _grid(epochs)
    initial = ArrayRecord(_linear().state_dict())
    assert list(initial.keys()) == ["f.weight"]  # arrays travel keyed "<model>.<parameter>"
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds, train_config=ConfigRecord())
    return torch.as_tensor(result.arrays["f.weight"].numpy()), grid


def _weight(record: ArrayRecord) -> np.ndarray:
    return record["f.weight"].numpy().astype(np.float64)


# --------------------------------------------------------------------------- config + factory
def test_every_strategy_name_builds_a_strict_flower_strategy() -> None:
    assert {"fedavg", "fedprox", "scaffold", "fednova", "fedmedian", "fedtrimmedavg"} <= set(STRATEGIES.names())
    for name in STRATEGIES.names():
        strategy = build_strategy(_named(name))
        assert type(strategy).__name__.startswith("Strict")
        base = STRATEGIES.get(name)(_named(name))[0]
        # Strict, 4 mixins (the round numbering, the server's training, the checks, the order), the
        # registered strategy class (FedAvg: after the participation and noised-mean mixins right above it)
        assert base in type(strategy).__mro__[5:9]
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
    uniform = _strategy(**{"aggregation-weights": "uniform"})
    assert (uniform.weighted_by_key, _strategy().weighted_by_key) == (wire.UNIFORM_WEIGHT, wire.NUM_EXAMPLES)


def test_strict_makes_one_class_per_strategy_and_mixin() -> None:
    """``strict`` is cached: every way of asking for the same combination gets the same class
    (the one ``build_strategy`` instantiates), whether the absent mixin is passed or not."""
    for name in STRATEGIES.names():
        strategy = build_strategy(_named(name))
        base = STRATEGIES.get(name)(_named(name))[0]
        assert strict(base) is strict(base, None) is strict(base, method_mixin=None), name
        assert type(strategy) is strict(base), name


def _cohorts(strategy, grid: InProcessGrid, rounds: Sequence[int]) -> tuple[list[list[int]], list[list[int]]]:
    """The nodes ``strategy`` asks to train and to evaluate in each of ``rounds`` (ascending)."""
    x = ArrayRecord(_linear().state_dict())
    train = [sorted(m.metadata.dst_node_id for m in strategy.configure_train(r, x, ConfigRecord(), grid)) for r in rounds]
    evaluate = [sorted(m.metadata.dst_node_id for m in strategy.configure_evaluate(r, x, ConfigRecord(), grid)) for r in rounds]
    return train, evaluate


@pytest.mark.parametrize("name", sorted(STRATEGIES.names()))
def test_fixed_size_cohorts_come_from_the_seed_and_round_not_from_pythons_random(name: str) -> None:
    """Every strategy (and server-side DP's wrapper, around FedAvg) draws who trains and who evaluates without
    touching Python's ``random``; seeded, the cohort of round r is the ``cohort`` stream's draw
    at (seed, r) -- the same for two strategies of one seed, and for a resumed one (rounds
    numbered from its ``round_offset``) -- and the evaluation cohort the ``evaluation-cohort``
    stream's."""
    knobs = {"strategy": name, "seed": 11, "fraction-train": 0.5, "min-train-nodes": 3, "min-available-nodes": 6}
    grid = _grid((1,) * 6)
    nodes = list(grid.get_node_ids())
    rounds = range(1, 7)
    random.seed(123)
    before = random.getstate()
    runs = []
    for _ in range(2):
        strategy = build_strategy(resolve_config(knobs))
        strategy.fraction_evaluate, strategy.min_evaluate_nodes = 0.5, 1
        runs.append(_cohorts(strategy, grid, rounds))
    resumed = build_strategy(resolve_config(knobs))
    resumed.fraction_evaluate, resumed.min_evaluate_nodes = 0.5, 1
    resumed.round_offset = 3  # stopped after round 3: its rounds 1, 2, 3 are the run's 4, 5, 6
    continued = _cohorts(resumed, grid, range(1, 4))
    dp_knobs = {**knobs, "strategy": "fedavg", "differential-privacy": "server-fixed", "dp-noise-multiplier": 0.8}
    dp = build_strategy(resolve_config(dp_knobs), num_nodes=6)  # the robust strategies refuse server-side DP
    secret = [sorted(m.metadata.dst_node_id for m in dp.configure_train(r, ArrayRecord(_linear().state_dict()),
                                                                          ConfigRecord(), grid)) for r in rounds]  # fmt: skip
    assert random.getstate() == before
    train, evaluate = runs[0]
    assert runs[1] == runs[0]
    assert train == [fixed_size_draw(nodes, 3, 11, r, "cohort") for r in rounds]
    assert evaluate == [fixed_size_draw(nodes, 3, 11, r, "evaluation-cohort") for r in rounds]
    assert len({tuple(c) for c in train}) > 1  # the cohort changes with the round
    assert continued == (train[3:], evaluate[3:])
    assert all(len(c) == 3 for c in secret)


def test_a_fixed_size_draw_follows_the_node_ids_not_their_order() -> None:
    nodes = [5, 17, 2, 40, 9]
    drawn = fixed_size_draw(nodes, 2, 3, 1)
    assert drawn == fixed_size_draw(nodes[::-1], 2, 3, 1) and drawn == sorted(drawn) and set(drawn) <= set(nodes)
    assert fixed_size_draw(nodes, 5, 3, 1) == sorted(nodes)
    assert fixed_size_draw(nodes, 0, 3, 1) == []
    with pytest.raises(ValueError, match="6 of 5"):
        fixed_size_draw(nodes, 6, 3, 1)


def test_a_method_aggregation_mixin_runs_on_checked_ordered_replies_before_the_strategy() -> None:
    seen: list[list[int]] = []

    class Recording:  # stands in for a method's ``aggregation()``
        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            seen.append([reply_order(m)[1] for m in replies])
            return super().aggregate_train(server_round, replies)

    strategy = build_strategy(resolve_config({"min-available-nodes": 3}), Recording)
    mro = type(strategy).__mro__
    assert mro[5] is Recording and FedAvg in mro[6:10]  # after the checks and the ordering, before the strategy
    assert type(strategy) is strict(FedAvg, Recording) and strict(FedAvg, Recording) is not strict(FedAvg)
    replies = {node: RecordDict({wire.ARRAYS: ArrayRecord({"f.w": Array(np.full(3, float(key), dtype=np.float32))}),
                                 wire.METRICS: MetricRecord({wire.NUM_EXAMPLES: 1, wire.UNIFORM_WEIGHT: 1, wire.NUM_STEPS: 1,
                                                             wire.TRAIN_LOSS: 0.0}),
                                 wire.NODE_RECORD: ConfigRecord({wire.NODE_KEY: key})})
               for node, key in ((1, 2), (2, 0), (3, 1))}  # fmt: skip
    grid = InProcessGrid(_scripted_app(replies), 3, {})
    zero = ArrayRecord({"f.w": Array(np.zeros(3, dtype=np.float32))})
    msgs = list(grid.send_and_receive(strategy.configure_train(1, zero, ConfigRecord(), grid)))
    out, _ = strategy.aggregate_train(1, msgs[::-1])
    assert seen == [[0, 1, 2]]  # the mixin saw the replies in node-key order
    np.testing.assert_allclose(out["f.w"].numpy(), np.ones(3))  # and the strategy still did the arithmetic


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
    with pytest.raises(ConfigError, match="fedsgd"):  # the registry's names are the valid values
        resolve_config({"strategy": "fedsgd"})
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
        return RecordDict({"arrays": ArrayRecord({"f.w": Array(values[key])}), "m": MetricRecord({"num-examples": 7 + key}),
                           wire.NODE_RECORD: ConfigRecord({wire.NODE_KEY: key})})  # fmt: skip

    zero = ArrayRecord({"f.w": Array(np.zeros(64, dtype=np.float32))})
    plain, ordered = FedAvg(min_available_nodes=5), strict(FedAvg)(min_available_nodes=5)
    received = []
    for node_of_key in (lambda k: k + 1, lambda k: 5 - k):  # two runs: the same clients under other node ids
        grid = InProcessGrid(_scripted_app({node_of_key(k): reply(k) for k in range(5)}), 5, {})
        msgs = list(grid.send_and_receive(plain.configure_train(1, zero, ConfigRecord(), grid)))
        received += [sorted(msgs, key=lambda m: m.metadata.src_node_id)]  # each run in node-id order
        received += [[msgs[i] for i in np.random.default_rng(s).permutation(5)] for s in range(3)]
    as_bytes = lambda strategy, msgs: strategy.aggregate_train(1, msgs)[0]["f.w"].numpy().tobytes()  # noqa: E731
    assert as_bytes(plain, received[0]) != as_bytes(plain, received[4])  # node-id order differs between runs
    assert len({as_bytes(plain, o) for o in received}) > 2  # Flower's FedAvg alone: order matters
    assert len({as_bytes(ordered, o) for o in received}) == 1  # ours: one result, in node-key order
    assert [reply_order(m)[1] for m in sorted(received[5], key=reply_order)] == [0, 1, 2, 3, 4]


def test_fednova_aggregation_follows_its_update_rule() -> None:
    x = {
        "f.w": np.array([1.0, -2.0, 0.5], dtype=np.float32),
        "f.bn.running_mean": np.array([0.1, 0.2], dtype=np.float32),
        "f.bn.num_batches_tracked": np.array(7, dtype=np.int64),
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
    expected_w = x["f.w"] - tau_eff * sum(pi * (x["f.w"] - y["f.w"]) / t for pi, y, t in zip(p, ys, steps))
    np.testing.assert_allclose(out["f.w"].numpy(), expected_w, rtol=1e-6)
    for key in ("f.bn.running_mean", "f.bn.num_batches_tracked"):  # statistics: plain weighted average
        np.testing.assert_allclose(out[key].numpy(), sum(pi * y[key] for pi, y in zip(p, ys)), rtol=1e-6)
    assert metrics["num-steps"] == pytest.approx(tau_eff)
    assert is_statistic("f.bn.running_var", x["f.w"]) and not is_statistic("f.conv.weight", x["f.w"])


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
            wire.ARRAYS: ArrayRecord({"f.weight": x.clone()}),
            wire.SERVER_CV: ArrayRecord({"f.weight": c.clone()}),
            wire.CONFIG: ConfigRecord({wire.SERVER_ROUND: 2, wire.SCAFFOLD_OPTION: option}),
        }
    )


@pytest.mark.parametrize("option", ["I", "II"])
def test_scaffold_client_update_equations(option: str) -> None:
    g = torch.Generator().manual_seed(1)
    x, c, c_i = (torch.randn(1, DIM, generator=g) for _ in range(3))
    state = RecordDict({wire.CLIENT_CV_STATE: ArrayRecord({"f.weight": c_i.clone()})})
    task, k = _task(1), 7
    models = _linear()
    models["f"].load_state_dict({"weight": x.clone()})
    built: list[LocalTask] = []

    def gradient_task() -> LocalTask:  # option I's pass, in uneven batches (5, 5, 5, 1): weighted by size
        built.append(_task(1, batch_size=5))
        return built[-1]

    update = prepare_client_update(
        _scaffold_content(x, c, option), state, models, ["f"], gradient_task, lr=LR, device=CPU, to_input=_identity
    )
    assert len(built) == (1 if option == "I" else 0)  # only option I needs the extra pass
    result = train_local(models, task, epochs=k, lr=LR, to_input=_identity, hooks=update.hooks, optimizer="sgd")
    records = update.reply_records(result, ("f",))

    # local steps follow y <- y - lr (g_i(y) + c - c_i)
    inputs, targets = _problem(1)
    y = x.clone()
    for _ in range(k):
        grad = ((inputs @ y.T).squeeze(1) - targets) @ inputs / ROWS
        y = y - LR * (grad + c - c_i)
    torch.testing.assert_close(models["f"].weight.detach(), y, rtol=1e-5, atol=1e-5)

    if option == "II":  # c_i+ = c_i - c + (x - y_i) / (K lr)
        expected = c_i - c + (x - models["f"].weight.detach()) / (result.num_steps * LR)
    else:  # c_i+ = g_i(x), over all local data
        expected = (((inputs @ x.T).squeeze(1) - targets) @ inputs / ROWS).unsqueeze(0)
    assert set(state[wire.CLIENT_CV_STATE].keys()) == set(records[wire.CV_DELTA].keys()) == {"f.weight"}
    new_c_i = state[wire.CLIENT_CV_STATE]["f.weight"].numpy()
    np.testing.assert_allclose(new_c_i, expected.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(records[wire.CV_DELTA]["f.weight"].numpy(), new_c_i - c_i.numpy(), rtol=1e-5, atol=1e-6)
    assert update.metrics[wire.CV_ROUNDS] == 1.0  # first update of this node's c_i


def test_scaffold_reports_no_delta_for_a_model_the_client_does_not_send() -> None:
    """Two exchanged models; the client sends only ``f``: ``g``'s c_i is kept, no Delta for it."""
    models = nn.ModuleDict({"f": nn.Linear(DIM, 1, bias=False), "g": nn.Linear(DIM, 1, bias=False)})
    for m in models.values():
        nn.init.zeros_(m.weight)
    x, y = _problem(0)

    def loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
        b = batch["rows"]
        out = models["f"](b["x"]).squeeze(-1) + models["g"](b["x"]).squeeze(-1)
        return 0.5 * ((out - b["y"]) ** 2).mean()

    task = LocalTask({"rows": Stream({"x": x, "y": y}, ROWS, images=())}, loss)
    c_i = {"f.weight": torch.full((1, DIM), 0.5), "g.weight": torch.full((1, DIM), -0.5)}
    state = RecordDict({wire.CLIENT_CV_STATE: ArrayRecord({k: v.clone() for k, v in c_i.items()})})
    content = RecordDict({wire.SERVER_CV: ArrayRecord(), wire.CONFIG: ConfigRecord({wire.SCAFFOLD_OPTION: "II"})})
    update = prepare_client_update(content, state, models, ["f", "g"], lambda: task, lr=LR, device=CPU, to_input=_identity)
    result = train_local(models, task, epochs=2, lr=LR, to_input=_identity, hooks=update.hooks, optimizer="sgd")
    records = update.reply_records(result, ("f",))
    assert set(records[wire.CV_DELTA].keys()) == {"f.weight"}
    stored = state[wire.CLIENT_CV_STATE]
    assert torch.equal(torch.as_tensor(stored["g.weight"].numpy()), c_i["g.weight"])  # g's c_i kept
    assert not torch.equal(torch.as_tensor(stored["f.weight"].numpy()), c_i["f.weight"])  # f's c_i updated


def test_scaffold_server_update_equations_with_partial_participation() -> None:
    strategy = _strategy(strategy="scaffold", **{"server-lr": 0.5, "fraction-train": 0.5, "aggregation-weights": "uniform"})
    grid = _grid((3, 3, 3, 3))
    random.seed(1)
    x = ArrayRecord(_linear().state_dict())
    c = np.zeros((1, DIM))
    for server_round in (1, 2):
        messages = list(strategy.configure_train(server_round, x, ConfigRecord(), grid))
        assert len(messages) == 2
        sent_c = messages[0].content[wire.SERVER_CV]
        np.testing.assert_allclose(sent_c["f.weight"].numpy() if len(sent_c) else np.zeros((1, DIM)), c, atol=1e-7)
        replies = list(grid.send_and_receive(messages))
        new_x, _ = strategy.aggregate_train(server_round, replies)
        mean_dy = np.mean([_weight(r.content[wire.ARRAYS]) - _weight(x) for r in replies], axis=0)
        mean_dc = np.mean([_weight(r.content[wire.CV_DELTA]) for r in replies], axis=0)
        np.testing.assert_allclose(_weight(new_x), _weight(x) + 0.5 * mean_dy, rtol=1e-5, atol=1e-6)  # eta_g = 0.5
        c = c + (2 / 4) * mean_dc  # |S| / N = 2 / 4
        np.testing.assert_allclose(_weight(strategy.server_cv), c, rtol=1e-5, atol=1e-6)
        x = new_x


def test_client_control_variate_survives_rounds_in_the_inprocess_grid() -> None:
    strategy = _strategy(strategy="scaffold")
    _, grid = _federate(strategy, rounds=1, epochs=(3, 3))
    after_1 = {n: _weight(ctx.state[wire.CLIENT_CV_STATE]) for n, ctx in grid.contexts.items()}
    # round 2 on the same grid: each node starts from its stored c_i
    x = ArrayRecord({"f.weight": torch.as_tensor(strategy.current_arrays["f.weight"].numpy())})
    replies = list(grid.send_and_receive(strategy.configure_train(2, x, ConfigRecord(), grid)))
    for reply in replies:
        node = reply.metadata.src_node_id
        after_2 = _weight(grid.contexts[node].state[wire.CLIENT_CV_STATE])
        assert not np.allclose(after_2, after_1[node])
        # the reply's delta is relative to the stored round-1 c_i: it was read back, not reset
        np.testing.assert_allclose(_weight(reply.content[wire.CV_DELTA]), after_2 - after_1[node], rtol=1e-5, atol=1e-6)
        assert reply.content[wire.METRICS][wire.CV_ROUNDS] == 2.0  # the node's round counter, from its state


def test_proximal_term_adds_mu_times_distance_to_the_gradient() -> None:
    models = _linear()
    models["f"].load_state_dict({"weight": torch.ones(1, DIM)})
    params = shared_parameters(models, ["f"])
    assert list(params) == ["f.weight"] and params["f.weight"] is models["f"].weight  # keyed as on the wire
    hook = ProximalTerm(0.3, params)
    with torch.no_grad():
        models["f"].weight.add_(torch.arange(DIM, dtype=torch.float32))
    models["f"].weight.grad = torch.full((1, DIM), 2.0)
    hook.after_backward()
    torch.testing.assert_close(models["f"].weight.grad, 2.0 + 0.3 * torch.arange(DIM, dtype=torch.float32).unsqueeze(0))


def test_full_gradient_leaves_the_model_and_batchnorm_statistics_alone() -> None:
    models = nn.ModuleDict({"f": nn.Sequential(nn.Linear(DIM, 3), nn.BatchNorm1d(3), nn.Linear(3, 1))})
    before = {k: v.clone() for k, v in models.state_dict().items()}
    params = shared_parameters(models, ["f"])
    grads = full_gradient(models, params, _task(0, batch_size=4), CPU, _identity)
    assert set(grads) == {f"f.{name}" for name, _ in models["f"].named_parameters()}
    assert grads["f.2.weight"].abs().sum() > 0  # a real gradient was taken
    assert all(torch.equal(before[k], v) for k, v in models.state_dict().items())
    assert all(p.grad is None for p in models.parameters())


# --------------------------------------------------------------------------- the real app
@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in STRATEGIES.names() if n not in ("krum", "multikrum", "bulyan")])
def test_every_strategy_trains_fedul_through_the_real_client_app(name: str) -> None:
    """One round of the real FedUL ClientApp per strategy (one config change each) on 2
    nodes; ``samples-per-client`` keeps it cheap (500 embedded-sample images per client).
    Krum, MultiKrum and Bulyan need 3 nodes: ``tests/test_privacy_robustness.py``."""
    from fedul_flwr.client_app import app as client_app
    from fedul_flwr.methods import get_method
    from fedul_flwr.server_app import global_models

    rc = {"strategy": name, "samples-per-client": 500}
    cfg = resolve_config(rc)
    method = get_method(cfg.method)(cfg)
    grid = InProcessGrid(client_app, 2, rc)
    models = global_models(cfg, method, 1, 10, 28)
    initial = ArrayRecord(models.state_dict())
    assert all(k.startswith("f.") for k in initial.keys())
    random.seed(0)
    settings = ConfigRecord({wire.RUN_CONFIG: cfg.to_json()})  # what the ServerApp sends
    result = build_strategy(cfg, method.aggregation()).start(
        grid=grid, initial_arrays=initial, num_rounds=1, train_config=settings
    )
    models.load_state_dict(result.arrays.to_torch_state_dict())  # loads back into f
    changed = [k for k in initial.keys() if not np.allclose(initial[k].numpy(), result.arrays[k].numpy())]
    assert changed and all(np.isfinite(result.arrays[k].numpy()).all() for k in result.arrays.keys())
    assert result.train_metrics_clientapp[1]["num-steps"] > 0
    stored = [ctx.state for ctx in grid.contexts.values() if wire.CLIENT_CV_STATE in ctx.state]
    if name == "scaffold":  # c_i of every sampled node, one array per trainable parameter of f
        assert len(stored) == 2
        assert set(stored[0][wire.CLIENT_CV_STATE].keys()) == {f"f.{n}" for n, _ in models["f"].named_parameters()}
    else:
        assert not stored

# --------------------------------------------------------------------------- fedul compare
def test_compare_builds_one_run_per_strategy_and_seed_and_renders_the_table() -> None:
    import argparse

    from fedul_flwr.experiments import compare

    args = argparse.Namespace(set=["lr=0.05", "fedprox:proximal-mu=0.1"], out="/tmp/x", strategies=["fedavg", "fedprox", "krum"],
                              dataset="mnist-sample", data_dir="", rounds=2, clients=5, seeds="0,1")  # fmt: skip
    runs, base, common = compare.compare_runs(args)
    assert common == {"lr": 0.05}
    assert [(s.column, s.seed) for s, _ in runs] == [(n, seed) for n in ("fedavg", "fedprox", "krum") for seed in (0, 1)]
    configs = {(s.column, s.seed): rc for s, rc in runs}
    assert configs[("fedprox", 1)]["proximal-mu"] == 0.1 and configs[("fedavg", 0)]["lr"] == 0.05
    assert base["min-train-nodes"] == 3  # Krum needs 2f + 3 replies
    for _, rc in runs:
        resolve_config(rc)  # every run's config is valid
    with pytest.raises(SystemExit, match="not a strategy"):
        compare.compare_runs(argparse.Namespace(**{**vars(args), "set": ["fedsgd:lr=0.1"]}))

    def record(strategy: str, settings: dict, last: float, best: float) -> dict:
        return {"spec": {"column": strategy, "overrides": settings}, "last-test-error": last, "best-test-error": best}

    records = [record("fedavg", {}, e, e - 0.01) for e in (0.10, 0.12)] + [record("fedprox", {"proximal-mu": 0.01}, 0.2, 0.15)]
    table = compare.render(records, "title")
    assert ["fedavg", "-", "11.00 (1.41)", "10.00 (1.41)", "2"] in table_rows(table)
    assert ["fedprox", "proximal-mu=0.01", "20.00", "15.00", "1"] in table_rows(table)


def test_compare_command_line_offers_the_registered_strategies_and_datasets(capsys) -> None:
    from fedul_flwr import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["compare", "--help"])
    assert exit_info.value.code == 0
    usage = capsys.readouterr().out
    assert "fedmedian" in usage and "bulyan" in usage and "mnist-sample" in usage
    with pytest.raises(SystemExit) as exit_info:  # argparse rejects a name no registry holds
        cli.main(["compare", "--strategies", "fedsgd"])
    assert exit_info.value.code == 2 and "fedsgd" in capsys.readouterr().err
