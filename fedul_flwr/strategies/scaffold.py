"""SCAFFOLD: Stochastic Controlled Averaging for federated learning, as a Message-API
Flower strategy.

Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic Controlled Averaging
for Federated Learning", ICML 2020, Algorithm 1.

The server keeps the global model x and a server control variate c; client i keeps its own
control variate c_i between rounds. In round t, on the sampled set S out of N clients:

- server -> client: x and c;
- client: K local steps y <- y - lr * (g_i(y) + c - c_i) from y = x, then
  option I:  c_i+ = g_i(x)  (gradient of the local loss at x over all local data), or
  option II: c_i+ = c_i - c + (x - y_i) / (K * lr);
  reply y_i and Delta c_i = c_i+ - c_i; store c_i+;
- server: x <- x + eta_g * sum_{i in S} w_i (y_i - x),
  c <- c + (|S| / N) * sum_{i in S} w_i Delta c_i.

The weights w_i are the strategy's weighted average (``weighted_by_key``): uniform weights
give the paper's ``1/|S|`` exactly; sample-count weights keep c the sample-weighted average
of the c_i under full participation, matching x's sample-weighted objective. With
``eta_g = 1`` the model update is exactly FedAvg's average. The client side (gradient
correction, c_i in ``context.state``) lives in :mod:`fedul_flwr.strategy_hooks`.

Wire format: the train message carries ``"arrays"`` (x), ``"server-cv"`` (c, an
ArrayRecord keyed by parameter name; empty = zeros before the first aggregation) and
``"config"`` (with ``"scaffold-option"``); a reply carries ``"arrays"`` (y_i),
``"cv-delta"`` (Delta c_i, keyed by parameter name) and one MetricRecord (with the
weighting key and, from our clients, ``scaffold-cv-rounds``).
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
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from fedul_flwr import wire

OPTIONS = ("I", "II")


class Scaffold(FedAvg):
    """SCAFFOLD (Karimireddy et al., ICML 2020) server side; see the module docstring.

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes,
    min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key,
    train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        As in :class:`flwr.serverapp.strategy.FedAvg`.
    global_learning_rate : float (default: 1.0)
        eta_g, the server step size on the averaged model update.
    option : str (default: "II")
        The clients' control-variate update, ``"I"`` or ``"II"`` (sent to the clients in
        the train config under ``"scaffold-option"``).

    Raises
    ------
    ValueError
        If ``option`` is not ``"I"``/``"II"`` or ``global_learning_rate <= 0``.
    """

    side_records = {wire.CV_DELTA: "model"}
    """Array records a reply carries beside ``"arrays"`` (:mod:`fedul_flwr.strategies.admission`):
    the control-variate update, shaped as the model."""

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
        global_learning_rate: float = 1.0,
        option: str = "II",
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
        if option not in OPTIONS:
            raise ValueError(f"option={option!r} is not one of {OPTIONS}")
        if not global_learning_rate > 0:
            raise ValueError(f"global_learning_rate={global_learning_rate} must be > 0")
        self.global_learning_rate = global_learning_rate
        self.option = option
        self.server_cv = ArrayRecord()  # c; empty means all zeros
        self.current_arrays: ArrayRecord | None = None  # x of the round being trained
        self.num_nodes = 0  # N, connected nodes when the round was configured

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        log(INFO, "\t├──> SCAFFOLD settings:")
        log(INFO, "\t│\t├── Global learning rate (eta_g): %s", self.global_learning_rate)
        log(INFO, "\t│\t└── Client control-variate update: option %s", self.option)
        super().summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's train messages plus the server control variate c and the option."""
        self.current_arrays = arrays
        self.num_nodes = len(list(grid.get_node_ids()))
        config[wire.SCAFFOLD_OPTION] = self.option
        messages = list(super().configure_train(server_round, arrays, config, grid))
        for message in messages:
            message.content[wire.SERVER_CV] = self.server_cv
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """x <- x + eta_g * avg(y_i - x); c <- c + (|S|/N) * avg(Delta c_i).

        Raises
        ------
        InconsistentMessageReplies
            If a reply lacks ``arrays``, ``cv-delta`` or the weighting metric, or the
            replies' keys differ.
        """
        valid, _ = self._check_and_log_replies(list(replies), is_train=True, validate=False)
        if not valid:
            return None, None
        if self.current_arrays is None:
            raise InconsistentMessageReplies(reason="SCAFFOLD: aggregate_train before configure_train")
        contents = [msg.content for msg in valid]
        self._validate(contents)
        models = self._weighted_average(contents, self.arrayrecord_key)
        deltas = self._weighted_average(contents, wire.CV_DELTA)

        x = self.current_arrays
        eta = self.global_learning_rate
        if eta != 1.0:
            models = ArrayRecord(
                {k: Array(np.asarray(x[k].numpy() + eta * (v.numpy() - x[k].numpy()))) for k, v in models.items()}
            )
        share = len(contents) / max(self.num_nodes, len(contents))  # |S| / N
        server_cv = {k: v.numpy() for k, v in self.server_cv.items()}
        for key, delta in deltas.items():
            server_cv[key] = server_cv.get(key, 0.0) + share * delta.numpy()
        self.server_cv = ArrayRecord({k: Array(np.asarray(v, dtype=np.float32)) for k, v in server_cv.items()})
        metrics = self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        return models, metrics

    def _weighted_average(self, contents: list[RecordDict], key: str) -> ArrayRecord:
        """Flower's weighted average of the ArrayRecord ``key`` of every reply."""
        views = [
            RecordDict({key: c[key], "metrics": next(iter(c.metric_records.values()))}) for c in contents
        ]
        return aggregate_arrayrecords(views, self.weighted_by_key)

    def _validate(self, contents: list[RecordDict]) -> None:
        for key in (self.arrayrecord_key, wire.CV_DELTA):
            if any(key not in c.array_records for c in contents):
                raise InconsistentMessageReplies(reason=f"SCAFFOLD: every train reply needs an ArrayRecord {key!r}")
            keys = set(contents[0][key].keys())
            if any(set(c[key].keys()) != keys for c in contents[1:]):
                raise InconsistentMessageReplies(reason=f"SCAFFOLD: the replies' {key!r} records have different keys")
        for c in contents:
            if len(c.metric_records) != 1:
                raise InconsistentMessageReplies(reason="SCAFFOLD: expected exactly one MetricRecord per reply")
            metrics = next(iter(c.metric_records.values()))
            if not isinstance(metrics.get(self.weighted_by_key), (int, float)):
                raise InconsistentMessageReplies(
                    reason=f"SCAFFOLD: the MetricRecord needs a scalar {self.weighted_by_key!r}"
                )
