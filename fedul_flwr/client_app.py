"""The ClientApp: one client's local round of FedUL (or another method).

Train: receive f's arrays, build the client's data (once per process) and the method's
local task, run the shared local loop (with the strategy's client-side work from
:mod:`fedul_flwr.client_update`), reply with f's arrays, scalar metrics, the node's stable key
(the server's aggregation order) and the strategy's extra records, e.g. SCAFFOLD's
control-variate delta.
The prior matrix, the set sizes, the images and Q_c never leave the node.
Evaluate: test f on the client's labeled local test split (``client-test-fraction > 0``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedul_flwr.client_update import prepare_client_update
from fedul_flwr.config import RunConfig, resolve_config
from fedul_flwr.data.client_data import ClientData, client_from_node_config, node_key
from fedul_flwr.methods import get_method
from fedul_flwr.models import build_model
from fedul_flwr.runtime import configure_threads, pick_device
from fedul_flwr.strategies import NODE_RECORD
from fedul_flwr.training import evaluate, train_local

log = logging.getLogger(__name__)

app = ClientApp()


def _client(context: Context) -> tuple[RunConfig, ClientData, torch.device]:
    configure_threads()
    cfg = _resolve(context.run_config)
    with_labels = get_method(cfg.method).needs_labels  # only the supervised reference
    # deployment: node_config["data-dir"]; simulation: partition-id / num-partitions
    client = client_from_node_config(cfg, context.node_config, with_labels=with_labels)
    return cfg, client, pick_device(cfg.device)


@functools.lru_cache(maxsize=8)
def _resolve_items(items: tuple[tuple[str, Any], ...]) -> RunConfig:
    return resolve_config(dict(items))


def _resolve(run_config: Mapping[str, Any]) -> RunConfig:
    """``resolve_config(run_config)``, once per process and run configuration.

    Every message of a run carries the same ``run_config``; resolving it again costs ~0.1 ms
    without a preset but ~0.2 s with one (Hydra compose), per message (docs/performance.md).
    """
    try:
        return _resolve_items(tuple(sorted(run_config.items())))
    except TypeError:  # an unhashable value: resolve without the cache
        return resolve_config(run_config)


@functools.lru_cache(maxsize=2)
def _module(name: str, channels: int, classes: int, size: int, device: str) -> torch.nn.Module:
    return build_model(name, channels, classes, size).to(device)


def _model(cfg: RunConfig, client: ClientData, msg: Message, device: torch.device) -> torch.nn.Module:
    """f with the received weights, on ``device``.

    The module is built once per process (and model, shape, device) and only its weights
    are replaced per message: ``load_state_dict`` overwrites every parameter and buffer,
    and the optimiser is created afresh in each round, so nothing carries over between
    clients or rounds. Building paper-cnn / resnet18 costs 0.2-0.3 s per message on a CPU
    (docs/performance.md). Each process (Ray actor) runs one message at a time.
    """
    _, channels, size, _ = client.x.shape
    model = _module(cfg.model, channels, len(client.class_names), size, str(device))
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return model


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One local round: E epochs of the method's loss on the client's U sets."""
    cfg, client, device = _client(context)
    model = _model(cfg, client, msg, device)
    method = get_method(cfg.method)(cfg)
    task = method.local_task(client, device)
    config = msg.content["config"]
    server_round = int(config["server-round"])  # a resumed run's strategy continues the numbering
    partition_id = node_key(context.node_config, context.node_id)
    seed = int(np.random.SeedSequence([cfg.seed, server_round, partition_id]).generate_state(1)[0])
    update = prepare_client_update(
        msg.content, context.state, model, task, lr=cfg.lr, batch_size=cfg.batch_size, device=device
    )
    result = train_local(
        model,
        task,
        epochs=cfg.local_epochs_of(partition_id),
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        l1_weight=cfg.l1_weight,
        seed=seed,
        device=device,
        hooks=update.hooks,
        optimizer=cfg.local_optimizer,
    )
    extra = update.reply_records(model, result)  # strategy records; fills update.metrics
    metrics = MetricRecord(
        {
            "train-loss": result.loss,
            "num-examples": result.num_examples,
            "uniform-weight": 1,
            "num-steps": result.num_steps,
            **update.metrics,
        }
    )
    arrays = ArrayRecord({k: v.detach().cpu() for k, v in method.exchanged_state(model).items()})
    node = ConfigRecord({"node-key": partition_id})  # the server aggregates in this order
    return Message(RecordDict({"arrays": arrays, "metrics": metrics, NODE_RECORD: node, **extra}), reply_to=msg)


@app.evaluate()
def evaluate_local(msg: Message, context: Context) -> Message:
    """Test f (argmax f(x), no Q_c) on the labeled local test split, if the client has one."""
    cfg, client, device = _client(context)
    if client.test_x is None or client.test_y is None:
        raise ValueError("this client has no labeled local test split (client-test-fraction=0)")
    model = _model(cfg, client, msg, device)
    result = evaluate(model, client.test_x, client.test_y, batch_size=cfg.eval_batch_size, device=device)
    result["uniform-weight"] = 1.0
    return Message(RecordDict({"metrics": MetricRecord(result)}), reply_to=msg)
