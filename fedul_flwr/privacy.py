"""Differential privacy switches: Flower's DP strategy wrappers and ``LocalDpMod``, by config.

``differential-privacy`` selects one of Flower's mechanisms; nothing here re-implements them:

- ``server-fixed``: :class:`~flwr.serverapp.strategy.DifferentialPrivacyServerSideFixedClipping`
  (McMahan et al., "Learning Differentially Private Recurrent Language Models", ICLR 2018):
  the server clips each client's update Delta_c = w_c - w to L2 norm at most C
  (``dp-clipping-norm``), averages, and adds Gaussian noise N(0, (z C / n)^2) per coordinate
  (z = ``dp-noise-multiplier``, n = the number of clipped updates). It protects the
  *released* global model against inference about any one client's participation; the
  server itself still sees every unclipped update.
- ``server-adaptive``: :class:`~flwr.serverapp.strategy.DifferentialPrivacyServerSideAdaptiveClipping`
  (Andrew et al., "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021): as
  above, with C tracking the update norms so that a ``dp-target-clipped-quantile`` share of
  them is clipped (geometric step ``dp-clip-norm-lr``), starting from ``dp-clipping-norm``.
- ``client-local``: Flower's :class:`~flwr.clientapp.mod.LocalDpMod` on every node: the
  client clips its own update to ``dp-clipping-norm`` and adds Gaussian noise of standard
  deviation ``dp-sensitivity * sqrt(2 ln(1.25 / dp-delta)) / dp-epsilon`` before the reply
  leaves the node (the Gaussian mechanism), so neither the server nor the network sees the
  exact update. It costs far more accuracy than central DP for the same (epsilon, delta).

Fitting them to this project's messages (the mechanisms are Flower's, unchanged):

- The number of clients n that Flower's server-side wrappers divide the noise by is set each
  round to the number of updates actually clipped (sampled clients minus the ones that sat
  the round out), not fixed at construction.
- A client that sits a round out (no arrays) has no update to clip and is left out before
  clipping; a failed reply is left out too (Flower's wrappers would drop the whole round).
- Flower's server-side clipping compares a reply's arrays *positionally* with the whole global
  ArrayRecord, so it needs replies that carry every exchanged model and nothing else. HASSLE's
  clients send only the models their data trains, and SCAFFOLD adds control-variate records:
  there the server-side wrappers stop with a :class:`ValueError` naming the node, and
  ``client-local`` (which clips each reply against the received copy of exactly the models it
  sends) is the switch that composes.
- ``LocalDpMod`` privatizes the model arrays of the reply; uploaded statistics (FedDB's APP-U,
  scalar metrics) and SCAFFOLD's control variates travel as they are.

Where this departs from Flower 1.42, measured in ``tests/test_privacy_robustness.py``:

- **The adaptive norm's direction.** Andrew et al. (Alg. 1) update C <- C exp(-eta (b - gamma))
  with b the fraction of updates *not* clipped and gamma its target. Flower passes the
  fraction that *was* clipped as b, so C moves away from its target: when every update is
  clipped C shrinks (measured: 1e-3 -> 0.82e-3 in 2 rounds) and keeps shrinking.
  :class:`QuantileTracking` applies the paper's rule with b = 1 - clipped fraction and
  gamma = 1 - ``dp-target-clipped-quantile``, i.e. C <- C exp(eta (clipped - target)).
- **Noise nobody can regenerate.** Flower draws the Gaussian noise from numpy's global
  generator. Every noise draw here (the server's, on the aggregate and on the adaptive
  clipped count, and ``LocalDpMod``'s on a node) runs under :func:`os_entropy`: numpy's global
  generator is seeded from 256 bits of the operating system's CSPRNG (``os.urandom``) for that
  draw only, and its previous state is put back afterwards. The run's ``seed``, its records and
  its folder cannot reproduce the noise (with a seeded noise, anyone who knows the seed
  subtracts it and recovers the exact update); the training draws stay seeded, so a DP run is
  not bit-reproducible, and only its noise differs between two runs with the same seed.
- **Equal client weights.** Flower's noise z C / n on the average of n clipped updates gives
  each client the noise multiplier z only when the clients weigh the same (Flower's own
  accountant refuses other weights). Under server-side DP the run therefore aggregates with
  ``aggregation-weights=uniform``: :func:`fedul_flwr.config.compose_config` sets it (with a
  notice) where it was not typed, and a typed ``num-examples`` is refused.

The privacy spent: :func:`privacy_spent` gives (epsilon, delta) after each round, an upper
bound for the sampling Flower performs (a fixed number of nodes drawn without replacement),
recorded per round in the run's metrics and in the summary line:

- ``server-fixed`` (client-level DP of the released models, neighbouring federations differ by
  adding or removing one client; the number n of updates a round averages is public): Flower's
  own accountant (``flwr.serverapp.RdpAccountant``, Rényi DP via Google's ``dp-accounting``)
  with ``sampling_method=no-amplification``, the only one Flower 1.42 allows for these
  wrappers: each round is the Gaussian mechanism with noise multiplier z on the sum of the
  clipped updates, whatever share of the nodes it samples.
- ``client-local`` (local DP of each node's replies, neighbouring inputs are any two local data
  sets of the node): each reply is the Gaussian mechanism with standard deviation
  sigma = ``dp-sensitivity * sqrt(2 ln(1.25 / dp-delta)) / dp-epsilon`` on an update clipped to
  C, so two replies of a node differ by at most 2C in L2 norm: noise multiplier sigma / (2C),
  composed over every round by ``dp-accounting``'s RDP accountant (a node that sat rounds out
  spent less).
- Beside the composed figure both record the exact epsilon of one round's release at the
  same delta (``privacy-epsilon-round``): the analytic Gaussian mechanism of Balle & Wang
  (ICML 2018, Thm. 8) by ``dp-accounting``'s ``GaussianPrivacyLoss``. For ``client-local`` it
  is what ``dp-epsilon`` promises only in part: ``LocalDpMod``'s sigma is the classic bound,
  valid for ``dp-epsilon`` < 1; with ``dp-sensitivity`` = 2C one reply is below ``dp-epsilon``
  up to about 8.4 and above it beyond (2.2e4 at ``dp-epsilon`` = 1000).
- ``server-adaptive`` is not accounted (its noisy clipped-count query shares the budget in a
  way Flower's wrapper fixes at construction): the run records no epsilon.

Secure aggregation (Flower's SecAgg+: ``secaggplus_mod`` and ``SecAggPlusWorkflow``) would
hide individual updates from the server altogether; it drives the rounds through Flower's
workflow API rather than the Message-API strategies used here, and is not wired in.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Iterable, Iterator
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import (
    ArrayRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp.mod import LocalDpMod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.logger import log
from flwr.serverapp.strategy import (
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
    Strategy,
)

from fedul_flwr import wire
from fedul_flwr.config import CHOICES, RunConfig, config_from_json

__all__ = ["ACCOUNTED_MODES", "DP_MODES", "NEIGHBOURS", "local_dp_mod", "os_entropy", "privacy_spent", "with_server_dp"]

DP_MODES: tuple[str, ...] = CHOICES["differential-privacy"]
"""Values of ``differential-privacy``: none, server-fixed, server-adaptive, client-local."""
ACCOUNTED_MODES: tuple[str, ...] = ("server-fixed", "client-local")
"""Values of ``differential-privacy`` whose (epsilon, delta) a run records."""
NEIGHBOURS: dict[str, str] = {
    "server-fixed": "client-level,add-or-remove-one-client,no-amplification",
    "client-local": "local,any-two-datasets-of-a-node",
}
"""The guarantee each accounted mode's epsilon is for, as the summary line names it
(``neighbours=...``): whom it protects, the neighbouring relation, and (central DP) the
sampling assumed."""
_ENTROPY_BYTES = 32  # 256 bits from the OS CSPRNG seed numpy's generator for one noise draw


@contextlib.contextmanager
def os_entropy() -> Iterator[None]:
    """numpy's global generator, from which Flower's DP noise is drawn, seeded from 256 bits of
    the operating system's CSPRNG (``os.urandom``) inside the block; its previous state is put
    back on leaving, so the seeded (training) draws around the block go on as without it.

    The noise drawn inside can be reproduced from nothing the run keeps (its ``seed``, records
    or folder). One process runs one node or the server at a time (Flower's runtimes, the
    in-process grid): no other thread draws from the global generator meanwhile.
    """
    state = np.random.get_state()
    np.random.seed(np.frombuffer(os.urandom(_ENTROPY_BYTES), dtype=np.uint32))
    try:
        yield
    finally:
        np.random.set_state(state)


def noise_multiplier(cfg: RunConfig) -> float:
    """The noise multiplier of one round's Gaussian mechanism (noise standard deviation over the
    largest L2 distance between two neighbouring inputs' outputs), unitless.

    ``server-fixed``: z = ``dp-noise-multiplier`` (Flower adds N(0, (z C / n)^2) to the average
    of n updates clipped to C, i.e. N(0, (z C)^2) to their sum, which one client changes by at
    most C). ``client-local``: ``LocalDpMod``'s sigma = ``dp-sensitivity``
    sqrt(2 ln(1.25 / dp-delta)) / ``dp-epsilon`` over 2C, the largest distance between two
    updates clipped to C.

    Raises
    ------
    ValueError
        For a mode that is not accounted (``none``, ``server-adaptive``).
    """
    if cfg.differential_privacy == "server-fixed":
        return cfg.dp_noise_multiplier
    if cfg.differential_privacy == "client-local":
        sigma = cfg.dp_sensitivity * math.sqrt(2 * math.log(1.25 / cfg.dp_delta)) / cfg.dp_epsilon
        return sigma / (2 * cfg.dp_clipping_norm)
    raise ValueError(f"differential-privacy={cfg.differential_privacy!r} is not accounted (only {ACCOUNTED_MODES})")


def sample_size(cfg: RunConfig, num_nodes: int) -> int:
    """Nodes that train in a round, as Flower's FedAvg samples them (without replacement):
    max(int(N * ``fraction-train``), ``min-train-nodes``) of the N nodes, at most N (>= 1)."""
    return max(1, min(num_nodes, max(int(num_nodes * cfg.fraction_train), cfg.min_train_nodes)))


def gaussian_epsilon(multiplier: float, delta: float) -> float:
    """The exact epsilon at ``delta`` of one Gaussian mechanism with noise multiplier
    ``multiplier`` (standard deviation over L2 sensitivity): the analytic Gaussian mechanism of
    Balle & Wang (ICML 2018, Thm. 8), by ``dp-accounting``'s ``GaussianPrivacyLoss``, inverted
    by its binary search from above (an upper bound; within 1e-7 for multipliers >= 1, relatively
    within ~2e-7 below). ``inf`` for no noise."""
    from dp_accounting.pld import common
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

    if multiplier <= 0:
        return math.inf
    loss = GaussianPrivacyLoss(multiplier, sensitivity=1.0)
    # epsilon grows as 1 / (2 multiplier^2) for small multipliers: a tolerance relative to that
    # scale (1e-7 at multiplier 1) stays above float spacing, so the search ends
    search = common.BinarySearchParameters(0.0, math.inf, initial_guess=1.0, tolerance=1e-7 * max(1.0, multiplier**-2))
    return float(common.inverse_monotone_function(loss.get_delta_for_epsilon, delta, search))


def composed_epsilon(cfg: RunConfig, rounds: int, num_nodes: int) -> float:
    """Epsilon at ``dp-delta`` of ``rounds`` rounds, by Rényi DP (see the module doc).

    ``server-fixed``: Flower's ``RdpAccountant`` (add-or-remove-one client, no amplification by
    Flower's fixed-size sampling of ``num_nodes`` nodes). ``client-local``: ``dp-accounting``'s
    ``RdpAccountant`` on the Gaussian mechanism of :func:`noise_multiplier` (no sampling: a node
    knows whether it replied). ``inf`` for no noise, 0 for no round.
    """
    import dp_accounting  # flwr[dp]; imported here: runs without DP do not need it
    from flwr.serverapp import NeighboringRelation, PrivacyConfig, RdpAccountant, SamplingMethod
    from flwr.serverapp import GaussianPrivacyEvent

    multiplier = noise_multiplier(cfg)
    if rounds <= 0:
        return 0.0
    if multiplier <= 0:
        return math.inf
    if cfg.differential_privacy == "server-fixed":
        population = max(1, num_nodes)
        accountant = RdpAccountant(PrivacyConfig(cfg.dp_delta, population, NeighboringRelation.ADD_OR_REMOVE_ONE,
                                                 SamplingMethod.NO_AMPLIFICATION))  # fmt: skip
        accountant.compose(GaussianPrivacyEvent(multiplier, sample_size(cfg, population), population), rounds)
        return accountant.get_privacy_spent(cfg.dp_delta).epsilon
    local = dp_accounting.rdp.RdpAccountant()
    local.compose(dp_accounting.GaussianDpEvent(multiplier), rounds)
    return float(local.get_epsilon(cfg.dp_delta))


def privacy_spent(cfg: RunConfig, rounds: int, num_nodes: int) -> dict[str, float]:
    """(epsilon, delta) spent after ``rounds`` rounds, and the exact epsilon of one round.

    Parameters
    ----------
    cfg : RunConfig
        Uses ``differential-privacy``, the DP keys of :func:`noise_multiplier`, ``dp-delta``
        (the delta the epsilons are given at), ``fraction-train`` and ``min-train-nodes``.
    rounds : int
        Rounds done (>= 0).
    num_nodes : int
        Nodes the rounds sample from (Flower's accountant records it; no amplification).

    Returns
    -------
    dict
        ``{"privacy-epsilon": eps, "privacy-epsilon-round": eps_1, "privacy-delta": delta}``:
        eps the composed upper bound of :func:`composed_epsilon` (0 at round 0), eps_1 the
        exact epsilon of one round's release (:func:`gaussian_epsilon`); ``{}`` when the run's
        mode is not accounted.
    """
    if cfg.differential_privacy not in ACCOUNTED_MODES:
        return {}
    return {
        wire.PRIVACY_EPSILON: composed_epsilon(cfg, rounds, num_nodes),
        wire.PRIVACY_EPSILON_ROUND: gaussian_epsilon(noise_multiplier(cfg), cfg.dp_delta),
        wire.PRIVACY_DELTA: cfg.dp_delta,
    }


class ClippableReplies:
    """Mixin for Flower's server-side DP wrappers: put the round's replies on record and apply
    the failure limits first (the strict strategy's ``screen``, which also leaves out the
    clients that had nothing to train), hand the wrappers only replies with an update to
    clip, check each carries exactly the global model's arrays in their order (the ClientApp sends
    them in the order of the method's model specs), and set the wrapper's
    ``num_sampled_clients`` (the noise's divisor) to their number.

    Raises
    ------
    ValueError
        If a reply carries other array records than ``"arrays"`` (SCAFFOLD) or only some of
        the global arrays (HASSLE): Flower's clipping would pair the wrong arrays.
    """

    current_arrays: ArrayRecord
    num_sampled_clients: int

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        kept = []
        expected = list(self.current_arrays.keys())
        inner: Any = self.strategy  # type: ignore[attr-defined]
        screened = inner.screen(server_round + getattr(inner, "round_offset", 0), replies)  # failures on record first
        for reply in screened:
            if reply.has_error():
                log(INFO, "round %d: node %d failed (%s); its reply is left out", server_round,
                    reply.metadata.src_node_id, reply.error.reason)  # fmt: skip
                continue
            records = list(reply.content.array_records.keys())
            if records != [wire.ARRAYS]:
                raise ValueError(
                    f"round {server_round}: node {reply.metadata.src_node_id} replied with array records {records}; "
                    "server-side DP clips one record of the whole model (SCAFFOLD's control variates cannot be "
                    "clipped with it): use differential-privacy=client-local"
                )
            sent = list(reply.content[wire.ARRAYS].keys())
            if sent != expected:  # Flower pairs the reply's arrays with the global ones by position
                missing = sorted({k.split(".", 1)[0] for k in expected} - {k.split(".", 1)[0] for k in sent})
                detail = f"models missing: {missing}" if missing else "in another order"
                raise ValueError(
                    f"round {server_round}: node {reply.metadata.src_node_id} sent {len(sent)} of the "
                    f"{len(expected)} global arrays ({detail}); server-side DP clips whole-model updates: use "
                    "differential-privacy=client-local"
                )
            kept.append(reply)
        self.num_sampled_clients = max(1, len(kept))
        return super().aggregate_train(server_round, kept)  # type: ignore[misc]


class QuantileTracking:
    """Mixin for Flower's adaptive-clipping wrapper: the clipping-norm update of Andrew et al.
    (NeurIPS 2021, Alg. 1), C <- C exp(-eta (b - gamma)), with b = 1 - (clipped fraction) and
    gamma = 1 - q (q = ``dp-target-clipped-quantile``), i.e. C <- C exp(eta (clipped - q)):
    C grows while more than a share q of the updates is clipped and shrinks otherwise."""

    clipping_norm: float
    clip_norm_lr: float
    target_clipped_quantile: float

    def _geometric_update(self, clipped_fraction: float) -> None:
        self.clipping_norm *= math.exp(self.clip_norm_lr * (clipped_fraction - self.target_clipped_quantile))


class SecretNoise:
    """Mixin for Flower's server-side DP wrappers: each of their noise draws (on the aggregate;
    on the clipped count of the adaptive wrapper) under :func:`os_entropy`, so no seed or record
    regenerates it."""

    def _add_noise_to_aggregated_arrays(self, aggregated_arrays: ArrayRecord) -> ArrayRecord:
        with os_entropy():
            return super()._add_noise_to_aggregated_arrays(aggregated_arrays)  # type: ignore[misc]

    def _noisy_fraction(self, count: int, total: int) -> float:  # the adaptive wrapper's only
        with os_entropy():
            return super()._noisy_fraction(count, total)  # type: ignore[misc]


@functools.cache
def _wrapper(base: type[Strategy]) -> type[Strategy]:
    adaptive = base is DifferentialPrivacyServerSideAdaptiveClipping
    mixins = (SecretNoise, ClippableReplies, *((QuantileTracking,) if adaptive else ()))
    return type(f"Clippable{base.__name__}", (*mixins, base), {"__module__": __name__})


def with_server_dp(strategy: FedAvg, cfg: RunConfig) -> Strategy:
    """``strategy`` wrapped in Flower's server-side DP wrapper that ``differential-privacy``
    names (``server-fixed`` or ``server-adaptive``); ``strategy`` itself otherwise.

    Parameters
    ----------
    strategy : FedAvg
        The run's (strict) strategy; the wrapper delegates sampling and aggregation to it.
    cfg : RunConfig
        Uses ``differential-privacy``, ``dp-noise-multiplier`` (z, unitless),
        ``dp-clipping-norm`` (C, L2 norm of a whole-model update; the initial C when
        adaptive), ``dp-target-clipped-quantile`` and ``dp-clip-norm-lr``.

    Returns
    -------
    Strategy
        The wrapper (its ``.strategy`` is ``strategy``) or ``strategy``.
    """
    if cfg.differential_privacy == "server-fixed":
        return _wrapper(DifferentialPrivacyServerSideFixedClipping)(
            strategy, noise_multiplier=cfg.dp_noise_multiplier, clipping_norm=cfg.dp_clipping_norm, num_sampled_clients=1
        )  # fmt: skip
    if cfg.differential_privacy == "server-adaptive":
        return _wrapper(DifferentialPrivacyServerSideAdaptiveClipping)(
            strategy, noise_multiplier=cfg.dp_noise_multiplier, num_sampled_clients=1,
            initial_clipping_norm=cfg.dp_clipping_norm, target_clipped_quantile=cfg.dp_target_clipped_quantile,
            clip_norm_lr=cfg.dp_clip_norm_lr,
        )  # fmt: skip
    return strategy


def _run_config(msg: Message) -> RunConfig | None:
    config = msg.content.config_records.get(wire.CONFIG)
    text = None if config is None else config.get(wire.RUN_CONFIG)
    return config_from_json(text) if isinstance(text, str) else None


def local_dp_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Client-side mod: Flower's ``LocalDpMod`` on the train reply when the run says
    ``differential-privacy=client-local`` (a pass-through otherwise).

    The reply's model arrays are clipped against the received copy of exactly the models the
    client sends (HASSLE's partial replies included) and noised by ``LocalDpMod``, its noise
    drawn under :func:`os_entropy` (never from the run's seed); a client that sat the round out
    and failed replies pass unchanged.

    Raises
    ------
    RuntimeError
        If ``LocalDpMod`` rejects the reply (the ClientApp then replies with the error).
    """
    cfg = _run_config(msg) if msg.metadata.message_type == MessageType.TRAIN else None
    if cfg is None or cfg.differential_privacy != "client-local":
        return call_next(msg, context)
    reply = call_next(msg, context)
    if reply.has_error() or not len(reply.content[wire.ARRAYS]):
        return reply
    sent = reply.content[wire.ARRAYS]
    received = msg.content[wire.ARRAYS]
    mod = LocalDpMod(cfg.dp_clipping_norm, cfg.dp_sensitivity, cfg.dp_epsilon, cfg.dp_delta)
    # LocalDpMod needs one ArrayRecord with the same keys in and out: show it just those
    view = Message(RecordDict({wire.ARRAYS: ArrayRecord({k: received[k] for k in sent.keys()})}),
                   dst_node_id=msg.metadata.dst_node_id, message_type=MessageType.TRAIN)  # fmt: skip

    def inner(_: Message, __: Context) -> Message:
        return Message(RecordDict({wire.ARRAYS: sent}), reply_to=view)

    with os_entropy():  # the noise: from the OS CSPRNG, never from the run's seed
        out: Any = mod(view, context, inner)
    if out.has_error():
        raise RuntimeError(f"LocalDpMod failed on node {context.node_id}: {out.error.reason}")
    reply.content[wire.ARRAYS] = out.content[wire.ARRAYS]
    return reply
