"""Client-side work of the server strategies, in one place for every method.

The strategy decides, through the train message, what a client does besides plain local
training; this module turns that message into :class:`~fedul_flwr.training.StepHook`
gradient editors for the shared loop and, after training, into the extra reply records.
It touches only gradients and arrays, so it works for FedUL and every other method.

- FedProx (Li et al., MLSys 2020): the config carries ``proximal-mu`` = mu > 0; the local
  objective gets (mu / 2) ||w - w_global||^2, i.e. every gradient gets mu (w - w_global).
- SCAFFOLD (Karimireddy et al., ICML 2020, Alg. 1): the message carries the server control
  variate c (``server-cv``) and the config ``scaffold-option``. Every gradient gets
  c - c_i; after training
  option I:  c_i+ = g_i(x), the gradient of the local loss at the received model x over all
  local data (one extra pass, before training; the L1 penalty is left out: it is the same
  on every client and cancels in c - c_i), or
  option II: c_i+ = c_i - c + (x - y_i) / (K * lr), K = local steps, lr = local step size.
  c_i lives in ``context.state`` (survives rounds); the reply carries Delta c_i =
  c_i+ - c_i as ``cv-delta`` and the metric ``scaffold-cv-rounds`` (rounds this node's
  c_i has been updated in, also kept in the state). Option II is exact for ``local-optimizer = "sgd"``; with Adam
  (x - y_i) / (K * lr) is the mean Adam direction, a different scale than gradients, and
  Adam rescales the correction c - c_i per coordinate under either option: on MNIST
  non-IID SCAFFOLD with Adam clients diverged after round 1 (README, "The comparison
  table"), so use SGD clients with SCAFFOLD.
- FedNova (Wang et al., NeurIPS 2020) needs only the step count tau_i, which every client
  reports as the metric ``num-steps``.

Control variates cover f's trainable parameters (``named_parameters``), keyed by name;
a key missing from c or c_i counts as zero.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from torch import nn

from fedul_flwr.methods.base import LocalTask
from fedul_flwr.strategies.scaffold import CV_DELTA_KEY, OPTION_CONFIG_KEY, SERVER_CV_KEY
from fedul_flwr.training import StepHook, TrainResult

PROXIMAL_MU_KEY = "proximal-mu"  # set by Flower's FedProx in the train config
CLIENT_CV_STATE_KEY = "scaffold-client-cv"  # c_i in context.state
CV_ROUNDS_KEY = "scaffold-cv-rounds"  # rounds c_i was updated in (state and reply metric)

Tensors = dict[str, torch.Tensor]


def _parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def _on(record: ArrayRecord | None, model: nn.Module) -> Tensors:
    """Tensors of ``record`` for f's trainable parameters (zeros where missing), on f's device."""
    values = record.to_torch_state_dict() if record is not None and len(record) else {}
    return {
        name: values[name].to(p.device, p.dtype) if name in values else torch.zeros_like(p)
        for name, p in _parameters(model).items()
    }


class ProximalTerm:
    """FedProx: add mu (w - w_global) to each gradient ((mu / 2) ||w - w_global||^2).

    Parameters
    ----------
    mu : float
        Proximal weight (> 0).
    model : nn.Module
        f holding the received global weights w_global (copied here, before training).
    """

    def __init__(self, mu: float, model: nn.Module) -> None:
        self.mu = mu
        self.anchor = {name: p.detach().clone() for name, p in _parameters(model).items()}

    def after_backward(self, model: nn.Module) -> None:
        """grad += mu * (w - w_global)."""
        for name, p in _parameters(model).items():
            if p.grad is not None:
                p.grad.add_(p.detach() - self.anchor[name], alpha=self.mu)


class GradientCorrection:
    """SCAFFOLD: add a fixed correction (c - c_i) to each gradient.

    Parameters
    ----------
    correction : dict[str, torch.Tensor]
        Per-parameter tensor, same shapes and device as f's parameters.
    """

    def __init__(self, correction: Tensors) -> None:
        self.correction = correction

    def after_backward(self, model: nn.Module) -> None:
        """grad += c - c_i."""
        for name, p in _parameters(model).items():
            if p.grad is not None:
                p.grad.add_(self.correction[name])


def full_gradient(model: nn.Module, task: LocalTask, batch_size: int, device: torch.device | str) -> Tensors:
    """Gradient of the mean local loss over all of the task's rows, at ``model``'s weights.

    Runs on a copy of ``model`` in training mode (as during local training), so neither
    its weights nor its BatchNorm statistics change. Uses the task's own batch order
    (``LocalTask.batches``) when it has one, else consecutive batches of ``batch_size``;
    batch losses are weighted by batch size.

    Returns
    -------
    dict[str, torch.Tensor]
        Per trainable parameter, on ``device``.
    """
    probe = copy.deepcopy(model).train()
    probe.zero_grad(set_to_none=True)
    n = task.num_examples
    if task.batches is not None:  # the method's own batch structure (e.g. set-stratified)
        batches = list(task.batches(torch.Generator().manual_seed(0)))
    else:
        batches = [torch.arange(start, min(start + batch_size, n)) for start in range(0, n, batch_size)]
    total = sum(len(idx) for idx in batches)
    for idx in batches:
        xb = task.inputs[idx].to(device)
        yb = task.targets[idx].to(device)
        (task.loss(probe, xb, yb) * (len(idx) / total)).backward()
    return {
        name: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
        for name, p in _parameters(probe).items()
    }


@dataclass
class ClientUpdate:
    """What the strategy asks of this client in this round.

    Attributes
    ----------
    hooks : tuple[StepHook, ...]
        Pass to :func:`~fedul_flwr.training.train_local`.
    finishers : list[Callable[[nn.Module, TrainResult], dict[str, ArrayRecord]]]
        Run after training by :meth:`reply_records`.
    metrics : dict[str, float]
        Extra scalar metrics for the reply, filled by the finishers (SCAFFOLD:
        ``scaffold-cv-rounds``, how many rounds this node's c_i has been updated in, read
        back from ``context.state`` -- observable proof that the state survives rounds).
    """

    hooks: tuple[StepHook, ...] = ()
    finishers: list[Callable[[nn.Module, TrainResult], dict[str, ArrayRecord]]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    def reply_records(self, model: nn.Module, result: TrainResult) -> dict[str, ArrayRecord]:
        """Extra records for the train reply (and state updates), after local training.

        Parameters
        ----------
        model : nn.Module
            f after local training (y_i).
        result : TrainResult
            Outcome of :func:`~fedul_flwr.training.train_local` (its ``num_steps`` is K).
        """
        records: dict[str, ArrayRecord] = {}
        for finish in self.finishers:
            records.update(finish(model, result))
        return records


def prepare_client_update(
    content: RecordDict,
    state: RecordDict,
    model: nn.Module,
    task: LocalTask,
    *,
    lr: float,
    batch_size: int,
    device: torch.device | str,
) -> ClientUpdate:
    """Read the train message and set up this round's strategy-specific client work.

    Call after loading the received weights into ``model`` and before training.

    Parameters
    ----------
    content : RecordDict
        The train message's content (``"config"``, maybe ``"server-cv"``).
    state : RecordDict
        ``context.state`` of this node; SCAFFOLD keeps c_i under ``"scaffold-client-cv"``.
    model : nn.Module
        f with the received global weights x, on ``device``.
    task : LocalTask
        The method's local task (option I's extra gradient pass).
    lr : float
        Local step size (option II).
    batch_size : int
        Batch size of option I's gradient pass.
    device : torch.device | str
        Training device.

    Returns
    -------
    ClientUpdate

    Raises
    ------
    ValueError
        If the config asks for an unknown SCAFFOLD option or a negative ``proximal-mu``.
    """
    config = content.config_records.get("config", {})
    update = ClientUpdate()
    hooks: list[StepHook] = []

    mu = float(config.get(PROXIMAL_MU_KEY, 0.0))
    if mu < 0:
        raise ValueError(f"{PROXIMAL_MU_KEY}={mu} must be >= 0")
    if mu > 0:
        hooks.append(ProximalTerm(mu, model))

    if SERVER_CV_KEY in content.array_records:
        option = str(config.get(OPTION_CONFIG_KEY, "II"))
        if option not in ("I", "II"):
            raise ValueError(f"{OPTION_CONFIG_KEY}={option!r} is not 'I' or 'II'")
        c = _on(content.array_records[SERVER_CV_KEY], model)
        c_i = _on(state.array_records.get(CLIENT_CV_STATE_KEY), model)
        x = {name: p.detach().clone() for name, p in _parameters(model).items()}
        gradient_at_x = full_gradient(model, task, batch_size, device) if option == "I" else None
        hooks.append(GradientCorrection({k: c[k] - c_i[k] for k in c}))

        def finish(trained: nn.Module, result: TrainResult) -> dict[str, ArrayRecord]:
            if gradient_at_x is not None:
                new_c_i = gradient_at_x
            else:
                scale = 1.0 / (result.num_steps * lr)
                y = _parameters(trained)
                new_c_i = {k: c_i[k] - c[k] + scale * (x[k] - y[k].detach()) for k in c_i}
            state[CLIENT_CV_STATE_KEY] = ArrayRecord({k: v.cpu() for k, v in new_c_i.items()})
            counter = state.metric_records.get(CV_ROUNDS_KEY, MetricRecord({"rounds": 0}))
            state[CV_ROUNDS_KEY] = MetricRecord({"rounds": int(counter["rounds"]) + 1})
            update.metrics[CV_ROUNDS_KEY] = float(state[CV_ROUNDS_KEY]["rounds"])
            return {CV_DELTA_KEY: ArrayRecord({k: (new_c_i[k] - c_i[k]).cpu() for k in new_c_i})}

        update.finishers.append(finish)
    update.hooks = tuple(hooks)
    return update
