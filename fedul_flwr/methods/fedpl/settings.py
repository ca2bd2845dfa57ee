"""The run-config keys FedPL owns: defaults, rules, meaning."""

from __future__ import annotations

from fedul_flwr.config import Option

__all__ = ["OPTIONS"]


OPTIONS: tuple[Option, ...] = (
    Option("fedpl-threshold", 0.4, "FedPL confidence threshold tau on softmax(f(x))[pseudo label]",
           check=lambda v: 0.0 <= v <= 1.0, rule="in [0, 1]"),
    Option("fedpl-mixup-alpha", 0.75, "FedPL mixup lam_mix ~ Beta(a, a)",
           check=lambda v: v > 0, rule="> 0"),
    Option("fedpl-mix-weight", 0.3, "FedPL weight lambda of the mixup loss",
           check=lambda v: v >= 0, rule=">= 0"),
)
