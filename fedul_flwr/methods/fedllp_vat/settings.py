"""The run-config keys FedLLP-VAT adds to FedLLP's: defaults, rules, meaning."""

from __future__ import annotations

from fedul_flwr.config import Option

__all__ = ["OPTIONS"]


OPTIONS: tuple[Option, ...] = (
    Option("vat-weight", 0.0005, "FedLLP-VAT consistency weight alpha (App. D: 5e-4 MNIST, 0.05 CIFAR-10)",
           check=lambda v: v >= 0, rule=">= 0"),
    Option("vat-epsilon", 0.01, "FedLLP-VAT perturbation radius mu (App. D: 1e-2 MNIST, 6.0 CIFAR-10)",
           check=lambda v: v >= 0, rule=">= 0"),
    Option("vat-xi", 1e-06, "FedLLP-VAT finite-difference step of the power iteration",
           check=lambda v: v > 0, rule="> 0"),
)
