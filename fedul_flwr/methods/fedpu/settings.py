"""The run-config keys FedPU owns: defaults, rules, meaning."""

from __future__ import annotations

from fedul_flwr.config import Option
from fedul_flwr.methods.fedpu.risk import PU_LOSSES

__all__ = ["OPTIONS"]


OPTIONS: tuple[Option, ...] = (
    Option("fedpu-loss", "nnpu", "the PU risk: `nnpu` (a sum of one-vs-rest non-negative binary PU risks, bounded "
           "below; not Eq. 10: it also penalises confusing two positive classes), `eq10-nn` (Eq. 10 itself with "
           "cross-entropy, each negative class's corrected risk clamped at 0), `upu` (`nnpu` unclamped: conventional "
           "PU), `eq10` (Eq. 10 with the bounded surrogate 1 - s), `authors` (the authors' code) ([FedPU](fedpu.md))",
           check=lambda v: v in PU_LOSSES, rule=f"one of {PU_LOSSES.names()}"),
    Option("fedpu-cross-client", False, "add Eq. 10's cross-client term; the server queries every node's positive "
           "classes and broadcasts them to all clients ([what this reveals](fedpu.md))",
           check=lambda v: isinstance(v, bool), rule="true or false"),
)
