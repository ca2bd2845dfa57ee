"""SemiFL (Diao et al., NeurIPS 2022): ``method = "semifl"`` (:mod:`.semifl`), with its static
batch normalization (:mod:`.sbn`). Runs in its own labels-at-server setting (the server
fine-tunes on its labels between rounds) and, as FedDB's Tables 1-3 run it, with the labels at
the clients (its client-side training beside each client's supervised loss).
"""

from __future__ import annotations

from fedul_flwr.methods.semifl.semifl import SemiFL

__all__ = ["SemiFL"]
