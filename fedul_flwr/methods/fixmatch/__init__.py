"""FixMatch inside any strategy: ``method = "fixmatch"`` (:mod:`.fixmatch`).

Sohn et al., "FixMatch", NeurIPS 2020, run by every client on its labeled and unlabeled images
(the baseline of Zhu et al., IJCAI 2024, Sec. 3.2; reused by HASSLE's baselines). FedDB's
debiased pseudo-labels and aggregation build on it in :mod:`fedul_flwr.methods.feddb`.
"""

from __future__ import annotations

from fedul_flwr.methods.fixmatch.fixmatch import FixMatch

__all__ = ["FixMatch"]
