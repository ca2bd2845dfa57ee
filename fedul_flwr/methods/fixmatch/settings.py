"""The run-config keys FixMatch owns (FixMatch-DPL, FedDB and HASSLE's FixMatch baseline read them too):
defaults, rules, meaning."""

from __future__ import annotations

from fedul_flwr.config import Option

__all__ = ["FIXMATCH_WEIGHTS", "OPTIONS", "STRONG_VIEWS"]

FIXMATCH_WEIGHTS = ("epoch", "all", "used")
"""Values of ``fixmatch-weight``, the reply's aggregation weight (:mod:`fedul_flwr.methods.fixmatch.fixmatch`)."""
STRONG_VIEWS = ("strong", "strong-random")
"""Values of ``fixmatch-strong-augment``, the strong view (:mod:`fedul_flwr.augment`): RandAugment
at a fixed magnitude (the default), or at a magnitude drawn per image and operation over the
full range with FixMatch's Cutout (the ``fixmatch`` and ``feddb-authors`` presets)."""


OPTIONS: tuple[Option, ...] = (
    Option("fixmatch-threshold", 0.95, "confidence threshold tau of the pseudo-labels",
           check=lambda v: 0.0 <= v <= 1.0, rule="in [0, 1]"),
    Option("fixmatch-lambda", 1.0, "weight lambda of the unlabeled loss",
           check=lambda v: v >= 0, rule=">= 0"),
    Option("fixmatch-mu", 7, "unlabeled images per labeled one in a step",
           check=lambda v: isinstance(v, int) and v >= 1, rule="an integer >= 1"),
    Option("fixmatch-weight", "epoch", "a reply's aggregation weight: `epoch` (the images one local epoch passes "
           "over: n_L where the client has labels, else n_U), `all` (n_L + n_U) or `used` (labeled rows plus "
           "pseudo-labels kept over the round's steps; a client with none sends no model)",
           choices=FIXMATCH_WEIGHTS),
    Option("fixmatch-strong-augment", "strong", "the strong view: `strong` (RandAugment at the fixed magnitude 10 of "
           "30, torchvision's) or `strong-random` (a magnitude per image and operation drawn over the full range, and"
           " Cutout up to half the side: FixMatch's paper and USB's code)",
           choices=STRONG_VIEWS),
)
