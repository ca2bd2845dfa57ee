"""FedRGD's grouping-based model averaging, as a strategy mixin.

Zhang et al., "Improving Semi-supervised Federated Learning by Reducing the Gradient Diversity
of Models", IEEE BigData 2021 (arXiv:2008.11364), Sec. 5: the replies of a round are split at
random into S groups G_1 .. G_S; each group's models are averaged together with the server's
model w_s (trained on the server's labels), and the global model is the mean of the group
models:

    w_g = (w_s + sum_{k in G_g} w_k) / (|G_g| + 1),        w^{t+1} = (1/S) sum_g w_g.

That is one weighted mean of the client models and w_s,

    w^{t+1} = a w_s + sum_k omega_k w_k,    omega_k = 1 / (S (|G_g(k)| + 1)),
    a = (1/S) sum_g 1 / (|G_g| + 1) = 1 - sum_k omega_k,

so :class:`GroupedAveraging` replaces each reply's weight by omega_k, lets the run's strategy
aggregate the clients (FedAvg: sum_k omega_k w_k / sum_k omega_k; FedAvgM, FedAdam, ...: their
server step on that mean), and moves the result a share a back to w_s:
w^{t+1} = a w_s + (1 - a) Agg. Under FedAvg this is the equation above exactly.

**w_s, the server's model.** In this repository's labels-at-server setting the server trains
on its labels after every aggregation (:mod:`fedul_flwr.strategies.server_training`), so the
model it sent this round -- the global arrays of ``configure_train`` -- *is* the model the
server trained on its labels; w_s is that model, and the grouped average is then trained on
the labels again before it goes out. The paper's server trains w_s from the round's global
model in parallel with the clients (as does the SemiFL authors' re-implementation, ``frgd``
with ``ft=0``): both orders train the server once per round, ours on the grouped average
instead of beside it. Where the server holds no labels (the labels-at-clients setting of
FedDB's tables) there is no w_s: the group models are the clients' means alone (s = 0 below)
and the global model their mean.

With s = 1 where the server trains, else 0: omega_k = 1 / (S (|G_g(k)| + s)), a = (s / S)
sum_g 1 / (|G_g| + 1). Groups are an even split (sizes differ by at most one) of a random
permutation of the replies, ordered by node key, drawn from the ``fedrgd-groups`` stream at
(run seed, round): a seeded run repeats its groups. With fewer replies than S, each reply is
its own group. Clients weigh the same inside a group (the paper's and the code's plain means).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from fedul_flwr import wire
from fedul_flwr.rng import numpy_generator
from fedul_flwr.strategies.contract import Combining, Contract
from fedul_flwr.strategies.per_model import PerModelAggregation

__all__ = ["SERVER_SHARE", "GroupedAveraging", "blend", "draw_groups", "group_weights", "with_weight"]

SERVER_SHARE = "fedrgd-server-share"
"""Train metric: a, the share of the server's model in the round's grouped average (0 where the
server holds no labels)."""


def draw_groups(seed: int, server_round: int, num_clients: int, groups: int) -> list[np.ndarray]:
    """The random groups of a round, as indices into its replies.

    Parameters
    ----------
    seed, server_round : int
        The run's seed and the round the groups are for.
    num_clients : int
        n >= 1: how many replies carry a model.
    groups : int
        S >= 1.

    Returns
    -------
    list[np.ndarray]
        min(S, n) int64 arrays, together a permutation of ``range(n)`` drawn from the
        ``fedrgd-groups`` stream at (seed, round), cut into groups whose sizes differ by at
        most one.

    Raises
    ------
    ValueError
        If n or S is below 1.
    """
    if num_clients < 1 or groups < 1:
        raise ValueError(f"groups need n, S >= 1, got n={num_clients}, S={groups}")
    order = numpy_generator("fedrgd-groups", seed, server_round).permutation(num_clients)
    return [part.astype(np.int64) for part in np.array_split(order, min(groups, num_clients))]


def group_weights(groups: Sequence[np.ndarray], num_clients: int, with_server: bool) -> tuple[np.ndarray, float]:
    """The clients' weights omega and the server model's share a of the grouped average.

    Parameters
    ----------
    groups : Sequence[np.ndarray]
        The S non-empty groups, indices into ``range(num_clients)`` (:func:`draw_groups`).
    num_clients : int
        n.
    with_server : bool
        Whether the server's model is a member of every group (s = 1).

    Returns
    -------
    (np.ndarray, float)
        omega ``[n]``: 1 / (S (|G_g| + s)) for a client of group g (0 for a client in no
        group), and a = (s / S) sum_g 1 / (|G_g| + 1); omega sums to 1 - a.

    Raises
    ------
    ValueError
        If a group is empty or there is none.
    """
    if not groups or any(len(g) == 0 for g in groups):
        raise ValueError(f"every group needs a member, got sizes {[len(g) for g in groups]}")
    s, count = int(with_server), len(groups)
    omega = np.zeros(num_clients, dtype=np.float64)
    for members in groups:
        omega[members] = 1.0 / (count * (len(members) + s))
    share = sum(s / (count * (len(g) + 1)) for g in groups)
    return omega, float(share)


def blend(aggregate: ArrayRecord, server: ArrayRecord, share: float) -> ArrayRecord:
    """``share * server + (1 - share) * aggregate`` for every floating-point array (others,
    e.g. batch norm's step counter, stay the aggregate's), in the aggregate's dtypes."""
    out = {}
    for key in aggregate.keys():
        a = aggregate[key].numpy()
        if np.issubdtype(a.dtype, np.floating):
            s = server[key].numpy().astype(np.float64)
            a = (share * s + (1.0 - share) * a.astype(np.float64)).astype(a.dtype)
        out[key] = Array(np.array(a, order="C"))  # keeps 0-d arrays 0-d
    return ArrayRecord(out)


def with_weight(reply: Message, key: str, weight: float) -> Message:
    """A shallow copy of ``reply`` whose metric ``key`` (the strategy's weight) is ``weight``;
    the reply itself is untouched."""
    view = copy.copy(reply)
    view.content = RecordDict(dict(reply.content.items()))
    view.content[wire.METRICS] = MetricRecord({**reply.content[wire.METRICS], key: weight})
    return view


class GroupedAveraging(PerModelAggregation):
    """Mixin for Flower strategies: FedRGD's grouping-based averaging (module docstring), on
    :class:`~fedul_flwr.strategies.per_model.PerModelAggregation` (whose ``configure_train``
    keeps the round's global arrays, w_s).

    Attributes
    ----------
    groups : int
        S, the groups per round.
    seed : int
        The run's seed (of the groups' stream).
    """

    groups: ClassVar[int] = 2
    seed: ClassVar[int] = 0
    contract: ClassVar[Contract] = Contract(
        Combining.REWEIGHTED, "fedrgd weighs each client by 1 / (S (|G| + 1)), the share of its random group, and "
        "mixes in the server's model", refuses=(Combining.ROBUST_SELECTION,),
    )  # fmt: skip
    """Reweighted (:mod:`fedul_flwr.strategies.contract`): a client's weight depends on its
    group's size, and the release includes the server's model. The robust strategies, which
    ignore the replies' weights and would drop the groups silently, are refused."""

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The strategy's aggregation of the replies with weights omega, then the share a of the
        server's model; the metrics gain ``fedrgd-server-share``. Replies without a model
        (idle clients, clients that sat out) and errors are left out."""
        ok = [r for r in replies if not r.has_error() and len(r.content[wire.ARRAYS])]
        if not ok:
            return None, None  # the global model stays
        server: ArrayRecord | None = getattr(self, "global_arrays", None)  # the round's, kept by configure_train
        with_server = getattr(self, "server_step", None) is not None and server is not None
        groups = draw_groups(self.seed, server_round, len(ok), self.groups)
        omega, share = group_weights(groups, len(ok), with_server)
        key = self.weighted_by_key  # type: ignore[attr-defined]
        weighted = [with_weight(reply, key, float(w)) for reply, w in zip(ok, omega, strict=True)]
        arrays, metrics = super().aggregate_train(server_round, weighted)  # type: ignore[misc]
        if arrays is not None and with_server and server is not None:
            arrays = blend(arrays, server, share)
        if metrics is not None:
            metrics[SERVER_SHARE] = share
        return arrays, metrics
