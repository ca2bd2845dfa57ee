"""The aggregation contract: how the server combines the training replies, declared once per
strategy and per method, and which differential-privacy modes and client weights follow from it.

Server-side DP (McMahan et al., ICLR 2018) clips each client's update to L2 norm C, averages
the n clipped updates with equal weights and adds Gaussian noise N(0, (z C / n)^2) per
coordinate: one client moves that mean by at most C / n, so the release is the Gaussian
mechanism with noise multiplier z, the figure the accountant composes
(:func:`fedul_flwr.privacy.accounting.privacy_spent`). That holds only where the server's release is a
plain uniform mean of the clipped updates, or a function of the *noised* mean alone
(post-processing: a server optimizer step taken after the noise, McMahan et al. 2018, Sec. 2;
Reddi et al., ICLR 2021). Every other way of combining replies gives one client more than
C / n of influence, and the recorded epsilon would not hold. Client-local DP noises each reply
on its node, so any server combination is post-processing of noised replies.

Each strategy declares one :class:`Contract` in :data:`STRATEGY_CONTRACTS`; a method declares
its own in the ``contract`` attribute of its aggregation mixin (``Method.aggregation()``;
``None``: it aggregates as the run's strategy does). :func:`dp_refusal` derives from the two
what a run may combine; :func:`fedul_flwr.preflight.validate_config` refuses the rest before
round 1 with its one line.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ACCEPTS",
    "COMMON_FIELDS",
    "METHOD_SERVER_FIELDS",
    "OPTION_FIELDS",
    "SERVER_FIELDS",
    "recorded_field",
    "Exposure",
    "Field",
    "METHOD_FIELDS",
    "STRATEGY_FIELDS",
    "Treatment",
    "field_refusal",
    "fields_table",
    "reply_fields",
    "train_metric_keys",
    "vector_metric_keys",
    "Combining",
    "Contract",
    "MISSING_CONTRACT",
    "SERVER_DP_WEIGHTS",
    "STRATEGY_CONTRACTS",
    "contract_table",
    "dp_refusal",
    "strategy_refusal",
]


class Combining(enum.Enum):
    """How a server combines the training replies of one round."""

    MEAN = "plain mean"
    """A weighted mean of the replies' updates (uniform weights under server DP)."""
    SERVER_OPTIMIZER = "mean, then a server optimizer"
    """The mean, then a server optimizer step on it (momentum, Adam, Adagrad, Yogi); under
    server DP the noise goes on the mean, before the step (:mod:`fedul_flwr.privacy`)."""
    REWEIGHTED = "reweighted"
    """Client weights other than equal ones, chosen by the server or the method."""
    ROBUST_SELECTION = "robust selection"
    """Coordinate-wise median or trimmed mean, or a selection of clients (Krum, Bulyan)."""
    PARTIAL_REPLIES = "partial replies"
    """Clients send only some of the exchanged models, each model averaged over its senders."""
    SIDE_RECORDS = "mean with side records"
    """The replies carry records beside the model that the aggregation uses (control variates)."""


ACCEPTS: dict[Combining, tuple[str, ...]] = {
    Combining.MEAN: ("none", "server-fixed", "server-adaptive", "client-local"),
    Combining.SERVER_OPTIMIZER: ("none", "server-fixed", "server-adaptive", "client-local"),
    Combining.REWEIGHTED: ("none", "client-local"),
    Combining.ROBUST_SELECTION: ("none", "client-local"),
    Combining.PARTIAL_REPLIES: ("none", "client-local"),
    Combining.SIDE_RECORDS: ("none",),
}
"""The ``differential-privacy`` modes each way of combining replies admits (module doc)."""
SERVER_DP_WEIGHTS = "uniform"
"""The ``aggregation-weights`` a server-DP run needs: with weights w_i summing to 1, one client
moves the mean by w_i C, more than C / n for every client above the mean weight."""


@dataclass(frozen=True)
class Contract:
    """How one strategy or one method combines the training replies.

    Attributes
    ----------
    combines : Combining
        The kind of combination (decides the DP modes, :data:`ACCEPTS`).
    how : str
        What it does to one client's influence, as the refusal line says it, e.g. ``"krum
        selects one client's update"``.
    refuses : tuple[Combining, ...]
        For a method's contract: the kinds of strategy its aggregation cannot compose with
        (e.g. a method that sets the replies' weights, under a strategy that ignores weights);
        :func:`strategy_refusal` refuses them before round 1.
    """

    combines: Combining
    how: str
    refuses: tuple[Combining, ...] = ()


STRATEGY_CONTRACTS: dict[str, Contract] = {
    "fedavg": Contract(Combining.MEAN, "fedavg averages the updates"),
    "fedprox": Contract(Combining.MEAN, "fedprox averages the updates (its proximal term is on the clients)"),
    "scaffold": Contract(Combining.SIDE_RECORDS, "scaffold aggregates control variates sent beside the model, "
                         "which neither server-side clipping bounds nor client-local noise covers"),  # fmt: skip
    "fednova": Contract(Combining.REWEIGHTED, "fednova rescales each update by tau_eff / tau_i, the client's "
                        "own step count"),  # fmt: skip
    "fedavgm": Contract(Combining.SERVER_OPTIMIZER, "fedavgm applies server momentum to the mean (under server DP, to the noised mean)"),
    "fedadam": Contract(Combining.SERVER_OPTIMIZER, "fedadam applies an Adam step to the mean (under server DP, to the noised mean)"),
    "fedyogi": Contract(Combining.SERVER_OPTIMIZER, "fedyogi applies a Yogi step to the mean (under server DP, to the noised mean)"),
    "fedadagrad": Contract(Combining.SERVER_OPTIMIZER, "fedadagrad applies an Adagrad step to the mean (under server DP, to the noised mean)"),
    "fedmedian": Contract(Combining.ROBUST_SELECTION, "fedmedian takes the coordinate-wise median"),
    "fedtrimmedavg": Contract(Combining.ROBUST_SELECTION, "fedtrimmedavg averages what survives a coordinate-wise "
                              "trim"),  # fmt: skip
    "krum": Contract(Combining.ROBUST_SELECTION, "krum selects one client's update"),
    "multikrum": Contract(Combining.ROBUST_SELECTION, "multikrum averages the updates it selects"),
    "bulyan": Contract(Combining.ROBUST_SELECTION, "bulyan selects updates, then trims coordinates"),
}
"""Every registered strategy's contract (a test checks each registered name has one)."""

MISSING_CONTRACT = Contract(Combining.REWEIGHTED, "its aggregation mixin declares no contract (a `contract` "
                            "attribute), so nothing says how it weighs the clients")  # fmt: skip
"""What a method aggregation mixin without a ``contract`` attribute counts as."""


def _mode_refusal(mode: str, contract: Contract, subject: str, local_accepted: bool = True) -> str | None:
    if mode in ACCEPTS[contract.combines]:
        return None
    if mode.startswith("server") and "client-local" in ACCEPTS[contract.combines]:
        # suggest client-local only where the whole run (strategy, method, fields) accepts it
        return (f"differential-privacy={mode!r} with {subject}: {contract.how} ({contract.combines.value}), so one "
                "client moves the release by more than the C/n that server-side DP's epsilon assumes; use "
                + ("differential-privacy=client-local" if local_accepted else "differential-privacy='none'"))  # fmt: skip
    return (f"differential-privacy={mode!r} with {subject}: {contract.how} ({contract.combines.value}), outside "
            "every DP mode's epsilon; use differential-privacy='none'")  # fmt: skip


def _combining_refusal(
    mode: str, strategy: str, method: str, method_contract: Contract | None, options: Mapping[str, object] | None
) -> str | None:
    """The refusal of ``mode`` by the strategy's contract, the method's, then the fields sent; a
    suggestion of ``client-local`` only where that refusal would be ``None`` for it."""
    local = mode == "client-local" or _combining_refusal("client-local", strategy, method, method_contract, options) is None
    why = _mode_refusal(mode, STRATEGY_CONTRACTS[strategy], f"strategy={strategy!r}", local)
    if why is None and method_contract is not None:
        why = _mode_refusal(mode, method_contract, f"method={method!r}", local)
    if why is None:
        why = field_refusal(mode, strategy, method, options)
    return why


def strategy_refusal(strategy: str, method: str, method_contract: Contract | None) -> str | None:
    """Why ``strategy`` cannot run ``method``'s aggregation, in one line; ``None`` when it can.

    Parameters
    ----------
    strategy : str
        ``strategy`` (a key of :data:`STRATEGY_CONTRACTS`).
    method : str
        ``method``, for the message.
    method_contract : Contract | None
        The method's aggregation contract (``None``: it aggregates as the strategy does).

    Returns
    -------
    str | None
        The refusal naming both keys, how the strategy combines the replies and how the method
        does, when the strategy's kind is in the method's :attr:`Contract.refuses`.

    Raises
    ------
    KeyError
        If ``strategy`` declares no contract.
    """
    ours = STRATEGY_CONTRACTS[strategy]
    if method_contract is None or ours.combines not in method_contract.refuses:
        return None
    return (f"strategy={strategy!r} with method={method!r}: {ours.how} ({ours.combines.value}) and ignores the "
            f"replies' weights, where {method_contract.how}; use a strategy that averages the replies' updates "
            "(e.g. strategy='fedavg')")  # fmt: skip


def dp_refusal(
    mode: str, weights: str, strategy: str, method: str, method_contract: Contract | None, noise_multiplier: float,
    options: Mapping[str, object] | None = None,
) -> str | None:
    """Why a run may not combine this DP mode, client weights, strategy and method, in one line;
    ``None`` when it may.

    Parameters
    ----------
    mode : str
        ``differential-privacy``.
    weights : str
        ``aggregation-weights``.
    strategy : str
        ``strategy`` (a key of :data:`STRATEGY_CONTRACTS`).
    method : str
        ``method``, for the message.
    method_contract : Contract | None
        The method's aggregation contract (``None``: it aggregates as the strategy does).
    noise_multiplier : float
        ``dp-noise-multiplier`` z: a server-side mode with z = 0 adds no noise, and is refused.
    options : Mapping[str, object] | None
        The run's settings (dashed keys) that decide which fields are sent
        (:func:`reply_fields`).

    Returns
    -------
    str | None
        The refusal, naming the keys, their values and why: z = 0 first, then the strategy,
        the method, a field the mode refuses (:func:`field_refusal`), the weights.

    Raises
    ------
    KeyError
        If ``strategy`` declares no contract.
    """
    if mode.startswith("server") and not noise_multiplier > 0:
        return (f"dp-noise-multiplier={noise_multiplier:g} with differential-privacy={mode!r} adds no noise: the run "
                "would release the exact clipped mean (epsilon = inf); give dp-noise-multiplier > 0, or "
                "differential-privacy='none'")  # fmt: skip
    why = _combining_refusal(mode, strategy, method, method_contract, options)
    if why is None and mode.startswith("server") and weights != SERVER_DP_WEIGHTS:
        why = (f"aggregation-weights={weights!r} with differential-privacy={mode!r}: the server's noise z C / n "
               "protects every client with noise multiplier z only when the clients weigh the same; use "
               f"aggregation-weights={SERVER_DP_WEIGHTS!r} (what server-side DP sets when the key is not typed)")  # fmt: skip
    return why


def contract_table(modes: tuple[str, ...]) -> str:
    """The Markdown table of every strategy x DP mode of ``modes``: accepted or refused, and
    why (docs/privacy.md holds it; a test keeps the two equal)."""
    head = "| strategy | combines the replies by | " + " | ".join(f"`{m}`" for m in modes) + " | why |"
    rows = [head, "|" + "---|" * (len(modes) + 3)]
    for name, contract in STRATEGY_CONTRACTS.items():
        marks = ["accepted" if m in ACCEPTS[contract.combines] else "refused" for m in modes]
        rows.append(f"| `{name}` | {contract.combines.value} | " + " | ".join(marks) + f" | {contract.how} |")
    return "\n".join(rows)


# --------------------------------------------------------------------------- what a run sends


class Exposure(enum.Enum):
    """What a DP mode does with one field a client sends or the server publishes."""

    NOISED = "noised"
    """Covered by the epsilon: clipped and noised (the model arrays), or computed from the
    noised release alone (post-processing)."""
    SERVER_ONLY = "server only"
    """Read by the server, neither recorded, printed nor sent on (server-side DP trusts the
    server: it sees every update before clipping)."""
    OPT_IN = "opt-in"
    """Published only with the opt-in setting named in the treatment, then outside the epsilon;
    otherwise not recorded, printed or asked for."""
    PUBLIC = "public"
    """Outside the epsilon, declared so (the treatment says why)."""
    REFUSED = "refused"
    """The mode refuses a run that sends it, before round 1."""


@dataclass(frozen=True)
class Treatment:
    """One DP mode's treatment of one field: the exposure and why (or the opt-in key)."""

    exposure: Exposure
    why: str


@dataclass(frozen=True)
class Field:
    """One field a client sends (a record and a key of a reply) or the server publishes.

    Attributes
    ----------
    record : str
        ``"<message>:<record>"``: ``train:arrays``, ``train:metrics``, ``train:node``,
        ``train:cv-delta``, ``evaluate:metrics``, ``query:metrics``, ``query:node``, or
        ``server:broadcast`` (what the server sends every client).
    key : str
        The key in that record (``*``: every key, e.g. every ``<model>.<parameter>``).
    what : str
        What it carries.
    server : Treatment
        Under ``server-fixed`` and ``server-adaptive``.
    local : Treatment
        Under ``client-local``.
    always : bool
        Whether every trained reply of the run carries it (``False``: only some nodes send it,
        e.g. a diagnostic that needs the true classes); the reply door refuses a trained reply
        that lacks a field sent always (:func:`train_metric_keys`).
    vector : bool
        Whether a metric's value is a list of numbers (e.g. K floats, one per class); else one
        number. The reply door refuses a reply whose value is of the other kind
        (:func:`vector_metric_keys`): Flower's metric averaging raises on a mix.
    """

    record: str
    key: str
    what: str
    server: Treatment
    local: Treatment
    always: bool = True
    vector: bool = False

    def treatment(self, mode: str) -> Treatment:
        """The treatment under ``mode`` (a DP mode other than ``none``)."""
        return self.local if mode == "client-local" else self.server


_NOISED_ARRAYS = Field(
    "train:arrays", "*", "the trained models' arrays",
    Treatment(Exposure.NOISED, "clipped to C, averaged with equal weights, noised"),
    Treatment(Exposure.NOISED, "clipped to C and noised on the node"),
)  # fmt: skip
_TRAIN_METRICS = Treatment(Exposure.OPT_IN, "dp-publish-unnoised-train-metrics")
_STATISTIC = Treatment(Exposure.PUBLIC, "a statistic of the node's data sent unnoised: outside the epsilon")
_SIZE = Treatment(Exposure.PUBLIC, "the size of the node's data (or 1), sent unnoised: outside the epsilon")
_CLIENT_EVAL = Treatment(Exposure.OPT_IN, "dp-publish-unnoised-client-evaluation")


def _metric(key: str, what: str, server: Treatment = _TRAIN_METRICS, local: Treatment = _STATISTIC,
            always: bool = True, vector: bool = False) -> Field:  # fmt: skip
    return Field("train:metrics", key, what, server, local, always, vector)


COMMON_FIELDS: tuple[Field, ...] = (
    _NOISED_ARRAYS,
    _metric("train-loss", "the node's mean training loss"),
    _metric("num-examples", "the node's examples (not read as a weight under server DP: every kept reply weighs 1)",
            local=_SIZE),
    _metric("uniform-weight", "1 (the uniform weight)",
            Treatment(Exposure.SERVER_ONLY, "set to 1 before aggregation, whatever the node claims"), _SIZE),
    _metric("num-steps", "the node's local optimiser steps", local=_SIZE),
    Field("train:node", "node-key", "the node's stable key (partition id, hash of its data folder)",
          Treatment(Exposure.SERVER_ONLY, "the aggregation order"),
          Treatment(Exposure.PUBLIC, "names the node, not its data; the server knows the node anyway")),
    Field("evaluate:metrics", "*", "the node's loss and accuracy on its labeled local test split", _CLIENT_EVAL,
          _CLIENT_EVAL),
)  # fmt: skip
"""Fields every method's ClientApp sends (:mod:`fedul_flwr.wire`)."""

STRATEGY_FIELDS: dict[str, tuple[Field, ...]] = {
    "scaffold": (
        Field("train:cv-delta", "*", "the change of the node's control variate (from its gradients)",
              Treatment(Exposure.REFUSED, "not clipped: one client moves the release by more than C/n"),
              Treatment(Exposure.REFUSED, "not noised on the node: as revealing as the update")),
        _metric("scaffold-cv-rounds", "rounds the node's control variate was updated in",
                Treatment(Exposure.REFUSED, "sent with the control variates"),
                Treatment(Exposure.REFUSED, "sent with the control variates")),
    ),
}  # fmt: skip
"""Fields a strategy adds to every reply."""

_PSEUDO = (
    _metric("pseudo-label-share", "the share of the node's unlabeled images whose pseudo-label passed"),
    _metric("pseudo-label-correct-share", "in simulation, the share also of their true class (a diagnostic)",
            always=False),
)
_POSITIVE = Treatment(Exposure.PUBLIC, "which classes each node labels, told to the server and every client: "
                      "outside the epsilon, and it shows the other clients which class sets take part")  # fmt: skip

_DPL = _metric("app-u", "with dpl=true (FedDB's plug-in): the node's average prediction on its unlabeled images (K "
                "floats)", always=False, vector=True)  # fmt: skip

METHOD_FIELDS: dict[str, tuple[Field, ...]] = {
    "fixmatch": _PSEUDO,
    "semifl": (*_PSEUDO, _DPL),
    "fedrgd": (*_PSEUDO, _DPL),
    "uda": _PSEUDO,
    "fixmatch-dpl": (*_PSEUDO, _metric("app-u", "the node's average prediction on its unlabeled images (K floats)",
                                       vector=True)),
    "feddb": (*_PSEUDO, _metric(
        "app-u", "the node's average prediction on its unlabeled images (K floats); DMA weighs the clients by it",
        Treatment(Exposure.REFUSED, "DMA reweighs the clients by it"),
        Treatment(Exposure.REFUSED, "DMA's weights depend on it unnoised, so the released model is no "
                  "post-processing of noised replies"), vector=True)),
    "rscfed": (
        _metric("num-labeled", "the node's labeled examples (a client with labels weighs more in its sub-set)",
                local=_SIZE),
        _metric("pseudo-label-share", "the share of the node's unlabeled images whose teacher prediction passed "
                "the threshold (0 without unlabeled images)"),
        _metric("pseudo-label-correct-share", "in simulation, the share also of their true class (a diagnostic)",
                always=False),
    ),
    "fedmatch": (
        *_PSEUDO,
        _metric("psi-nonzero-share", "the share of the node's psi entries it sends non-zero (psi's sparsity)"),
        _metric("num-labeled", "the node's labeled examples (sigma's weight)", local=_SIZE),
        _metric("num-unlabeled", "the node's unlabeled examples (psi's weight)", local=_SIZE),
        _DPL,
    ),
    "hassle": (
        *_PSEUDO,
        _metric("pseudo-label-classes", "per class, the share of the node's unlabeled images kept with it (K floats)",
                vector=True),
        _metric("num-labeled", "the node's labeled examples (model weight)", local=_SIZE),
        _metric("num-unlabeled", "the node's unlabeled examples (model weight)", local=_SIZE),
    ),
}  # fmt: skip
"""Fields a method adds to its train replies (``Method.uploads``)."""

_RELEASE = Treatment(Exposure.NOISED, "computed from the released model alone (post-processing)")
_OPERATIONAL = Treatment(Exposure.PUBLIC, "who trained, sat out or failed each round: outside the epsilon")
_ACCOUNT = Treatment(Exposure.PUBLIC, "the accountant's figures, from the public settings")
SERVER_FIELDS: tuple[Field, ...] = (
    Field("server:metrics.json", "round", "the round", Treatment(Exposure.PUBLIC, "the round's number"),
          Treatment(Exposure.PUBLIC, "the round's number")),
    Field("server:metrics.json", "wall-time", "seconds since the run started",
          Treatment(Exposure.PUBLIC, "the server's clock"), Treatment(Exposure.PUBLIC, "the server's clock")),
    Field("server:metrics.json", "test-*", "the released model on the server's test split", _RELEASE, _RELEASE),
    Field("server:metrics.json", "val-*", "the released model on the labeled validation hold-out", _RELEASE, _RELEASE),
    Field("server:metrics.json", "privacy-*", "epsilon, delta; server-adaptive: the round's clipping norm (set by "
          "earlier rounds' noised counts)", _ACCOUNT, _ACCOUNT),
    *(Field("server:metrics.json", k, "the round's replies by node", _OPERATIONAL, _OPERATIONAL)
      for k in ("trained-nodes", "trained-clients", "failed-nodes", "idle-replies", "failed-replies")),
)  # fmt: skip
"""What the server records and prints beyond the model (``metrics.json``/``.csv``, the
progress and summary lines). A recorded aggregate of a reply metric (``train-loss``, a method's
``recorded_metrics``) has that reply metric's treatment (:func:`recorded_field`)."""
METHOD_SERVER_FIELDS: dict[str, tuple[Field, ...]] = {
    "feddb": tuple(Field("server:metrics.json", k, "DMA's weights and objective, from the clients' APP-U",
                         Treatment(Exposure.REFUSED, "computed from the unnoised APP-U"),
                         Treatment(Exposure.REFUSED, "computed from the unnoised APP-U"))
                   for k in ("dma-beta", "dma-loss-uniform", "dma-loss")),
    "fedrgd": (Field("server:metrics.json", "fedrgd-server-share", "the server model's share of the grouped average",
                     *(Treatment(Exposure.PUBLIC, "a function of how many clients trained and of the seeded "
                                 "groups: outside the epsilon, as who trained"),) * 2),),
}  # fmt: skip
"""What a method's aggregation adds to the record (also logged each round)."""

OPTION_FIELDS: dict[tuple[str, object], tuple[Field, ...]] = {
    ("fedpu-cross-client", True): (
        Field("query:metrics", "positive-classes", "the node's positive classes (K floats in {0, 1})", _POSITIVE,
              _POSITIVE),
        Field("query:node", "node-key", "the node's stable key", Treatment(Exposure.SERVER_ONLY, "unused"),
              Treatment(Exposure.PUBLIC, "names the node, not its data")),
        Field("server:broadcast", "fedpu-positive-sets", "every node's positive classes, in every train message",
              _POSITIVE, _POSITIVE),
    ),
}  # fmt: skip
"""Fields a setting adds (``(key, value)``: sent when the run sets ``key`` to ``value``)."""


def reply_fields(strategy: str, method: str, options: Mapping[str, object] | None = None) -> tuple[Field, ...]:
    """Every field a run of ``strategy`` and ``method`` with settings ``options`` sends or
    publishes beyond the released model (:data:`COMMON_FIELDS`, :data:`STRATEGY_FIELDS`,
    :data:`METHOD_FIELDS`, :data:`OPTION_FIELDS`)."""
    options = options or {}
    extra = [f for (key, value), fields in OPTION_FIELDS.items() if options.get(key) == value for f in fields]
    return (*COMMON_FIELDS, *STRATEGY_FIELDS.get(strategy, ()), *METHOD_FIELDS.get(method, ()), *extra)


def train_metric_keys(
    strategy: str, method: str, options: Mapping[str, object] | None = None
) -> tuple[frozenset[str], frozenset[str]]:
    """The metric keys a trained reply of a run may carry and those it must carry: the
    ``train:metrics`` fields :func:`reply_fields` declares for ``strategy``, ``method`` and
    ``options``, and the subset of them sent always (``Field.always``). The reply door
    (:mod:`fedul_flwr.strategies.admission`) judges each reply against these, not against the
    other replies.

    Returns
    -------
    tuple[frozenset[str], frozenset[str]]
        (declared keys, keys every trained reply carries).
    """
    fields = [f for f in reply_fields(strategy, method, options) if f.record == "train:metrics"]
    return frozenset(f.key for f in fields), frozenset(f.key for f in fields if f.always)


def vector_metric_keys(strategy: str, method: str, options: Mapping[str, object] | None = None) -> frozenset[str]:
    """The declared train metric keys (:func:`train_metric_keys`) whose value is a list of
    numbers (``Field.vector``); every other declared key carries one number. The reply door
    refuses a reply whose value is of the other kind."""
    return frozenset(f.key for f in reply_fields(strategy, method, options) if f.record == "train:metrics" and f.vector)


def recorded_field(strategy: str, method: str, key: str, options: Mapping[str, object] | None = None) -> Field | None:
    """The declaration of ``key`` of the run's record (``metrics.json``): a
    :data:`SERVER_FIELDS` entry (exact, or a ``prefix-*`` one), a method's
    :data:`METHOD_SERVER_FIELDS`, or the reply metric whose aggregate it is; ``None`` if
    undeclared."""
    fields = (*SERVER_FIELDS, *METHOD_SERVER_FIELDS.get(method, ()),
              *(f for f in reply_fields(strategy, method, options) if f.record == "train:metrics"))  # fmt: skip
    for field in fields:
        if field.key == key or (field.key.endswith("*") and key.startswith(field.key[:-1])):
            return field
    return None


def field_refusal(mode: str, strategy: str, method: str, options: Mapping[str, object] | None = None) -> str | None:
    """Why ``mode`` refuses what a run sends, in one line naming the first refused field;
    ``None`` when every field is noised, kept on the server, opt-in or declared public."""
    if mode == "none":
        return None
    for field in (*reply_fields(strategy, method, options), *METHOD_SERVER_FIELDS.get(method, ())):
        treatment = field.treatment(mode)
        if treatment.exposure is Exposure.REFUSED:
            ours = field in (*METHOD_FIELDS.get(method, ()), *METHOD_SERVER_FIELDS.get(method, ()))
            sender = f"method={method!r}" if ours else f"strategy={strategy!r}"
            carry = "its record holds" if field.record.startswith("server:") else "its replies carry"
            return (f"differential-privacy={mode!r} with {sender}: {carry} {field.record.split(':')[1]} "
                    f"{field.key!r} ({field.what}); {treatment.why}, outside the epsilon; use "
                    "differential-privacy='none'")  # fmt: skip
    return None


def fields_table() -> str:
    """The Markdown table of every declared field and its treatment under the server modes and
    ``client-local`` (docs/privacy.md holds it; a test keeps the two equal)."""

    def cell(t: Treatment) -> str:
        if t.exposure is Exposure.OPT_IN:
            return f"only with `{t.why}=true`, then public (outside the epsilon)"
        return f"{t.exposure.value}: {t.why}"

    groups = [("every method", COMMON_FIELDS), *((f"strategy `{k}`", v) for k, v in STRATEGY_FIELDS.items()),
              *((f"method `{k}`", v) for k, v in METHOD_FIELDS.items()), ("the server", SERVER_FIELDS),
              *((f"method `{k}` (server)", v) for k, v in METHOD_SERVER_FIELDS.items()),
              *((f"`{k}={str(v).lower()}`", f) for (k, v), f in OPTION_FIELDS.items())]  # fmt: skip
    rows = ["| sent by | field | carries | `server-fixed`, `server-adaptive` | `client-local` |", "|---|---|---|---|---|"]
    for who, fields in groups:
        for f in fields:
            rows.append(f"| {who} | `{f.record}` `{f.key}` | {f.what} | {cell(f.server)} | {cell(f.local)} |")
    return "\n".join(rows)
