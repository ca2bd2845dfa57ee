"""The run-config keys FedUL owns: their defaults, rules and meaning (generated into
``[tool.flwr.app.config]`` and docs/configuration.md by ``scripts/config_reference.py``)."""

from __future__ import annotations

from fedul_flwr.config import Option
from fedul_flwr.methods.fedul.transition import LOSSES

__all__ = ["OPTIONS"]


OPTIONS: tuple[Option, ...] = (
    Option("loss", "nll", "FedUL's loss: `nll` (paper: -log Q_c[ybar]) or `ce-prob` (authors' code: cross-entropy "
           "applied to the probabilities Q_c)",
           check=lambda v: v in LOSSES, rule=f"one of {LOSSES.names()}"),
)
