"""The run-config keys SemiFL owns (besides FixMatch's threshold, mu, lambda, strong view and
reply weight, which it reads): defaults, rules, meaning."""

from __future__ import annotations

from fedul_flwr.config import Option

__all__ = ["OPTIONS"]


OPTIONS: tuple[Option, ...] = (
    Option("semifl-mixup-alpha", 0.75, "SemiFL's mixup weight lambda_mix ~ Beta(a, a), drawn once per step (the "
           "authors' code: a = 0.75)", check=lambda v: v > 0, rule="> 0"),
    Option("semifl-sbn", True, "SemiFL's static batch normalization: where the server holds labeled images, the "
           "global model's batch-norm statistics are recomputed on them after the server's training instead of "
           "averaged (no effect on a model without batch norm, or where the server holds no images)",
           check=lambda v: isinstance(v, bool), rule="true or false"),
)
