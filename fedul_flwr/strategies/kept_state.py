"""The server side of ``local-optimizer-state = "kept"``: each client's local optimiser state,
held by the server between the client's rounds.

FedDB's code (Zhu et al., IJCAI 2024) keeps every client's SGD optimiser between rounds; a
Flower ClientApp keeps nothing that survives a node's restart, so the server holds each
client's state (:mod:`fedul_flwr.optimizer_state`): a client's train reply carries its new state
(record ``"optimizer-state"``), stored under the client's stable node key (partition id, or
the hash of a deployed node's data folder) and sent back in the client's next train message.
The states are part of the strategy's checkpoint (:mod:`fedul_flwr.checkpoint`), so a run
resumed after a kill gives every client the state it had after its last trained round.

Node ids are not stable (a resumed simulation, a restarted SuperNode get new ones): the node
key of a node id is learnt from the node's replies, and for a node sampled before any reply of
its own while states are held (the first round after a resume) from a one-off *query* message
(the ClientApp answers it with its key). A node that does not answer trains from a fresh
optimiser that round, and its reply replaces its state; a failed or idle reply leaves the
state as it was. The state is the server's only: it is never aggregated or published, and
runs with differential privacy refuse ``kept`` (the state is un-noised client data).
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedul_flwr import wire

__all__ = ["KeptOptimizerStates", "ask_node_keys"]


class KeptOptimizerStates:
    """Mixin for Flower strategies: keep each client's local optimiser state (module doc).

    Attributes
    ----------
    client_states : dict[str, ArrayRecord]
        Node key (as a string) -> the client's optimiser state after its last trained round.
    """

    contract = None
    """The aggregation contract (:mod:`fedul_flwr.strategies.contract`): the strategy
    aggregates the replies as it is; the states leave them before it does."""

    side_records = {wire.OPTIMIZER_STATE: None}
    """Array records a reply carries beside ``"arrays"`` (:mod:`fedul_flwr.strategies.admission`):
    the client's new optimiser state (its layout is the optimiser's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.client_states: dict[str, ArrayRecord] = {}
        self._node_keys: dict[int, int] = {}

    def configure_train(self, server_round: int, arrays: Any, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """The strategy's train messages, each with its client's kept state (if any)."""
        messages = list(super().configure_train(server_round, arrays, config, grid))  # type: ignore[misc]
        self._learn_keys(grid, [m.metadata.dst_node_id for m in messages], config)
        out = []
        for message in messages:
            key = self._node_keys.get(message.metadata.dst_node_id)
            state = self.client_states.get(str(key)) if key is not None else None
            if state is None:
                out.append(message)
                continue
            content = RecordDict({**dict(message.content.items()), wire.OPTIMIZER_STATE: state})
            out.append(Message(content=content, dst_node_id=message.metadata.dst_node_id,
                               message_type=message.metadata.message_type, group_id=message.metadata.group_id))  # fmt: skip
        return out

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> Any:
        """Store each trained reply's new state under its node key, take it out of the reply,
        then aggregate as the strategy does."""
        replies = list(replies)
        for reply in replies:
            if reply.has_error():
                continue
            key = int(reply.content[wire.NODE_RECORD][wire.NODE_KEY])
            self._node_keys[reply.metadata.src_node_id] = key
            if wire.OPTIMIZER_STATE in reply.content.array_records:
                self.client_states[str(key)] = reply.content.array_records[wire.OPTIMIZER_STATE]
                del reply.content[wire.OPTIMIZER_STATE]
        return super().aggregate_train(server_round, replies)  # type: ignore[misc]

    def _learn_keys(self, grid: Grid, nodes: list[int], config: ConfigRecord) -> None:
        """Ask the sampled nodes whose key is unknown for it, when states are held."""
        unknown = [n for n in nodes if n not in self._node_keys]
        if not unknown or not set(self.client_states) - {str(k) for k in self._node_keys.values()}:
            return
        self._node_keys.update(ask_node_keys(grid, unknown, config, "local-optimizer-state=kept"))


def ask_node_keys(grid: Grid, nodes: list[int], config: ConfigRecord, why: str) -> dict[int, int]:
    """The stable node keys of ``nodes`` (node id -> key), asked with one *query* message each
    (the ClientApp answers with its ``node-key``); a node that does not answer is left out
    with a warning.

    Parameters
    ----------
    grid : Grid
        The run's grid.
    nodes : list[int]
        Node ids whose key the server does not know.
    config : ConfigRecord
        The round's train config: its run settings go with the question.
    why : str
        What keeps state by node key (the log lines' prefix, e.g. ``"local-optimizer-state=kept"``).
    """
    question = ConfigRecord({key: config[key] for key in wire.RUN_SETTINGS if key in config})
    messages = [Message(content=RecordDict({wire.CONFIG: question}), dst_node_id=n, message_type=MessageType.QUERY,
                        group_id="node-key") for n in nodes]  # fmt: skip
    keys: dict[int, int] = {}
    for reply in grid.send_and_receive(messages):
        if reply.has_error() or wire.NODE_RECORD not in reply.content.config_records:
            log(WARNING, "%s: node %s did not tell its key (%s); it starts from a fresh state", why,
                reply.metadata.src_node_id, reply.error.reason if reply.has_error() else "no key")  # fmt: skip
            continue
        keys[reply.metadata.src_node_id] = int(reply.content[wire.NODE_RECORD][wire.NODE_KEY])
    log(INFO, "%s: the keys of nodes %s", why, {n: keys.get(n) for n in nodes})
    return keys
