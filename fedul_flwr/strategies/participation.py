"""Which nodes train in a round: the run setting ``participation``.

- ``fixed-size`` (Flower's own sampling): m = max(int(N ``fraction-train``), ``min-train-nodes``)
  of the N connected nodes, drawn without replacement.
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
guarantee does not depend on the sampling) ``poisson`` draws from a generator seeded with
(``seed``, round), so a seeded run, resumed or not, trains the same nodes, and ``fixed-size``
is Flower's draw from Python's ``random``, which the server seeds with ``seed`` and checkpoints.
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

__all__ = ["Participation", "poisson_draw"]


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


class Participation:
    """Mixin for Flower's FedAvg, right above it in the strategy's MRO
    (:func:`fedul_flwr.strategies.strict`): the nodes of a training round (module doc).

    Attributes
    ----------
    participation : str
        ``fixed-size`` or ``poisson``.
    secret_sampling : bool
        Draw from the OS CSPRNG (server-side DP); else seeded (module doc).
    sampling_seed : int
        The run's ``seed`` (the seeded Poisson draw).
    """

    participation: str = "fixed-size"
    secret_sampling: bool = False
    sampling_seed: int = 0
    fraction_train: float
    min_train_nodes: int
    min_available_nodes: int
    arrayrecord_key: str
    configrecord_key: str

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if self.participation == "fixed-size" and not self.secret_sampling:
            return super().configure_train(server_round, arrays, config, grid)  # type: ignore[misc]
        if self.fraction_train == 0.0:
            return []
        _, connected = sample_nodes(grid, self.min_available_nodes, 0)  # waits for min-available-nodes, draws none
        if self.participation == "poisson":
            seed = None if self.secret_sampling else self.sampling_seed
            chosen = poisson_draw(connected, self.fraction_train, seed, server_round)
        else:
            size = min(len(connected), max(int(len(connected) * self.fraction_train), self.min_train_nodes))
            chosen = secrets.SystemRandom().sample(sorted(connected), size)
        log(INFO, "configure_train: %s sampling: %d nodes (out of %d)", self.participation, len(chosen), len(connected))
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, chosen, MessageType.TRAIN)  # type: ignore[attr-defined]
