"""The cohort trained at once: a round's clients as one batched model (``cohort = "batched"``).

On a GPU a client's local step on a small model is a few dozen tiny kernels; the card idles
between them. The batched path trains the K clients of a round together: their weights
stacked (``[K, ...]`` per parameter), each local step one batched forward over all of them
(:func:`torch.func.vmap` of :func:`torch.func.functional_call`), one backward of the sum of
their losses (client k's parameters get exactly client k's gradient, as no loss depends on
another client's weights) and one optimizer step over the stacked tensors (SGD and Adam are
elementwise: each client's slice moves as its own optimizer would move it, its own moments
included).

Everything else stays each client's own. The in-process engine runs every client's real
ClientApp call in a thread of its own (:class:`~fedul_flwr.inprocess.InProcessGrid`); the
training loop (:func:`fedul_flwr.training.train_local`) of a client that may take the path
joins the round's :class:`Cohort` as a :class:`Member`: in its own thread it draws its batches
from its own generators (order, augmentation, views), calls its method's loss closure with
stand-in models whose forward waits for the batched forward, and hands the loss over; the
coordinator (the grid's thread) gathers the members' forward requests, runs them batched
(requests of one model and input shape together), and steps when every active member has
handed over its loss. A member leaves when its epochs are done and takes its slice of the
weights back; one that runs more steps than another goes on alone in the batch. Method state
the loss keeps (FixMatch's pseudo-label counts), its ``before_epoch`` (FedDB's DPL), the
strategy's reply records and the client's uploads work as on the other paths, since they run
in the client's thread on its own objects.

Who takes it: a client whose loop trains one model, with no strategy hook on its gradients
(FedProx's proximal term and SCAFFOLD's correction run one client at a time), whose method
allows it (:attr:`fedul_flwr.methods.Method.batched_cohort`; HASSLE's dual models and
FedLLP-VAT's inner gradient do not) and whose model has no dropout other than the project's
:class:`~fedul_flwr.models.Dropout`: the cohort draws each client's masks from the client's
own generator, in the order its forward would draw them alone, and hands them to the batched
forward (a generator cannot be used inside ``vmap``). Any other client trains alone, in its thread, one at a time. The replies equal
those of one-after-another training to float tolerance (batched kernels sum in another order;
tests/test_cohort.py, per method).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap

from fedul_flwr.models import DROPOUT_MASKS, Dropout

__all__ = ["Cohort", "Member", "current_cohort", "eligible"]

_CURRENT: contextvars.ContextVar[Cohort | None] = contextvars.ContextVar("fedul_cohort", default=None)


def current_cohort() -> Cohort | None:
    """The cohort this thread's client belongs to (set by the grid), else ``None``."""
    return _CURRENT.get()


def eligible(models: nn.ModuleDict, trained: list[str], hooks: tuple[Any, ...], batchable: bool) -> bool:
    """Whether a client's loop may train in the batched cohort (module docstring): one trained
    model, no gradient hook, a method that allows it, and no dropout but the project's own
    :class:`~fedul_flwr.models.Dropout` (whose masks the cohort draws from each client's
    generator)."""
    if not batchable or hooks or len(trained) != 1 or set(models.keys()) != set(trained):
        return False
    return not any(isinstance(m, nn.Dropout) and not isinstance(m, Dropout) for m in models[trained[0]].modules())


@dataclass(eq=False)
class Member:
    """One client of a :class:`Cohort`: its module, its settings, and the hand-over slots.

    Attributes
    ----------
    module : nn.Module
        The client's model (its weights: the round's start; the trained ones at the end).
    signature : tuple
        What must match to share a batch: parameter names and shapes, optimizer, lr,
        momentum, L1 weight, precision, device.
    """

    module: nn.Module
    signature: tuple[Any, ...]
    l1_weight: float
    make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer]
    precision: str
    device: torch.device
    index: int = -1
    state: str = "joined"  # joined | request | loss | running | done
    request: tuple[bool, torch.Tensor] | None = None
    reply: torch.Tensor | None = None
    loss: torch.Tensor | None = None
    group: _Group | None = None
    error: BaseException | None = None
    dropout: torch.Generator | None = None
    """The client's dropout generator (its masks are drawn from it in the order of its own
    forward passes)."""


@dataclass(eq=False)
class _Group:
    members: list[Member]
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    optimizer: torch.optim.Optimizer
    base: nn.Module
    precision: str
    device: torch.device
    dropouts: list[Dropout] = field(default_factory=list)
    shapes: dict[tuple[Any, ...], list[tuple[int, ...]]] = field(default_factory=dict)


class _Standin(nn.Module):
    """A member's model as its loss sees it: the forward hands the input to the coordinator
    and returns this member's slice of the batched output; ``train()``/``eval()`` reach the
    member's module. Outside a step (``before_epoch``) it runs the member's current weights
    directly."""

    def __init__(self, cohort: Cohort, member: Member) -> None:
        super().__init__()
        self._cohort = cohort
        self._member = member
        self.module = member.module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, K]`` of this member's model on ``x`` ``[B, C, H, W]``."""
        return self._cohort._forward(self._member, x)


class Cohort:
    """The round's batched training (module docstring): created by the grid for one batch of
    train messages, entered by every client thread (:meth:`client`), run by the grid's thread
    (:meth:`coordinate`).

    Parameters
    ----------
    clients : int
        The client threads of the round; the coordinator starts once each has joined or left
        (finished without joining, or trains alone).
    """

    def __init__(self, clients: int) -> None:
        self.expected = clients
        self.members: list[Member] = []
        self.left = 0
        self.started = False
        self.cond = threading.Condition()
        self.solo = threading.Lock()
        """Held by a client that trains alone (one at a time)."""
        self.direct = threading.local()
        self.counted = threading.local()
        self.alone = 0
        """Clients of the round that trained alone (their loop could not join)."""

    # ---------------------------------------------------------------- client threads
    def client(self, call: Callable[[], Any]) -> Any:
        """Run one client's ClientApp call in this cohort (in the client's thread)."""
        token = _CURRENT.set(self)
        self.counted.done = False
        try:
            return call()
        finally:
            _CURRENT.reset(token)
            self.decline()

    def decline(self) -> None:
        """This client thread will not join (it trains alone, or finished without training);
        counted once per thread."""
        if getattr(self.counted, "done", False):
            return
        self.counted.done = True
        with self.cond:
            self.left += 1
            self.cond.notify_all()

    def join(self, member: Member) -> bool:
        """Register ``member`` (the client's thread) and wait until its group is set up;
        ``False`` when the cohort started already (the client then trains alone)."""
        with self.cond:
            if self.started:
                return False
            self.counted.done = True
            self.members.append(member)
            self.cond.notify_all()
            self.cond.wait_for(lambda: member.group is not None or member.error is not None)
        if member.error is not None:
            raise member.error
        return True

    @contextlib.contextmanager
    def training_alone(self) -> Iterator[None]:
        """Within the block this client trains alone: one such client at a time, counted in
        :attr:`alone`."""
        self.decline()
        with self.solo:
            with self.cond:
                self.alone += 1
            yield

    def abandon(self, member: Member) -> None:
        """The member's training failed in its thread: it leaves the batch (the error is its
        client's reply)."""
        with self.cond:
            member.state = "done"
            self.cond.notify_all()

    def standins(self, member: Member, name: str) -> nn.ModuleDict:
        """The models the member's loss receives (one stand-in under ``name``)."""
        return nn.ModuleDict({name: _Standin(self, member)})

    def _forward(self, member: Member, x: torch.Tensor) -> torch.Tensor:
        if getattr(self.direct, "on", False):  # before_epoch: this member's current weights, alone
            group = member.group
            assert group is not None
            params = {k: v[member.index].detach() for k, v in group.params.items()}
            buffers = {k: v[member.index] for k, v in group.buffers.items()}
            with torch.autocast(member.device.type, dtype=torch.bfloat16, enabled=member.precision == "bf16"):
                return functional_call(member.module, (params, buffers), (x,)).float()
        with self.cond:
            member.request, member.reply, member.state = (member.module.training, x), None, "request"
            self.cond.notify_all()
            self.cond.wait_for(lambda: member.state == "running" or member.error is not None)
        if member.error is not None:
            raise member.error
        assert member.reply is not None
        return member.reply

    def step(self, member: Member, loss: torch.Tensor) -> None:
        """Hand over the member's loss of this step; return once the group has stepped."""
        with self.cond:
            member.loss, member.state = loss, "loss"
            self.cond.notify_all()
            self.cond.wait_for(lambda: member.state == "running" or member.error is not None)
        if member.error is not None:
            raise member.error

    def leave(self, member: Member) -> None:
        """The member's epochs are done: copy its slice of the weights into its module."""
        group = member.group
        assert group is not None
        with torch.no_grad():
            for name, p in member.module.named_parameters():
                p.copy_(group.params[name][member.index])
            for name, b in member.module.named_buffers():
                b.copy_(group.buffers[name][member.index])
        with self.cond:
            member.state = "done"
            self.cond.notify_all()

    @contextlib.contextmanager
    def direct_calls(self) -> Iterator[None]:
        """Context in which the member's stand-ins run its weights alone (``before_epoch``; this
        thread only)."""
        self.direct.on = True
        try:
            yield
        finally:
            self.direct.on = False

    # ---------------------------------------------------------------- coordinator
    def coordinate(self) -> None:
        """Set up the groups once every client joined or left, then serve forwards and steps
        until every member is done (the grid's thread)."""
        with self.cond:
            self.cond.wait_for(lambda: len(self.members) + self.left >= self.expected)
            self.started = True
            members = list(self.members)
        try:
            groups = self._groups(members)
        except BaseException as exc:  # noqa: BLE001 -- every waiting client gets the error
            self._fail(members, exc)
            raise
        with self.cond:
            for group in groups:
                for member in group.members:
                    member.group, member.state = group, "running"
            self.cond.notify_all()
        try:
            while True:
                with self.cond:
                    self.cond.wait_for(lambda: all(m.state != "running" for m in members))
                    active = [m for m in members if m.state != "done"]
                if not active:
                    return
                requests = [m for m in active if m.state == "request"]
                moved = requests
                if requests:
                    self._serve(requests)
                else:
                    moved = []
                    for group in groups:
                        ready = [m for m in group.members if m.state == "loss"]
                        if ready:
                            self._step(group, ready)
                            moved += ready
                with self.cond:
                    for m in moved:
                        m.state = "running"
                    self.cond.notify_all()
        except BaseException as exc:  # noqa: BLE001
            self._fail(members, exc)
            raise

    def _fail(self, members: list[Member], exc: BaseException) -> None:
        with self.cond:
            for m in members:
                m.error = exc
            self.cond.notify_all()

    def _groups(self, members: list[Member]) -> list[_Group]:
        by_signature: dict[tuple[Any, ...], list[Member]] = {}
        for m in members:
            by_signature.setdefault(m.signature, []).append(m)
        groups = []
        for same in by_signature.values():
            for index, m in enumerate(same):
                m.index = index
            base = copy.deepcopy(same[0].module)  # the structure the batched forward calls (its own train/eval flag)
            params = {name: torch.stack([dict(m.module.named_parameters())[name].detach() for m in same]).requires_grad_(True)
                      for name, _ in base.named_parameters()}  # fmt: skip
            buffers = {name: torch.stack([dict(m.module.named_buffers())[name] for m in same])
                       for name, _ in base.named_buffers()}  # fmt: skip
            optimizer = same[0].make_optimizer(list(params.values()))
            dropouts = []
            for name, module in base.named_modules():
                if isinstance(module, Dropout):
                    module.cohort_name = name
                    dropouts.append(module)
            groups.append(_Group(same, params, buffers, optimizer, base, same[0].precision, same[0].device, dropouts))
        return groups

    def _serve(self, requests: list[Member]) -> None:
        """Run the forward requests, batched by (group, input shape)."""
        buckets: dict[tuple[Any, ...], list[Member]] = {}
        for m in requests:
            assert m.request is not None and m.group is not None
            buckets.setdefault((id(m.group), m.request[0], tuple(m.request[1].shape), m.request[1].dtype), []).append(m)
        for same in buckets.values():
            group = same[0].group
            assert group is not None
            index = torch.tensor([m.index for m in same], device=group.device)
            params = {k: v.index_select(0, index) for k, v in group.params.items()}
            buffers = {k: v.index_select(0, index) for k, v in group.buffers.items()}
            x = torch.stack([m.request[1] for m in same])  # type: ignore[index]
            base = group.base
            training = bool(same[0].request[0])  # type: ignore[index]
            base.train(training)
            masks = self._masks(group, same, x[0]) if training and group.dropouts else {}

            def one(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], xi: torch.Tensor,
                    mi: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
                b = {k: v.clone() for k, v in b.items()}  # batch norm updates its running statistics in place
                token = DROPOUT_MASKS.set(mi)
                try:
                    out = functional_call(base, (p, b), (xi,))
                finally:
                    DROPOUT_MASKS.reset(token)
                return out, b

            with torch.autocast(group.device.type, dtype=torch.bfloat16, enabled=group.precision == "bf16"):
                out, new_buffers = vmap(one)(params, buffers, x, masks)
            with torch.no_grad():
                for k, v in new_buffers.items():
                    group.buffers[k].index_copy_(0, index, v)
            for i, m in enumerate(same):
                m.reply = out[i].float()
                m.request = None

    def _masks(self, group: _Group, same: list[Member], x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every member's dropout masks for a forward of input ``x``'s shape, stacked
        ``[K, ...]`` by layer, each drawn from the member's own generator in its layers' order
        (the draws its forward would make alone). The shapes come from one forward without
        gradient in eval mode, once per input shape."""
        key = tuple(x.shape)
        if key not in group.shapes:
            shapes: list[tuple[int, ...]] = []
            hooks = [d.register_forward_pre_hook(lambda module, args: shapes.append(tuple(args[0].shape))) for d in group.dropouts]
            group.base.eval()
            try:
                with torch.no_grad():
                    functional_call(group.base, ({k: v[0] for k, v in group.params.items()}, {k: v[0] for k, v in group.buffers.items()}),
                                    (x,))  # fmt: skip
            finally:
                group.base.train(True)
                for hook in hooks:
                    hook.remove()
            group.shapes[key] = shapes
        masks: dict[str, list[torch.Tensor]] = {d.cohort_name: [] for d in group.dropouts}
        for m in same:
            for d, shape in zip(group.dropouts, group.shapes[key]):
                masks[d.cohort_name].append(
                    torch.empty(shape, device=x.device, dtype=torch.float32).bernoulli_(1.0 - d.p, generator=m.dropout))
        return {name: torch.stack(values) for name, values in masks.items()}

    def _step(self, group: _Group, ready: list[Member]) -> None:
        """One optimizer step of the group: backward of the sum of the ready members' losses
        (plus their L1 terms), then the stacked optimizer."""
        objective = torch.stack([m.loss for m in ready]).sum()  # type: ignore[misc]
        for m in ready:
            if m.l1_weight:
                objective = objective + m.l1_weight * sum(p[m.index].abs().sum() for p in group.params.values())
        group.optimizer.zero_grad(set_to_none=True)
        objective.backward()
        group.optimizer.step()
        for m in ready:
            m.loss = None

