"""Per-model aggregation: each exchanged model averaged over the clients that sent it, with its
own weights, by whatever strategy the run uses.

For methods with several models in flight whose clients send only the models their data can
train (HASSLE: w_S and r_{U-S} weighted by labeled counts n_L, w_U and r_{S-U} by unlabeled
counts n_U), or whose weights come from uploaded vectors. For model m with replies S_m
(the clients that sent m) and weights w_{i,m} (:meth:`PerModelAggregation.model_weight`),
the run's strategy aggregates m alone, e.g. FedAvg:

    m <- sum_{i in S_m} w_{i,m} y_{i,m} / sum_{i in S_m} w_{i,m},

and a model that no client sent keeps its previous global value. A client that sat the round
out (``Method.sits_out``: it lacks the data the method trains on) sends no model; the train
metrics are aggregated over the clients that sent one. The strategy does the
arithmetic, so FedProx, FedMedian, FedTrimmedAvg, FedAvgM, FedAdam / FedYogi / FedAdagrad,
SCAFFOLD and FedNova all work per model: their cross-round state (FedOpt's moments, FedAvgM's
momentum, SCAFFOLD's control variate) is split by model for each call and joined again, so
each model has its own.

Usage: it is every method's default ``aggregation()``; a method whose models have their own
weights returns a subclass that sets :attr:`model_weight_keys` (model -> reply metric) or
overrides :meth:`model_weight`. The class is composed before the strategy in the MRO
(:func:`fedul_flwr.strategies.strict`).
"""

from __future__ import annotations

import copy
from logging import INFO
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.exception import InconsistentMessageReplies

from fedul_flwr import wire
from fedul_flwr.strategies.contract import Contract

__all__ = ["PerModelAggregation", "STATE_ATTRIBUTES"]

STATE_ATTRIBUTES: tuple[str, ...] = ("current_arrays", "momentum_vector", "m_t", "v_t", "server_cv")
"""Cross-round state of the strategies, keyed (or, FedAvgM's momentum, ordered) by array."""


def _slice(value: Any, keys: list[str], order: list[str]) -> Any:
    """The entries of ``value`` for ``keys`` (``order``: all keys, for list-valued state)."""
    if isinstance(value, ArrayRecord):
        return ArrayRecord({k: value[k] for k in keys if k in value})
    if isinstance(value, dict):
        return {k: value[k] for k in keys if k in value}
    if isinstance(value, list):
        return [value[order.index(k)] for k in keys]
    raise TypeError(f"cannot split strategy state of type {type(value).__name__}")


def _join(full: Any, part: Any, keys: list[str], order: list[str], template: ArrayRecord) -> Any:
    """``full`` with the entries of ``keys`` replaced by ``part`` (both may be None)."""
    if part is None:
        return full
    if isinstance(part, ArrayRecord):
        merged = {k: full[k] for k in full} if isinstance(full, ArrayRecord) else {}
        merged.update({k: part[k] for k in part})
        return ArrayRecord({k: merged[k] for k in order if k in merged})
    if isinstance(part, dict):
        merged = dict(full) if isinstance(full, dict) else {}
        merged.update(part)
        return {k: merged[k] for k in order if k in merged}
    if isinstance(part, list):
        base = list(full) if isinstance(full, list) else [np.zeros_like(template[k].numpy()) for k in order]
        for k, v in zip(keys, part):
            base[order.index(k)] = v
        return base
    raise TypeError(f"cannot join strategy state of type {type(part).__name__}")


class PerModelAggregation:
    """Mixin for Flower strategies: aggregate each exchanged model separately (module doc).

    Attributes
    ----------
    model_weight_keys : dict[str, str]
        Model name -> the reply metric that weights it. Models not listed are weighted by
        the strategy's ``weighted_by_key``.
    """

    model_weight_keys: ClassVar[dict[str, str]] = {}
    contract: ClassVar[Contract | None] = None
    """The aggregation contract (:mod:`fedul_flwr.strategies.contract`): ``None``, each model as
    the run's strategy aggregates it; a subclass that reweighs or takes partial replies says so."""

    def model_weight(self, model: str, metrics: MetricRecord) -> float:
        """The weight w_{i,m} of one reply for ``model`` (> 0 for every reply that sent it).

        Raises
        ------
        KeyError
            If the reply lacks the weight metric.
        """
        key = self.model_weight_keys.get(model, self.weighted_by_key)  # type: ignore[attr-defined]
        return float(metrics[key])

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Any:
        """The strategy's train messages; remembers the global arrays of this round."""
        self.global_arrays = arrays
        return super().configure_train(server_round, arrays, config, grid)  # type: ignore[misc]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Per model: the replies that carry it, reweighted, aggregated by the strategy. With one
        model, its default weight and every successful reply carrying it, this is the
        strategy's own aggregation, on all replies (errors included, as Flower counts them).

        Raises
        ------
        InconsistentMessageReplies
            If a reply carries a model with a non-positive weight, or before ``configure_train``.
        """
        replies = list(replies)
        ok = [r for r in replies if not r.has_error()]
        if not ok and getattr(self, "dp_empty_mean", None) is None:
            return None, None
        if not ok:  # server DP, Poisson: no update kept; the strategy releases the model plus noise
            return super().aggregate_train(server_round, replies)  # type: ignore[misc]
        current: ArrayRecord | None = getattr(self, "global_arrays", None)
        if current is None:
            raise InconsistentMessageReplies(reason="per-model aggregation before configure_train")
        order = list(current.keys())
        models = list(dict.fromkeys(wire.model_of(k) for k in order))
        if len(models) == 1 and models[0] not in self.model_weight_keys and all(len(r.content[wire.ARRAYS]) for r in ok):
            return super().aggregate_train(server_round, replies)  # type: ignore[misc]
        state = {a: getattr(self, a) for a in STATE_ATTRIBUTES if getattr(self, a, None) is not None}
        joined = {a: state.get(a) for a in STATE_ATTRIBUTES if hasattr(self, a)}
        new: dict[str, Array] = {}
        senders: dict[str, int] = {}
        for model in models:
            keys = [k for k in order if wire.model_of(k) == model]
            views = [v for v in (self._view(r, model, keys) for r in ok) if v is not None]
            senders[model] = len(views)
            if not views:
                continue  # nobody sent this model: it keeps its global value
            for attr in joined:
                setattr(self, attr, _slice(state[attr], keys, order) if attr in state else None)
            arrays, _ = super().aggregate_train(server_round, views)  # type: ignore[misc]
            if arrays is None:
                raise InconsistentMessageReplies(reason=f"the strategy aggregated nothing for model {model!r}")
            new.update({k: arrays[k] for k in arrays})
            for attr in joined:
                joined[attr] = _join(joined[attr], getattr(self, attr), keys, order, current)
        for attr, value in joined.items():
            setattr(self, attr, value)
        if len(models) > 1 or senders[models[0]] < len(ok):
            log(INFO, "round %d: replies per model %s (of %d)", server_round, senders, len(ok))
        merged = ArrayRecord({k: new[k] if k in new else current[k] for k in order})
        trained = [r.content for r in ok if len(r.content[wire.ARRAYS])]  # not the clients that sat out
        if not trained:
            return merged, None
        return merged, self.train_metrics_aggr_fn(trained, self.weighted_by_key)  # type: ignore[attr-defined]

    def _view(self, reply: Message, model: str, keys: list[str]) -> Message | None:
        """The reply restricted to ``model``'s arrays (every ArrayRecord, e.g. SCAFFOLD's
        ``cv-delta`` too), its weight metric set to the model's weight; None if it lacks them."""
        content = reply.content
        arrays = content[wire.ARRAYS]
        if not any(k in arrays for k in keys):
            return None
        metrics = content[wire.METRICS]
        weight = self.model_weight(model, metrics)
        if not weight > 0:
            raise InconsistentMessageReplies(
                reason=f"node {reply.metadata.src_node_id} sent model {model!r} with weight {weight} (must be > 0)"
            )
        records = RecordDict()
        for name, record in content.array_records.items():
            records[name] = ArrayRecord({k: record[k] for k in keys if k in record})
        records[wire.METRICS] = MetricRecord({**metrics, self.weighted_by_key: weight})  # type: ignore[attr-defined]
        for name, record in content.config_records.items():
            records[name] = record
        view = copy.copy(reply)
        view.content = records
        return view
