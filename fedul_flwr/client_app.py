"""The ClientApp: one client's local round of FedUL (or another method).

Train: receive f's arrays, build the client's data (once per process) and the method's
local task, run the shared local loop, reply with f's arrays and scalar metrics only.
The prior matrix, the set sizes, the images and Q_c never leave the node.
Evaluate: test f on the client's labeled local test split (``client-test-fraction > 0``).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedul_flwr.config import RunConfig, resolve_config
from fedul_flwr.data.client_data import ClientData, load_client
from fedul_flwr.methods import get_method
from fedul_flwr.models import build_model
from fedul_flwr.runtime import configure_threads, pick_device
from fedul_flwr.training import evaluate, train_local

log = logging.getLogger(__name__)

app = ClientApp()


def _client(context: Context) -> tuple[RunConfig, ClientData, torch.device]:
    configure_threads()
    cfg = resolve_config(context.run_config)
    node = context.node_config
    client = load_client(cfg, int(node["partition-id"]), int(node["num-partitions"]))
    return cfg, client, pick_device(cfg.device)


def _model(cfg: RunConfig, client: ClientData, msg: Message, device: torch.device) -> torch.nn.Module:
    _, channels, size, _ = client.x.shape
    model = build_model(cfg.model, channels, len(client.class_names), size)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return model.to(device)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One local round: E epochs of the method's loss on the client's U sets."""
    cfg, client, device = _client(context)
    model = _model(cfg, client, msg, device)
    method = get_method(cfg.method)(cfg)
    task = method.local_task(client, device)
    server_round = int(msg.content["config"]["server-round"])
    partition_id = int(context.node_config["partition-id"])
    seed = int(np.random.SeedSequence([cfg.seed, server_round, partition_id]).generate_state(1)[0])
    result = train_local(
        model,
        task,
        epochs=cfg.local_epochs,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        l1_weight=cfg.l1_weight,
        seed=seed,
        device=device,
    )
    metrics = MetricRecord(
        {
            "train-loss": result.loss,
            "num-examples": result.num_examples,
            "uniform-weight": 1,
            "num-steps": result.num_steps,
        }
    )
    arrays = ArrayRecord({k: v.detach().cpu() for k, v in method.exchanged_state(model).items()})
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


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
