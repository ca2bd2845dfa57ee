"""The pseudo-label counts of the methods that pseudo-label at every step: ``pseudo-label-share``
(the share of the round's unlabeled rows whose pseudo-label passed the method's mask, over all
steps) and, where the run knows the unlabeled images' true classes (simulation),
``pseudo-label-correct-share`` (the share that passed and is of its true class, a diagnostic).
One counter for FixMatch and the local SSL methods, FedMatch and RSCFed. The methods that
pseudo-label once a round (SemiFL, FixMatch-DPL, FedDB) upload the shares of that one pass
instead; FixMatch-DPL and FedDB still count here the rows that ``fixmatch-weight = "used"``
weighs."""

from __future__ import annotations

import torch

from fedul_flwr.data.client_data import ClientData

__all__ = ["PseudoLabelCounts"]


class PseudoLabelCounts:
    """Mixin for a :class:`~fedul_flwr.methods.base.Method` that pseudo-labels: the round's
    counts, kept as tensors (no device synchronisation per step), and their uploads."""

    def reset_counts(self) -> None:
        """Zero the round's counts: labeled rows, unlabeled rows seen, kept and kept-and-right."""
        self._kept: torch.Tensor | int = 0
        self._correct: torch.Tensor | int = 0
        self._seen = self._labeled_rows = 0

    def count(self, targets: torch.Tensor, mask: torch.Tensor, unlabeled: dict[str, torch.Tensor]) -> None:
        """Add one unlabeled batch's kept targets (bool ``mask`` ``[n]``) and, where the batch
        carries the true ``classes``, the kept ones of the true class (int64 ``targets``
        ``[n]``)."""
        self._kept = self._kept + mask.sum()
        self._seen += len(mask)
        if "classes" in unlabeled:
            self._correct = self._correct + (mask & (targets == unlabeled["classes"])).sum()

    def pseudo_label_uploads(self, client: ClientData) -> dict[str, float | list[float]]:
        """``pseudo-label-share``: the share of the round's unlabeled rows (over all steps)
        whose target passed the mask (0 without unlabeled images); where the run knows the
        unlabeled images' true classes (simulation), ``pseudo-label-correct-share``: the share
        that passed and whose hard target is the true class (a diagnostic)."""
        out: dict[str, float | list[float]] = {"pseudo-label-share": float(self._kept) / max(self._seen, 1)}
        if client.unlabeled_classes is not None:
            out["pseudo-label-correct-share"] = float(self._correct) / max(self._seen, 1)
        return out
