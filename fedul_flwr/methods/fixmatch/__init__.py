"""Semi-supervised clients: FixMatch inside any strategy, its debiased pseudo-labels (DPL) and
FedDB (DPL + the DMA aggregation).

- ``fixmatch`` (:mod:`.fixmatch`): Sohn et al., "FixMatch", NeurIPS 2020, run by every
  client on its labeled and unlabeled images (the baseline of Zhu et al., IJCAI 2024,
  Sec. 3.2; reused by HASSLE's baselines);
- ``fixmatch-dpl`` (:mod:`.dpl`): FixMatch with FedDB's debiased pseudo-labels (Eqs. 8, 14);
- ``feddb`` (:mod:`.feddb`): DPL plus the server's debiased model aggregation (Eqs. 15-17,
  :mod:`fedul_flwr.strategies.dma`).
"""

from __future__ import annotations

from fedul_flwr.methods.fixmatch.dpl import FixMatchDPL
from fedul_flwr.methods.fixmatch.feddb import FedDB
from fedul_flwr.methods.fixmatch.fixmatch import FixMatch

__all__ = ["FedDB", "FixMatch", "FixMatchDPL"]
