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

Two departures from Flower 1.41, both measured in ``tests/test_privacy_robustness.py``:

- **The adaptive norm's direction.** Andrew et al. (Alg. 1) update C <- C exp(-eta (b - gamma))
  with b the fraction of updates *not* clipped and gamma its target. Flower passes the
  fraction that *was* clipped as b, so C moves away from its target: when every update is
  clipped C shrinks (measured: 1e-3 -> 0.82e-3 in 2 rounds) and keeps shrinking.
  :class:`QuantileTracking` applies the paper's rule with b = 1 - clipped fraction and
  gamma = 1 - ``dp-target-clipped-quantile``, i.e. C <- C exp(eta (clipped - target)).
- **Seeded noise.** Flower draws the Gaussian noise from numpy's global generator; it is
  seeded here from the run's seed (server side, once) and from (seed, round, node key) on
  the node before ``LocalDpMod`` runs, so a seeded run repeats itself.

Secure aggregation (Flower's SecAgg+: ``secaggplus_mod`` and ``SecAggPlusWorkflow``) would
hide individual updates from the server altogether; it drives the rounds through Flower's
workflow API rather than the Message-API strategies used here, and is not wired in.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
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
from fedul_flwr.data.sources import node_key

__all__ = ["DP_MODES", "local_dp_mod", "with_server_dp"]

DP_MODES: tuple[str, ...] = CHOICES["differential-privacy"]
"""Values of ``differential-privacy``: none, server-fixed, server-adaptive, client-local."""
_LOCAL_DP_STREAM = 0x1DB  # keeps the node's noise stream apart from its other seeded draws


class ClippableReplies:
    """Mixin for Flower's server-side DP wrappers: hand them only replies with an update to
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
        for reply in replies:
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
            if not sent:  # sat the round out: nothing to clip
                continue
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


@functools.cache
def _wrapper(base: type[Strategy]) -> type[Strategy]:
    mixins = (ClippableReplies, QuantileTracking) if base is DifferentialPrivacyServerSideAdaptiveClipping else (ClippableReplies,)
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
    if cfg.differential_privacy != "none":
        np.random.seed(cfg.seed)  # Flower's wrappers draw their noise from numpy's global generator
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
    client sends (HASSLE's partial replies included) and noised by ``LocalDpMod``; a client
    that sat the round out and failed replies pass unchanged.

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
    server_round = int(msg.content[wire.CONFIG][wire.SERVER_ROUND])
    key = node_key(context.node_config, context.node_id)
    np.random.seed(np.random.SeedSequence([cfg.seed, server_round, key, _LOCAL_DP_STREAM]).generate_state(1)[0])
    # LocalDpMod needs one ArrayRecord with the same keys in and out: show it just those
    view = Message(RecordDict({wire.ARRAYS: ArrayRecord({k: received[k] for k in sent.keys()})}),
                   dst_node_id=msg.metadata.dst_node_id, message_type=MessageType.TRAIN)  # fmt: skip

    def inner(_: Message, __: Context) -> Message:
        return Message(RecordDict({wire.ARRAYS: sent}), reply_to=view)

    out: Any = mod(view, context, inner)
    if out.has_error():
        raise RuntimeError(f"LocalDpMod failed on node {context.node_id}: {out.error.reason}")
    reply.content[wire.ARRAYS] = out.content[wire.ARRAYS]
    return reply
