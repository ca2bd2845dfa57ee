"""Server-side DP (``server-fixed``, ``server-adaptive``): Flower's DP strategy wrappers with this
project's aggregation (:class:`ClippableReplies`: the clip of :func:`~fedul_flwr.privacy.mechanism.clip_update`,
non-finite updates as failed replies), the noise on the clipped mean (:class:`NoisedMean`) and
the adaptive norm of Andrew et al. (:class:`QuantileTracking`), built by :func:`with_server_dp`.
The overview is :mod:`fedul_flwr.privacy`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp.strategy import (
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
    Strategy,
)
from flwr.supercore.differential_privacy import compute_stdv

from fedul_flwr import wire
from fedul_flwr.config import RunConfig
from fedul_flwr.console import PROGRESS
from fedul_flwr.privacy.accounting import clipped_count_stddev, expected_cohort, update_noise_multiplier
from fedul_flwr.privacy.mechanism import NonFiniteUpdateError, add_noise, clip_update, release_generator
from fedul_flwr.strategies.admission import failed_reply

__all__ = ["ClippableReplies", "NoisedMean", "QuantileTracking", "with_server_dp"]


class NoisedMean:
    """Mixin for Flower's FedAvg, placed right above it in the strategy's MRO
    (:func:`fedul_flwr.strategies.strict`): server-side DP's Gaussian noise goes on the mean of
    the clipped updates that ``FedAvg.aggregate_train`` computes, *before* a subclass takes its
    server step on it (FedAvgM's momentum, FedAdam / FedAdagrad / FedYogi's adaptive step).

    The mean of n updates clipped to C, with equal weights, moves by at most C / n when one
    client is added or removed; N(0, (z C / n)^2) per coordinate makes it the Gaussian
    mechanism with noise multiplier z, and the server step, a function of the noised mean and
    the server's own state only, is post-processing (DP-FedAvg with server momentum, McMahan et
    al., ICLR 2018, Alg. 1; adaptive server optimizers, Reddi et al., ICLR 2021, Alg. 2). Flower's
    wrappers add the noise after the step instead, where one client's influence is the step's.

    Attributes
    ----------
    dp_noise_std : float | None
        The standard deviation z C / n of this round's noise, set by the DP wrapper before each
        aggregation (:class:`ClippableReplies`); ``None``: no noise (no server-side DP).
    dp_release : ArrayRecord | None
        The latest noised mean (what the epsilon covers), ``None`` before the first.
    """

    dp_noise_std: float | None = None
    dp_release: ArrayRecord | None = None
    dp_empty_mean: ArrayRecord | None = None
    """``participation=poisson``: the global arrays, set by the DP wrapper for a round that kept
    no update, whose release is the global model plus the noise."""

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        arrays, metrics = super().aggregate_train(server_round, replies)  # type: ignore[misc]
        if arrays is None and self.dp_empty_mean is not None:  # Poisson: no update kept, the mean is w itself
            arrays = self.dp_empty_mean
        if arrays is None or self.dp_noise_std is None:
            return arrays, metrics
        noisy = add_noise(arrays.to_numpy_ndarrays(), self.dp_noise_std, release_generator())
        if not all(np.isfinite(a).all() for a in noisy):
            raise FloatingPointError(f"round {server_round}: the noised model holds non-finite values (noise of standard "
                                     f"deviation {self.dp_noise_std:.3g} per coordinate): lower dp-noise-multiplier")  # fmt: skip
        arrays = ArrayRecord({k: Array(np.asarray(v)) for k, v in zip(arrays.keys(), noisy, strict=True)})
        # a copy: the server step may empty the record it is handed (FedAvgM does)
        self.dp_release = ArrayRecord({k: Array(np.array(v)) for k, v in zip(arrays.keys(), noisy, strict=True)})
        return arrays, metrics


def _scaled_update(reply: Message, current: list[np.ndarray], keys: list[str], scale: float) -> Message:
    """``reply`` with its arrays w + scale (w_c - w), w the global arrays ``current`` (in
    ``keys``' order): its update scaled, in place."""
    sent = reply.content[wire.ARRAYS].to_numpy_ndarrays()
    reply.content[wire.ARRAYS] = ArrayRecord(
        {k: Array(np.asarray((c + scale * (np.asarray(x, dtype=np.float64) - c)).astype(np.asarray(x).dtype)))
         for k, c, x in zip(keys, current, sent, strict=True)}  # fmt: skip
    )
    return reply


class ClippableReplies:
    """Mixin for Flower's server-side DP wrappers: their aggregation, done so that it holds for
    every reply and every accepted strategy.

    Per round: every reply goes through the strategy's door first
    (:mod:`fedul_flwr.strategies.admission`, with whole-model replies required): a malformed
    one (wrong shape or dtype, missing or extra arrays or records, no metrics, a weight that is
    not a finite number > 0) becomes a failed reply of its node (``MalformedReplyError``); a
    reply whose update (reply minus global arrays) holds NaN or an infinity becomes one too
    (``NonFiniteUpdateError``), both on record with the round's other failures; every kept
    reply then weighs 1 whatever weight it claims (its weight metrics are set to 1: the mean is
    the uniform one the noise z C / n is for); the strict strategy's ``screen`` applies the
    failure limits and leaves out the
    clients that had nothing to train; every remaining update is clipped to L2 norm C
    (:func:`clip_update`: a zero update stays zero); ``num_sampled_clients``, the noise's
    divisor n, is set to their number; the adaptive wrapper updates C from the noisy clipped
    count; the strategy aggregates with the noise z C / n added to the mean before any server
    step (:class:`NoisedMean`, C the norm the updates were clipped to). The aggregated client
    metrics (the train loss, ...) are returned and recorded only with
    ``dp-publish-unnoised-train-metrics=true``: they are outside the epsilon.

    Raises
    ------
    RuntimeError
        If the strategy aggregated without the noise (one whose aggregation never reaches
        FedAvg's mean).
    """

    current_arrays: ArrayRecord
    num_sampled_clients: int
    clipping_norm: float
    expected_cohort: float | None = None
    """``participation=poisson``: qN, the fixed divisor of the noised sum (DP-FedAvg); ``None``:
    the number of updates kept (a fixed-size cohort)."""
    noise_multiplier: float
    publish_train_metrics: bool = False
    last_clipping_norm: float | None = None
    """C of the latest aggregation (``server-adaptive``: set by earlier rounds' noisy counts, so
    publishing it is post-processing)."""

    def _clip(self, reply: Message, current: list[np.ndarray], expected: list[str]) -> None:
        """Clip ``reply``'s update in place (an admitted reply: every global array, in order).

        Raises
        ------
        NonFiniteUpdateError
            If the update holds NaN or an infinity.
        """
        if reply.has_error() or not len(reply.content[wire.ARRAYS]):
            return
        sent = [reply.content[wire.ARRAYS][k].numpy() for k in expected]
        clipped, was_clipped = clip_update([np.subtract(x, y) for x, y in zip(sent, current, strict=True)],
                                           self.clipping_norm)  # fmt: skip
        reply.content[wire.ARRAYS] = ArrayRecord(
            {k: Array(np.asarray(c + u)) for k, c, u in zip(expected, current, clipped, strict=True)}
        )
        self._clipped += int(was_clipped)

    @staticmethod
    def _weigh_one(reply: Message, keys: Iterable[str]) -> Message:
        """``reply`` with each weight metric in ``keys`` set to 1: under server-side DP no
        reply weighs more than another, whatever it claims."""
        name, metrics = next(iter(reply.content.metric_records.items()))  # the one the door admitted
        reply.content[name] = MetricRecord({**metrics, **{k: 1.0 for k in keys}})
        return reply

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        inner: Any = self.strategy  # type: ignore[attr-defined]
        expected = list(self.current_arrays.keys())
        current = self.current_arrays.to_numpy_ndarrays()
        instructions = {m.metadata.message_id: m for m in getattr(inner, "_instructions", [])}
        self._clipped = 0
        checked = []
        for reply in inner.admit(server_round, replies):  # the one door: malformed replies fail here
            try:
                self._clip(reply, current, expected)
                checked.append(reply)
            except NonFiniteUpdateError as exc:
                log(WARNING, "round %d: node %d: %s; its reply counts as failed", server_round,
                    reply.metadata.src_node_id, exc)  # fmt: skip
                instruction = instructions.get(reply.metadata.reply_to_message_id)
                why = NonFiniteUpdateError(f"node {reply.metadata.src_node_id}: {exc}")
                checked.append(failed_reply(reply, instruction, why))
        weights = {inner.weighted_by_key, wire.UNIFORM_WEIGHT, *getattr(inner, "model_weight_keys", {}).values()}
        screened = inner.screen(server_round + getattr(inner, "round_offset", 0), checked)  # failures on record first
        kept = []
        for reply in screened:
            if reply.has_error():
                log(INFO, "round %d: node %d failed (%s); its reply is left out", server_round,
                    reply.metadata.src_node_id, reply.error.reason)  # fmt: skip
                continue
            kept.append(self._weigh_one(reply, weights))
        self.num_sampled_clients = max(1, len(kept))
        clipping_norm = self.clipping_norm  # the norm this round's updates were clipped to
        self.last_clipping_norm = clipping_norm
        cohort = self.expected_cohort  # Poisson: the fixed divisor qN; None: the n updates kept
        if hasattr(self, "_geometric_update") and cohort is not None:  # the adaptive wrapper, Poisson
            self._geometric_update(self._noisy_centred_fraction(self._clipped, len(kept), cohort))  # type: ignore[attr-defined]
        elif kept and hasattr(self, "_geometric_update"):  # the adaptive wrapper
            self._geometric_update(self._noisy_fraction(self._clipped, len(kept)))  # type: ignore[attr-defined]
        if cohort is not None:  # FedAvg's mean of the k kept is w + sum / k: rescaled to w + sum / (qN)
            kept = [_scaled_update(reply, current, expected, len(kept) / cohort) for reply in kept]
        inner.dp_noise_std = compute_stdv(self.noise_multiplier, clipping_norm, cohort or self.num_sampled_clients)
        inner.dp_release = None
        # Poisson: a round that kept no update releases the global model plus the noise (a sum of nothing)
        inner.dp_empty_mean = self.current_arrays if cohort is not None and not kept else None
        try:
            arrays, metrics = inner.aggregate_train(server_round, kept)
        finally:
            inner.dp_empty_mean = None
        if arrays is not None and inner.dp_release is None:
            raise RuntimeError(f"round {server_round}: {type(inner).__name__} aggregated without server-side DP's "
                               "noise (its aggregation does not take FedAvg's mean)")  # fmt: skip
        if not self.publish_train_metrics:  # unnoised client statistics stay on the server
            inner.last_train_metrics = None
            metrics = None
        return arrays, metrics


class QuantileTracking:
    """Mixin for Flower's adaptive-clipping wrapper: the clipping-norm update of Andrew et al.
    (NeurIPS 2021, Alg. 1), C <- C exp(-eta (b - gamma)), with b = 1 - (clipped fraction) and
    gamma = 1 - q (q = ``dp-target-clipped-quantile``), i.e. C <- C exp(eta (clipped - q)):
    C grows while more than a share q of the updates is clipped and shrinks otherwise. The
    clipped count's noise N(0, sigma_b^2) comes from :func:`release_generator`."""

    clipping_norm: float
    clip_norm_lr: float
    target_clipped_quantile: float
    clipped_count_stddev: float

    def _geometric_update(self, clipped_fraction: float) -> None:
        try:
            updated = self.clipping_norm * math.exp(self.clip_norm_lr * (clipped_fraction - self.target_clipped_quantile))
        except OverflowError:
            updated = math.inf
        if not 0 < updated < math.inf:
            raise FloatingPointError(f"the adaptive clipping norm left the floating-point range ({self.clipping_norm:.3g} "
                                     f"-> {updated:.3g}): lower dp-clip-norm-lr={self.clip_norm_lr:g}")  # fmt: skip
        self.clipping_norm = updated

    def _noisy_fraction(self, count: int, total: int) -> float:
        return float(release_generator().normal(count, self.clipped_count_stddev)) / float(total)

    def _noisy_centred_fraction(self, count: int, total: int, cohort: float) -> float:
        """Poisson sampling: the clipped share as 1/2 + (sum of the centred bits b_i - 1/2 plus
        N(0, sigma_b^2)) / qN; the realised count ``total`` stays inside the noised sum (one
        client moves it by 1/2), the divisor is the expected cohort. The estimate is clamped to
        [0, 1], post-processing of the noised count: with a small expected cohort qN (a round that
        samples nobody at q = 1e-9) the unclamped share is the noise divided by qN, and one round
        would throw C out of the floating-point range."""
        noised = float(release_generator().normal(count - total / 2, self.clipped_count_stddev))
        return min(1.0, max(0.0, 0.5 + noised / cohort))


@functools.cache
def _wrapper(base: type[Strategy]) -> type[Strategy]:
    adaptive = base is DifferentialPrivacyServerSideAdaptiveClipping
    mixins = (ClippableReplies, *((QuantileTracking,) if adaptive else ()))
    return type(f"Clippable{base.__name__}", (*mixins, base), {"__module__": __name__})


def with_server_dp(strategy: FedAvg, cfg: RunConfig, num_nodes: int | None = None) -> Strategy:
    """``strategy`` wrapped in Flower's server-side DP wrapper that ``differential-privacy``
    names (``server-fixed`` or ``server-adaptive``), aggregating as :class:`ClippableReplies`
    says; ``strategy`` itself otherwise.

    Parameters
    ----------
    strategy : FedAvg
        The run's (strict) strategy, with :class:`NoisedMean` above FedAvg; the wrapper
        delegates sampling and aggregation to it.
    cfg : RunConfig
        Uses ``differential-privacy``, ``dp-noise-multiplier`` (z, unitless),
        ``dp-clipping-norm`` (C, L2 norm of a whole-model update; the initial C when
        adaptive), ``dp-target-clipped-quantile``, ``dp-clip-norm-lr``,
        ``dp-clipped-count-stddev``, ``dp-publish-unnoised-train-metrics`` and the sampling
        settings (``fraction-train``, ``min-train-nodes``).
    num_nodes : int | None
        The nodes the rounds sample from: ``server-adaptive`` sizes its clipped-count noise for
        the cohort they give (:func:`sample_size`, :func:`clipped_count_stddev`).

    Returns
    -------
    Strategy
        The wrapper (its ``.strategy`` is ``strategy``) or ``strategy``.

    Raises
    ------
    ValueError
        ``server-adaptive`` without ``num_nodes``.
    """
    if cfg.differential_privacy == "server-fixed":
        wrapper = _wrapper(DifferentialPrivacyServerSideFixedClipping)(
            strategy, noise_multiplier=cfg.dp_noise_multiplier, clipping_norm=cfg.dp_clipping_norm, num_sampled_clients=1
        )  # fmt: skip
    elif cfg.differential_privacy == "server-adaptive":
        if num_nodes is None:
            raise ValueError("server-adaptive sizes its clipped-count noise for the cohort: give num_nodes")
        cohort = expected_cohort(cfg, num_nodes)  # m, or qN under Poisson sampling
        count_stddev = clipped_count_stddev(cfg, cohort)
        update_noise_multiplier(cfg.dp_noise_multiplier, count_stddev)  # the one refusal, in this project's words
        wrapper = _wrapper(DifferentialPrivacyServerSideAdaptiveClipping)(
            strategy, noise_multiplier=cfg.dp_noise_multiplier, num_sampled_clients=max(1, math.ceil(cohort)),
            initial_clipping_norm=cfg.dp_clipping_norm, target_clipped_quantile=cfg.dp_target_clipped_quantile,
            clip_norm_lr=cfg.dp_clip_norm_lr, clipped_count_stddev=count_stddev,
        )  # fmt: skip
        PROGRESS.info("fedul-flwr: server-adaptive: cohort m=%.4g, clipped-count noise sigma_b=%.4g, update noise "
            "multiplier z_Delta=%.4g (z=%g for both queries together)", cohort, count_stddev,
            wrapper.noise_multiplier, cfg.dp_noise_multiplier)  # fmt: skip
    else:
        return strategy
    if cfg.participation == "poisson":
        if num_nodes is None:
            raise ValueError("participation='poisson' divides the noised sum by the expected cohort: give num_nodes")
        wrapper.expected_cohort = expected_cohort(cfg, num_nodes)
    wrapper.publish_train_metrics = cfg.dp_publish_unnoised_train_metrics
    strategy.whole_replies = True  # the door refuses partial replies: the update is of the whole model
    return wrapper
