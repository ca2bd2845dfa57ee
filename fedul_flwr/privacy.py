"""Differential privacy switches: Flower's DP strategy wrappers and ``LocalDpMod``'s mechanism, by config.

``differential-privacy`` selects one mechanism:

- ``server-fixed``: :class:`~flwr.serverapp.strategy.DifferentialPrivacyServerSideFixedClipping`
  (McMahan et al., "Learning Differentially Private Recurrent Language Models", ICLR 2018):
  the server clips each client's update Delta_c = w_c - w to L2 norm at most C
  (``dp-clipping-norm``), averages with equal weights, and adds Gaussian noise
  N(0, (z C / n)^2) per coordinate (z = ``dp-noise-multiplier``, n = the number of clipped
  updates). It protects the *released* global model against inference about any one client's
  participation; the server itself still sees every unclipped update.
- ``server-adaptive``: :class:`~flwr.serverapp.strategy.DifferentialPrivacyServerSideAdaptiveClipping`
  (Andrew et al., "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021): as
  above, with C tracking the update norms so that a ``dp-target-clipped-quantile`` share of
  them is clipped (geometric step ``dp-clip-norm-lr``), starting from ``dp-clipping-norm``.
- ``client-local``: the Gaussian mechanism of Flower's :class:`~flwr.clientapp.mod.LocalDpMod`
  on every node (:func:`local_dp_mod`): the client clips its own update to ``dp-clipping-norm``
  and adds Gaussian noise of standard deviation ``dp-sensitivity * sqrt(2 ln(1.25 / dp-delta)) /
  dp-epsilon`` before the reply leaves the node, so neither the server nor the network sees the
  exact update. It costs far more accuracy than central DP for the same (epsilon, delta).

Which strategies and methods a mode may run with is declared in
:mod:`fedul_flwr.strategies.contract` and checked before round 1.

The server-side wrappers are Flower's classes (construction, sampling, evaluation), their
aggregation this module's (:class:`ClippableReplies`), because Flower's, measured in
``tests/test_privacy_robustness.py`` and ``tests/test_dp_contract.py``:

- divides by the update's norm (a zero update crashed the run; a NaN one passed unclipped):
  here :func:`clip_update` leaves a zero update zero, and a non-finite update becomes a failed
  reply of its node;
- adds the noise after the strategy's server step (FedAvgM, FedOpt), where one client moves
  the release by more than C / n: here :class:`NoisedMean` adds it to the clipped mean, before
  the step;
- draws the noise from numpy's global generator: here each release draws from its own
  :func:`release_generator`, seeded from the OS CSPRNG, so no seed, record or folder of the
  run regenerates it and no global state is touched;
- moves the adaptive norm away from its target. Andrew et al. (Alg. 1) update
  C <- C exp(-eta (b - gamma)) with b the fraction of updates *not* clipped and gamma its
  target; Flower passes the fraction that *was* clipped as b (measured: 1e-3 -> 0.82e-3 in 2
  rounds when every update is clipped). :class:`QuantileTracking` applies the paper's rule,
  C <- C exp(eta (clipped - ``dp-target-clipped-quantile``)).

Fitting them to this project's messages: n is set each round to the number of updates actually
clipped (sampled clients minus the ones that sat the round out or failed); replies must carry
exactly the global arrays in their order (a guard: the contract refuses HASSLE and SCAFFOLD
under server DP before round 1); the clients' aggregated train metrics are not recorded under
server DP unless ``dp-publish-unnoised-train-metrics`` is set (they are outside the epsilon).
Under ``client-local`` uploaded scalar statistics travel as they are (declared public in
:mod:`fedul_flwr.strategies.contract`); SCAFFOLD's control variates and FedDB's APP-U are refused. Under server-side DP the run aggregates with
``aggregation-weights=uniform`` (:func:`fedul_flwr.config.server_dp_weights` sets it, with a
notice, where it was not typed; a typed ``num-examples`` is refused): z C / n on the mean gives
every client noise multiplier z only under equal weights.

The privacy spent: :func:`privacy_spent` gives (epsilon, delta) after each round, an upper
bound for the sampling the run performs (``participation``,
:mod:`fedul_flwr.strategies.participation`), recorded per round in the run's metrics and in the
summary line with the guarantee it is for (:func:`neighbours`):

- ``server-fixed`` (client-level DP of the released models), by :func:`round_event`: with every
  node training every round, neighbouring federations differ by adding or removing one client
  (the number n of updates a round averages is public) and a round is the Gaussian mechanism
  with multiplier z on the sum of the clipped updates; with a fixed-size cohort of m < N nodes,
  a removed client's place goes to another node, so the relation is replace-one (sensitivity
  2C, multiplier z / 2) with amplification by sampling m of N without replacement; with
  ``participation=poisson`` (each node with probability q, the sum divided by the fixed qN)
  it is add-or-remove with Poisson amplification. Composed by ``dp-accounting``'s RDP
  accountant. Amplification needs a cohort no one can predict: under server-side DP the
  cohort is drawn from the OS CSPRNG.
- ``client-local`` (local DP of each node's replies, neighbouring inputs are any two local data
  sets of the node): each reply is the Gaussian mechanism with standard deviation
  sigma = ``dp-sensitivity * sqrt(2 ln(1.25 / dp-delta)) / dp-epsilon`` on an update clipped to
  C, so two replies of a node differ by at most 2C in L2 norm: noise multiplier sigma / (2C),
  composed over every round by ``dp-accounting``'s RDP accountant (a node that sat rounds out
  spent less).
- Beside the composed figure both record the tight epsilon of one round's release at the
  same delta (``privacy-epsilon-round``, :func:`round_epsilon`): the analytic Gaussian
  mechanism of Balle & Wang (ICML 2018, Thm. 8) by ``dp-accounting``'s ``GaussianPrivacyLoss``,
  or the subsampled Gaussian's dominating pair (:func:`subsampled_gaussian_epsilon`). For ``client-local`` it
  is what ``dp-epsilon`` promises only in part: ``LocalDpMod``'s sigma is the classic bound,
  valid for ``dp-epsilon`` < 1; with ``dp-sensitivity`` = 2C one reply is below ``dp-epsilon``
  up to about 8.4 and above it beyond (2.2e4 at ``dp-epsilon`` = 1000).
- ``server-adaptive`` runs two Gaussian queries a round (Andrew et al., Sec. 3): the clipped
  sum with noise multiplier z_Delta and the count of clipped updates with standard deviation
  sigma_b (sensitivity 1/2 once the bits are centred, as the fraction's public denominator n
  allows; under Poisson sampling the centred sum is divided by qN, under replace-one both
  sensitivities double and the multiplier is z / 2). Together they are one Gaussian mechanism with 1 / z^2 = 1 / z_Delta^2 + 1 / (2
  sigma_b)^2, so z = ``dp-noise-multiplier`` is accounted exactly as ``server-fixed``'s and
  the update carries z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2 > z. The paper recommends
  sigma_b = m / 20 for a cohort of m clients, which needs m > 10 z (Flower's wrapper refuses the
  rest, and it was built with m = 1). Here sigma_b = ``dp-clipped-count-stddev`` when typed,
  else max(m / 20, z) with m the nodes a round samples (:func:`clipped_count_stddev`): the
  paper's value where it costs the update at most a factor 2 / sqrt(3) = 1.155 in noise, z
  below (the same factor; 5 clients at z = 1 get sigma_b = 1, a clipped-share noise of 0.2).

Secure aggregation (Flower's SecAgg+: ``secaggplus_mod`` and ``SecAggPlusWorkflow``) would
hide individual updates from the server altogether; it drives the rounds through Flower's
workflow API rather than the Message-API strategies used here, and is not wired in.
"""

from __future__ import annotations

import functools
import logging
import math
import secrets
import warnings
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
)
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.logger import log
from flwr.supercore.differential_privacy import compute_stdv, get_norm
from flwr.serverapp.strategy import (
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
    Strategy,
)

from fedul_flwr import wire
from fedul_flwr.config import CHOICES, RunConfig, config_from_json
from fedul_flwr.console import PROGRESS
from fedul_flwr.strategies.admission import failed_reply

__all__ = [
    "ACCOUNTED_MODES", "DP_MODES", "SERVER_MODES", "NoisedMean", "NonFiniteUpdateError", "add_noise", "check_numbers",
    "clip_update", "clipped_count_stddev", "composed_epsilon", "expected_cohort", "local_dp_mod", "neighbours",
    "privacy_spent", "release_generator", "round_epsilon", "round_event", "sample_size", "subsampled_gaussian_epsilon",
    "update_noise_multiplier", "with_server_dp",
]  # fmt: skip

DP_MODES: tuple[str, ...] = CHOICES["differential-privacy"]
"""Values of ``differential-privacy``: none, server-fixed, server-adaptive, client-local."""
SERVER_MODES: tuple[str, ...] = ("server-fixed", "server-adaptive")
"""Values of ``differential-privacy`` whose noise the server adds (Flower's DP strategy wrappers)."""
ACCOUNTED_MODES: tuple[str, ...] = (*SERVER_MODES, "client-local")
"""Values of ``differential-privacy`` whose (epsilon, delta) a run records."""
_ENTROPY_BITS = 256  # from the OS CSPRNG, seed of one release's generator


def release_generator() -> np.random.Generator:
    """A fresh generator for one release's noise: numpy's ``Generator`` on ``PCG64``, seeded with
    256 bits of the operating system's CSPRNG (:func:`secrets.randbits`, i.e. ``os.urandom``).

    No state is shared with numpy's global generator or with any other release, and nothing the
    run keeps (its ``seed``, records, folder) can regenerate the draws. PCG64 itself is not a
    cryptographic generator: its 256-bit seed, drawn per release and never stored, is what no
    one can know.
    """
    return np.random.Generator(np.random.PCG64(secrets.randbits(_ENTROPY_BITS)))


def add_noise(arrays: list[np.ndarray], std: float, generator: np.random.Generator) -> list[np.ndarray]:
    """``arrays`` plus i.i.d. Gaussian noise N(0, std^2) per coordinate, each array in its own dtype.

    Parameters
    ----------
    arrays : list[np.ndarray]
        Any shapes (float arrays; an integer array gets the noise rounded away by the cast, as
        Flower's ``add_gaussian_noise_inplace`` does).
    std : float
        Standard deviation (>= 0), in the arrays' units.
    generator : np.random.Generator
        Where the noise comes from (:func:`release_generator`).

    Returns
    -------
    list[np.ndarray]
        New arrays; ``arrays`` are left as they are.
    """
    return [a + generator.normal(0.0, std, a.shape).astype(a.dtype) for a in arrays]


def clip_update(update: list[np.ndarray], clipping_norm: float) -> tuple[list[np.ndarray], bool]:
    """An update scaled to L2 norm at most C (the flat clip of McMahan et al., ICLR 2018):
    Delta min(1, C / ||Delta||), the norm taken over every array together (Flower's ``get_norm``).

    A zero update stays zero (Flower's clipping divides by its norm).

    Parameters
    ----------
    update : list[np.ndarray]
        The update's arrays, finite (:class:`NonFiniteUpdateError` otherwise).
    clipping_norm : float
        C > 0, in the update's units.

    Returns
    -------
    (list[np.ndarray], bool)
        The clipped arrays (new ones, same dtypes) and whether they were scaled down.

    Raises
    ------
    NonFiniteUpdateError
        If an array holds NaN or an infinity: there is no norm to clip to.
    """
    bad = sum(int(np.size(a) - np.count_nonzero(np.isfinite(a))) for a in update)
    if bad:
        total = sum(int(np.size(a)) for a in update)
        raise NonFiniteUpdateError(f"the update holds {bad} non-finite values (NaN or inf) of {total}: no norm to clip to")
    norm = get_norm([np.asarray(a, dtype=np.float64) for a in update])
    if norm <= clipping_norm:
        return [np.array(a, copy=True) for a in update], False
    scale = clipping_norm / norm
    return [(np.asarray(a, dtype=np.float64) * scale).astype(np.asarray(a).dtype) for a in update], True


class NonFiniteUpdateError(ValueError):
    """A reply's model update holds NaN or an infinity (:func:`clip_update`); under DP the
    reply counts as a failed one of its node."""


def noise_multiplier(cfg: RunConfig) -> float:
    """The noise multiplier of one round's Gaussian mechanism (noise standard deviation over the
    largest L2 distance between two neighbouring inputs' outputs), unitless.

    ``server-fixed``: z = ``dp-noise-multiplier`` (Flower adds N(0, (z C / n)^2) to the average
    of n updates clipped to C, i.e. N(0, (z C)^2) to their sum, which one client changes by at
    most C). ``server-adaptive``: the same z, of the update and clipped-count queries together
    (:func:`clipped_count_stddev`). ``client-local``: ``LocalDpMod``'s sigma = ``dp-sensitivity``
    sqrt(2 ln(1.25 / dp-delta)) / ``dp-epsilon`` over 2C, the largest distance between two
    updates clipped to C.

    Raises
    ------
    ValueError
        For ``none``.
    """
    if cfg.differential_privacy in SERVER_MODES:
        return cfg.dp_noise_multiplier
    if cfg.differential_privacy == "client-local":
        sigma = cfg.dp_sensitivity * math.sqrt(2 * math.log(1.25 / cfg.dp_delta)) / cfg.dp_epsilon
        return sigma / (2 * cfg.dp_clipping_norm)
    raise ValueError(f"differential-privacy={cfg.differential_privacy!r} is not accounted (only {ACCOUNTED_MODES})")


def sample_size(cfg: RunConfig, num_nodes: int) -> int:
    """Nodes that train in a ``participation=fixed-size`` round, as Flower's FedAvg samples them
    (without replacement): max(int(N * ``fraction-train``), ``min-train-nodes``) of the N nodes,
    at most N (>= 1)."""
    return max(1, min(num_nodes, max(int(num_nodes * cfg.fraction_train), cfg.min_train_nodes)))


def expected_cohort(cfg: RunConfig, num_nodes: int) -> float:
    """The nodes a round trains on average: qN for ``participation=poisson`` (q =
    ``fraction-train``; the fixed divisor of the noised sum under server-side DP), else
    :func:`sample_size`. In nodes, > 0 for N >= 1."""
    if cfg.participation == "poisson":
        return cfg.fraction_train * max(1, num_nodes)
    return float(sample_size(cfg, num_nodes))


def neighbours(cfg: RunConfig, num_nodes: int) -> str:
    """What the recorded epsilon guarantees, as the summary line names it (``neighbours=...``):
    whom it protects, the neighbouring relation and the sampling it credits.

    - ``client-local``: ``local,any-two-datasets-of-a-node``;
    - server-side DP, ``participation=poisson``:
      ``client-level,add-or-remove-one-client,poisson(q)``;
    - server-side DP, a fixed-size cohort of m < N nodes:
      ``client-level,replace-one-client,sampled-without-replacement(m/N)``;
    - server-side DP, every node every round (m = N):
      ``client-level,add-or-remove-one-client,every-client-every-round``.

    ``""`` without DP.
    """
    mode = cfg.differential_privacy
    if mode == "client-local":
        return "local,any-two-datasets-of-a-node"
    if mode not in SERVER_MODES:
        return ""
    population = max(1, num_nodes)
    if cfg.participation == "poisson":
        return f"client-level,add-or-remove-one-client,poisson({cfg.fraction_train:g})"
    cohort = sample_size(cfg, population)
    if cohort < population:
        return f"client-level,replace-one-client,sampled-without-replacement({cohort}/{population})"
    return "client-level,add-or-remove-one-client,every-client-every-round"


MAX_NOISE_STD = 1e30
"""The largest noise standard deviation on the sum of updates (z C) a server-side DP run
accepts: far beyond it the noised float32 model overflows (its largest value is 3.4e38), and
long before it no model survives the noise."""
MAX_CLIP_NORM_LR = 10.0
"""The largest ``dp-clip-norm-lr``: C changes by up to exp(eta) per round (Andrew et al. use
eta = 0.2; at 10, a factor 2.2e4 per round)."""
MIN_POISSON_RATE = 1e-12
"""The smallest ``fraction-train`` q of ``participation=poisson`` under server-side DP:
``dp-accounting`` computes the subsampled Gaussian's epsilon only while 1 - q differs from 1 in
floating point (it fails below about 1e-16); far below, a round samples nobody anyway."""


def check_numbers(cfg: RunConfig) -> None:
    """Refuse DP settings the run could not compute with: every value finite, the noise within
    :data:`MAX_NOISE_STD`, ``dp-clip-norm-lr`` at most :data:`MAX_CLIP_NORM_LR`, and an epsilon
    the accountant computes (``dp-accounting`` overflows for multipliers beyond about 1e200 or
    below 1e-200). A no-op without DP.

    Raises
    ------
    ValueError
        One line naming the key and the value.
    """
    mode = cfg.differential_privacy
    if mode == "none":
        return
    d = cfg.as_dict()
    keys = {"server-fixed": ("dp-noise-multiplier", "dp-clipping-norm", "dp-delta"),
            "server-adaptive": ("dp-noise-multiplier", "dp-clipping-norm", "dp-delta", "dp-clip-norm-lr",
                                "dp-clipped-count-stddev"),
            "client-local": ("dp-epsilon", "dp-sensitivity", "dp-clipping-norm", "dp-delta")}[mode]  # fmt: skip
    for key in keys:
        if not math.isfinite(d[key]):
            raise ValueError(f"{key}={d[key]} must be a finite number")
    if mode in SERVER_MODES and cfg.dp_noise_multiplier * cfg.dp_clipping_norm > MAX_NOISE_STD:
        raise ValueError(
            f"dp-noise-multiplier={cfg.dp_noise_multiplier:g} x dp-clipping-norm={cfg.dp_clipping_norm:g}: noise of "
            f"standard deviation above {MAX_NOISE_STD:g} on the sum of updates overflows the model's float32 weights"
        )
    if mode == "server-adaptive" and cfg.dp_clip_norm_lr > MAX_CLIP_NORM_LR:
        raise ValueError(f"dp-clip-norm-lr={cfg.dp_clip_norm_lr:g} must be at most {MAX_CLIP_NORM_LR:g} (C changes by "
                         "up to exp(dp-clip-norm-lr) per round; Andrew et al. use 0.2)")  # fmt: skip
    if mode in SERVER_MODES and cfg.participation == "poisson" and 0 < cfg.fraction_train < MIN_POISSON_RATE:
        raise ValueError(f"fraction-train={cfg.fraction_train:g} with participation='poisson' and differential-privacy="
                         f"{mode!r}: the accountant (dp-accounting) computes no epsilon for a sampling rate below "
                         f"{MIN_POISSON_RATE:g}; give fraction-train >= {MIN_POISSON_RATE:g}")  # fmt: skip
    key = "dp-epsilon" if mode == "client-local" else "dp-noise-multiplier"
    try:
        with warnings.catch_warnings():  # dp-accounting's overflow warnings: the refusal below is the one line
            warnings.simplefilter("ignore")
            if mode == "server-adaptive":
                update_noise_multiplier(cfg.dp_noise_multiplier, clipped_count_stddev(cfg, 1))
            spent = privacy_spent(cfg, 1, 1)
    except (ArithmeticError, ValueError) as exc:
        raise ValueError(f"{key}={d[key]:g}: the accountant cannot compute its epsilon ({type(exc).__name__}: {exc})") from None
    if not all(math.isfinite(v) and v >= 0 for v in spent.values()):
        raise ValueError(f"{key}={d[key]:g}: the accountant gives no finite epsilon for it ({spent})")


def clipped_count_stddev(cfg: RunConfig, cohort: int) -> float:
    """sigma_b, the standard deviation of the noise on ``server-adaptive``'s count of clipped
    updates (Andrew et al., NeurIPS 2021, Sec. 3), in updates.

    ``dp-clipped-count-stddev`` when typed (> 0), else max(m / 20, z) for a cohort of m nodes
    and z = ``dp-noise-multiplier``: the paper's m / 20 where it leaves the update's noise
    multiplier :func:`update_noise_multiplier` within a factor 2 / sqrt(3) of z, and z below
    (0 for z = 0).

    Parameters
    ----------
    cfg : RunConfig
        Uses ``dp-clipped-count-stddev`` and ``dp-noise-multiplier``.
    cohort : float
        m, the nodes a round samples (:func:`sample_size`), or qN under Poisson sampling
        (:func:`expected_cohort`), > 0.
    """
    if cfg.dp_clipped_count_stddev > 0:
        return cfg.dp_clipped_count_stddev
    if cfg.dp_noise_multiplier <= 0:  # no noise in either query (the checks refuse z = 0 to users)
        return 0.0
    return max(cohort / 20, cfg.dp_noise_multiplier)


def update_noise_multiplier(z: float, count_stddev: float) -> float:
    """z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2, the noise multiplier of ``server-adaptive``'s
    clipped sum that, composed with the clipped count's noise sigma_b (sensitivity 1/2), makes
    one Gaussian mechanism of multiplier z (Andrew et al., NeurIPS 2021, Thm. 1; Flower's
    ``compute_adaptive_noise_params``). Unitless; 0 for z = 0 (no noise).

    Raises
    ------
    ValueError
        If 2 sigma_b <= z: the count alone would spend more than the whole budget.
    """
    if z <= 0:
        return 0.0
    if 2 * count_stddev <= z:
        raise ValueError(f"the clipped count's noise sigma_b={count_stddev:g} must exceed z/2={z / 2:g}")
    return float((z**-2 - (2 * count_stddev) ** -2) ** -0.5)


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


def subsampled_gaussian_epsilon(multiplier: float, rate: float, delta: float) -> float:
    """The epsilon at ``delta`` of one subsampled Gaussian mechanism: the privacy profile of its
    dominating pair P = (1 - q) N(0, s^2) + q N(1, s^2) against Q = N(0, s^2) (s = ``multiplier``,
    the noise over the sensitivity; q = ``rate``), in both directions (P against Q and Q
    against P), the larger. It is the tight one-round epsilon of Poisson sampling under
    add-or-remove-one adjacency (Zhu, Dong & Wang, AISTATS 2022, Sec. 5), and of sampling m of
    N without replacement under replace-one adjacency with q = m / N and s = z / 2 (Balle,
    Barthe & Gaboardi, NeurIPS 2018, Thm. 10): the pair in which the replaced client's update
    moves the sum by 2C whenever it is sampled.

    The privacy loss ln(P / Q)(x) = ln(1 - q + q exp((2x - 1) / (2 s^2))) is increasing in x, so
    delta(epsilon) = P(L > epsilon) - e^epsilon Q(L > epsilon) is a difference of normal tails
    (log-space, :func:`scipy.special.log_ndtr`), solved for epsilon by Brent's method to 1e-9.

    Parameters
    ----------
    multiplier : float
        s > 0, unitless.
    rate : float
        q in (0, 1]; 1 gives the Gaussian mechanism (:func:`gaussian_epsilon`'s figure).
    delta : float
        In (0, 1).

    Returns
    -------
    float
        epsilon >= 0; ``inf`` for no noise.
    """
    from scipy.optimize import brentq
    from scipy.special import log_ndtr

    if multiplier <= 0:
        return math.inf
    q, var = float(rate), float(multiplier) ** 2

    def log_gap(a: float, b: float) -> float:  # log(exp(a) - exp(b)), -inf where b >= a
        return a + math.log(-math.expm1(b - a)) if b < a else -math.inf

    def profile(eps: float) -> float:
        # P against Q: the loss exceeds eps where x > x_hi
        log_t = eps + math.log1p(-(1 - q) * math.exp(-eps)) - math.log(q)  # ln((e^eps - (1 - q)) / q)
        x_hi = var * log_t + 0.5
        remove = math.log(q) + log_gap(float(log_ndtr((1 - x_hi) / multiplier)),
                                       log_t + float(log_ndtr(-x_hi / multiplier)))  # fmt: skip
        # Q against P: the loss exceeds eps where x < x_lo (only while e^-eps > 1 - q)
        add = -math.inf
        if math.exp(-eps) > 1 - q:
            u = (math.exp(-eps) - (1 - q)) / q
            x_lo = var * math.log(u) + 0.5
            add = math.log(q) + eps + log_gap(math.log(u) + float(log_ndtr(x_lo / multiplier)),
                                              float(log_ndtr((x_lo - 1) / multiplier)))  # fmt: skip
        return max(remove, add)

    target = math.log(delta)
    if profile(0.0) <= target:
        return 0.0
    high = 1.0
    while profile(high) > target:
        high *= 2
    return float(brentq(lambda e: profile(e) - target, high / 2 if high > 1 else 0.0, high, xtol=1e-9, rtol=1e-12))


def round_event(cfg: RunConfig, num_nodes: int) -> tuple[Any, Any]:
    """One round of the run as ``dp-accounting`` models it: the event and its neighbouring
    relation (see :func:`neighbours`).

    - ``client-local``: ``GaussianDpEvent(sigma / (2C))`` (:func:`noise_multiplier`), no
      sampling (a node knows whether it replied);
    - server-side DP, ``participation=poisson``: ``PoissonSampledDpEvent(q,
      GaussianDpEvent(z))`` under ``ADD_OR_REMOVE_ONE``: a client moves the sum of the clipped
      updates by at most C, the divisor qN is fixed (DP-FedAvg, McMahan et al., ICLR 2018);
    - server-side DP, a fixed-size cohort of m < N nodes: ``SampledWithoutReplacementDpEvent(N,
      m, GaussianDpEvent(z / 2))`` under ``REPLACE_ONE``: the federation keeps its N nodes, so
      a neighbour replaces one client's data, which moves the sum by up to 2C; the noise z C
      on the sum is multiplier z / 2 of that sensitivity (Wang, Balle & Kasiviswanathan,
      AISTATS 2019, Thm. 27, in ``dp-accounting``'s RDP accountant);
    - server-side DP, every node every round: ``GaussianDpEvent(z)`` under
      ``ADD_OR_REMOVE_ONE`` (the number of updates a round averages is public).

    ``server-adaptive``'s two queries are one Gaussian mechanism of multiplier z (the module
    doc); under replace-one both sensitivities double (2C for the sum, 1 for the centred
    count), so it is z / 2 there too.

    Parameters
    ----------
    cfg : RunConfig
        Uses ``differential-privacy``, ``participation``, ``fraction-train``,
        ``min-train-nodes`` and the keys of :func:`noise_multiplier`.
    num_nodes : int
        N, the nodes the rounds sample from.

    Returns
    -------
    (dp_accounting.DpEvent, dp_accounting.NeighboringRelation)

    Raises
    ------
    ValueError
        For ``none``.
    """
    import dp_accounting  # flwr[dp]; imported here: runs without DP do not need it

    multiplier = noise_multiplier(cfg)
    add_remove = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    gaussian = dp_accounting.GaussianDpEvent(multiplier)
    if cfg.differential_privacy == "client-local":
        return gaussian, add_remove
    population = max(1, num_nodes)
    if cfg.participation == "poisson":
        return dp_accounting.PoissonSampledDpEvent(cfg.fraction_train, gaussian), add_remove
    cohort = sample_size(cfg, population)
    if cohort < population:
        half = dp_accounting.GaussianDpEvent(multiplier / 2)
        return (dp_accounting.SampledWithoutReplacementDpEvent(population, cohort, half),
                dp_accounting.NeighboringRelation.REPLACE_ONE)  # fmt: skip
    return gaussian, add_remove


def composed_epsilon(cfg: RunConfig, rounds: int, num_nodes: int) -> float:
    """Epsilon at ``dp-delta`` of ``rounds`` rounds: ``dp-accounting``'s Rényi DP accountant
    on :func:`round_event`, composed ``rounds`` times (an upper bound). For a fixed-size cohort
    the smaller of the sampled bound and the unsampled replace-one Gaussian's (z / 2), both
    valid: at small z the sampling bound of Wang et al. exceeds the unsampled one. ``inf`` for
    no noise, 0 for no round.

    Parameters
    ----------
    cfg : RunConfig
        As :func:`round_event`, and ``dp-delta``.
    rounds : int
        Rounds done (>= 0).
    num_nodes : int
        N, the nodes the rounds sample from.
    """
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    if rounds <= 0:
        return 0.0
    if noise_multiplier(cfg) <= 0:
        return math.inf
    event, relation = round_event(cfg, num_nodes)
    accountant = RdpAccountant(neighboring_relation=relation)
    absl = logging.getLogger("absl")  # fractional orders of a subsampled event that do not converge are
    level = absl.level  # left out of the bound (still valid) with a warning per order and call: kept quiet
    absl.setLevel(logging.ERROR)
    try:
        accountant.compose(event, rounds)
        epsilon = float(accountant.get_epsilon(cfg.dp_delta))
        if isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent):
            # at small multipliers Wang et al.'s bound exceeds the unsampled mechanism's; both hold
            plain = RdpAccountant(neighboring_relation=relation)
            plain.compose(event.event, rounds)
            epsilon = min(epsilon, float(plain.get_epsilon(cfg.dp_delta)))
        return epsilon
    finally:
        absl.setLevel(level)


def round_epsilon(cfg: RunConfig, num_nodes: int) -> float:
    """The tight epsilon at ``dp-delta`` of one round's release (``privacy-epsilon-round``):
    the Gaussian mechanism's (:func:`gaussian_epsilon`) where a round samples nothing
    (``client-local``; every node every round), else the subsampled Gaussian's
    (:func:`subsampled_gaussian_epsilon`): q = ``fraction-train`` and z under Poisson
    sampling, q = m / N and z / 2 for a fixed-size cohort of m < N (:func:`round_event`)."""
    multiplier = noise_multiplier(cfg)
    if cfg.differential_privacy in SERVER_MODES:
        population = max(1, num_nodes)
        if cfg.participation == "poisson" and cfg.fraction_train < 1:
            return subsampled_gaussian_epsilon(multiplier, cfg.fraction_train, cfg.dp_delta)
        cohort = sample_size(cfg, population)
        if cfg.participation != "poisson" and cohort < population:
            return subsampled_gaussian_epsilon(multiplier / 2, cohort / population, cfg.dp_delta)
    return gaussian_epsilon(multiplier, cfg.dp_delta)


def privacy_spent(cfg: RunConfig, rounds: int, num_nodes: int) -> dict[str, float]:
    """(epsilon, delta) spent after ``rounds`` rounds, and the tight epsilon of one round.

    Parameters
    ----------
    cfg : RunConfig
        Uses ``differential-privacy``, the DP keys of :func:`noise_multiplier`, ``dp-delta``
        (the delta the epsilons are given at), ``participation``, ``fraction-train`` and
        ``min-train-nodes``.
    rounds : int
        Rounds done (>= 0).
    num_nodes : int
        N, the nodes the rounds sample from.

    Returns
    -------
    dict
        ``{"privacy-epsilon": eps, "privacy-epsilon-round": eps_1, "privacy-delta": delta}``:
        eps the composed upper bound of :func:`composed_epsilon` (0 at round 0), eps_1 the
        tight epsilon of one round's release (:func:`round_epsilon`; 0 at round 0, before any
        release); ``{}`` when the run's mode is not accounted.
    """
    if cfg.differential_privacy not in ACCOUNTED_MODES:
        return {}
    return {
        wire.PRIVACY_EPSILON: composed_epsilon(cfg, rounds, num_nodes),
        wire.PRIVACY_EPSILON_ROUND: _round_epsilon(cfg, num_nodes) if rounds > 0 else 0.0,
        wire.PRIVACY_DELTA: cfg.dp_delta,
    }


@functools.lru_cache(maxsize=64)
def _round_epsilon(cfg: RunConfig, num_nodes: int) -> float:
    return round_epsilon(cfg, num_nodes)  # the same every round: computed once per run


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


def _run_config(msg: Message) -> RunConfig | None:
    config = msg.content.config_records.get(wire.CONFIG)
    text = None if config is None else config.get(wire.RUN_CONFIG)
    return config_from_json(text) if isinstance(text, str) else None


def local_dp_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Client-side mod for ``differential-privacy=client-local`` (a pass-through otherwise): the
    Gaussian mechanism of Flower's ``LocalDpMod`` on the train reply, with its clipping and its
    sigma = ``dp-sensitivity`` sqrt(2 ln(1.25 / dp-delta)) / ``dp-epsilon``, the noise drawn from
    :func:`release_generator`.

    The update (reply minus the received copy of exactly the models the client sends, HASSLE's
    partial replies included) is clipped to ``dp-clipping-norm`` (:func:`clip_update`: a zero
    update stays zero), added back to the received arrays and noised; a client that sat the
    round out and failed replies pass unchanged.

    Raises
    ------
    NonFiniteUpdateError
        If the update holds NaN or an infinity (the ClientApp replies with the error, so the
        server records a failed reply of this node).
    """
    cfg = _run_config(msg) if msg.metadata.message_type == MessageType.TRAIN else None
    if cfg is None or cfg.differential_privacy != "client-local":
        return call_next(msg, context)
    reply = call_next(msg, context)
    if reply.has_error() or not len(reply.content[wire.ARRAYS]):
        return reply
    sent = reply.content[wire.ARRAYS]
    received = msg.content[wire.ARRAYS]
    keys = list(sent.keys())
    base = [received[k].numpy() for k in keys]
    try:
        clipped, _ = clip_update([np.subtract(sent[k].numpy(), b) for k, b in zip(keys, base, strict=True)],
                                 cfg.dp_clipping_norm)  # fmt: skip
    except NonFiniteUpdateError as exc:
        raise NonFiniteUpdateError(f"node {context.node_id}: {exc}") from None
    sigma = cfg.dp_sensitivity * math.sqrt(2 * math.log(1.25 / cfg.dp_delta)) / cfg.dp_epsilon
    noisy = add_noise([b + c for b, c in zip(base, clipped, strict=True)], sigma, release_generator())
    reply.content[wire.ARRAYS] = ArrayRecord({k: Array(np.asarray(v)) for k, v in zip(keys, noisy, strict=True)})
    return reply
