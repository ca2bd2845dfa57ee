"""The run-config keys FedLLP owns (FedLLP-VAT shares them): defaults, rules, meaning."""

from __future__ import annotations

from fedul_flwr.config import Option

__all__ = ["LLP_BATCHES", "OPTIONS"]

LLP_BATCHES = ("stratified", "single-set", "whole-set")
"""Values of ``llp-batches``: how a client's batches are cut from its U sets."""


OPTIONS: tuple[Option, ...] = (
    Option("llp-batches", "stratified", "FedLLP(-VAT) batches: `stratified` (each batch holds a proportional share of"
           " every U set), `single-set` (each batch = a chunk of one U set) or `whole-set` (one batch per U set)",
           choices=LLP_BATCHES),
)
