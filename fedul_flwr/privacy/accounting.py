"""The privacy a run spends: the noise multiplier of a round (:func:`noise_multiplier`), the
neighbouring relation it is for (:func:`neighbours`), one round as a ``dp-accounting`` event
(:func:`round_event`), epsilon composed over the rounds (:func:`composed_epsilon`) and of one
round (:func:`round_epsilon`), what a run records (:func:`privacy_spent`), and the limits on the
numbers a DP run may type (:func:`check_numbers`). The overview, with the guarantees and the
papers, is :mod:`fedul_flwr.privacy`.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from typing import Any

from fedul_flwr import wire
from fedul_flwr.config import RunConfig
from fedul_flwr.privacy.mechanism import ACCOUNTED_MODES, SERVER_MODES

__all__ = [
    "MAX_CLIP_NORM_LR", "MAX_NOISE_STD", "MIN_POISSON_RATE", "check_numbers", "clipped_count_stddev", "composed_epsilon",
    "expected_cohort", "gaussian_epsilon", "neighbours", "noise_multiplier", "privacy_spent", "round_epsilon",
    "round_event", "sample_size", "subsampled_gaussian_epsilon", "update_noise_multiplier",
]  # fmt: skip


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
    from dp_accounting.pld import common  # deferred: import cost of dp_accounting (seconds), paid only by a DP run
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss  # deferred: import cost of dp_accounting (seconds), paid only by a DP run

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
    from scipy.optimize import brentq  # deferred: import cost of scipy.optimize (a second), paid only by a DP run
    from scipy.special import log_ndtr  # deferred: import cost of scipy.special, paid only by a DP run

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
    import dp_accounting  # deferred: import cost of dp_accounting (seconds), paid only by a DP run

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
    import dp_accounting  # deferred: import cost of dp_accounting (seconds), paid only by a DP run
    from dp_accounting.rdp import RdpAccountant  # deferred: import cost of dp_accounting (seconds), paid only by a DP run

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
