"""The bare loop of the benchmarks: a FedAvg round of any method over simulated clients,
sequentially in one process, exactly as the ClientApp trains each client (same data, seeds,
batch order and loop), without Flower. ``fedul benchmark`` compares it with ``flwr run .``
and times the methods, the loop's executions and the augmentations on it."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fedul_flwr.acceleration import Acceleration
from fedul_flwr.augment import build_augmentation
from fedul_flwr.checkpoint import save_checkpoint
from fedul_flwr.config import RunConfig
from fedul_flwr.data.client_data import ClientData
from fedul_flwr.data.image_dataset import normalize
from fedul_flwr.data.simulated import load_client, load_run_dataset
from fedul_flwr.methods import Method, RoundContext
from fedul_flwr.methods.base import Predictor
from fedul_flwr.execution import loop_acceleration
from fedul_flwr.server_app import global_models
from fedul_flwr.evaluation import evaluate
from fedul_flwr.training import LocalLoop

__all__ = ["Federation", "State", "bare_round", "build_federation", "central_eval", "client_parts", "fedavg"]

State = dict[str, torch.Tensor]


@dataclass
class Federation:
    """What the bare loop needs, built once (as a Ray actor builds it once).

    Attributes
    ----------
    cfg : RunConfig
        Run configuration the federation was built from.
    clients : list[ClientData]
        Client i = simulated partition i of C (``load_client``, as the ClientApp loads it).
    models : nn.ModuleDict
        The method's exchanged models on ``device`` (keys = model names, so state-dict keys
        are the wire keys ``"<model>.<param>"``).
    initial : State
        Their initial weights, seeded as the ServerApp seeds them.
    predictors : dict[str, Predictor]
        The method's predictors, evaluated centrally every round.
    test_x, test_y : torch.Tensor
        uint8 test images and their labels.
    to_input : Callable[[torch.Tensor], torch.Tensor]
        uint8 images -> model inputs with the dataset's constants (the ServerApp's).
    device : torch.device
        Where training and evaluation run.
    """

    cfg: RunConfig
    clients: list[ClientData]
    models: nn.ModuleDict
    initial: State
    predictors: dict[str, Predictor]
    test_x: torch.Tensor
    test_y: torch.Tensor
    to_input: Callable[[torch.Tensor], torch.Tensor]
    device: torch.device


def client_parts(*methods: Method) -> frozenset[str]:
    """The data parts the ClientApp loads for ``methods`` (``requires`` and ``uses`` of each)."""
    return frozenset(part for m in methods for part in (*m.requires, *m.uses))


def build_federation(cfg: RunConfig, num_clients: int, device: torch.device, methods: Sequence[Method]) -> Federation:
    """Clients, the exchanged models (seeded as the ServerApp seeds them) and the test set.

    Parameters
    ----------
    cfg : RunConfig
        Run configuration (dataset, model, seed, ...).
    num_clients : int
        C; client i is partition i of C.
    device : torch.device
        Where the models live.
    methods : Sequence[Method]
        The methods that will train these clients: each client is loaded with the parts all
        of them need (FedUL's ``unlabeled`` images *are* the supervised reference's
        ``labeled.x``, so both methods train the very same tensors); the models and
        predictors are those of the first.

    Raises
    ------
    ValueError
        If the first method keeps models on the nodes (the bare loop exchanges every model).
    """
    method = methods[0]
    kept = [s.name for s in method.model_specs() if not s.exchanged]
    if kept:
        raise ValueError(f"the bare loop handles exchanged models only; method {method.name!r} keeps {kept}")
    parts = client_parts(*methods)
    clients = [load_client(cfg, i, num_clients, parts) for i in range(num_clients)]
    data = load_run_dataset(cfg)
    models = global_models(cfg, method, data.in_channels, data.num_classes, data.image_size).to(device)
    initial = {k: v.detach().clone() for k, v in models.state_dict().items()}
    to_input = functools.partial(normalize, mean=data.mean, std=data.std)
    return Federation(cfg, clients, models, initial, method.predictors(), data.test_x, data.test_y, to_input, device)


def fedavg(states: Sequence[State], weights: Sequence[float]) -> State:
    """Weighted average of state dicts (Flower's FedAvg; integer buffers cast back)."""
    total = float(sum(weights))
    out: State = {}
    for key, ref in states[0].items():
        acc = sum(s[key].double() * (w / total) for s, w in zip(states, weights, strict=True))
        out[key] = acc.to(ref.dtype)
    return out


def bare_round(
    fed: Federation, method: Method, global_state: State, server_round: int, acceleration: Acceleration | None = None
) -> tuple[State, int]:
    """One FedAvg round of ``method`` over all clients, sequentially, in this process.

    Each client trains as the ClientApp trains it: the method's ``local_task`` on
    :class:`~fedul_flwr.methods.base.RoundContext` (seed, round, partition id), then
    ``train_local`` with the context's ``batch_seed``, the client's ``to_input`` and its
    local epochs; the replies are averaged in partition-id order (the strategy's order).

    Parameters
    ----------
    fed : Federation
        Clients and models (``fed.models`` is overwritten).
    method : Method
        The method, built on its run configuration (``method.cfg``).
    global_state : State
        The global weights the round starts from.
    server_round : int
        The round number (from 1; it seeds the batch order).
    acceleration : Acceleration | None
        How the loop executes (``None``: the run configuration's settings on ``fed.device``,
        as the ClientApp resolves them).

    Returns
    -------
    (State, int)
        The new global state and the number of images trained (sum of n_c x E_c over clients).
    """
    cfg = method.cfg
    acc = acceleration if acceleration is not None else loop_acceleration(cfg, fed.device)
    states, weights, samples = [], [], 0
    for pid, client in enumerate(fed.clients):
        fed.models.load_state_dict(global_state)
        ctx = RoundContext(cfg.seed, server_round, pid, fed.device)
        epochs = cfg.local_epochs_of(pid)
        loop = LocalLoop(
            epochs, cfg.lr_of(server_round), cfg.l1_weight, cfg.local_optimizer, ctx.batch_seed, fed.device,
            client.to_input, acceleration=acc, momentum=cfg.local_momentum,
            augment=build_augmentation(cfg.augment, client.image_shape[1], client.flip),
        )  # fmt: skip
        result = method.local_update(client, fed.models, ctx, loop)
        states.append({k: v.detach().clone() for k, v in fed.models.state_dict().items()})
        weights.append(result.num_examples if cfg.aggregation_weights == "num-examples" else 1.0)
        samples += result.num_examples * epochs
    return fedavg(states, weights), samples


def central_eval(
    fed: Federation, state: State, server_round: int, run_dir: Path | None = None, acceleration: Acceleration | None = None
) -> dict[str, float]:
    """The ServerApp's per-round work: checkpoint the models (rounds >= 1, if ``run_dir``) and
    evaluate every predictor of the method on the test set.

    Returns
    -------
    dict[str, float]
        The headline predictor's metrics (``test-accuracy``, ...).
    """
    fed.models.load_state_dict(state)
    if run_dir is not None and server_round > 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_checkpoint(run_dir, server_round, fed.models.state_dict(), fed.cfg.as_dict())
    acc = acceleration if acceleration is not None else loop_acceleration(fed.cfg, fed.device)
    results = [
        evaluate(
            fed.models, predict, fed.test_x, fed.test_y, to_input=fed.to_input, batch_size=fed.cfg.eval_batch_size,
            device=fed.device, acceleration=acc,
        )  # fmt: skip
        for predict in fed.predictors.values()
    ]
    return results[0]
