"""Server strategies: Flower's own, built from the run configuration.

FedUL turns unlabeled clients into an ordinary supervised FL problem, so the server runs a
stock supervised strategy (Lu et al., ICLR 2022, Sec. 3.2: FedAvg by default). Two things
are added to every strategy here:

- a round in which no client replied successfully stops the run with the clients' errors
  (Flower's FedAvg would otherwise keep the old model and "complete");
- ``aggregation-weights``: ``num-examples`` (FedAvg, McMahan et al. 2017) weighs clients
  by n_c; ``uniform`` (the FedUL authors' code) gives each client 1/C. Clients report both
  weights; the strategy aggregates by the key the setting names.
"""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAvg

from fedul_flwr.config import RunConfig

WEIGHT_KEYS = {"num-examples": "num-examples", "uniform": "uniform-weight"}


class NoSuccessfulReplyError(RuntimeError):
    """A training round got no usable client reply; the message lists each node's error."""


class RequireReplies:
    """Mixin for Flower strategies: raise :class:`NoSuccessfulReplyError` when a training
    round yields nothing to aggregate, instead of silently keeping the old model."""

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)  # type: ignore[misc]
        if arrays is None:
            errors = [f"node {m.metadata.src_node_id}: {m.error.reason}" for m in replies if m.has_error()]
            raise NoSuccessfulReplyError(
                f"round {server_round}: no successful training reply out of {len(replies)} "
                + ("; ".join(errors) if errors else "(no node replied in time)")
            )
        return arrays, metrics


class StrictFedAvg(RequireReplies, FedAvg):
    """Flower's FedAvg that fails loudly on an empty round (see :class:`RequireReplies`)."""


def build_strategy(cfg: RunConfig) -> FedAvg:
    """The server strategy of the run.

    Parameters
    ----------
    cfg : RunConfig
        Uses ``aggregation-weights``, ``fraction-train``, ``min-available-nodes`` and
        ``client-test-fraction`` (client-side evaluation runs only when clients hold a
        labeled local test split).
    """
    evaluate = 1.0 if cfg.client_test_fraction > 0 else 0.0
    return StrictFedAvg(
        fraction_train=cfg.fraction_train,
        fraction_evaluate=evaluate,
        min_train_nodes=1,
        min_evaluate_nodes=1 if evaluate else 0,
        min_available_nodes=cfg.min_available_nodes,
        weighted_by_key=WEIGHT_KEYS[cfg.aggregation_weights],
    )
