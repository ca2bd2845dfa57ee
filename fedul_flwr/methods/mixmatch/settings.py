"""The run-config keys MixMatch owns: defaults, rules, meaning."""

from __future__ import annotations

from fedul_flwr.config import Option

__all__ = ["OPTIONS"]


OPTIONS: tuple[Option, ...] = (
    Option("mixmatch-k", 2, "MixMatch: K, augmentations of each unlabeled image whose predictions are averaged "
           "into its guessed label (Alg. 1)",
           check=lambda v: isinstance(v, int) and v >= 1, rule="an integer >= 1"),
    Option("mixmatch-temperature", 0.5, "MixMatch: sharpening temperature T of the guessed labels (Eq. 7)",
           check=lambda v: v > 0, rule="> 0"),
    Option("mixmatch-alpha", 0.75, "MixMatch: MixUp's lambda ~ Beta(alpha, alpha), lambda' = max(lambda, 1 - lambda) "
           "(Eqs. 8-9)",
           check=lambda v: v > 0, rule="> 0"),
    Option("mixmatch-lambda-u", 100.0, "MixMatch: weight lambda_U of the unlabeled loss (Eq. 5)",
           check=lambda v: v >= 0, rule=">= 0"),
    Option("mixmatch-ramp-up", 0.015625, "MixMatch: share of the run's rounds over which lambda_U ramps up linearly "
           "from 0 (the paper's and the code's first 16,384 of 1,048,576 steps: 1/64); 0 = none",
           check=lambda v: 0.0 <= v <= 1.0, rule="in [0, 1]"),
    Option("mixmatch-unlabeled-clients", "train", "MixMatch: what a client without labeled images does: `train` "
           "(lambda_U L_U on its own guesses alone) or `sit-out` (idle; only clients with labels run MixMatch)",
           choices=("train", "sit-out")),
)  # fmt: skip
