"""The run-config keys of the supervised reference (FedAvg on labels): defaults, rules, meaning."""

from __future__ import annotations

from fedul_flwr.config import Option

__all__ = ["OPTIONS"]


OPTIONS: tuple[Option, ...] = (
    Option("label-fraction", 1.0, "fraction of each client's images used with their true labels (0.1 = \"FedAvg 10%\", "
           "1.0 = the supervised reference of Theorem 4)",
           check=lambda v: 0.0 < v <= 1.0, rule="in (0, 1]"),
)
