"""The one door every training reply goes through before any aggregation, in every mode.

A Flower strategy trusts what a reply says about itself: its arrays' shapes and dtypes, which
arrays it holds, and the weight it claims. A reply that does not fit the round's global model
made Flower's aggregation raise (a ``ValueError`` of numpy's broadcasting, an
``InconsistentMessageReplies``) and stopped the whole run; a claimed weight of -2.999 among
three honest ones made the weighted mean's denominator 0.001, so one node moved the model by
4000 times what it could with an honest weight. Here each successful reply is checked against
the global arrays the round sent (:func:`malformed`); one that fails becomes a failed reply of
its node (:class:`MalformedReplyError`), on record with the round's other failures, where
``min-train-nodes`` and ``max-failure-fraction`` apply to it as to any failure.

A reply is admitted when:

- it carries one MetricRecord (the ClientApp's ``"metrics"``) whose keys the run's contract
  declares (see "Metric keys" below), and the array records the strategy reads, no others:
  ``"arrays"``, plus the strategy's side records (SCAFFOLD's ``"cv-delta"``, the kept
  optimiser state);
- its ``"arrays"`` hold only keys of the global arrays, each model it sends complete
  (``"<model>.<parameter>"`` keys; a method may send only some models, HASSLE does), in the
  global order, every model when the run needs whole-model replies (server-side DP);
- each array decodes, has the global array's shape and a dtype of the same kind (floating
  point where the global is, integer where it is), and a floating-point array holds no NaN or
  inf (one such reply made every later round's training raise, or the global model NaN): the
  numpy array is checked, not the shape the ``Array`` claims;
- a side record that mirrors the model (``"cv-delta"``) holds arrays of the global shapes;
- each weight the aggregation reads (the strategy's ``weighted_by_key`` and a method's
  per-model weight keys) is a finite number > 0 (not a bool, not a list);
- each declared metric is of its declared kind: a list where the contract declares one
  (``Field.vector``, e.g. K floats), else one number (Flower's metric averaging raises on a
  mix, and a method's aggregation reads some, e.g. RSCFed's ``num-labeled``).

Metric keys. Flower averages metrics only over replies with equal key sets, so the round's
trained replies must agree; which one is wrong is decided by the declaration, never by a vote
(a vote of two replies is a tie, and a hostile node could have the honest one refused). Each
trained reply is judged on its own against the run's contract
(:func:`fedul_flwr.strategies.contract.train_metric_keys` of its strategy, method and settings):
a key the contract does not declare for the run makes *that* reply malformed, and so does the
lack of a key every honest ClientApp of the run sends (``Field.always``). What remains can
differ only in declared keys that some nodes send and others do not (a diagnostic that needs
the true classes): those not on every admitted reply are dropped from the round's replies
(none of them is read by an aggregation), so no reply is refused for another's key. The
verdict does not depend on the order or number of the replies. Without a declaration (a
strategy not built by :func:`fedul_flwr.strategies.build_strategy`) only the dropping applies.

A reply with no model (an empty ``"arrays"`` record: the client had nothing to train) needs
only its metrics. Under server-side DP the weights are not read at all: every kept reply
weighs 1 (:class:`fedul_flwr.privacy.server.ClippableReplies`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping

import numpy as np
from flwr.app import ArrayRecord, Error, Message, MetricRecord
from flwr.common.constant import ErrorCode

from fedul_flwr import wire

__all__ = ["MODEL_LAYOUT", "MalformedReplyError", "admit", "failed_reply", "malformed"]

MODEL_LAYOUT = "model"
"""A side record whose arrays mirror the global arrays (keys among them, same shapes)."""
_KINDS = {"f": "floating point", "i": "integer", "u": "integer"}


class MalformedReplyError(ValueError):
    """A training reply the server cannot aggregate (:func:`malformed` says why); the reply
    counts as a failed reply of its node."""


def failed_reply(reply: Message, instruction: Message | None, error: Exception) -> Message:
    """An error reply in place of ``reply`` (answering ``instruction``, the message ``reply``
    answers, when known), whose reason ``"<ErrorType>: <message>"`` names the error type on
    record (:func:`fedul_flwr.strategies.error_type`)."""
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(error).__name__}: {error}"),
                   reply_to=instruction if instruction is not None else reply)  # fmt: skip


def _kind(dtype: np.dtype) -> str | None:
    return _KINDS.get(np.dtype(dtype).kind)


def _check_arrays(name: str, record: ArrayRecord, expected: ArrayRecord, whole: bool) -> str | None:
    order = list(expected.keys())
    sent = list(record.keys())
    unknown = [k for k in sent if k not in expected]
    if unknown:
        return f"'{name}' holds arrays the global model lacks: {unknown[:3]}{' ...' if len(unknown) > 3 else ''}"
    models = list(dict.fromkeys(wire.model_of(k) for k in order))
    sent_models = {wire.model_of(k) for k in sent}
    for model in models:
        keys = [k for k in order if wire.model_of(k) == model]
        if model in sent_models or whole:
            missing = [k for k in keys if k not in record]
            if missing:
                return f"'{name}' lacks {len(missing)} of model {model!r}'s {len(keys)} arrays, e.g. {missing[0]!r}"
    if sent != [k for k in order if k in record]:
        return f"'{name}' holds the global arrays in another order"
    for key in sent:
        want = expected[key]
        try:
            got = record[key].numpy()
        except Exception as exc:  # noqa: BLE001 -- any undecodable array is the node's fault
            return f"array {key!r} of '{name}' does not decode ({type(exc).__name__})"
        if tuple(got.shape) != tuple(want.shape):
            return f"array {key!r} of '{name}' has shape {tuple(got.shape)}, the global one {tuple(want.shape)}"
        kind, want_kind = _kind(got.dtype), _kind(np.dtype(want.dtype))
        if kind is None or kind != want_kind:
            return f"array {key!r} of '{name}' has dtype {got.dtype}, not {want_kind or want.dtype} like the global one"
        if got.dtype.kind in "fc" and not np.isfinite(got).all():
            bad = int(got.size - np.count_nonzero(np.isfinite(got)))
            return f"array {key!r} of '{name}' holds {bad} non-finite value(s) (NaN or inf)"
    return None


def _check_weight(key: str, metrics: MetricRecord) -> str | None:
    if key not in metrics:
        return f"its metrics lack the weight {key!r}"
    value = metrics[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"its weight {key!r} is {type(value).__name__} {value!r}, not a number"
    if not (math.isfinite(float(value)) and float(value) > 0):
        return f"its weight {key!r} is {value!r}, not a finite number > 0"
    return None


def malformed(
    reply: Message,
    expected: ArrayRecord,
    *,
    weight_keys: Mapping[str, str] | str,
    side_records: Mapping[str, str | None] = {},  # noqa: B006 -- read only
    whole: bool = False,
) -> str | None:
    """Why ``reply`` cannot be aggregated against the round's global arrays, in one phrase;
    ``None`` when it can (the module doc lists the conditions). Error replies pass (``None``).

    Parameters
    ----------
    reply : Message
        A training reply.
    expected : ArrayRecord
        The global arrays the round sent (keys ``"<model>.<parameter>"``; their shapes and
        dtypes are the reference).
    weight_keys : Mapping[str, str] | str
        The reply metric that weighs each model (model name -> key), or one key for every
        model; checked only for the models the reply sends.
    side_records : Mapping[str, str | None]
        The array records the strategy reads beside ``"arrays"``: name -> :data:`MODEL_LAYOUT`
        (checked as the global arrays) or ``None`` (its content is the strategy's own).
    whole : bool
        Every model is required (server-side DP clips whole-model updates).

    Returns
    -------
    str | None
        E.g. ``"array 'f.fc.weight' of 'arrays' has shape (3, 4), the global one (10, 84)"``.
    """
    if reply.has_error():
        return None
    content = reply.content
    if len(content.metric_records) != 1:
        return f"it carries the metric records {list(content.metric_records.keys())}, expected one ('{wire.METRICS}')"
    records = list(content.array_records.keys())
    allowed = {wire.ARRAYS, *side_records}
    if wire.ARRAYS not in records or any(r not in allowed for r in records):
        return f"it carries the array records {records}, expected '{wire.ARRAYS}'" + (
            f" and any of {sorted(side_records)}" if side_records else " only")  # fmt: skip
    arrays = content[wire.ARRAYS]
    if not len(arrays):  # nothing trained (the ClientApp's idle reply): no model to check
        return None
    why = _check_arrays(wire.ARRAYS, arrays, expected, whole)
    if why is not None:
        return why
    for name, layout in side_records.items():
        if layout == MODEL_LAYOUT and name in content.array_records:
            why = _check_arrays(name, content[name], ArrayRecord({k: expected[k] for k in expected.keys()
                                                                  if k in content[name]}), whole=False)  # fmt: skip
            if why is not None:
                return why
    metrics = next(iter(content.metric_records.values()))
    sent_models = list(dict.fromkeys(wire.model_of(k) for k in arrays.keys()))
    keys = [weight_keys] if isinstance(weight_keys, str) else [weight_keys[m] for m in sent_models if m in weight_keys]
    for key in dict.fromkeys(keys):
        why = _check_weight(key, metrics)
        if why is not None:
            return why
    return None


def _metric_keys(reply: Message) -> frozenset[str]:
    return frozenset(next(iter(reply.content.metric_records.values())).keys())


def _wrong_kind(metrics: MetricRecord, vectors: frozenset[str] | None) -> str | None:
    """Why a declared metric's value is of the wrong kind (a list where the contract declares one
    number, or a number where it declares a list); ``None`` if none is, or without a declaration."""
    if vectors is None:
        return None
    for key, value in metrics.items():
        if isinstance(value, list) != (key in vectors):
            want = "a list of numbers" if key in vectors else "one number"
            return f"its metric {key!r} is {type(value).__name__} {value!r:.60}, the run's contract declares {want}"
    return None


def _undeclared(keys: frozenset[str], declared: tuple[frozenset[str], frozenset[str]] | None) -> str | None:
    if declared is None:
        return None
    allowed, always = declared
    if keys - allowed:
        return f"its metrics hold {sorted(keys - allowed)}, which the run's contract does not declare"
    if always - keys:
        return f"its metrics lack {sorted(always - keys)}, which every reply of the run carries"
    return None


def admit(
    server_round: int,
    replies: Iterable[Message],
    expected: ArrayRecord,
    instructions: Collection[Message] = (),
    declared_metrics: tuple[frozenset[str], frozenset[str]] | None = None,
    vector_metrics: frozenset[str] | None = None,
    **checks: object,
) -> list[Message]:
    """``replies`` with every malformed one (:func:`malformed`, given ``checks``, and a metric
    key set the declaration refuses) replaced by a failed reply of its node
    (:class:`MalformedReplyError`, naming the round, the node and why); the admitted trained
    replies keep only the metric keys they all hold (module doc, "Metric keys").

    Parameters
    ----------
    declared_metrics : tuple[frozenset[str], frozenset[str]] | None
        (keys the run's contract declares, keys every reply carries):
        :func:`fedul_flwr.strategies.contract.train_metric_keys`; ``None``: not checked.
    vector_metrics : frozenset[str] | None
        The declared keys whose value is a list
        (:func:`fedul_flwr.strategies.contract.vector_metric_keys`); a reply whose declared
        metric is of the other kind is malformed. ``None``: not checked.
    """
    by_id = {m.metadata.message_id: m for m in instructions}
    replies = list(replies)
    whys = [malformed(reply, expected, **checks) for reply in replies]  # type: ignore[arg-type]
    trained = [why is None and not r.has_error() and len(r.content[wire.ARRAYS]) > 0
               for r, why in zip(replies, whys, strict=True)]  # fmt: skip
    whys = [(_undeclared(_metric_keys(r), declared_metrics) or _wrong_kind(next(iter(r.content.metric_records.values())),
                                                                          vector_metrics)) if ok else why
            for r, why, ok in zip(replies, whys, trained, strict=True)]  # fmt: skip
    kept = [r for r, why, ok in zip(replies, whys, trained, strict=True) if ok and why is None]
    common = frozenset.intersection(*(_metric_keys(r) for r in kept)) if kept else frozenset()
    for reply in kept:  # declared keys only some nodes send: dropped, not blamed (module doc)
        if _metric_keys(reply) != common:
            name, metrics = next(iter(reply.content.metric_records.items()))
            reply.content[name] = MetricRecord({k: v for k, v in metrics.items() if k in common})
    out = []
    for reply, why in zip(replies, whys, strict=True):
        if why is None:
            out.append(reply)
            continue
        error = MalformedReplyError(f"round {server_round}: node {reply.metadata.src_node_id}'s reply: {why}")
        out.append(failed_reply(reply, by_id.get(reply.metadata.reply_to_message_id), error))
    return out
