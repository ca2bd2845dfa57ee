"""The run-config keys HASSLE owns: defaults, rules, meaning."""

from __future__ import annotations

from fedul_flwr.config import Option

__all__ = ["GAMMA_FORMS", "OPTIONS", "PAIRING", "PHASE_ORDERS"]

PAIRING = ("previous", "current")
"""Values of ``hassle-pairing``: which dual model a residual model is added to."""
PHASE_ORDERS = ("residual-first", "dual-first")
"""Values of ``hassle-phase-order``: the order of a client's phases."""
GAMMA_FORMS = ("mean", "sum")
"""Values of ``hassle-gamma-form``: the form of the proximity term."""


OPTIONS: tuple[Option, ...] = (
    Option("hassle-residual-width", 0.25, "width of the residual models r_{U-S}, r_{S-U} as a share of the model's "
           "channels (1/16 ... 1); 0 removes them (the GRA ablation)",
           check=lambda v: 0.0 <= v <= 1.0, rule="in [0, 1] (0: no residual models)"),
    Option("hassle-lambda", 1.0, "weight lambda of the residual alignment (KL to the tempered logit difference)",
           check=lambda v: v >= 0, rule=">= 0"),
    Option("hassle-gamma", 0.01, "gamma of the cross-model proximity term, gamma / 2 times the squared distance of "
           "w_S and w_U beside the batch-mean loss (`hassle-gamma-form`); 0 turns it off (the MPA ablation)",
           check=lambda v: v >= 0, rule=">= 0"),
    Option("hassle-temperature", 1.0, "temperature T of the residual target (T^2-scaled KL)",
           check=lambda v: v > 0, rule="> 0"),
    Option("hassle-threshold", 0.0, "confidence threshold of the pseudo-labels (0: none, the paper's default; 0.95 in"
           " its Table 6)",
           check=lambda v: 0.0 <= v <= 1.0, rule="in [0, 1]"),
    Option("hassle-pairing", "previous", "which dual model a residual model is added to in SM, UM and the "
           "pseudo-labels: `previous`, the one it was trained against (the paper, after its Eq. 10; the previous "
           "round's w_S / w_U travel too), or `current`, the same round's",
           choices=PAIRING),
    Option("hassle-phase-order", "residual-first", "`residual-first` (Eqs. 7-8 and Fig. 3: each residual fits the "
           "received dual models) or `dual-first` (Alg. 1's order: the dual model trains first, its residual then "
           "fits the updated one)",
           choices=PHASE_ORDERS),
    Option("hassle-gamma-form", "mean", "`mean` (gamma / 2 times the squared distance beside the batch-mean loss) or "
           "`sum` (Eq. 12 as written: gamma times it beside the sum over the client's n examples, i.e. 2 gamma / n "
           "per batch-mean step)",
           choices=GAMMA_FORMS),
    Option("hassle-shared-init", False, "start w_U from w_S's initial weights",
           check=lambda v: isinstance(v, bool), rule="true or false"),
    Option("hassle-warmup-rounds", 0, "rounds before w_U and r_{S-U} train on pseudo-labels (0: none)",
           check=lambda v: isinstance(v, int) and v >= 0, rule="an integer >= 0"),
)
