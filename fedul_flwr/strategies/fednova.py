"""FedNova: normalised averaging for heterogeneous local work, as a Message-API Flower
strategy.

Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020 (Sec. 4, Eq. 6-7).

Clients that take different numbers of local steps tau_i drift towards different
objectives under FedAvg. FedNova normalises each client's update by its step count before
averaging and rescales by an effective step count. With weights p_i (the strategy's
``weighted_by_key``, normalised over the replies):

    d_i = (x - y_i) / tau_i                  (normalised update of client i)
    tau_eff = sum_i p_i tau_i
    x <- x - tau_eff * sum_i p_i d_i

This is the vanilla-SGD form (a_i = [1, ..., 1], ||a_i||_1 = tau_i). Clients report
tau_i as the metric ``num-steps`` (local optimiser steps). With Adam local optimisers the
same normalisation by the step count is the usual practical adaptation (the paper derives
a_i for SGD with momentum / proximal terms only). With equal tau_i the update equals
FedAvg's weighted average (up to float rounding).

Only trainable float arrays are normalised. Statistics that are not the result of
gradient steps -- integer arrays such as BatchNorm's ``num_batches_tracked`` and the
BatchNorm running mean / variance -- are averaged plainly with the weights p_i.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import INFO

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import FedAvg

from fedul_flwr import wire

STATISTIC_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


def is_statistic(name: str, array: np.ndarray) -> bool:
    """True for arrays FedNova averages plainly: non-float arrays and BatchNorm statistics.

    Parameters
    ----------
    name : str
        State-dict key, e.g. ``"features.1.running_mean"``.
    array : np.ndarray
        The array under that key.
    """
    return not np.issubdtype(array.dtype, np.floating) or name.endswith(STATISTIC_SUFFIXES)


class FedNova(FedAvg):
    """FedNova (Wang et al., NeurIPS 2020) server side; see the module docstring.

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes,
    min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key,
    train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        As in :class:`flwr.serverapp.strategy.FedAvg`.
    steps_key : str (default: "num-steps")
        Metric in each train reply holding the client's local step count tau_i (> 0).
    is_plain : Callable[[str, np.ndarray], bool] (default: :func:`is_statistic`)
        Which arrays are averaged plainly instead of normalised.
    """

    def __init__(  # pylint: disable=too-many-arguments
        self,
        *,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        steps_key: str = wire.NUM_STEPS,
        is_plain: Callable[[str, np.ndarray], bool] = is_statistic,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
        )
        self.steps_key = steps_key
        self.is_plain = is_plain
        self.current_arrays: ArrayRecord | None = None  # x of the round being trained

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        log(INFO, "\t├──> FedNova settings:")
        log(INFO, "\t│\t└── Local step count key: '%s'", self.steps_key)
        super().summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's train messages; remembers x for the normalised update."""
        self.current_arrays = arrays
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """x <- x - tau_eff * sum_i p_i (x - y_i) / tau_i (statistics: sum_i p_i y_i).

        Raises
        ------
        InconsistentMessageReplies
            If the replies fail FedAvg's checks, or a reply lacks a positive ``steps_key``
            metric, or ``aggregate_train`` runs before ``configure_train``.
        """
        valid, _ = self._check_and_log_replies(list(replies), is_train=True)
        if not valid:
            return None, None
        if self.current_arrays is None:
            raise InconsistentMessageReplies(reason="FedNova: aggregate_train before configure_train")
        contents = [msg.content for msg in valid]
        metrics = [next(iter(c.metric_records.values())) for c in contents]
        steps = [m.get(self.steps_key) for m in metrics]
        if any(not isinstance(t, (int, float)) or t <= 0 for t in steps):
            raise InconsistentMessageReplies(
                reason=f"FedNova: every train reply needs a positive metric {self.steps_key!r}, got {steps}"
            )
        weights = np.array([float(m[self.weighted_by_key]) for m in metrics])
        p = weights / weights.sum()
        tau = np.array(steps, dtype=np.float64)
        tau_eff = float(p @ tau)
        ys = [next(iter(c.array_records.values())) for c in contents]

        new: dict[str, Array] = {}
        for key in ys[0].keys():
            if key not in self.current_arrays:
                raise InconsistentMessageReplies(reason=f"FedNova: reply array {key!r} was not sent to the clients")
            x = self.current_arrays[key].numpy()
            y = [r[key].numpy() for r in ys]
            if self.is_plain(key, x):
                value = sum(p_i * y_i.astype(np.float64) for p_i, y_i in zip(p, y))
            else:
                x64 = x.astype(np.float64)
                step = sum(p_i * (x64 - y_i) / t_i for p_i, y_i, t_i in zip(p, y, tau))
                value = x64 - tau_eff * step
            dtype = y[0].dtype if np.issubdtype(y[0].dtype, np.floating) else np.float64
            new[key] = Array(np.asarray(value, dtype=dtype))
        return ArrayRecord(new), self.train_metrics_aggr_fn(contents, self.weighted_by_key)
