"""An in-process Flower federation: the real ServerApp logic and the real ClientApp, no
SuperLink and no Ray.

:class:`InProcessGrid` implements Flower's :class:`~flwr.serverapp.Grid` by calling the
ClientApp directly, each node with its own persistent :class:`~flwr.app.Context` (so
``context.state`` survives between rounds as it does in a simulation). A ClientApp exception
becomes an error reply, as in Flower's runtimes.

The cohort path (``path``, from the run setting ``cohort`` by
:func:`fedul_flwr.execution.cohort_path`): ``sequential`` runs the nodes of a message batch one
after another on the process's torch threads; ``parallel`` runs W = ``workers`` at once in a
pool of threads, each on one torch thread (:func:`fedul_flwr.execution.pinned_threads`): torch
releases Python's lock inside its kernels, so the clients' forward and backward passes run on
W cores at once; ``batched`` runs every node of the batch in a thread of its own, their
training loops joined into one batched model (:class:`fedul_flwr.cohort.Cohort`, coordinated
by the grid's thread). A client's replies do not depend on the path: every random draw of a client comes from
generators of (run seed, round, node) (:mod:`fedul_flwr.rng`), none from a process-wide
generator, and the ClientApp keeps its modules per thread. With one
torch thread the sequential and parallel paths give equal replies bit for bit; the thread
count otherwise changes the order of floating-point sums, hence the last bits, and so do the
batched path's kernels.
Used by the tests, the reproduction runner and the benchmarks; ``flwr run .`` is the way
to run the app for real.

Building Flower messages outside a Flower runtime needs the process's task identity set;
that private detail lives here and nowhere else.
"""

from __future__ import annotations

import functools
import traceback
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.run import Run
from flwr.serverapp import Grid
from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message
from flwr.supercore.task_identity import TaskIdentity

from fedul_flwr.cohort import Cohort
from fedul_flwr.execution import COHORT_PATHS, pinned_threads

CLIENT_EXCEPTION = 1  # error code of a reply whose ClientApp raised


class InProcessGrid(Grid):
    """A Grid whose nodes are ClientApp calls in this process.

    Parameters
    ----------
    client_app : ClientApp
        The app every node runs.
    num_nodes : int
        Number of nodes; node i (ids 1..N) gets ``node_config`` ``{"partition-id": i-1,
        "num-partitions": N}`` unless ``node_configs`` is given.
    run_config : Mapping[str, Any]
        The values the user typed: every node's ``context.run_config`` and the run's
        ``override_config`` (so the ServerApp's ``main`` resolves them as Flower would).
    node_configs : list[dict] | None
        Per-node ``node_config`` (deployment-style, e.g. ``{"data-dir": ...}``).
    path : str
        The cohort path (module docstring): ``sequential``, ``parallel`` or ``batched``.
    workers : int
        Clients at once on the parallel path (>= 2; ignored by the others).
    """

    def __init__(
        self,
        client_app: ClientApp,
        num_nodes: int,
        run_config: Mapping[str, Any],
        node_configs: list[dict[str, Any]] | None = None,
        path: str = "sequential",
        workers: int = 1,
    ) -> None:
        configs = node_configs or [{"partition-id": i, "num-partitions": num_nodes} for i in range(num_nodes)]
        self.client_app = client_app
        self.simulated = all("data-dir" not in c for c in configs)
        """Whether the nodes are simulated partitions (built by ``client-setting``), not node folders."""
        self.run_config = dict(run_config)
        self.contexts = {
            node_id: Context(
                run_id=1, node_id=node_id, node_config=dict(cfg), state=RecordDict(), run_config=self.run_config
            )
            for node_id, cfg in enumerate(configs, start=1)
        }
        self.down: set[int] = set()  # nodes that are "disconnected" (tests of faults)
        self.lost: set[int] = set()
        """Nodes that died mid-run (tests of faults): still listed, every instruction to them is
        answered by the SuperLink's own error reply (Flower's ``NODE_UNAVAILABLE``, whose source
        is the SuperLink, not the node)."""
        self._run = Run.create_empty(run_id=1)
        self._run.override_config = dict(run_config)  # what a user typed, as the SuperLink keeps it
        self._replies: dict[str, Message] = {}
        if path not in COHORT_PATHS:
            raise ValueError(f"cohort path {path!r} is not one of {COHORT_PATHS}")
        self.cohort_path = path
        """The cohort path (module docstring)."""
        self.workers = max(2, int(workers)) if path == "parallel" else 0 if path == "batched" else 1
        """Clients at once: W on the parallel path, 1 on the sequential one, 0 (all) batched."""
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self.trained = {"batched": 0, "alone": 0}
        """On the batched path: client trainings of this grid in the batched model and alone."""
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0

    def set_run(self, run: Run) -> None:
        """Set the run (kept for interface compatibility)."""
        self._run = run

    @property
    def run(self) -> Run:
        """The current run."""
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        """A new instruction message to ``dst_node_id``."""
        return Message(content=content, message_type=message_type, dst_node_id=dst_node_id, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        """Ids of the connected nodes."""
        return [n for n in self.contexts if n not in self.down]

    def _call(self, msg: Message) -> Message:
        """The ClientApp's reply to ``msg`` (an exception becomes an error reply)."""
        try:
            return self.client_app(msg, self.contexts[msg.metadata.dst_node_id])
        except Exception as exc:  # noqa: BLE001 -- a failing client becomes an error reply
            reason = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
            return Message(Error(code=CLIENT_EXCEPTION, reason=reason), reply_to=msg)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Run the ClientApp on each message now (the cohort path of ``workers``); keep the
        replies for :meth:`pull_messages`."""
        ids, run = [], []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # the SuperLink's job
            ids.append(msg.metadata.message_id)
            if msg.metadata.dst_node_id in self.down:
                continue
            if msg.metadata.dst_node_id in self.lost:
                self._replies[msg.metadata.message_id] = create_message_error_unavailable_res_message(msg.metadata, "node")
                continue
            run.append(msg)
        if self.cohort_path == "parallel" and len(run) > 1:
            with pinned_threads(1):
                replies = list(self._threads(self.workers).map(self._call, run))
        elif self.cohort_path == "batched" and run:
            cohort = Cohort(len(run))
            futures = [self._threads(len(run)).submit(cohort.client, functools.partial(self._call, msg)) for msg in run]
            try:
                cohort.coordinate()
            except Exception:  # noqa: BLE001 -- every member got the error: its client's error reply
                pass
            replies = [f.result() for f in futures]
            self.trained["batched"] += len(cohort.members)
            self.trained["alone"] += cohort.alone
        else:
            replies = [self._call(msg) for msg in run]
        for msg, reply in zip(run, replies):
            self._replies[msg.metadata.message_id] = reply
        return ids

    def _threads(self, at_least: int) -> ThreadPoolExecutor:
        """The pool of client threads, grown to ``at_least`` threads (a thread keeps its
        ClientApp modules between rounds)."""
        if self._pool is None or self._pool_size < at_least:
            if self._pool is not None:
                self._pool.shutdown()
            self._pool, self._pool_size = ThreadPoolExecutor(at_least, thread_name_prefix="fedul-client"), at_least
        return self._pool

    def close(self) -> None:
        """Stop the pool of client threads (a later round starts a new one)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Replies to the given message ids (removed once pulled)."""
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Push, then pull all replies (calls are synchronous, so nothing is pending)."""
        return self.pull_messages(self.push_messages(messages))
