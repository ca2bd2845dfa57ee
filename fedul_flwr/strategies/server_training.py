"""The server's own training between rounds, in the labels-at-server setting.

SemiFL (Diao et al., NeurIPS 2022, Alg. 1), FedRGD (Zhang et al., IEEE BigData 2021) and
FedMatch's labels-at-server scenario (Jeong et al., ICLR 2021) alternate: the clients train on
unlabeled images, the server aggregates their models and then trains the aggregate on its own
labeled images, and that model is the next round's global model:

    w^{t} = ServerUpdate(Aggregate({w_k^{t}}), D_s),

with ``Aggregate`` whatever the run's strategy does (FedAvg, FedProx, FedAvgM, FedAdam, ...,
with the method's aggregation mixin) and ``ServerUpdate`` the method's
:meth:`~fedul_flwr.methods.base.Method.server_update` (``server-epochs`` epochs of the shared
loop). The server also trains once before round 1 (:mod:`fedul_flwr.server_app`), so the
clients' first pseudo-labels come from a model that has seen the labels, and in a round where no
client trained (every reply idle, e.g. no pseudo-label passed the threshold) it trains the
global model it sent, as SemiFL's code fine-tunes every round: otherwise such a run could stall
for good.

A strategy that keeps the global model between rounds (FedAvgM's ``current_arrays``, from
which its next pseudo-gradient is taken) is given the server-trained model: the server's
training is part of the global update, not a detour the strategy's momentum undoes. FedOpt,
SCAFFOLD and FedNova read the global model afresh in every ``configure_train``, which the
server-trained arrays reach anyway. Under server-side DP the noise is added to the clients'
aggregate before the server trains: the server's training on its own images is
post-processing of the release.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import ArrayRecord, Message, MetricRecord

__all__ = ["SERVER_LABELED_IMAGES", "SERVER_TRAIN_LOSS", "ServerTraining"]

SERVER_TRAIN_LOSS = "server-train-loss"
"""Train metric: the mean loss of the server's training after the round's aggregation."""

SERVER_LABELED_IMAGES = "server-labeled-images"
"""Train metric: how many labeled images the server trained on (its folder's, in deployment or
with ``server-data-dir``, where ``num-labeled`` does not size it)."""

ServerStep = Callable[[ArrayRecord, int], tuple[ArrayRecord, dict[str, float]]]
"""``step(aggregated arrays, round) -> (server-trained arrays, metrics)``."""


class ServerTraining:
    """Mixin for Flower strategies: after the aggregation of a round, train the aggregate on the
    server's labeled images (module docstring). Composed outermost, right after the round
    numbering (:class:`~fedul_flwr.strategies.ResumedRounds`); a no-op while
    :attr:`server_step` is ``None`` (every run whose server holds no labels).

    Attributes
    ----------
    server_step : ServerStep | None
        ``step(arrays, round) -> (arrays, metrics)``: the server's training, set by the
        ServerApp (:func:`fedul_flwr.server_app.run_federation`).
    """

    server_step: ServerStep | None = None
    _sent: ArrayRecord | None = None  # the global arrays of the round being trained

    def configure_train(self, server_round: int, arrays: ArrayRecord, *args: Any, **kwargs: Any) -> Iterable[Message]:
        self._sent = arrays
        return super().configure_train(server_round, arrays, *args, **kwargs)  # type: ignore[misc]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        arrays, metrics = super().aggregate_train(server_round, replies)  # type: ignore[misc]
        if self.server_step is None:
            return arrays, metrics
        if arrays is None:  # no client trained (all idle): the server still trains the global model, as SemiFL does
            if self._sent is None:
                return arrays, metrics
            arrays = self._sent
        arrays, extra = self.server_step(arrays, server_round)
        current: Any = getattr(self, "current_arrays", None)
        if isinstance(current, ArrayRecord):  # FedAvgM: its next pseudo-gradient starts from the server's model
            self.current_arrays = arrays
        elif isinstance(current, dict):  # FedOpt's ndarrays (reset in configure_train anyway)
            self.current_arrays = {k: a.numpy() for k, a in arrays.items()}
        return arrays, MetricRecord({**(dict(metrics) if metrics is not None else {}), **extra})
