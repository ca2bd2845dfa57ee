"""The method interface: what a learning method brings to the federation.

A *method* (FedUL and its baselines; later FedPU, FixMatch / FedDB, HASSLE) owns

- the parts of a client's data it needs (``requires``; checked at the boundary, see
  :meth:`fedul_flwr.data.client_data.ClientData.require`) and those it uses where a client
  has them (``uses``; e.g. labels on some clients only);
- its options (``options``: run-config keys it owns, validated by it; declared with their
  defaults and meaning in its folder's ``settings.py``, :class:`fedul_flwr.config.Option`);
- its named models (``model_specs``): each built from the model registry and marked
  *exchanged* (sent to and aggregated by the server), *kept* (stays on the node across
  rounds, in ``context.state``) and *trained* (optimised by the local loop);
- its local round (``local_update``; by default the shared loop of
  :mod:`fedul_flwr.training` on the :class:`LocalTask` of ``local_task``: batches drawn from
  one or several streams, a loss over all models);
- which exchanged models a client sends (``sent_models``; default all) and what else its
  reply carries (``uploads``: scalars or K-vectors in the reply's metrics);
- what a client tells the server before training when the server asks (``announce``,
  answered to a Flower *query* message; e.g. FedPU's positive classes under its
  cross-client switch), and reads back from the train config (``RoundContext.broadcast``);
- optionally its server aggregation (``aggregation``: a strategy mixin class, in Flower's
  style, composed with the run's strategy);
- its predictors (``predictors``): the functions evaluated centrally every round;
- in the labels-at-server setting, its training on the server's labeled images after every
  round's aggregation (``server_task`` / ``server_update``, on a :class:`ServerRoundContext`;
  ``trains_on_server`` says it has one).

The apps only wire these together; they never branch on a method's name. A method is
registered in :data:`fedul_flwr.methods.METHODS` by the module that defines it.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

from fedul_flwr.config import Option, RunConfig
from fedul_flwr.data.client_data import ClientData
from fedul_flwr.registry import Registry
from fedul_flwr.rng import numpy_generator, stream_seed, torch_generator
from fedul_flwr.strategies.per_model import PerModelAggregation

if TYPE_CHECKING:  # pragma: no cover
    from fedul_flwr.training import LocalLoop, TrainResult

__all__ = ["METHODS", "method_class", "Augment", "Batch", "LocalTask", "Method", "ModelSpec", "Predictor", "RoundContext",
           "ServerRoundContext", "Stream", "register_method"]  # fmt: skip

Batch = dict[str, dict[str, torch.Tensor]]
"""One training step's data: stream name -> tensor name -> ``[B, ...]`` batch on the training
device (image tensors already turned into float model inputs)."""

Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
"""``augment(images uint8 [B, C, H, W], generator) -> uint8 [B, C, H, W]`` (see
:class:`fedul_flwr.augment.Augmentation`)."""

Predictor = Callable[[nn.ModuleDict, torch.Tensor], torch.Tensor]
"""``predict(models, x [B, C, H, W] float input) -> logits [B, K]``."""

@dataclass(frozen=True)
class ModelSpec:
    """A model a method trains or uses.

    Attributes
    ----------
    name : str
        Its name (``"f"``, ``"w_S"``, ...); the key prefix of its arrays on the wire.
    arch : str | None
        A name of the model registry (:data:`fedul_flwr.models.MODELS`); ``None``: the run's
        ``model``.
    exchanged : bool
        Sent to the clients and aggregated by the server every round.
    kept : bool
        Kept on the node across rounds in ``context.state`` (never sent); initialised from
        a seed of (run seed, node key, model) in the node's first round.
    trained : bool
        Optimised by the local loop.
    width : float
        Channel width factor of the architecture (> 0; e.g. HASSLE's residual models at 1/4).
    initial : str | None
        For an exchanged model: another exchanged model whose initial weights it starts from
        (same architecture and width), e.g. HASSLE's copy of the previous round's w_S;
        ``None``: its own seed.
    initial_scale : float
        For an exchanged model: its initial parameters (not its buffers) multiplied by this
        factor, after the copy of ``initial`` (e.g. FedMatch's psi = 0.2 sigma); 1: as built.

    Raises
    ------
    ValueError
        If a model is both exchanged and kept, or neither (a model must live somewhere), or
        has ``initial`` or ``initial_scale`` while kept, or starts from itself.
    """

    name: str
    arch: str | None = None
    exchanged: bool = True
    kept: bool = False
    trained: bool = True
    width: float = 1.0
    initial: str | None = None
    initial_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.exchanged == self.kept:
            raise ValueError(f"model {self.name!r}: exactly one of exchanged / kept must be set")
        if not self.width > 0:
            raise ValueError(f"model {self.name!r}: width {self.width} must be > 0")
        if not self.name or "." in self.name:
            raise ValueError(f"model name {self.name!r} must be non-empty and contain no '.'")
        if self.initial is not None and (self.kept or self.initial == self.name):
            raise ValueError(f"model {self.name!r}: initial={self.initial!r} needs an exchanged model other than itself")
        if self.initial_scale != 1.0 and self.kept:
            raise ValueError(f"model {self.name!r}: initial_scale={self.initial_scale} needs an exchanged model")


@dataclass(frozen=True)
class Stream:
    """One source of training batches: row-aligned tensors of the client's data.

    Attributes
    ----------
    tensors : Mapping[str, torch.Tensor]
        ``[n, ...]`` tensors with the same first dimension (CPU); e.g. ``{"x": uint8
        images, "y": int64 labels}``.
    batch_size : int
        Rows per batch B >= 1.
    batches : Callable[[torch.Generator], Iterable[torch.Tensor]] | None
        Optional order of one pass: ``batches(generator)`` yields int64 row-index tensors
        (e.g. set-stratified batches). ``None``: a random permutation cut into batches of
        ``batch_size``.
    images : tuple[str, ...]
        Keys of uint8 image tensors, turned into float model inputs per batch on the
        training device (``ClientData.to_input``), after the run's ``augment``.
    views : Mapping[str, tuple[str, Augment]]
        Augmented views added to each batch: view name -> (key of a uint8 image tensor, an
        augmentation ``(uint8 [B, C, H, W], generator) -> uint8 [B, C, H, W]``), turned into
        float model inputs; e.g. FixMatch's ``{"weak": ("x", weak), "strong": ("x", strong)}``.
        The views of a batch draw from the loop's augmentation generator.
    """

    tensors: Mapping[str, torch.Tensor]
    batch_size: int
    batches: Callable[[torch.Generator], Iterable[torch.Tensor]] | None = None
    images: tuple[str, ...] = ("x",)
    views: Mapping[str, tuple[str, Augment]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = {k: int(v.shape[0]) for k, v in self.tensors.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"stream tensors differ in length: {sizes}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        unknown = {view: key for view, (key, _) in self.views.items() if key not in self.tensors}
        if unknown:
            raise ValueError(f"stream views of missing tensors: {unknown}; the stream has {list(self.tensors)}")

    @property
    def num_rows(self) -> int:
        """n, the rows of the stream."""
        return int(next(iter(self.tensors.values())).shape[0]) if self.tensors else 0


class NothingToTrain(Exception):
    """Raised by :meth:`Method.local_update` when the client has nothing to train this round
    (e.g. HASSLE without a labeled image and without a confident pseudo-label). Not an
    error: the ClientApp replies with no model and zero examples, the server counts the reply
    as idle and leaves it out of the aggregation; only real errors count toward
    ``max-failure-fraction``. The message says why (it goes to the node's log)."""


@dataclass
class LocalTask:
    """The training problem of one client in one round.

    Attributes
    ----------
    streams : dict[str, Stream]
        Named batch sources. The *first* stream drives an epoch (one pass over its rows);
        the others are cycled, re-shuffled each time they run out (e.g. FixMatch: B labeled
        + mu * B unlabeled images per step).
    loss : Callable[[nn.ModuleDict, Batch], torch.Tensor]
        ``loss(models, batch) -> scalar`` (mean over the batch), for all models at once.
    before_epoch : Callable[[nn.ModuleDict], None] | None
        Called with the models before every local epoch, i.e. with the weights w^{e-1} that
        epoch e starts from (e.g. FedDB's average prediction on unlabeled data, Alg. 3);
        ``None``: nothing.
    """

    streams: dict[str, Stream]
    loss: Callable[[nn.ModuleDict, Batch], torch.Tensor]
    before_epoch: Callable[[nn.ModuleDict], None] | None = None

    def __post_init__(self) -> None:
        if not self.streams:
            raise ValueError("a local task needs at least one stream")

    @property
    def num_examples(self) -> int:
        """n, the rows of the first stream (one epoch)."""
        return next(iter(self.streams.values())).num_rows


@dataclass(frozen=True)
class RoundContext:
    """Who trains in which round, and the random generators of that round.

    Every random draw of a client comes from here -- batch order, augmentation, mixup, VAT
    noise --, seeded from (run seed, round, node key): metrics never depend on which
    process (Ray actor) ran the client or what it ran before.

    Attributes
    ----------
    seed : int
        The run's seed.
    server_round : int
        The round being trained (from 1).
    node_key : int
        The node's stable key (:func:`fedul_flwr.data.sources.node_key`).
    device : torch.device
        The training device.
    broadcast : Mapping[str, Any]
        What the server's strategy put in this round's train config besides the run
        configuration and the round (e.g. values a method's aggregation mixin broadcasts).
    """

    seed: int
    server_round: int
    node_key: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    broadcast: Mapping[str, Any] = field(default_factory=dict)

    @property
    def batch_seed(self) -> int:
        """Seed of the batch order (the training loop's own generator)."""
        return stream_seed("batch", self.seed, self.server_round, self.node_key)

    @cached_property
    def generator(self) -> torch.Generator:
        """A CPU torch generator for the method's own draws (mixup partners, noise, ...)."""
        return torch_generator("method-torch", self.seed, self.server_round, self.node_key)

    @cached_property
    def rng(self) -> np.random.Generator:
        """A numpy generator for the method's scalar draws (e.g. a Beta mixing weight)."""
        return numpy_generator("method-numpy", self.seed, self.server_round, self.node_key)


@dataclass(frozen=True)
class ServerRoundContext(RoundContext):
    """The round of the server's own training in the labels-at-server setting: after round
    ``server_round``'s aggregation (0: before round 1). Its generators come from the
    ``server-*`` streams of (run seed, round) (:data:`fedul_flwr.rng.STREAMS`), never from a
    client's; ``node_key`` is 0 and names no client."""

    @property
    def batch_seed(self) -> int:
        """Seed of the batch order of the server's training."""
        return stream_seed("server-batch", self.seed, self.server_round)

    @cached_property
    def generator(self) -> torch.Generator:
        """A CPU torch generator for the method's own draws on the server."""
        return torch_generator("server-method-torch", self.seed, self.server_round)

    @cached_property
    def rng(self) -> np.random.Generator:
        """A numpy generator for the method's scalar draws on the server."""
        return numpy_generator("server-method-numpy", self.seed, self.server_round)


class Method(ABC):
    """Base class of learning methods (see the module docstring).

    Parameters
    ----------
    cfg : RunConfig
        The run configuration; the method's own options are read with ``cfg.option(key)``.
    """

    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ("unlabeled", "usets")
    uses: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[tuple[Option, ...]] = ()
    setting: ClassVar[str] = "usets"
    """The simulated ``client-setting`` whose clients hold the parts the method requires
    (named in the error when a client lacks them)."""
    settings: ClassVar[tuple[str, ...]] = ()
    """The simulated ``client-setting`` values the method is defined for, checked before round 1
    (:func:`fedul_flwr.preflight.method_settings`); empty: every setting whose clients hold the
    parts in ``requires``. A method that requires no part (it adapts to what each client
    holds) names them."""
    batched_cohort: ClassVar[bool] = True
    """Whether a client's local update may train as one member of a batched cohort
    (:mod:`fedul_flwr.cohort`, the in-process engine's ``cohort = "batched"``). The loop still
    trains alone any client with more than one trained model, strategy gradient hooks or a
    model with dropout; a method whose local update does more than the shared loop allows
    (e.g. two phases over two models) sets it ``False``."""
    trains_on_server: ClassVar[bool] = False
    """Whether the method trains on the server's labeled images in the labels-at-server setting
    (:meth:`server_task`); a run whose server holds labels (``client-setting=labels-at-server``,
    ``server-data-dir``) needs such a method."""
    recorded_metrics: ClassVar[tuple[str, ...]] = ()
    """Aggregated train metrics written to the run's ``metrics.json`` besides the train loss
    (its uploads, or what its aggregation mixin adds)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    @classmethod
    def check_options(cls, cfg: RunConfig) -> None:
        """Validate the method's own options in ``cfg``.

        Raises
        ------
        ConfigError
            Naming the key, the value and the rule.
        """
        for option in cls.options:
            option.validate(cfg, cls.name)

    def option(self, key: str) -> Any:
        """The value of one of the method's options."""
        return self.cfg.option(key)

    def model_specs(self) -> tuple[ModelSpec, ...]:
        """The method's models; default: one exchanged, trained classifier ``f``."""
        return (ModelSpec("f"),)

    @abstractmethod
    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """The client's :class:`LocalTask` for this round (tensors stay on the CPU; the loop
        moves batches).

        Parameters
        ----------
        client : ClientData
            Holds every part in ``requires``.
        models : nn.ModuleDict
            All the method's models, on ``ctx.device``, with this round's weights.
        ctx : RoundContext
            Round, node and the random generators to draw from.
        """

    def local_update(
        self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext, loop: LocalLoop
    ) -> TrainResult:
        """One local round: by default the shared loop on :meth:`local_task`, optimising
        every trained model. A method with several phases calls ``loop.run`` several times.

        Raises
        ------
        NothingToTrain
            If the client has nothing to train this round (a method may also train and send
            no model, :meth:`sent_models`: both make the client's reply idle).
        """
        trained = [spec.name for spec in self.model_specs() if spec.trained]
        return loop.run(models, self.local_task(client, models, ctx), trained=trained)

    def sits_out(self, client: ClientData) -> bool:
        """Whether the client lacks a part in ``requires`` that its setting lets it lack
        (``ClientData.optional_parts``, e.g. an unlabeled client of the annotation-heterogeneity
        setting under a method that trains on labels). Such a client trains nothing and
        replies with no model; the aggregation (:meth:`aggregation`) leaves it out."""
        return any(p not in client.parts() for p in self.requires)

    def sent_models(self, client: ClientData, ctx: RoundContext) -> tuple[str, ...]:
        """The exchanged models this client sends back (default: all of them)."""
        return tuple(spec.name for spec in self.model_specs() if spec.exchanged)

    def uploads(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> dict[str, float | list[float]]:
        """Extra values of the train reply (in its metrics), after local training: scalars or
        K-vectors. Every client must send the same keys (Flower's validation)."""
        return {}

    def announce(self, client: ClientData) -> dict[str, float | list[float]]:
        """What this client tells the server when asked (a *query* message, sent by the
        method's aggregation mixin): scalars or K-vectors. Default: nothing."""
        return {}

    def aggregation(self) -> type | None:
        """A strategy mixin class for the server side (its ``aggregate_train`` runs before
        the strategy's own), or ``None`` for the run's strategy as it is. Default:
        :class:`~fedul_flwr.strategies.per_model.PerModelAggregation`, which leaves out the
        replies of clients that sat the round out (:meth:`sits_out`) and, for one model,
        otherwise aggregates exactly as the run's strategy does."""
        return PerModelAggregation

    def server_task(self, server: ClientData, models: nn.ModuleDict, ctx: ServerRoundContext) -> LocalTask | None:
        """The server's training task on its labeled images (labels-at-server setting), run
        after every round's aggregation and once before round 1; ``None``: none (the default;
        a method that has one sets :attr:`trains_on_server`).

        Parameters
        ----------
        server : ClientData
            The server's data: the ``labeled`` part only (uint8 images ``[n, C, H, W]``,
            int64 labels ``[n]``).
        models : nn.ModuleDict
            The exchanged models with the round's aggregated weights, on ``ctx.device``.
        ctx : ServerRoundContext
            The round and the server's generators.
        """
        return None

    def server_update(
        self, server: ClientData, models: nn.ModuleDict, ctx: ServerRoundContext, loop: LocalLoop
    ) -> TrainResult | None:
        """The server's training between rounds: by default the shared loop on
        :meth:`server_task` (``server-epochs`` epochs, the run's optimiser settings), over
        every exchanged, trained model; ``None`` without a task. ``models`` are changed in
        place; their weights are the next round's global models."""
        task = self.server_task(server, models, ctx)
        if task is None:
            return None
        trained = [spec.name for spec in self.model_specs() if spec.exchanged and spec.trained]
        return loop.run(models, task, trained=trained)

    def predictors(self) -> dict[str, Predictor]:
        """The predictors evaluated centrally every round, by name; the first is the
        method's headline (``test-accuracy``), the others are recorded as
        ``test-accuracy-<name>``. Default: argmax of ``f``."""
        return {"f": lambda models, x: models["f"](x)}


METHODS: Registry[type[Method]] = Registry("method")
"""Method classes by name; a method's module registers it with :func:`register_method`."""


def register_method(cls: type[Method]) -> type[Method]:
    """Class decorator: register ``cls`` in :data:`METHODS` under ``cls.name``.

    Raises
    ------
    ValueError
        If the name is taken.
    """
    METHODS.add(cls.name, cls)
    return cls


def method_class(name: str) -> type[Method]:
    """The method class of the run setting ``method``: a registered name, or the import path
    ``"package.module:Class"`` of a :class:`Method` subclass defined outside this package
    (it must be importable on every node).

    Raises
    ------
    UnknownChoiceError
        For an unregistered name without ``":"`` (lists the registered ones).
    ValueError
        If an import path does not name a Method subclass (or does not import).
    """
    if ":" not in name:
        return METHODS.get(name)

    module, _, attr = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"method={name!r}: cannot import {attr!r} from {module!r} ({exc})") from exc
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise ValueError(f"method={name!r} is not a subclass of fedul_flwr.methods.Method")
    return cls
