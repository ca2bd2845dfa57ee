"""Client-side work of the server strategies, in one place for every method.

The strategy decides, through the train message, what a client does besides plain local
training; this module turns that message into :class:`~fedul_flwr.training.StepHook`
gradient editors for the shared loop and, after training, into the extra reply records.
It touches only gradients and arrays, so it works for every method, on each of the method's
exchanged and trained models (their parameters keyed as on the wire, ``"<model>.<name>"``).

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
  non-IID SCAFFOLD with Adam clients diverged after round 1 (docs/server-strategies.md, "The
  comparison table"), so use SGD clients with SCAFFOLD.
- FedNova (Wang et al., NeurIPS 2020) needs only the step count tau_i, which every client
  reports as the metric ``num-steps``.

Control variates cover the trainable parameters of the exchanged, trained models, keyed as
on the wire; a key missing from c or c_i counts as zero. A client that does not send a model
(a method's ``sent_models``) reports no Delta c_i for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from torch import nn

from fedul_flwr import wire
from fedul_flwr.methods.base import LocalTask
from fedul_flwr.training import StepHook, TrainResult, augment_generator, dropout_masks, iterate_batches

Tensors = dict[str, torch.Tensor]
Parameters = dict[str, nn.Parameter]


def shared_parameters(models: nn.ModuleDict, names: Iterable[str]) -> Parameters:
    """Trainable parameters of the models ``names``, keyed ``"<model>.<parameter>"`` (the
    keys of their arrays on the wire)."""
    return {
        f"{model}.{key}": p for model in names for key, p in models[model].named_parameters() if p.requires_grad
    }


def _on(record: ArrayRecord | None, params: Parameters) -> Tensors:
    """Tensors of ``record`` for ``params`` (zeros where missing), on their device."""
    with wire.decoding():
        values = record.to_torch_state_dict() if record is not None and len(record) else {}
    return {
        name: values[name].to(p.device, p.dtype) if name in values else torch.zeros_like(p) for name, p in params.items()
    }


class ProximalTerm:
    """FedProx: add mu (w - w_anchor) to each gradient ((mu / 2) ||w - w_anchor||^2); the anchor
    is the received global w_global (FedProx) or, given, another model's weights (HASSLE's
    cross-model proximity term).

    Parameters
    ----------
    mu : float
        Proximal weight (> 0).
    params : dict[str, nn.Parameter]
        The parameters it applies to, holding the received global weights w_global (copied
        here, before training).
    anchor : dict[str, torch.Tensor] | None
        Per parameter of ``params`` (same shapes): the weights to pull towards (copied);
        ``None``: the parameters' current values.
    """

    def __init__(self, mu: float, params: Parameters, anchor: Tensors | None = None) -> None:
        self.mu = mu
        self.params = params
        source = anchor if anchor is not None else params
        self.anchor = {name: source[name].detach().clone() for name in params}

    def after_backward(self) -> None:
        """grad += mu * (w - w_anchor)."""
        for name, p in self.params.items():
            if p.grad is not None:
                p.grad.add_(p.detach() - self.anchor[name], alpha=self.mu)


class GradientCorrection:
    """SCAFFOLD: add a fixed correction (c - c_i) to each gradient.

    Parameters
    ----------
    params : dict[str, nn.Parameter]
        The parameters it applies to.
    correction : dict[str, torch.Tensor]
        Per parameter, same shapes and device.
    """

    def __init__(self, params: Parameters, correction: Tensors) -> None:
        self.params = params
        self.correction = correction

    def after_backward(self) -> None:
        """grad += c - c_i."""
        for name, p in self.params.items():
            if p.grad is not None:
                p.grad.add_(self.correction[name])


def full_gradient(
    models: nn.ModuleDict,
    params: Parameters,
    task: LocalTask,
    device: torch.device,
    to_input: Callable[[torch.Tensor], torch.Tensor],
) -> Tensors:
    """Gradient of the mean local loss over one pass of the task's first stream, at the
    current weights.

    Runs in training mode (as during local training) and restores every model's weights,
    gradients and BatchNorm statistics afterwards. Uses the first stream's own batch order
    when it has one, else consecutive batches; batch losses are weighted by batch size. The
    images are not augmented; a stream's views (FixMatch) and dropout masks draw from fixed generators.

    Returns
    -------
    dict[str, torch.Tensor]
        Per parameter of ``params``, on its device.
    """
    saved = {name: {k: v.detach().clone() for k, v in m.state_dict().items()} for name, m in models.items()}
    models.train()
    models.zero_grad(set_to_none=True)
    batches = list(iterate_batches(task, None, device, to_input, augment_gen=augment_generator(0)))
    first = next(iter(task.streams))
    total = sum(len(next(iter(b[first].values()))) for b in batches)
    with dropout_masks(0, device):
        for batch in batches:
            rows = len(next(iter(batch[first].values())))
            (task.loss(models, batch) * (rows / total)).backward()
    grads = {name: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for name, p in params.items()}
    models.zero_grad(set_to_none=True)
    for name, m in models.items():
        m.load_state_dict(saved[name])
    return grads


@dataclass
class ClientUpdate:
    """What the strategy asks of this client in this round.

    Attributes
    ----------
    hooks : tuple[StepHook, ...]
        Pass to the training loop.
    finishers : list[Callable[[TrainResult, tuple[str, ...]], dict[str, ArrayRecord]]]
        Run after training by :meth:`reply_records` with the result and the sent models.
    metrics : dict[str, float]
        Extra scalar metrics for the reply, filled by the finishers (SCAFFOLD:
        ``scaffold-cv-rounds``, how many rounds this node's c_i has been updated in, read
        back from ``context.state`` -- observable proof that the state survives rounds).
    """

    hooks: tuple[StepHook, ...] = ()
    finishers: list[Callable[[TrainResult, tuple[str, ...]], dict[str, ArrayRecord]]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    def reply_records(self, result: TrainResult, sent: tuple[str, ...]) -> dict[str, ArrayRecord]:
        """Extra records for the train reply (and state updates), after local training.

        Parameters
        ----------
        result : TrainResult
            Outcome of local training (its ``num_steps`` is K).
        sent : tuple[str, ...]
            The models the client sends back.
        """
        records: dict[str, ArrayRecord] = {}
        for finish in self.finishers:
            records.update(finish(result, sent))
        return records


def prepare_client_update(
    content: RecordDict,
    state: RecordDict,
    models: nn.ModuleDict,
    shared: Iterable[str],
    task: Callable[[], LocalTask],
    *,
    lr: float,
    device: torch.device,
    to_input: Callable[[torch.Tensor], torch.Tensor],
) -> ClientUpdate:
    """Read the train message and set up this round's strategy-specific client work.

    Call after loading the received weights into ``models`` and before training.

    Parameters
    ----------
    content : RecordDict
        The train message's content (``"config"``, maybe ``"server-cv"``).
    state : RecordDict
        ``context.state`` of this node; SCAFFOLD keeps c_i under ``"scaffold-client-cv"``.
    models : nn.ModuleDict
        The method's models with the received global weights x, on ``device``.
    shared : Iterable[str]
        The exchanged, trained models the strategy acts on.
    task : Callable[[], LocalTask]
        Builds the method's local task (option I's extra gradient pass).
    lr : float
        Local step size (option II).
    device : torch.device
        Training device.
    to_input : Callable
        uint8 images -> float model inputs.

    Returns
    -------
    ClientUpdate

    Raises
    ------
    ValueError
        If the config asks for an unknown SCAFFOLD option or a negative ``proximal-mu``.
    """
    config = content.config_records.get(wire.CONFIG, {})
    params = shared_parameters(models, shared)
    update = ClientUpdate()
    hooks: list[StepHook] = []

    mu = float(config.get(wire.PROXIMAL_MU, 0.0))
    if mu < 0:
        raise ValueError(f"{wire.PROXIMAL_MU}={mu} must be >= 0")
    if mu > 0:
        hooks.append(ProximalTerm(mu, params))

    if wire.SERVER_CV in content.array_records:
        option = str(config.get(wire.SCAFFOLD_OPTION, "II"))
        if option not in ("I", "II"):
            raise ValueError(f"{wire.SCAFFOLD_OPTION}={option!r} is not 'I' or 'II'")
        c = _on(content.array_records[wire.SERVER_CV], params)
        c_i = _on(state.array_records.get(wire.CLIENT_CV_STATE), params)
        x = {name: p.detach().clone() for name, p in params.items()}
        gradient_at_x = full_gradient(models, params, task(), device, to_input) if option == "I" else None
        hooks.append(GradientCorrection(params, {k: c[k] - c_i[k] for k in c}))

        def finish(result: TrainResult, sent: tuple[str, ...]) -> dict[str, ArrayRecord]:
            if gradient_at_x is not None:
                new_c_i = gradient_at_x
            else:
                scale = 1.0 / (result.num_steps * lr)
                new_c_i = {k: c_i[k] - c[k] + scale * (x[k] - params[k].detach()) for k in c_i}
            keys = [k for k in new_c_i if wire.model_of(k) in sent]
            new_c_i = {k: new_c_i[k] if k in keys else c_i[k] for k in new_c_i}  # untrained models keep c_i
            state[wire.CLIENT_CV_STATE] = ArrayRecord({k: v.cpu() for k, v in new_c_i.items()})
            counter = state.metric_records.get(wire.CV_ROUNDS, MetricRecord({"rounds": 0}))
            state[wire.CV_ROUNDS] = MetricRecord({"rounds": int(counter["rounds"]) + 1})
            update.metrics[wire.CV_ROUNDS] = float(state[wire.CV_ROUNDS]["rounds"])
            return {wire.CV_DELTA: ArrayRecord({k: (new_c_i[k] - c_i[k]).cpu() for k in keys})}

        update.finishers.append(finish)
    update.hooks = tuple(hooks)
    return update
