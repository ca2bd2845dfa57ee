"""Which nodes train in a round: the run setting ``participation``.

- ``fixed-size`` (Flower's FedAvg's cohort size): m = max(int(N ``fraction-train``),
  ``min-train-nodes``) of the N connected nodes (at most N), drawn without replacement.
- ``poisson``: each connected node trains on its own with probability q = ``fraction-train``, so
  a round trains a random number of nodes (qN on average, possibly none). This is the sampling
  of DP-FedAvg (McMahan et al., "Learning Differentially Private Recurrent Language Models",
  ICLR 2018, Alg. 1), under which server-side DP divides the noised sum of the clipped updates
  by the fixed expected cohort qN (:class:`fedul_flwr.privacy.server.ClippableReplies`) and the
  privacy spent is that of the Poisson-subsampled Gaussian mechanism
  (:func:`fedul_flwr.privacy.accounting.composed_epsilon`).

Where the draw comes from: under server-side DP (``differential-privacy=server-fixed`` or
``server-adaptive``) the sampling is part of the mechanism, and its amplification holds only if
no one can predict who trains, so both modes draw from the operating system's CSPRNG
(:class:`secrets.SystemRandom`), never stored. Otherwise (no DP, or ``client-local``, whose
guarantee does not depend on the sampling) both draw from a stream of the run seed
(:mod:`fedul_flwr.rng`) keyed by the round: ``poisson`` from ``participation``, ``fixed-size``
from ``cohort`` (a permutation of the sorted connected node ids, its first m), so a seeded run,
resumed or not, trains the same nodes in the same round, and no checkpoint has to carry a
generator's state. The nodes asked to evaluate (``fraction-evaluate`` > 0) are drawn the same
way, fixed-size, from the ``evaluation-cohort`` stream (also under DP: who evaluates is outside
the mechanism). Flower's own draw (``strategy_utils.sample_nodes`` with a positive size, from
Python's process-wide ``random``) is never used; :class:`Participation` calls it with size 0,
only to wait for the nodes to connect.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from fedul_flwr.rng import numpy_generator

__all__ = ["Participation", "cohort_size", "fixed_size_draw", "poisson_draw"]


def poisson_draw(nodes: list[int], rate: float, seed: int | None, server_round: int) -> list[int]:
    """The nodes that train in a Poisson-sampled round: each of ``nodes`` independently with
    probability ``rate``.

    Parameters
    ----------
    nodes : list[int]
        The connected node ids (any order; the draw follows their ascending order).
    rate : float
        q in [0, 1].
    seed : int | None
        ``None``: draw from the OS CSPRNG (:class:`secrets.SystemRandom`); else from numpy's
        generator seeded with (``seed``, ``server_round``, a stream word), the same nodes for the
        same seed and round.
    server_round : int
        The round (a resumed run's numbering).

    Returns
    -------
    list[int]
        The sampled ids, ascending (possibly empty).
    """
    ordered = sorted(nodes)
    if seed is None:
        draw = secrets.SystemRandom()
        return [n for n in ordered if draw.random() < rate]
    uniforms = numpy_generator("participation", int(seed), int(server_round)).random(len(ordered))
    return [n for n, u in zip(ordered, uniforms, strict=True) if u < rate]


def cohort_size(connected: int, fraction: float, minimum: int) -> int:
    """m, the nodes of a fixed-size round: ``min(N, max(int(N fraction), minimum))`` of the N
    ``connected`` nodes (Flower's FedAvg.configure_train / configure_evaluate, capped at N)."""
    return min(connected, max(int(connected * fraction), minimum))


def fixed_size_draw(nodes: list[int], size: int, seed: int | None, server_round: int, stream: str = "cohort") -> list[int]:
    """``size`` of ``nodes``, drawn without replacement.

    Parameters
    ----------
    nodes : list[int]
        The connected node ids (any order; the draw follows their ascending order).
    size : int
        m in [0, len(nodes)] (:func:`cohort_size`).
    seed : int | None
        ``None``: draw from the OS CSPRNG (:class:`secrets.SystemRandom`); else the first
        ``size`` of a permutation drawn from numpy's generator of ``stream`` at (``seed``,
        ``server_round``): the same nodes for the same seed and round, whatever came before.
    server_round : int
        The round (a resumed run's numbering).
    stream : str
        ``cohort`` (who trains) or ``evaluation-cohort`` (who evaluates), keys of
        :data:`fedul_flwr.rng.STREAMS`.

    Returns
    -------
    list[int]
        The sampled ids, ascending.

    Raises
    ------
    ValueError
        If ``size`` is negative or above ``len(nodes)``.
    """
    ordered = sorted(nodes)
    if not 0 <= size <= len(ordered):
        raise ValueError(f"cannot draw {size} of {len(ordered)} nodes")
    if seed is None:
        return sorted(secrets.SystemRandom().sample(ordered, size))
    picks = numpy_generator(stream, int(seed), int(server_round)).permutation(len(ordered))[:size]
    return sorted(ordered[int(i)] for i in picks)


class Participation:
    """Mixin for Flower's FedAvg, right above it in the strategy's MRO
    (:func:`fedul_flwr.strategies.strict`): the nodes of a training round and of an evaluation
    round (module doc); every strategy of :data:`fedul_flwr.strategies.STRATEGIES` reaches
    Flower's FedAvg through it, so none draws from Python's ``random``.

    Attributes
    ----------
    participation : str
        ``fixed-size`` or ``poisson``.
    secret_sampling : bool
        Draw from the OS CSPRNG (server-side DP); else seeded (module doc).
    sampling_seed : int
        The run's ``seed`` (the seeded draws: who trains, who evaluates).
    """

    participation: str = "fixed-size"
    secret_sampling: bool = False
    sampling_seed: int = 0
    fraction_train: float
    min_train_nodes: int
    min_available_nodes: int
    fraction_evaluate: float
    min_evaluate_nodes: int
    arrayrecord_key: str
    configrecord_key: str

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if self.fraction_train == 0.0:
            return []
        seed = None if self.secret_sampling else self.sampling_seed
        if self.participation == "poisson":
            _, connected = sample_nodes(grid, self.min_available_nodes, 0)  # waits for min-available-nodes, draws none
            chosen = poisson_draw(connected, self.fraction_train, seed, server_round)
        else:  # as Flower's FedAvg, waits for min-train-nodes too
            _, connected = sample_nodes(grid, max(self.min_available_nodes, self.min_train_nodes), 0)
            size = cohort_size(len(connected), self.fraction_train, self.min_train_nodes)
            chosen = fixed_size_draw(connected, size, seed, server_round, "cohort")
        log(INFO, "configure_train: %s sampling: %d nodes (out of %d)", self.participation, len(chosen), len(connected))
        return self._messages(server_round, arrays, config, chosen, MessageType.TRAIN)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if self.fraction_evaluate == 0.0:
            return []
        _, connected = sample_nodes(grid, max(self.min_available_nodes, self.min_evaluate_nodes), 0)  # waits, draws none
        size = cohort_size(len(connected), self.fraction_evaluate, self.min_evaluate_nodes)
        chosen = fixed_size_draw(connected, size, self.sampling_seed, server_round, "evaluation-cohort")
        log(INFO, "configure_evaluate: sampled %d nodes (out of %d)", len(chosen), len(connected))
        return self._messages(server_round, arrays, config, chosen, MessageType.EVALUATE)

    def _messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, nodes: list[int], message_type: str
    ) -> Iterable[Message]:
        config["server-round"] = server_round  # as Flower's FedAvg: every instruction names its round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, nodes, message_type)  # type: ignore[attr-defined]
