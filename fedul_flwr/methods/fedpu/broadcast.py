"""The server side of FedPU's cross-client term: every client's positive classes, broadcast.

Lin et al., "Federated Learning with Positive and Unlabeled Data", ICML 2022, Eq. 10: client
k's risk has a term over every other client q that needs CP_q, the positive classes of q.
Under ``fedpu-cross-client = true`` the server asks every connected node for its positive
classes (a Flower *query* message, answered by
:meth:`~fedul_flwr.methods.fedpu.FedPU.announce`) before the first round it trains -- and
again whenever nodes it has not heard from are connected -- and puts the sets of all nodes in
every train config (``fedpu-positive-sets``: one ``"c1,c2,..."`` string per node, in node-id
order). Each client then knows which classes each of the others labels (not which node
labels them: the list carries no node ids, and its own set is removed once).

What this reveals: to the server and to every client, the positive classes of every client
-- which classes each site annotates. No counts, no images, no labels of images.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO
from typing import Any

from flwr.common.logger import log
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.exception import InconsistentMessageReplies

from fedul_flwr import wire

__all__ = ["ANNOUNCED", "BROADCAST", "PositiveClassBroadcast", "parse_sets"]

ANNOUNCED = "positive-classes"
"""Metric of a node's query reply: its positive-class indicator, K floats in {0, 1}."""
BROADCAST = "fedpu-positive-sets"
"""Train-config key: the positive classes of every node, one ``"c1,c2,..."`` per node."""


def parse_sets(values: Iterable[str]) -> list[tuple[int, ...]]:
    """The ``fedpu-positive-sets`` strings as class tuples."""
    return [tuple(int(c) for c in v.split(",") if c) for v in values]


class PositiveClassBroadcast:
    """Mixin for Flower strategies: broadcast every node's positive classes (module doc).

    Attributes
    ----------
    positive_sets : dict[int, tuple[int, ...]]
        Node id -> its positive classes, as announced.
    """

    positive_sets: dict[int, tuple[int, ...]]
    contract = None
    """The aggregation contract (:mod:`fedul_flwr.strategies.contract`): the run's strategy
    aggregates the replies as it is; only the train instructions change."""

    def configure_train(self, server_round: int, arrays: Any, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """The strategy's train messages, their config carrying every node's positive classes.

        Raises
        ------
        InconsistentMessageReplies
            If a node fails to answer the query or answers without its positive classes.
        """
        known = self.__dict__.setdefault("positive_sets", {})
        new = [n for n in grid.get_node_ids() if n not in known]
        if new:
            known.update(self._ask(grid, new, config))
            log(INFO, "fedpu-cross-client: positive classes of nodes %s: %s", new, [known[n] for n in new])
        config[BROADCAST] = [",".join(map(str, known[n])) for n in sorted(known)]
        return super().configure_train(server_round, arrays, config, grid)  # type: ignore[misc]

    @staticmethod
    def _ask(grid: Grid, nodes: list[int], config: ConfigRecord) -> dict[int, tuple[int, ...]]:
        """Query ``nodes`` for their positive classes (the query carries the run config)."""
        question = ConfigRecord({key: config[key] for key in wire.RUN_SETTINGS if key in config})
        messages = [
            Message(content=RecordDict({wire.CONFIG: question}), dst_node_id=n, message_type=MessageType.QUERY,
                    group_id="positive-classes")
            for n in nodes
        ]
        answers: dict[int, tuple[int, ...]] = {}
        for reply in grid.send_and_receive(messages):
            node = reply.metadata.src_node_id
            if reply.has_error():
                raise InconsistentMessageReplies(reason=f"node {node} did not announce its positive classes: {reply.error.reason}")
            indicator = reply.content[wire.METRICS].get(ANNOUNCED)
            if not isinstance(indicator, list):
                raise InconsistentMessageReplies(reason=f"node {node} answered without '{ANNOUNCED}'")
            answers[node] = tuple(c for c, v in enumerate(indicator) if v > 0.5)
        missing = sorted(set(nodes) - set(answers))
        if missing:
            raise InconsistentMessageReplies(reason=f"nodes {missing} did not answer the positive-classes query")
        return answers
