"""Server strategies: Flower's own, built from the run configuration.

FedUL turns unlabeled clients into an ordinary supervised FL problem, so the server runs a
stock supervised strategy (Lu et al., ICLR 2022, Sec. 3.2: FedAvg by default). Three things
are added to every strategy here:

- a round in which no client replied successfully, or more than ``max-failure-fraction`` of
  the replies are errors, stops the run with the clients' errors (Flower's FedAvg would
  otherwise keep the old model, or train on the few that succeeded, and "complete"); every
  round's replies go on record (``last_replies``: the nodes that trained, that had nothing to
  train, that failed), and the replies of clients with nothing to train (:func:`is_idle`)
  reach no aggregation;
- replies are aggregated in the order of the clients' partition ids (stable node keys),
  so a seeded run repeats itself bit for bit;
- ``aggregation-weights``: ``num-examples`` (FedAvg, McMahan et al. 2017) weighs clients
  by n_c; ``uniform`` (the FedUL authors' code) gives each client 1/C. Clients report both
  weights; the strategy aggregates by the key the setting names.

``strategy`` picks the server algorithm from :data:`STRATEGIES`: Flower's FedAvg, FedProx
(Li et al., MLSys 2020), FedAvgM (Hsu et al., 2019), FedAdam / FedYogi / FedAdagrad (Reddi
et al., ICLR 2021), the robust FedMedian and FedTrimmedAvg (Yin et al., ICML 2018), Krum /
MultiKrum (Blanchard et al., NeurIPS 2017) and Bulyan (El Mhamdi et al., ICML 2018), or
ours, :class:`~fedul_flwr.strategies.scaffold.Scaffold` (Karimireddy et al., ICML 2020)
and :class:`~fedul_flwr.strategies.fednova.FedNova` (Wang et al., NeurIPS 2020). Their
client-side work (prox term, control variates) is in :mod:`fedul_flwr.strategy_hooks`.

Every strategy aggregates every exchanged model of the method: the models travel in one
ArrayRecord (keys ``"<model>.<parameter>"``). A method that needs its own aggregation
(per-model weights, clients that send only some models, uploaded vectors) supplies a mixin
(``Method.aggregation``), composed here *before* the strategy in the MRO, so the strategy
still does the arithmetic (see :mod:`fedul_flwr.strategies.per_model`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

from flwr.app import ArrayRecord, Error, Message, MetricRecord
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from flwr.serverapp.strategy import (
    Bulyan,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedMedian,
    FedProx,
    FedTrimmedAvg,
    FedYogi,
    Krum,
    MultiKrum,
    Strategy,
)

from fedul_flwr import wire
from fedul_flwr.config import RunConfig
from fedul_flwr.registry import Registry
from fedul_flwr.strategies.admission import admit
from fedul_flwr.strategies.contract import train_metric_keys, vector_metric_keys
from fedul_flwr.strategies.fednova import FedNova
from fedul_flwr.strategies.kept_state import KeptOptimizerStates
from fedul_flwr.strategies.participation import Participation
from fedul_flwr.strategies.scaffold import Scaffold
from fedul_flwr.strategies.server_training import ServerTraining

__all__ = [
    "STRATEGIES", "UNNOISED_PREFIX", "NoSuccessfulReplyError", "RoundReplies", "build_strategy", "client_evaluation",
    "error_type", "inner_strategy", "is_idle", "reply_order", "strict",
]  # fmt: skip


class NoSuccessfulReplyError(RuntimeError):
    """A training round got fewer successful replies than ``min-train-nodes`` (or none), or more
    failed replies than ``max-failure-fraction`` allows; the message lists each failing node's
    error."""


_ERROR_CODES = {v: k for k, v in vars(ErrorCode).items() if k.isupper() and isinstance(v, int)}


def error_type(error: Error) -> str:
    """The kind of a failed reply, for the record: the exception class the node's ClientApp
    raised when Flower names it (``<class 'pkg.NodeDataError'>:<'...'>`` from a SuperNode or
    from the ClientApp's own error reply under Ray, ``NodeDataError: ...`` from
    :class:`~fedul_flwr.inprocess.InProcessGrid`), else Flower's error code
    (``NODE_UNAVAILABLE``, ...)."""
    reason = str(error.reason or "")
    found = re.search(r"<class '(?:[\w]+\.)*(\w+)'>", reason) or re.match(r"(\w+(?:Error|Exception)): ", reason)
    return found.group(1) if found else _ERROR_CODES.get(int(error.code), f"error code {error.code}")


def is_idle(reply: Message) -> bool:
    """Whether a training reply is a client's "nothing to train" answer: a successful reply
    that carries no model (an empty ``arrays`` record; the ClientApp also reports zero
    examples). It is no failure, and no aggregation sees it."""
    return not reply.has_error() and wire.ARRAYS in reply.content.array_records and not len(reply.content[wire.ARRAYS])


@dataclass
class RoundReplies:
    """What the training replies of one round were, for the run's record.

    Attributes
    ----------
    server_round : int
        The round (a resumed run's numbering).
    trained : list[int]
        Node ids that trained and sent a model (ascending, as the other two).
    idle : list[int]
        Node ids that had nothing to train (:func:`is_idle`).
    failed : list[tuple[int, str]]
        (node id, error type) of each failed reply: the node the instruction was sent to,
        not the error reply's source (the SuperLink answers for a node it lost), and the type
        of :func:`error_type`.
    clients : list[int]
        The ``node-key`` of each trained reply (ascending): the client's stable key (partition
        id in simulation, a hash of the data folder in deployment), which, unlike the node id,
        a resumed simulation keeps. The node's own claim, as in :func:`reply_order`.
    """

    server_round: int
    trained: list[int] = field(default_factory=list)
    idle: list[int] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)
    clients: list[int] = field(default_factory=list)


class RequireReplies:
    """Mixin for Flower strategies: sort a training round's replies into trained, idle
    (:func:`is_idle`) and failed ones, record them (``last_replies``), and raise
    :class:`NoSuccessfulReplyError` when the round yields fewer successful replies than the
    strategy's ``min_train_nodes`` (at least one), or when more than ``max_failure_fraction``
    of its replies are errors, instead of silently aggregating too few clients or keeping the
    old model. Every reply goes through one door first (:meth:`admit`,
    :mod:`fedul_flwr.strategies.admission`). Otherwise the round's trained replies (and the errors, which Flower's strategies
    log and skip) are aggregated; idle replies never reach the aggregation, and a round in
    which every successful reply is idle keeps the global model. A failed reply is attributed
    to the node its instruction was sent to (:meth:`screen`)."""

    max_failure_fraction: float = 1.0
    """The largest share of a round's replies that may fail (the run setting
    ``max-failure-fraction``; 1: only ``min_train_nodes`` counts). Idle replies are no failures."""
    last_replies: RoundReplies | None = None
    """The latest training round's replies, for the server to record (kept when the round
    stops the run)."""
    _screened: int | None = None  # the round whose replies screen() has seen already (a DP wrapper's call)
    declared_metrics: tuple[frozenset[str], frozenset[str]] | None = None
    """(declared, always sent) train metric keys of the run's contract
    (:func:`~fedul_flwr.strategies.contract.train_metric_keys`; set by :func:`build_strategy`):
    the door's reference for each reply's metric keys."""
    vector_metrics: frozenset[str] | None = None
    """The declared train metric keys whose value is a list
    (:func:`~fedul_flwr.strategies.contract.vector_metric_keys`); every other declared key carries
    one number. ``None``: not checked (no declaration)."""
    whole_replies: bool = False
    """Whether every reply must carry every exchanged model (server-side DP clips whole-model
    updates; :func:`fedul_flwr.privacy.server.with_server_dp` sets it)."""

    def configure_train(self, server_round: int, *args: Any, **kwargs: Any) -> Iterable[Message]:
        messages = list(super().configure_train(server_round, *args, **kwargs))  # type: ignore[misc]
        self._instructions = messages  # their message ids are set when the grid pushes them
        self._sent_arrays = args[0] if args else kwargs.get("arrays")  # the round's global arrays
        self._admitted: set[int] = set()
        return messages

    def admit(self, server_round: int, replies: Iterable[Message]) -> list[Message]:
        """The door of every training reply (:mod:`fedul_flwr.strategies.admission`): each
        malformed one becomes a failed reply of its node (``MalformedReplyError``); the
        others pass as they are. Each reply is checked once per round."""
        replies = list(replies)
        expected = getattr(self, "_sent_arrays", None)
        if expected is None:
            return replies
        fresh = [r for r in replies if id(r) not in self._admitted]
        if not fresh:
            return replies
        models = list(dict.fromkeys(wire.model_of(k) for k in expected.keys()))
        per_model = getattr(self, "model_weight_keys", {})
        side: dict[str, str | None] = {}
        for cls in reversed(type(self).__mro__):
            side.update(cls.__dict__.get("side_records", {}))
        checked = iter(admit(server_round, fresh, expected, getattr(self, "_instructions", ()),
                             weight_keys={m: per_model.get(m, self.weighted_by_key) for m in models},  # type: ignore[attr-defined]
                             side_records=side, whole=self.whole_replies,
                             declared_metrics=getattr(self, "declared_metrics", None),
                             vector_metrics=getattr(self, "vector_metrics", None)))  # fmt: skip
        out = [next(checked) if id(r) not in self._admitted else r for r in replies]
        self._admitted.update(id(r) for r in out)
        return out

    def screen(self, server_round: int, replies: Iterable[Message]) -> list[Message]:
        """Admit the round's replies (:meth:`admit`: a malformed reply becomes a failed one of
        its node), sort and record them (``last_replies``) and apply
        ``min_train_nodes`` and ``max_failure_fraction``; returns the replies to aggregate
        (the trained ones and the errors, in their order). A DP wrapper in front of the
        strategy calls it first, then hands on only what it can clip
        (:class:`~fedul_flwr.privacy.server.ClippableReplies`).

        Raises
        ------
        NoSuccessfulReplyError
            Naming the round, the counts and every failed node's error.
        """
        replies = self.admit(server_round, replies)
        sent_to = {m.metadata.message_id: m.metadata.dst_node_id for m in getattr(self, "_instructions", [])}

        def node(reply: Message) -> int:
            return sent_to.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)

        failed = [m for m in replies if m.has_error()]
        idle = [m for m in replies if is_idle(m)]
        trained = [m for m in replies if not m.has_error() and not is_idle(m)]
        self.last_replies = RoundReplies(server_round, sorted(node(m) for m in trained), sorted(node(m) for m in idle),
                                         sorted((node(m), error_type(m.error)) for m in failed),
                                         sorted(key for keyed, key, _ in map(reply_order, trained) if keyed == 0))  # fmt: skip
        ok = len(replies) - len(failed)
        needed = max(1, int(getattr(self, "min_train_nodes", 1)))
        if getattr(self, "participation", "fixed-size") == "poisson":  # a random cohort: min-train-nodes is no floor
            needed = min(needed, len(getattr(self, "_instructions", [])))
        if ok < needed or len(failed) > self.max_failure_fraction * len(replies):
            errors = [f"node {node(m)}: {m.error.reason}" for m in failed]
            why = (f"{ok} successful training repl{'y' if ok == 1 else 'ies'} out of {len(replies)}, {needed} needed "
                   "(min-train-nodes)" if ok < needed else
                   f"{len(failed)} of {len(replies)} training replies failed, more than "
                   f"max-failure-fraction={self.max_failure_fraction:g} allows")  # fmt: skip
            raise NoSuccessfulReplyError(
                f"round {server_round}: {why}; " + ("; ".join(errors) if errors else "(no node replied in time)")
            )
        self._screened = server_round
        return [m for m in replies if not is_idle(m)]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies) if self._screened == server_round else self.screen(server_round, replies)
        self._screened = None
        # every successful reply idle: the model stays (a Poisson round under server DP still releases its noise)
        if not any(not m.has_error() for m in replies) and getattr(self, "dp_empty_mean", None) is None:
            log(INFO, "round %d: no client had anything to train; the global model stays", server_round)
            return None, None
        arrays, metrics = super().aggregate_train(server_round, replies)  # type: ignore[misc]
        if arrays is None:
            raise NoSuccessfulReplyError(f"round {server_round}: the strategy aggregated none of the trained replies")
        return arrays, metrics


def reply_order(reply: Message) -> tuple[int, int, int]:
    """Sort key of a training reply: its ``node-key`` (partition id in simulation, a hash of
    the data folder in deployment; see :func:`~fedul_flwr.data.sources.node_key`), then
    its source node id. Replies without a key (errors, foreign clients) come last."""
    if not reply.has_error() and wire.NODE_RECORD in reply.content.config_records:
        return 0, int(reply.content[wire.NODE_RECORD][wire.NODE_KEY]), reply.metadata.src_node_id
    return 1, 0, reply.metadata.src_node_id


class OrderedReplies:
    """Mixin for Flower strategies: aggregate the training replies in a fixed order, by the
    ``node-key`` each client sends (:func:`reply_order`), not in the order they arrived.

    Floating-point sums depend on the order of their terms, and one ulp of difference in the
    global model grows over rounds (measured: 0.2 points of MNIST test error after 8 rounds),
    so without this a seeded run would not repeat itself. The node id is no such order:
    Flower's simulation engine draws new node ids on every run.
    """

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return super().aggregate_train(server_round, sorted(replies, key=reply_order))  # type: ignore[misc]


class ResumedRounds:
    """Mixin for Flower strategies: number rounds from ``round_offset + 1`` on.

    ``Strategy.start`` counts its rounds from 1; a run resumed after round r
    (``resume=true``) sets ``round_offset = r``, so that round r + 1 is configured (the
    clients' ``server-round``, hence their seeds) and aggregated (FedAdam's bias correction
    uses the round) exactly as in an uninterrupted run. It also keeps the latest round's
    aggregated train metrics (``last_train_metrics``), which the server records with that
    round's evaluation, so a stopped run keeps the metrics of every finished round.
    """

    round_offset: int = 0
    evaluation_prefix: str = ""
    """Prefixed to every key of the clients' aggregated evaluation (``"unnoised-"`` under DP,
    where it runs only with ``dp-publish-unnoised-client-evaluation=true``)."""
    last_train_metrics: MetricRecord | None = None
    """The aggregated train metrics of the latest round, for the server to record (and
    checkpoint) with that round's evaluation."""

    def configure_train(self, server_round: int, *args: Any, **kwargs: Any) -> Iterable[Message]:
        return super().configure_train(server_round + self.round_offset, *args, **kwargs)  # type: ignore[misc]

    def aggregate_train(self, server_round: int, *args: Any, **kwargs: Any) -> Any:
        arrays, metrics = super().aggregate_train(server_round + self.round_offset, *args, **kwargs)  # type: ignore[misc]
        self.last_train_metrics = metrics
        return arrays, metrics

    def configure_evaluate(self, server_round: int, *args: Any, **kwargs: Any) -> Iterable[Message]:
        return super().configure_evaluate(server_round + self.round_offset, *args, **kwargs)  # type: ignore[misc]

    def aggregate_evaluate(self, server_round: int, *args: Any, **kwargs: Any) -> Any:
        result = super().aggregate_evaluate(server_round + self.round_offset, *args, **kwargs)  # type: ignore[misc]
        if self.evaluation_prefix and isinstance(result, MetricRecord):  # marked where Flower prints it
            return MetricRecord({f"{self.evaluation_prefix}{k}": v for k, v in result.items()})
        return result


def strict(strategy_class: type[FedAvg], method_mixin: type | None = None, kept_states: bool = False) -> type[FedAvg]:
    """``strategy_class`` with :class:`ResumedRounds`,
    :class:`~fedul_flwr.strategies.server_training.ServerTraining` (labels-at-server), :class:`RequireReplies`,
    :class:`OrderedReplies`, with ``kept_states``
    :class:`~fedul_flwr.strategies.kept_state.KeptOptimizerStates` (the clients' kept
    optimiser states, ``local-optimizer-state = "kept"``) and the method's aggregation mixin
    (if any) mixed in, and
    :class:`~fedul_flwr.privacy.server.NoisedMean` right above FedAvg (server-side DP's noise on the
    mean, before any server step).

    Parameters
    ----------
    strategy_class : type[FedAvg]
        Flower's FedAvg or a subclass of it.
    method_mixin : type | None
        ``Method.aggregation()``: runs after the replies are checked and ordered, before the
        strategy's own ``aggregate_train``.

    Returns
    -------
    type[FedAvg]
        ``Strict<Name>`` (one class per combination).
    """
    return _strict(strategy_class, method_mixin, kept_states)


@functools.cache
def _noised_fedavg() -> type[FedAvg]:
    # deferred: cycle fedul_flwr.strategies -> fedul_flwr.privacy.server -> fedul_flwr.strategies.admission -> fedul_flwr.strategies
    from fedul_flwr.privacy.server import NoisedMean

    return type("NoisedMeanFedAvg", (Participation, NoisedMean, FedAvg), {"__module__": __name__})


@functools.cache
def _strict(strategy_class: type[FedAvg], method_mixin: type | None, kept_states: bool = False) -> type[FedAvg]:
    kept = (KeptOptimizerStates,) if kept_states else ()
    mixins = (ResumedRounds, ServerTraining, RequireReplies, OrderedReplies, *kept) + ((method_mixin,) if method_mixin else ())
    name = f"Strict{'Kept' if kept_states else ''}{'' if method_mixin is None else method_mixin.__name__}{strategy_class.__name__}"
    # NoisedMean right above FedAvg: server-side DP's noise goes on the mean, before a server step
    noised = _noised_fedavg()
    core = (noised,) if strategy_class in (FedAvg, noised) or issubclass(strategy_class, noised) else (strategy_class, noised)
    return type(
        name,
        (*mixins, *core),
        {"__module__": __name__, "__doc__": f"{strategy_class.__name__} that fails loudly on an empty round."},
    )


StrategyBuilder = Callable[[RunConfig], tuple[type[FedAvg], dict[str, Any]]]
STRATEGIES: Registry[StrategyBuilder] = Registry("strategy")
"""Server strategies by name: ``builder(cfg) -> (strategy class, its own constructor arguments)``."""

# Server step size when ``server-lr = 0`` ("the strategy's default"): Flower's defaults,
# and eta_g = 1 for SCAFFOLD (Karimireddy et al. 2020).
DEFAULT_SERVER_LR = {"fedavgm": 1.0, "fedadam": 0.1, "fedyogi": 0.01, "fedadagrad": 0.1, "scaffold": 1.0}


def _server_lr(cfg: RunConfig) -> float:
    return cfg.server_lr or DEFAULT_SERVER_LR.get(cfg.strategy, 1.0)


def _fedopt(cfg: RunConfig) -> dict[str, Any]:
    return {"eta": _server_lr(cfg), "eta_l": cfg.lr, "tau": cfg.tau}


STRATEGIES.add("fedavg", lambda cfg: (FedAvg, {}))
STRATEGIES.add("fedprox", lambda cfg: (FedProx, {"proximal_mu": cfg.proximal_mu}))
STRATEGIES.add("scaffold", lambda cfg: (Scaffold, {"global_learning_rate": _server_lr(cfg), "option": cfg.scaffold_option}))
STRATEGIES.add("fednova", lambda cfg: (FedNova, {}))
STRATEGIES.add(
    "fedavgm",
    lambda cfg: (FedAvgM, {"server_learning_rate": _server_lr(cfg), "server_momentum": cfg.server_momentum}),
)
STRATEGIES.add("fedadam", lambda cfg: (FedAdam, {**_fedopt(cfg), "beta_1": cfg.beta_1, "beta_2": cfg.beta_2}))
STRATEGIES.add("fedyogi", lambda cfg: (FedYogi, {**_fedopt(cfg), "beta_1": cfg.beta_1, "beta_2": cfg.beta_2}))
STRATEGIES.add("fedadagrad", lambda cfg: (FedAdagrad, _fedopt(cfg)))
STRATEGIES.add("fedmedian", lambda cfg: (FedMedian, {}))
STRATEGIES.add("fedtrimmedavg", lambda cfg: (FedTrimmedAvg, {}))
STRATEGIES.add("krum", lambda cfg: (Krum, {"num_malicious_nodes": cfg.num_malicious_nodes}))
STRATEGIES.add(
    "multikrum",
    lambda cfg: (MultiKrum, {"num_malicious_nodes": cfg.num_malicious_nodes, "num_nodes_to_select": cfg.num_nodes_to_select}),
)
STRATEGIES.add("bulyan", lambda cfg: (Bulyan, {"num_malicious_nodes": cfg.num_malicious_nodes}))


def inner_strategy(strategy: Strategy) -> FedAvg:
    """The strict strategy inside a DP wrapper (``strategy.strategy``), or ``strategy``: the
    object whose rounds are offset on resume and whose state is checkpointed."""
    return getattr(strategy, "strategy", strategy)


def build_strategy(cfg: RunConfig, method_mixin: type | None = None, num_nodes: int | None = None) -> Strategy:
    """The server strategy of the run, strict about empty rounds, inside Flower's server-side
    DP wrapper when ``differential-privacy`` asks for one (:mod:`fedul_flwr.privacy`).

    Parameters
    ----------
    cfg : RunConfig
        Uses ``strategy`` and its knobs (``proximal-mu``, ``server-lr``,
        ``server-momentum``, ``beta-1``, ``beta-2``, ``tau``, ``scaffold-option``; ``lr``
        as FedOpt's logged ``eta_l``), the sampling settings ``fraction-train``,
        ``min-train-nodes`` and ``min-available-nodes``, ``aggregation-weights``, and
        ``client-test-fraction`` (client-side evaluation runs only when clients hold a
        labeled local test split, and under DP only when opted in: :func:`client_evaluation`),
        ``num-malicious-nodes`` / ``num-nodes-to-select`` (Krum,
        MultiKrum, Bulyan) and the ``dp-*`` keys.
    method_mixin : type | None
        The method's aggregation mixin (``Method.aggregation()``).
    num_nodes : int | None
        The nodes the rounds sample from (``server-adaptive`` sizes its noise for the cohort;
        :func:`fedul_flwr.privacy.server.with_server_dp`).

    Returns
    -------
    Strategy
        An instance of ``strict(<strategy class>, method_mixin)``, or Flower's DP wrapper
        around one (:func:`inner_strategy` unwraps it).
    """
    evaluate = 1.0 if client_evaluation(cfg) else 0.0
    if cfg.strategy == "scaffold" and cfg.local_optimizer != "sgd":
        log(
            WARNING,
            "SCAFFOLD's correction c - c_i (and option II's (x - y_i) / (K * lr)) assumes local SGD; "
            "with local-optimizer=%r the optimiser rescales it per coordinate (measured: accuracy "
            "falls after round 1 with either option). Prefer local-optimizer='sgd' "
            "(docs/server-strategies.md).",
            cfg.local_optimizer,
        )
    strategy_class, specific = STRATEGIES.get(cfg.strategy)(cfg)
    strategy = strict(strategy_class, method_mixin, cfg.local_optimizer_state == "kept")(
        fraction_train=cfg.fraction_train,
        fraction_evaluate=evaluate,
        min_train_nodes=cfg.min_train_nodes,
        min_evaluate_nodes=1 if evaluate else 0,
        min_available_nodes=cfg.min_available_nodes,
        weighted_by_key=wire.WEIGHT_KEYS[cfg.aggregation_weights],
        **specific,
    )
    strategy.max_failure_fraction = cfg.max_failure_fraction
    # the reply door judges each reply's metric keys against the run's declaration (admission.py);
    # a method given by import path ("module:Class") is outside the contract: its keys are not judged
    declared = ":" not in cfg.method
    strategy.declared_metrics = train_metric_keys(cfg.strategy, cfg.method, cfg.as_dict()) if declared else None
    strategy.vector_metrics = vector_metric_keys(cfg.strategy, cfg.method, cfg.as_dict()) if declared else None
    # which nodes train (strategies/participation.py): a secret draw where it is part of server-side DP
    strategy.participation, strategy.sampling_seed = cfg.participation, cfg.seed
    strategy.secret_sampling = cfg.differential_privacy in ("server-fixed", "server-adaptive")
    if evaluate and cfg.differential_privacy != "none":
        strategy.evaluation_prefix = UNNOISED_PREFIX
        log(WARNING, "fedul-flwr: dp-publish-unnoised-client-evaluation=true: the clients' evaluation on their local "
            "test splits is printed each round as '%s...': no DP noise covers it, it is outside the epsilon",
            UNNOISED_PREFIX)  # fmt: skip
    # deferred: cycle fedul_flwr.strategies -> fedul_flwr.privacy.server -> fedul_flwr.strategies.admission -> fedul_flwr.strategies
    from fedul_flwr.privacy.server import with_server_dp

    return with_server_dp(strategy, cfg, num_nodes)


UNNOISED_PREFIX = "unnoised-"
"""The mark of an unnoised client aggregate a DP run prints (its keys start with it)."""


def client_evaluation(cfg: RunConfig) -> bool:
    """Whether the rounds ask the clients to evaluate on their labeled local test splits: they
    hold one (``client-test-fraction`` > 0) and, under any ``differential-privacy`` mode, the
    run opted in with ``dp-publish-unnoised-client-evaluation=true`` (no DP noise covers the
    clients' test metrics, nor their aggregate Flower prints)."""
    return cfg.client_test_fraction > 0 and (cfg.differential_privacy == "none" or cfg.dp_publish_unnoised_client_evaluation)
