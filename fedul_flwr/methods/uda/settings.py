"""The run-config keys UDA owns: defaults, rules, meaning."""

from __future__ import annotations

from fedul_flwr.config import Option
from fedul_flwr.methods.fixmatch.settings import STRONG_VIEWS

__all__ = ["OPTIONS", "TARGET_VIEWS"]

TARGET_VIEWS = ("weak", "original")
"""Values of ``uda-target-view``, the view of an unlabeled image whose prediction is the target:
its weak augmentation (default; FixMatch's and FedMatch's UDA) or the image as it is (UDA's
Eq. 1, p(y | x))."""


OPTIONS: tuple[Option, ...] = (
    Option("uda-lambda", 1.0, "UDA: weight lambda of the consistency loss (Eq. 1)",
           check=lambda v: v >= 0, rule=">= 0"),
    Option("uda-threshold", 0.8, "UDA: confidence mask beta: an unlabeled image counts only where the largest class "
           "probability of its target view is > beta (Sec. 3.2)",
           check=lambda v: 0.0 <= v <= 1.0, rule="in [0, 1]"),
    Option("uda-temperature", 0.4, "UDA: softmax temperature tau of the target (sharpening, Sec. 3.2); 1 = none",
           check=lambda v: v > 0, rule="> 0"),
    Option("uda-mu", 7, "UDA: unlabeled images per labeled one in a step",
           check=lambda v: isinstance(v, int) and v >= 1, rule="an integer >= 1"),
    Option("uda-strong-augment", "strong", "UDA: the strong view (RandAugment), as `fixmatch-strong-augment`: "
           "`strong` (fixed magnitude) or `strong-random` (a magnitude per image and operation, and Cutout)",
           choices=STRONG_VIEWS),
    Option("uda-target-view", "weak", "UDA: the view whose sharpened prediction is the target: `weak` (the weak "
           "augmentation, FixMatch's and FedMatch's UDA) or `original` (the image as it is, UDA's Eq. 1)",
           choices=TARGET_VIEWS),
)  # fmt: skip
