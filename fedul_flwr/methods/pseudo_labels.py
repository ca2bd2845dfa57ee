"""Hard pseudo-labels from softmax probabilities, in one overridable method that the
pseudo-labelling methods share (SemiFL, FedRGD): a debiasing plug-in (e.g. FedDB's debiased
pseudo-labels) wraps this one method to change how every one of them labels."""

from __future__ import annotations

import torch

from fedul_flwr.methods.feddb.debias import FedDPL

__all__ = ["ThresholdedPseudoLabels"]


class ThresholdedPseudoLabels(FedDPL):
    """Mixin for a :class:`~fedul_flwr.methods.base.Method` that reads ``fixmatch-threshold``:
    the argmax of each prediction, kept where its probability reaches tau (FixMatch's rule,
    Sohn et al., NeurIPS 2020, Eq. 4; SemiFL's, Diao et al., NeurIPS 2022, Sec. 3); with
    ``dpl = true`` of the debiased prediction (FedDB's plug-in, :class:`~fedul_flwr.methods.feddb.debias.FedDPL`:
    the threshold applies to the debiased posterior, as in FedDB)."""

    def pseudo_labels_from(self, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Hard pseudo-labels and their mask: argmax of each row and whether its maximum
        reaches tau (``fixmatch-threshold``).

        Parameters
        ----------
        probs : torch.Tensor
            ``[n, K]`` softmax predictions on the weak views (no gradient).

        Returns
        -------
        (torch.Tensor, torch.Tensor)
            int64 ``[n]`` pseudo-labels and bool ``[n]`` mask, on ``probs``' device.
        """
        confidence, targets = self.debiased(probs).max(dim=1)
        return targets, confidence >= self.option("fixmatch-threshold")  # type: ignore[attr-defined]
