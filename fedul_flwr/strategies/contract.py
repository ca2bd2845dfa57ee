"""The aggregation contract: how the server combines the training replies, declared once per
strategy and per method, and which differential-privacy modes and client weights follow from it.

Server-side DP (McMahan et al., ICLR 2018) clips each client's update to L2 norm C, averages
the n clipped updates with equal weights and adds Gaussian noise N(0, (z C / n)^2) per
coordinate: one client moves that mean by at most C / n, so the release is the Gaussian
mechanism with noise multiplier z, the figure the accountant composes
(:func:`fedul_flwr.privacy.privacy_spent`). That holds only where the server's release is a
plain uniform mean of the clipped updates, or a function of the *noised* mean alone
(post-processing: a server optimizer step taken after the noise, McMahan et al. 2018, Sec. 2;
Reddi et al., ICLR 2021). Every other way of combining replies gives one client more than
C / n of influence, and the recorded epsilon would not hold. Client-local DP noises each reply
on its node, so any server combination is post-processing of noised replies.

Each strategy declares one :class:`Contract` in :data:`STRATEGY_CONTRACTS`; a method declares
its own in the ``contract`` attribute of its aggregation mixin (``Method.aggregation()``;
``None``: it aggregates as the run's strategy does). :func:`dp_refusal` derives from the two
what a run may combine; :func:`fedul_flwr.checks.validate_config` refuses the rest before
round 1 with its one line.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "ACCEPTS",
    "Combining",
    "Contract",
    "MISSING_CONTRACT",
    "SERVER_DP_WEIGHTS",
    "STRATEGY_CONTRACTS",
    "contract_table",
    "dp_refusal",
]


class Combining(enum.Enum):
    """How a server combines the training replies of one round."""

    MEAN = "plain mean"
    """A weighted mean of the replies' updates (uniform weights under server DP)."""
    SERVER_OPTIMIZER = "mean, then a server optimizer"
    """The mean, then a server optimizer step on it (momentum, Adam, Adagrad, Yogi); under
    server DP the noise goes on the mean, before the step (:mod:`fedul_flwr.privacy`)."""
    REWEIGHTED = "reweighted"
    """Client weights other than equal ones, chosen by the server or the method."""
    ROBUST_SELECTION = "robust selection"
    """Coordinate-wise median or trimmed mean, or a selection of clients (Krum, Bulyan)."""
    PARTIAL_REPLIES = "partial replies"
    """Clients send only some of the exchanged models, each model averaged over its senders."""
    SIDE_RECORDS = "mean with side records"
    """The replies carry records beside the model that the aggregation uses (control variates)."""


ACCEPTS: dict[Combining, tuple[str, ...]] = {
    Combining.MEAN: ("none", "server-fixed", "server-adaptive", "client-local"),
    Combining.SERVER_OPTIMIZER: ("none", "server-fixed", "server-adaptive", "client-local"),
    Combining.REWEIGHTED: ("none", "client-local"),
    Combining.ROBUST_SELECTION: ("none", "client-local"),
    Combining.PARTIAL_REPLIES: ("none", "client-local"),
    Combining.SIDE_RECORDS: ("none", "client-local"),
}
"""The ``differential-privacy`` modes each way of combining replies admits (module doc)."""
SERVER_DP_WEIGHTS = "uniform"
"""The ``aggregation-weights`` a server-DP run needs: with weights w_i summing to 1, one client
moves the mean by w_i C, more than C / n for every client above the mean weight."""


@dataclass(frozen=True)
class Contract:
    """How one strategy or one method combines the training replies.

    Attributes
    ----------
    combines : Combining
        The kind of combination (decides the DP modes, :data:`ACCEPTS`).
    how : str
        What it does to one client's influence, as the refusal line says it, e.g. ``"krum
        selects one client's update"``.
    """

    combines: Combining
    how: str


STRATEGY_CONTRACTS: dict[str, Contract] = {
    "fedavg": Contract(Combining.MEAN, "fedavg averages the updates"),
    "fedprox": Contract(Combining.MEAN, "fedprox averages the updates (its proximal term is on the clients)"),
    "scaffold": Contract(Combining.SIDE_RECORDS, "scaffold aggregates control variates sent beside the model, "
                         "which server-side clipping does not bound"),  # fmt: skip
    "fednova": Contract(Combining.REWEIGHTED, "fednova rescales each update by tau_eff / tau_i, the client's "
                        "own step count"),  # fmt: skip
    "fedavgm": Contract(Combining.SERVER_OPTIMIZER, "fedavgm applies server momentum to the mean (under server DP, to the noised mean)"),
    "fedadam": Contract(Combining.SERVER_OPTIMIZER, "fedadam applies an Adam step to the mean (under server DP, to the noised mean)"),
    "fedyogi": Contract(Combining.SERVER_OPTIMIZER, "fedyogi applies a Yogi step to the mean (under server DP, to the noised mean)"),
    "fedadagrad": Contract(Combining.SERVER_OPTIMIZER, "fedadagrad applies an Adagrad step to the mean (under server DP, to the noised mean)"),
    "fedmedian": Contract(Combining.ROBUST_SELECTION, "fedmedian takes the coordinate-wise median"),
    "fedtrimmedavg": Contract(Combining.ROBUST_SELECTION, "fedtrimmedavg averages what survives a coordinate-wise "
                              "trim"),  # fmt: skip
    "krum": Contract(Combining.ROBUST_SELECTION, "krum selects one client's update"),
    "multikrum": Contract(Combining.ROBUST_SELECTION, "multikrum averages the updates it selects"),
    "bulyan": Contract(Combining.ROBUST_SELECTION, "bulyan selects updates, then trims coordinates"),
}
"""Every registered strategy's contract (a test checks each registered name has one)."""

MISSING_CONTRACT = Contract(Combining.REWEIGHTED, "its aggregation mixin declares no contract (a `contract` "
                            "attribute), so nothing says how it weighs the clients")  # fmt: skip
"""What a method aggregation mixin without a ``contract`` attribute counts as."""


def _mode_refusal(mode: str, contract: Contract, subject: str) -> str | None:
    if mode in ACCEPTS[contract.combines]:
        return None
    if mode.startswith("server"):
        return (f"differential-privacy={mode!r} with {subject}: {contract.how} ({contract.combines.value}), so one "
                "client moves the release by more than the C/n that server-side DP's epsilon assumes; use "
                "differential-privacy=client-local")  # fmt: skip
    return f"differential-privacy={mode!r} with {subject}: {contract.how} ({contract.combines.value})"


def dp_refusal(
    mode: str, weights: str, strategy: str, method: str, method_contract: Contract | None, noise_multiplier: float
) -> str | None:
    """Why a run may not combine this DP mode, client weights, strategy and method, in one line;
    ``None`` when it may.

    Parameters
    ----------
    mode : str
        ``differential-privacy``.
    weights : str
        ``aggregation-weights``.
    strategy : str
        ``strategy`` (a key of :data:`STRATEGY_CONTRACTS`).
    method : str
        ``method``, for the message.
    method_contract : Contract | None
        The method's aggregation contract (``None``: it aggregates as the strategy does).
    noise_multiplier : float
        ``dp-noise-multiplier`` z: a server-side mode with z = 0 adds no noise, and is refused.

    Returns
    -------
    str | None
        The refusal, naming the keys, their values and why: z = 0 first, then the strategy,
        the method, the weights.

    Raises
    ------
    KeyError
        If ``strategy`` declares no contract.
    """
    if mode.startswith("server") and not noise_multiplier > 0:
        return (f"dp-noise-multiplier={noise_multiplier:g} with differential-privacy={mode!r} adds no noise: the run "
                "would release the exact clipped mean (epsilon = inf); give dp-noise-multiplier > 0, or "
                "differential-privacy='none'")  # fmt: skip
    why = _mode_refusal(mode, STRATEGY_CONTRACTS[strategy], f"strategy={strategy!r}")
    if why is None and method_contract is not None:
        why = _mode_refusal(mode, method_contract, f"method={method!r}")
    if why is None and mode.startswith("server") and weights != SERVER_DP_WEIGHTS:
        why = (f"aggregation-weights={weights!r} with differential-privacy={mode!r}: the server's noise z C / n "
               "protects every client with noise multiplier z only when the clients weigh the same; use "
               f"aggregation-weights={SERVER_DP_WEIGHTS!r} (what server-side DP sets when the key is not typed)")  # fmt: skip
    return why


def contract_table(modes: tuple[str, ...]) -> str:
    """The Markdown table of every strategy x DP mode of ``modes``: accepted or refused, and
    why (docs/privacy.md holds it; a test keeps the two equal)."""
    head = "| strategy | combines the replies by | " + " | ".join(f"`{m}`" for m in modes) + " | why |"
    rows = [head, "|" + "---|" * (len(modes) + 3)]
    for name, contract in STRATEGY_CONTRACTS.items():
        marks = ["accepted" if m in ACCEPTS[contract.combines] else "refused" for m in modes]
        rows.append(f"| `{name}` | {contract.combines.value} | " + " | ".join(marks) + f" | {contract.how} |")
    return "\n".join(rows)
