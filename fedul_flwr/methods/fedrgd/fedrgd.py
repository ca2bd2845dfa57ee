"""FedRGD: FixMatch-style consistency on the clients, the server's training on its labels, and
grouping-based model averaging.

Zhang et al., "Improving Semi-supervised Federated Learning by Reducing the Gradient Diversity
of Models", IEEE BigData 2021 (arXiv:2008.11364). No code of the authors is public; the SemiFL
authors re-implemented it (``diaoenmao/SemiFL-...``, ``src/modules/modules.py``, loss mode
``frgd``), which this follows where the paper is silent. FedDB (Zhu et al., IJCAI 2024) runs it
as a baseline with the labels at the clients: it "mitigates the model bias by reducing gradient
divergence among clients".

- **Clients** train the consistency regularization loss (CRL) of the paper, FixMatch's: the
  weak view's prediction, kept where its confidence reaches tau (``fixmatch-threshold``,
  0.95), is the target of the strong view (:class:`~fedul_flwr.methods.fixmatch.fixmatch.FixMatch`,
  whose local step this reuses: L = CE(labeled) + lambda L_u where the client holds labels,
  lambda L_u alone where it does not). The pseudo-labels of a batch come from
  ``pseudo_labels_from`` of :class:`~fedul_flwr.methods.pseudo_labels.ThresholdedPseudoLabels`
  (softmax probabilities in, targets and mask out).
- **Server** (``labels-at-server``): trains on its labeled images after every aggregation and
  once before round 1 (FixMatch's server task: CE of the weak views, ``server-epochs``).
- **Aggregation**: the grouping-based averaging of
  :mod:`fedul_flwr.methods.fedrgd.grouping` (``fedrgd-groups`` = S random groups a round, each
  averaged with the server's model, the group models averaged).

Choices:

- **Normalization.** The paper replaces batch norm by group norm (GN), one of its three
  findings; that is the run's ``model`` here (``small-cnn`` has no normalization layer at all,
  the WRN-28-2 of FedDB's tables has batch norm, as FedDB ran it).
- **S = 2** by default, the SemiFL authors' re-implementation (two halves of the round's
  clients); the paper studies S as a knob.
- **Order of the server's training**: after the aggregation, as this repository's
  labels-at-server setting does, with the model the server trained last round as the server's
  member of every group (the paper trains it beside the clients: see the grouping module).
- **Pseudo-labels per batch** from the training forward pass (FixMatch's, train mode); the
  SemiFL authors' re-implementation predicts in eval mode and trains on the confident images
  only, averaging over them.
- **Labels at the clients** (FedDB's setting): no server model; each client also trains its
  labeled images (FixMatch's L_s); groups are averaged alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import LocalTask, RoundContext, register_method
from fedul_flwr.methods.feddb.settings import DPL_PLUGIN_OPTIONS
from fedul_flwr.methods.feddb.debias import APP_U
from fedul_flwr.methods.fedrgd.grouping import SERVER_SHARE, GroupedAveraging
from fedul_flwr.methods.fedrgd.settings import OPTIONS
from fedul_flwr.methods.fixmatch.fixmatch import FixMatch
from fedul_flwr.methods.pseudo_labels import ThresholdedPseudoLabels

__all__ = ["FedRGD"]


@register_method
class FedRGD(ThresholdedPseudoLabels, FixMatch):
    """FixMatch clients, the server's training on its labels and grouping-based averaging
    (module docstring)."""

    name = "fedrgd"
    settings = ("labels-at-server", "labels-at-clients", "annotation-heterogeneity")
    options = FixMatch.options + OPTIONS + DPL_PLUGIN_OPTIONS
    recorded_metrics = (*FixMatch.recorded_metrics, SERVER_SHARE, APP_U)
    trains_on_server = True

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """FixMatch's task, with FedDB's debiased pseudo-labels where ``dpl`` is set
        (:class:`~fedul_flwr.methods.feddb.debias.FedDPL`)."""
        self.begin_dpl(client, models, ctx)
        return self.with_dpl(super().local_task(client, models, ctx))

    def uploads(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> dict[str, float | list[float]]:
        """FixMatch's uploads, and ``app-u`` where ``dpl`` is set."""
        return {**super().uploads(client, models, ctx), **self.dpl_uploads()}

    def pseudo_labels(self, weak_logits: torch.Tensor | None, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """FixMatch's per-batch pseudo-labels through :meth:`pseudo_labels_from` on the softmax
        of the weak views (detached)."""
        assert weak_logits is not None  # FixMatch's stream has weak views
        return self.pseudo_labels_from(F.softmax(weak_logits.detach(), dim=1))

    def aggregation(self) -> type | None:
        """:class:`~fedul_flwr.methods.fedrgd.grouping.GroupedAveraging` with this run's S and seed."""
        return type("GroupedAveraging", (GroupedAveraging,), {"groups": self.option("fedrgd-groups"), "seed": self.cfg.seed})
