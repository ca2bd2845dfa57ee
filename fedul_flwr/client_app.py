"""The ClientApp: one client's local round of the run's method.

Train: read the run's settings and dataset facts from the message (resolved once by the
server), build the client's data (once per process; a deployed node reads only its own folder) and the method's models with this round's weights (the
received exchanged models; the models the method keeps on the node from ``context.state``),
let the strategy set up its client-side work (:mod:`fedul_flwr.strategy_hooks`), run the
method's local update, and reply with the models the method sends, the metrics and uploads,
the node's stable key (the server's aggregation order) and the strategy's extra records.
Nothing here depends on which method runs: the method object says what to do.

Evaluate: test the method's headline predictor on the client's labeled local test split
(``client-test-fraction > 0``, or a deployed node's ``test/`` folder).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from logging import ERROR, INFO
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from torch import nn

from fedul_flwr import wire
from fedul_flwr.strategy_hooks import prepare_client_update
from fedul_flwr.config import RunConfig, config_from_json
from fedul_flwr.console import set_verbose
from fedul_flwr.data.client_data import ClientData
from fedul_flwr.data.image_dataset import DatasetInfo
from fedul_flwr.data.sources import client_from_node_config, node_key
from fedul_flwr.methods import Method, NothingToTrain, RoundContext, get_method
from fedul_flwr.models import build_model
from fedul_flwr.optimizer_state import OptimizerStates
from fedul_flwr.privacy.client import local_dp_mod
from fedul_flwr.acceleration import Acceleration
from fedul_flwr.augment import build_augmentation
from fedul_flwr.execution import configure_threads, loop_acceleration, model_seed, pick_device
from fedul_flwr.evaluation import evaluate
from fedul_flwr.training import LocalLoop


def error_reply_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Client-side mod: an exception of the ClientApp becomes an error reply naming its type,
    in the form a SuperNode gives (``<class 'pkg.NodeDataError'>:<'message'>``, code
    ``CLIENT_APP_RAISED_EXCEPTION``), on every runtime: Flower's Ray backend would otherwise
    report every client error as its own ``ClientAppException`` and the type would be lost.
    The server records the type (:func:`fedul_flwr.strategies.error_type`); the node logs one
    error line, and the traceback with ``verbose=true``."""
    try:
        return call_next(msg, context)
    except Exception as exc:  # noqa: BLE001 -- every client error becomes the reply's error
        log(ERROR, "fedul-flwr: node %s, %s message: %s: %s", context.node_id, msg.metadata.message_type,
            type(exc).__name__, exc)  # fmt: skip
        log(INFO, "fedul-flwr: the traceback of that error", exc_info=exc)
        return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(exc)}:<'{exc}'>"), reply_to=msg)


app = ClientApp(mods=[error_reply_mod, local_dp_mod])  # LocalDpMod where differential-privacy=client-local


@dataclass(frozen=True)
class _Client:
    cfg: RunConfig
    method: Method
    data: ClientData
    device: torch.device
    key: int
    acceleration: Acceleration


def _client(msg: Message, context: Context) -> _Client:
    """The run's settings (from the message), method, this node's data, device and key.

    Raises
    ------
    ValueError
        If the message carries no resolved run configuration (a foreign ServerApp).
    """
    config = msg.content.config_records.get(wire.CONFIG, ConfigRecord())
    text = config.get(wire.RUN_CONFIG)
    if not isinstance(text, str):
        raise ValueError(
            f"the {msg.metadata.message_type} message carries no '{wire.RUN_CONFIG}' in its config: "
            "the fedul-flwr ServerApp sends the resolved run configuration with every message"
        )
    cfg = config_from_json(text)
    facts = config.get(wire.DATASET_FACTS)
    set_verbose(cfg.verbose)  # the node's console (a simulation's Ray actors print into the run's log)
    configure_threads(cfg.client_threads)
    method = get_method(cfg.method)(cfg)
    data = client_from_node_config(cfg, context.node_config, method=cfg.method, parts=method.requires, uses=method.uses,
                                   facts=DatasetInfo.from_json(facts) if isinstance(facts, str) else None)  # fmt: skip
    device = pick_device(cfg.device)
    key = node_key(context.node_config, context.node_id)
    return _Client(cfg, method, data, device, key, loop_acceleration(cfg, device))


class _ThreadModules(threading.local):
    """The ClientApp's modules, built once per thread (the in-process engine trains clients in
    threads at once, :mod:`fedul_flwr.inprocess`) and model, shape and device."""

    def __init__(self) -> None:
        self.modules: dict[tuple[Any, ...], nn.Module] = {}

    def __call__(self, name: str, arch: str, channels: int, classes: int, size: int, device: str, width: float) -> nn.Module:
        """This thread's module of that model and shape (built on first use)."""
        key = (name, arch, channels, classes, size, device, width)
        if key not in self.modules:
            if len(self.modules) >= 16:  # a long-lived thread that met many models: start again
                self.modules.clear()
            self.modules[key] = build_model(arch, channels, classes, size, width=width).to(device)
        return self.modules[key]

    def cache_clear(self) -> None:
        """Forget this thread's modules."""
        self.modules.clear()

    @property
    def currsize(self) -> int:
        """How many modules this thread holds."""
        return len(self.modules)


_module = _ThreadModules()


_RECEIVED: list[Any] = [None, None]  # the last received ArrayRecord and its tensors
_RECEIVED_LOCK = threading.Lock()


def _received(record: ArrayRecord) -> dict[str, torch.Tensor]:
    """``record.to_torch_state_dict()``, decoded once per record object: a strategy sends one
    ArrayRecord to every node of a round, and in one process (the in-process engine) the
    nodes' messages share it, so the round's clients decode it once instead of once each. The
    tensors are only read (copied into the modules)."""
    with _RECEIVED_LOCK:
        if _RECEIVED[0] is record:
            return _RECEIVED[1]
    with wire.decoding():
        tensors = record.to_torch_state_dict()
    with _RECEIVED_LOCK:
        _RECEIVED[:] = [record, tensors]
    return tensors


def _models(c: _Client, msg: Message, state: RecordDict) -> nn.ModuleDict:
    """The method's models on the device, with this round's weights.

    Modules are built once per process and thread (and model, shape, device: the in-process
    engine's parallel path trains clients in threads at once, :mod:`fedul_flwr.inprocess`);
    their weights are replaced every message: ``load_state_dict`` overwrites every parameter and buffer, so
    nothing carries over between clients or rounds except what the method keeps in the
    node's ``context.state``. A kept model that is not in the state yet starts from weights
    seeded by (run seed, model, node key).
    """
    channels, size, _ = c.data.image_shape
    specs = c.method.model_specs()
    models = nn.ModuleDict()
    for spec in specs:
        models[spec.name] = _module(spec.name, spec.arch or c.cfg.model, channels, c.data.num_classes, size, str(c.device),
                                    spec.width)  # fmt: skip
    exchanged = nn.ModuleDict({s.name: models[s.name] for s in specs if s.exchanged})
    exchanged.load_state_dict(_received(msg.content[wire.ARRAYS]))
    for index, spec in enumerate(specs):
        if spec.kept:
            saved = state.array_records.get(wire.KEPT_MODEL_STATE + spec.name)
            if saved is not None:
                with wire.decoding():
                    weights = saved.to_torch_state_dict()
            else:
                arch = spec.arch or c.cfg.model
                seed = model_seed(c.cfg.seed, index, c.key)
                weights = build_model(arch, channels, c.data.num_classes, size, seed=seed, width=spec.width).state_dict()
            models[spec.name].load_state_dict(weights)
    return models


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One local round of the run's method on this node's data."""
    c = _client(msg, context)
    cfg, method = c.cfg, c.method
    server_round = int(msg.content[wire.CONFIG][wire.SERVER_ROUND])  # a resumed run continues the numbering
    broadcast = {k: v for k, v in msg.content[wire.CONFIG].items() if k not in (*wire.RUN_SETTINGS, wire.SERVER_ROUND)}
    ctx = RoundContext(cfg.seed, server_round, c.key, c.device, broadcast)
    if method.sits_out(c.data):  # e.g. an unlabeled client under a method that trains on labels
        log(INFO, "%s sits round %d out: method %r needs %s, it holds %s", c.data.node, server_round, cfg.method,
                 list(method.requires), list(c.data.parts()))  # fmt: skip
        return _idle_reply(msg, c)
    models = _models(c, msg, context.state)
    specs = method.model_specs()
    shared = [s.name for s in specs if s.exchanged and s.trained]
    try:  # SCAFFOLD option I builds the local task in prepare_client_update: it may have nothing to train too
        update = prepare_client_update(
            msg.content,
            context.state,
            models,
            shared,
            lambda: method.local_task(c.data, models, ctx),
            lr=cfg.lr_of(server_round),
            device=c.device,
            to_input=c.data.to_input,
        )
        kept = cfg.local_optimizer_state == "kept"  # the state the server kept for this client (none at first)
        states = OptimizerStates.from_record(msg.content.array_records.get(wire.OPTIMIZER_STATE)) if kept else None
        loop = LocalLoop(
            epochs=cfg.local_epochs_of(c.key),
            lr=cfg.lr_of(server_round),
            l1_weight=cfg.l1_weight,
            optimizer=cfg.local_optimizer,
            momentum=cfg.local_momentum,
            seed=ctx.batch_seed,
            device=c.device,
            to_input=c.data.to_input,
            hooks=update.hooks,
            acceleration=c.acceleration,
            augment=build_augmentation(cfg.augment, c.data.image_shape[1], c.data.flip),
            batchable=method.batched_cohort,
            weight_decay=cfg.weight_decay,
            nesterov=cfg.nesterov,
            grad_clip_norm=cfg.grad_clip_norm,
            optimizer_states=states,
        )
        result = method.local_update(c.data, models, ctx, loop)
    except NothingToTrain as idle:
        log(INFO, "%s has nothing to train in round %d: %s", c.data.node, server_round, idle)
        return _idle_reply(msg, c)
    for spec in specs:
        if spec.kept:
            weights = {k: v.detach().cpu() for k, v in models[spec.name].state_dict().items()}
            context.state[wire.KEPT_MODEL_STATE + spec.name] = ArrayRecord(weights)
    sent = method.sent_models(c.data, ctx)
    if not sent:  # trained nothing it could send (e.g. FixMatch with no image above the threshold)
        return _idle_reply(msg, c)
    extra = update.reply_records(result, sent)  # strategy records; fills update.metrics
    if states is not None:
        extra[wire.OPTIMIZER_STATE] = states.to_record()
    metrics = {
        wire.TRAIN_LOSS: result.loss,
        wire.NUM_EXAMPLES: result.num_examples,
        wire.UNIFORM_WEIGHT: 1,
        wire.NUM_STEPS: result.num_steps,
        **update.metrics,
        **method.uploads(c.data, models, ctx),
    }
    in_order = [s.name for s in specs if s.name in sent]  # the global ArrayRecord's order (Flower's DP pairs by position)
    arrays = ArrayRecord(
        {f"{wire.model_prefix(name)}{k}": v.detach().cpu() for name in in_order for k, v in models[name].state_dict().items()}
    )
    return _reply(msg, c, arrays, metrics, extra)


def _idle_reply(msg: Message, c: _Client) -> Message:
    """The reply of a client with nothing to train this round: no model, zero examples (the
    server counts it as ``idle-replies``; no aggregation sees it,
    :func:`fedul_flwr.strategies.is_idle`)."""
    return _reply(msg, c, ArrayRecord(), {wire.TRAIN_LOSS: 0.0, wire.NUM_EXAMPLES: 0, wire.UNIFORM_WEIGHT: 0, wire.NUM_STEPS: 0})


def _reply(
    msg: Message, c: _Client, arrays: ArrayRecord, metrics: dict[str, Any], extra: dict[str, ArrayRecord] | None = None
) -> Message:
    """The train reply: the sent models' arrays, the metrics, the node key (the server
    aggregates in this order) and the strategy's extra records."""
    node = ConfigRecord({wire.NODE_KEY: c.key})
    content = {wire.ARRAYS: arrays, wire.METRICS: MetricRecord(metrics), wire.NODE_RECORD: node, **(extra or {})}
    return Message(RecordDict(content), reply_to=msg)


@app.evaluate()
def evaluate_local(msg: Message, context: Context) -> Message:
    """Test the method's headline predictor on the labeled local test split, if the client has one."""
    c = _client(msg, context)
    if c.data.test is None:
        raise ValueError(f"{c.data.node} has no labeled local test split (client-test-fraction=0, no test/ folder)")
    models = _models(c, msg, context.state)
    predict = next(iter(c.method.predictors().values()))
    result = evaluate(
        models, predict, c.data.test.x, c.data.test.y, to_input=c.data.to_input, batch_size=c.cfg.eval_batch_size,
        device=c.device, acceleration=c.acceleration,
    )  # fmt: skip
    result[wire.UNIFORM_WEIGHT] = 1.0
    return Message(RecordDict({wire.METRICS: MetricRecord(result)}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """What the run's method announces about this node's data (e.g. FedPU's positive classes),
    and the node's stable key (record ``"node"``)."""
    c = _client(msg, context)
    node = ConfigRecord({wire.NODE_KEY: c.key})
    return Message(RecordDict({wire.METRICS: MetricRecord(c.method.announce(c.data)), wire.NODE_RECORD: node}), reply_to=msg)
