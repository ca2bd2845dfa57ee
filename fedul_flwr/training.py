"""The one local training loop, shared by every method (the evaluation of predictors is
:mod:`fedul_flwr.evaluation`).

Local update of Eq. (3) in Lu et al. (ICLR 2022): E local epochs of Adam (lr, batch B) on
the method's loss, plus an optional L1 penalty ``l1_weight * sum_p |p|_1`` over the trained
parameters (App. D.2, Table D.4). The optimiser is created afresh every round, as in the
paper's code, unless the client keeps its state (``local-optimizer-state = "kept"``,
:mod:`fedul_flwr.optimizer_state`); SGD (``local-optimizer = "sgd"``, with momentum,
Nesterov and weight decay as FixMatch's recipe has them) is the alternative SCAFFOLD's and
FedNova's rules assume, and ``grad-clip-norm`` clips each step's gradient norm.

A task's batches come from one or several *streams* (:class:`~fedul_flwr.methods.base.Stream`):
the first stream drives the epoch, the others are cycled. Images travel as uint8 and become
float model inputs per batch, on the training device, after the run's augmentation (``augment``)
and with the stream's augmented views (:mod:`fedul_flwr.augment`), drawn from a generator of
their own (seeded from the batch seed, so augmenting leaves the batch order unchanged). Strategies that change the client
update (FedProx's proximal term, SCAFFOLD's control variates) plug in through
:class:`StepHook` instead of copying the loop.

How the loop executes (precision, memory format, optimiser kernels, compile) is an
:class:`~fedul_flwr.acceleration.Acceleration`; the loop never waits for the device inside an
epoch: the losses are summed on the device and read once per epoch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from fedul_flwr.acceleration import PLAIN, Acceleration
from fedul_flwr.cohort import Cohort, Member, current_cohort, eligible
from fedul_flwr.methods.base import Augment, Batch, LocalTask, Stream
from fedul_flwr.models import DROPOUT_GENERATOR
from fedul_flwr.optimizer_state import OptimizerStates
from fedul_flwr.rng import torch_from_seed, torch_generator

__all__ = ["LocalLoop", "StepHook", "ToInput", "TrainResult", "augment_generator", "dropout_masks", "iterate_batches", "train_local"]

ToInput = Callable[[torch.Tensor], torch.Tensor]


def augment_generator(seed: int) -> torch.Generator:
    """The generator of a round's augmentations, from its batch seed."""
    return torch_generator("augment", seed)


@contextlib.contextmanager
def dropout_masks(seed: int, device: torch.device | str) -> Iterator[None]:
    """Within the block, the models' :class:`~fedul_flwr.models.Dropout` layers draw their masks
    from a generator on ``device`` seeded from ``seed`` (a round's batch seed) and a stream
    word of their own; the block's thread only (a context variable)."""
    generator = torch_generator("dropout", seed, device=device)
    token = DROPOUT_GENERATOR.set(generator)
    try:
        yield
    finally:
        DROPOUT_GENERATOR.reset(token)


class StepHook(Protocol):
    """Called around each optimiser step of :func:`train_local`."""

    def after_backward(self) -> None:
        """Edit gradients (e.g. add a proximal or control-variate term) before the step."""


@dataclass(frozen=True)
class TrainResult:
    """Outcome of one client's local training.

    Attributes
    ----------
    loss : float
        Mean training loss (method loss, without the L1 term) over all steps.
    num_examples : int
        Rows of the first stream n (per epoch).
    num_steps : int
        Optimiser steps taken (E * batches per epoch).
    """

    loss: float
    num_examples: int
    num_steps: int


def _epoch_order(stream: Stream, generator: torch.Generator | None) -> list[torch.Tensor]:
    """Row-index batches of one pass over ``stream``: the stream's own order, else a random
    permutation (``generator``) or, without one, consecutive rows."""
    n = stream.num_rows
    if stream.batches is not None:
        return list(stream.batches(generator if generator is not None else torch_from_seed(0)))
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    return [order[start : start + stream.batch_size] for start in range(0, n, stream.batch_size)]


def _cycle(stream: Stream, generator: torch.Generator | None) -> Iterator[torch.Tensor]:
    """Endless batches of a secondary stream, re-shuffled at every pass."""
    while True:
        batches = _epoch_order(stream, generator)
        if not batches:
            raise ValueError("a secondary stream has no rows")
        yield from batches


def _batch(
    stream: Stream, rows: torch.Tensor, device: torch.device, to_input: ToInput,
    augment: Augment | None, generator: torch.Generator | None,
) -> dict[str, torch.Tensor]:  # fmt: skip
    raw = {key: tensor[rows].to(device, non_blocking=True) for key, tensor in stream.tensors.items()}
    out = {}
    for key, value in raw.items():
        if key in stream.images:
            value = to_input(augment(value, generator) if augment is not None and generator is not None else value)
        out[key] = value
    for view, (key, view_augment) in stream.views.items():
        if generator is None:
            raise ValueError(f"stream view {view!r} needs an augmentation generator")
        out[view] = to_input(view_augment(raw[key], generator))
    return out


def iterate_batches(
    task: LocalTask, generator: torch.Generator | None, device: torch.device, to_input: ToInput,
    augment: Augment | None = None, augment_gen: torch.Generator | None = None,
) -> Iterator[Batch]:  # fmt: skip
    """One epoch of ``task``: a batch of every stream per step, on ``device``.

    Parameters
    ----------
    task : LocalTask
        Its first stream drives the epoch; the others are cycled.
    generator : torch.Generator | None
        Source of the batch order (``None``: consecutive rows, e.g. for a full-gradient pass).
    device : torch.device
        Where batches go.
    to_input : Callable
        uint8 images -> float model inputs (per batch, on ``device``).
    augment : Augment | None
        Applied to every stream's ``images`` before ``to_input`` (the run's ``augment``).
    augment_gen : torch.Generator | None
        Source of the augmentations and the streams' views (needed by views).
    """
    names = list(task.streams)
    first = task.streams[names[0]]
    others = {name: _cycle(task.streams[name], generator) for name in names[1:]}
    for rows in _epoch_order(first, generator):
        batch = {names[0]: _batch(first, rows, device, to_input, augment, augment_gen)}
        for name, cycle in others.items():
            batch[name] = _batch(task.streams[name], next(cycle), device, to_input, augment, augment_gen)
        yield batch


def train_local(
    models: nn.ModuleDict,
    task: LocalTask,
    *,
    epochs: int,
    lr: float,
    to_input: ToInput,
    trained: Sequence[str] | None = None,
    l1_weight: float = 0.0,
    seed: int = 0,
    device: torch.device | str = "cpu",
    hooks: Sequence[StepHook] = (),
    optimizer: str = "adam",
    momentum: float = 0.0,
    acceleration: Acceleration | None = None,
    augment: Augment | None = None,
    batchable: bool = True,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    grad_clip_norm: float = 0.0,
    optimizer_states: OptimizerStates | None = None,
) -> TrainResult:
    """Train the ``trained`` models in place on ``task`` for ``epochs`` epochs.

    Inside a batched cohort (:mod:`fedul_flwr.cohort`, the in-process engine's
    ``cohort = "batched"``) a client that may take that path trains as one member of the round's
    batched model: the same batches, loss and optimizer update, its forward and step batched
    with the other clients'; any other client trains here alone, one at a time.

    Parameters
    ----------
    models : nn.ModuleDict
        The method's models, on ``device``.
    task : LocalTask
        Streams and the loss of the method.
    epochs : int
        E >= 1 passes over the first stream.
    lr : float
        Learning rate of the local optimiser (one optimiser over all trained models).
    to_input : Callable[[torch.Tensor], torch.Tensor]
        uint8 images -> float model inputs (``ClientData.to_input``).
    trained : Sequence[str] | None
        Names of the models to optimise (train mode); the others are put in eval mode and
        left unchanged. ``None``: all.
    l1_weight : float
        Weight of the L1 penalty on the trained parameters (0 disables it).
    seed : int
        Seed of the batch order (use a different one per round and client).
    device : torch.device | str
        Where batches are moved (non-blocking from pinned memory on CUDA).
    hooks : Sequence[StepHook]
        Gradient editors called after ``backward`` and before ``step``.
    optimizer : str
        ``"adam"`` (the paper's local optimiser) or ``"sgd"`` (plain SGD, the form in which
        SCAFFOLD's and FedNova's update rules are derived).
    momentum : float
        Heavy-ball momentum of SGD (``local-momentum``; FedPU's protocol: 0.5); the
        optimiser's state starts afresh every round.
    acceleration : Acceleration | None
        Precision, memory format, optimiser kernels and compile of the loop on ``device``
        (``None``: the plain float32 NCHW loop). The method's loss receives the models as
        :meth:`Acceleration.prepare` returns them; the weights are NCHW again on return.
    augment : Augment | None
        The run's augmentation of every stream's images (``None``: none). It and the
        streams' views draw from :func:`augment_generator` of ``seed``.
    batchable : bool
        Whether the method lets this loop train in a batched cohort
        (:attr:`fedul_flwr.methods.Method.batched_cohort`).
    weight_decay : float
        L2 weight decay of the optimiser (``weight-decay``; 0: none).
    nesterov : bool
        Nesterov momentum for SGD (``nesterov``).
    grad_clip_norm : float
        Clip the gradients of the trained parameters to this total 2-norm before each step
        (:func:`torch.nn.utils.clip_grad_norm_`, after the strategy's hooks; 0: no clipping).
    optimizer_states : OptimizerStates | None
        The client's kept optimiser states (``local-optimizer-state = "kept"``): the
        optimiser of these models starts from its saved state, and its state after training
        replaces it (:mod:`fedul_flwr.optimizer_state`). ``None``: a fresh optimiser.

    Returns
    -------
    TrainResult

    Raises
    ------
    ValueError
        If the first stream has no rows, a model name is unknown, the optimiser is unknown,
        or the loss becomes NaN/inf (names the epoch; checked once per epoch).
    """
    n = task.num_examples
    if n == 0:
        raise ValueError("local task has no training examples")
    device = torch.device(device)
    names = list(models.keys()) if trained is None else list(trained)
    unknown = [m for m in names if m not in models]
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; the method has {list(models.keys())}")
    acc = acceleration if acceleration is not None else dataclasses.replace(PLAIN, device=device)
    params = [p for m in names for p in models[m].parameters()]
    penalised = [p for p in params if p.requires_grad]
    if device.type == "cuda":
        streams = {k: dataclasses.replace(s, tensors={t: v.pin_memory() for t, v in s.tensors.items()})
                   for k, s in task.streams.items()}  # fmt: skip
        task = dataclasses.replace(task, streams=streams)
    for name, model in models.items():
        model.train(name in names)
    settings = {"weight_decay": weight_decay, "nesterov": nesterov}

    def build(ps: Sequence[nn.Parameter]) -> torch.optim.Optimizer:
        return acc.optimizer(optimizer, ps, lr, momentum, **settings)

    alone = _Alone(names, penalised, params, build, l1_weight, grad_clip_norm, hooks, optimizer_states)
    cohort = current_cohort()
    if cohort is not None:
        # clipping needs each client's own gradient norm, a kept state each client's own buffers
        if eligible(models, names, tuple(hooks), batchable) and not grad_clip_norm and optimizer_states is None:
            signature = _signature(models[names[0]], optimizer, lr, momentum, l1_weight, acc, weight_decay, nesterov)
            member = Member(models[names[0]], signature, l1_weight, build, acc.precision, device)
            if cohort.join(member):
                return _train_member(cohort, member, names[0], task, epochs, seed, device, to_input, augment)
        with cohort.training_alone():
            return _train_alone(models, task, alone, acc, epochs, to_input, seed, device, augment)
    return _train_alone(models, task, alone, acc, epochs, to_input, seed, device, augment)


def _signature(
    module: nn.Module, optimizer: str, lr: float, momentum: float, l1_weight: float, acc: Acceleration,
    weight_decay: float, nesterov: bool,
) -> tuple[Any, ...]:  # fmt: skip
    """What two clients must share to train in one batch (:class:`fedul_flwr.cohort.Member`)."""
    shapes = tuple((name, tuple(p.shape), p.dtype) for name, p in module.named_parameters())
    buffers = tuple((name, tuple(b.shape), b.dtype) for name, b in module.named_buffers())
    return (type(module), shapes, buffers, optimizer, lr, momentum, weight_decay, nesterov, l1_weight, acc.precision,
            acc.fused_optimizer, str(acc.device))  # fmt: skip


@dataclass(frozen=True)
class _Alone:
    """What :func:`_train_alone` steps with: the trained models' names and parameters, the
    optimiser's builder and the step's extras (L1, clipping, hooks, the kept state)."""

    names: list[str]
    penalised: list[nn.Parameter]
    params: list[nn.Parameter]
    build: Callable[[Sequence[nn.Parameter]], torch.optim.Optimizer]
    l1_weight: float
    grad_clip_norm: float
    hooks: Sequence[StepHook]
    states: OptimizerStates | None


def _train_member(
    cohort: Cohort, member: Member, name: str, task: LocalTask, epochs: int, seed: int, device: torch.device,
    to_input: ToInput, augment: Augment | None,
) -> TrainResult:  # fmt: skip
    """:func:`train_local` as a member of a batched cohort: this client's batches, loss and
    dropout generator, the forward and the step the cohort's (:mod:`fedul_flwr.cohort`)."""
    n = task.num_examples
    try:
        with dropout_masks(seed, device):
            member.dropout = DROPOUT_GENERATOR.get()
            forwards = cohort.standins(member, name)
            generator = torch_from_seed(seed)
            views = augment_generator(seed)
            total, steps = torch.zeros((), device=device), 0
            for epoch in range(epochs):
                if task.before_epoch is not None:
                    with cohort.direct_calls():
                        task.before_epoch(forwards)
                epoch_sum = torch.zeros((), device=device)
                for batch in iterate_batches(task, generator, device, to_input, augment, views):
                    loss = task.loss(forwards, batch)
                    cohort.step(member, loss)
                    epoch_sum += loss.detach()
                    steps += 1
                value = float(epoch_sum)
                if not math.isfinite(value):
                    raise ValueError(f"training loss became {value} in local epoch {epoch + 1} of {epochs}")
                total += epoch_sum
        cohort.leave(member)
    except BaseException:
        cohort.abandon(member)
        raise
    return TrainResult(loss=float(total) / steps, num_examples=n, num_steps=steps)


def _train_alone(
    models: nn.ModuleDict, task: LocalTask, alone: _Alone, acc: Acceleration, epochs: int, to_input: ToInput, seed: int,
    device: torch.device, augment: Augment | None,
) -> TrainResult:  # fmt: skip
    """:func:`train_local` of one client on its own."""
    n = task.num_examples
    forwards = acc.prepare(models)  # channels-last weights from here on (if chosen) ...
    try:
        with dropout_masks(seed, device):
            opt = alone.build(alone.params)  # ... so the optimiser state matches them
            if alone.states is not None:
                alone.states.load(alone.names, opt, alone.params)
            generator = torch_from_seed(seed)
            views = augment_generator(seed)
            total, steps = torch.zeros((), device=device), 0
            for epoch in range(epochs):
                if task.before_epoch is not None:
                    task.before_epoch(forwards)
                epoch_sum = torch.zeros((), device=device)
                for batch in iterate_batches(task, generator, device, to_input, augment, views):
                    loss = task.loss(forwards, batch)
                    l1 = alone.l1_weight
                    objective = loss + l1 * sum(p.abs().sum() for p in alone.penalised) if l1 else loss
                    opt.zero_grad(set_to_none=True)
                    objective.backward()
                    for hook in alone.hooks:
                        hook.after_backward()
                    if alone.grad_clip_norm:
                        torch.nn.utils.clip_grad_norm_(alone.penalised, alone.grad_clip_norm, foreach=device.type == "cuda")
                    opt.step()
                    epoch_sum += loss.detach()
                    steps += 1
                value = float(epoch_sum)  # the one host synchronisation of the epoch
                if not math.isfinite(value):
                    raise ValueError(f"training loss became {value} in local epoch {epoch + 1} of {epochs}")
                total += epoch_sum
            if alone.states is not None:
                alone.states.save(alone.names, opt, alone.params)
    finally:
        acc.restore(models)
    return TrainResult(loss=float(total) / steps, num_examples=n, num_steps=steps)


@dataclass(frozen=True)
class LocalLoop:
    """The shared loop with this client's round settings bound (what a method's
    ``local_update`` calls).

    Attributes
    ----------
    epochs : int
        Local epochs E of this client.
    lr, l1_weight : float
        Local step size and L1 weight.
    optimizer : str
        ``"adam"`` or ``"sgd"``.
    momentum : float
        SGD momentum.
    seed : int
        Batch-order seed of this round and client.
    device : torch.device
        Training device.
    to_input : Callable[[torch.Tensor], torch.Tensor]
        uint8 images -> float model inputs.
    hooks : tuple[StepHook, ...]
        The strategy's gradient editors.
    acceleration : Acceleration | None
        How the loop executes (``None``: the plain float32 NCHW loop).
    augment : Augment | None
        The run's augmentation of training images (``None``: none).
    batchable : bool
        Whether the method lets the loop train in a batched cohort.
    weight_decay, grad_clip_norm : float
        The optimiser's L2 weight decay and the gradient-norm clip (0: none).
    nesterov : bool
        Nesterov momentum (SGD).
    optimizer_states : OptimizerStates | None
        The client's kept optimiser states (``None``: a fresh optimiser every call).
    """

    epochs: int
    lr: float
    l1_weight: float
    optimizer: str
    seed: int
    device: torch.device
    to_input: ToInput
    hooks: tuple[StepHook, ...] = ()
    acceleration: Acceleration | None = None
    momentum: float = 0.0
    augment: Augment | None = None
    batchable: bool = True
    weight_decay: float = 0.0
    nesterov: bool = False
    grad_clip_norm: float = 0.0
    optimizer_states: OptimizerStates | None = None

    def run(self, models: nn.ModuleDict, task: LocalTask, trained: Sequence[str] | None = None) -> TrainResult:
        """:func:`train_local` of ``task`` with these settings."""
        return train_local(
            models,
            task,
            epochs=self.epochs,
            lr=self.lr,
            to_input=self.to_input,
            trained=trained,
            l1_weight=self.l1_weight,
            seed=self.seed,
            device=self.device,
            hooks=self.hooks,
            optimizer=self.optimizer,
            momentum=self.momentum,
            acceleration=self.acceleration,
            augment=self.augment,
            batchable=self.batchable,
            weight_decay=self.weight_decay,
            nesterov=self.nesterov,
            grad_clip_norm=self.grad_clip_norm,
            optimizer_states=self.optimizer_states,
        )
