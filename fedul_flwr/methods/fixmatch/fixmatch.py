"""FixMatch on every client (FedAvg + FixMatch, the baseline framework of FedDB).

Sohn et al., "FixMatch: Simplifying Semi-Supervised Learning with Consistency and
Confidence", NeurIPS 2020, Eqs. 1-4; inside federated learning as in Zhu et al., "Debiasing
Federated Semi-Supervised Learning" (FedDB), IJCAI 2024, Sec. 3.2.

A client with labeled images (x_b, y_b) and unlabeled images u_b minimises, per step,

    L = L_s + lambda * L_u,
    L_s = 1/B sum_b CE(f(alpha(x_b)), y_b),
    L_u = 1/(mu B) sum_b 1[max q_b >= tau] CE(f(A(u_b)), argmax q_b),

with alpha the weak and A the strong augmentation (:mod:`fedul_flwr.augment`), q_b the
pseudo-label distribution of u_b -- here the model's prediction on the weak view, without
gradient (FixMatch) -- and tau the confidence threshold (``fixmatch-threshold``, 0.95),
lambda = ``fixmatch-lambda`` (1), mu = ``fixmatch-mu`` (7) unlabeled images per labeled one.
The labeled, weak and strong batches go through f in one forward pass (batch norm sees all).

Choices:

- **What an epoch is.** The labeled stream drives a local epoch: ceil(n_L / B) steps of B
  labeled and mu B unlabeled images (the unlabeled stream is cycled). This is FixMatch's step
  as written; FedDB's paper trains on full batches, impractical beyond toy sizes.
- L_u is divided by mu B, masked images included (FixMatch, and FedDB's 1/N_u); FedDB's code
  averages over the confident images only.
- The run's ``augment`` does not apply: FixMatch's views are part of the method (weak for
  labeled images, weak and strong for unlabeled ones). The strong view is
  ``fixmatch-strong-augment``: ``strong`` (RandAugment at the fixed magnitude 10 of 30, as
  torchvision's) or ``strong-random`` (a magnitude drawn per image and operation over the
  full range, and Cutout up to half the side, as FixMatch's paper and USB's code).
- **A client with one part only** (the annotation-heterogeneity setting: fully labeled or
  unlabeled clients) trains on what it holds: L_s alone on labeled images, lambda L_u alone
  on unlabeled ones (the unlabeled stream, mu B images per step, then drives the epoch), as
  FSSL baselines run FixMatch on such clients. A client with neither sits the round out.
  (FixMatch-DPL and FedDB need both parts: their APP-U is over the unlabeled part, and
  their clients without one sit out.)
- **Aggregation weight** of a reply (``fixmatch-weight``; what FedAvg's n_k is):

  ``epoch`` (default)
      the images one local epoch passes over: n_L where the client holds labeled images,
      else n_U (the shared loop's count of the stream that drives the epoch);
  ``all``
      n_L + n_U, every image the client holds;
  ``used``
      the examples that trained the model this round: the labeled rows of every step plus
      the unlabeled rows whose pseudo-label passed tau, over all the round's steps (a row
      drawn twice counts twice). A client with none (an unlabeled client whose
      pseudo-labels all fall below tau) has had nothing to train: it replies with no model
      and zero examples (an idle reply, counted in ``idle-replies``, no failure), so it does
      not pull the average back to the model it received; a round where no client has one
      keeps the global model.

  Under ``feddb`` the DMA weights beta replace these (a client with no used example is left
  out of DMA under ``used``). The train metrics of a round are averaged with the same weights.
- **Labels at the server** (``client-setting=labels-at-server``): the clients hold unlabeled
  images only and train lambda L_u alone; the server trains L_s on its labeled images after every
  aggregation (:meth:`FixMatch.server_task`), the alternation SemiFL and FedRGD build on.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.augment import Augmentation
from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import LocalTask, RoundContext, Stream, register_method
from fedul_flwr.methods.fixmatch.settings import OPTIONS
from fedul_flwr.methods.local_ssl import LocalSSL

if TYPE_CHECKING:  # pragma: no cover
    from fedul_flwr.training import LocalLoop, TrainResult

__all__ = ["FixMatch", "unlabeled_loss"]

def unlabeled_loss(strong_logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """L_u: mean over the batch of mask * CE(strong logits, pseudo-label).

    Parameters
    ----------
    strong_logits : torch.Tensor
        ``[n, K]`` logits of the strong views.
    targets : torch.Tensor
        int64 ``[n]`` pseudo-labels.
    mask : torch.Tensor
        ``[n]`` 1 where the pseudo-label is kept, 0 where it is not (float or bool).

    Returns
    -------
    torch.Tensor
        Scalar; 0 for an empty batch.
    """
    if len(targets) == 0:
        return strong_logits.sum() * 0
    return (F.cross_entropy(strong_logits, targets, reduction="none") * mask.to(strong_logits.dtype)).mean()


@register_method
class FixMatch(LocalSSL):
    """FixMatch on each client's labeled and unlabeled images (module docstring); the parts,
    settings, views, labeled stream, one-pass step and server task are those of
    :class:`~fedul_flwr.methods.local_ssl.LocalSSL`."""

    name = "fixmatch"
    recorded_metrics = ("pseudo-label-share", "pseudo-label-correct-share")
    options = OPTIONS

    def views(self, client: ClientData) -> tuple[Augmentation, Augmentation]:
        """The weak and the strong augmentation of this client's images."""
        return self.weak_view(client), self.strong_view(client, self.option("fixmatch-strong-augment"))

    def unlabeled_stream(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> Stream:
        """The unlabeled images (``x``) with their weak and strong views; FixMatch computes
        pseudo-labels per batch, so the stream carries nothing else. A subclass may drop the
        weak view (its batches then forward only the strong one) and add tensors that
        :meth:`pseudo_labels` reads."""
        assert client.unlabeled is not None  # ``requires``
        weak, strong = self.views(client)
        size = self.option("fixmatch-mu") * self.cfg.batch_size
        return Stream({"x": client.unlabeled, **self.known_classes(client)}, size, images=(),
                      views={"weak": ("x", weak), "strong": ("x", strong)})  # fmt: skip

    @staticmethod
    def known_classes(client: ClientData) -> dict[str, torch.Tensor]:
        """``{"classes": the true classes of the unlabeled images}`` where the run knows them
        (simulation), else ``{}``: the unlabeled stream carries them for the diagnostic
        ``pseudo-label-correct-share`` only; no loss reads them."""
        return {} if client.unlabeled_classes is None else {"classes": client.unlabeled_classes}

    def pseudo_labels(self, weak_logits: torch.Tensor | None, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Pseudo-labels and mask of an unlabeled batch: argmax and max >= tau of the softmax
        of the weak view (no gradient).

        Parameters
        ----------
        weak_logits : torch.Tensor | None
            ``[n, K]`` logits of the batch's weak views (None when the stream has none).
        batch : dict[str, torch.Tensor]
            The unlabeled batch.

        Returns
        -------
        (torch.Tensor, torch.Tensor)
            int64 ``[n]`` pseudo-labels and bool ``[n]`` mask.
        """
        assert weak_logits is not None  # FixMatch's stream has weak views
        confidence, targets = F.softmax(weak_logits.detach(), dim=1).max(dim=1)
        return targets, confidence >= self.option("fixmatch-threshold")

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """Streams ``labeled`` (weak view, y; drives the epoch) and ``unlabeled`` (weak and
        strong views), those the client holds; loss = L_s + lambda L_u (module docstring)."""

        def term(weak_logits: torch.Tensor | None, strong_logits: torch.Tensor, batch: dict[str, torch.Tensor]):  # type: ignore[no-untyped-def]
            targets, mask = self.pseudo_labels(weak_logits, batch)
            return unlabeled_loss(strong_logits, targets, mask), targets, mask

        streams = self.ssl_streams(client, lambda: self.unlabeled_stream(client, models, ctx))
        return self.consistency_task(streams, float(self.option("fixmatch-lambda")), term)

    def local_update(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext, loop: LocalLoop) -> TrainResult:
        """The shared loop on :meth:`local_task`; the reply's count is the ``fixmatch-weight``
        of the round (module docstring), and under ``used`` a client with no used example
        sends no model."""
        result = super().local_update(client, models, ctx, loop)
        self._sent: tuple[str, ...] | None = None
        mode = self.option("fixmatch-weight")
        if mode == "epoch":
            return result
        if mode == "all":
            n = sum(len(part) for part in (client.labeled, client.unlabeled) if part is not None)
        else:
            n = self._labeled_rows + int(self._kept)
            if n == 0:
                self._sent = ()
        return dataclasses.replace(result, num_examples=n)

    def sent_models(self, client: ClientData, ctx: RoundContext) -> tuple[str, ...]:
        """The model, unless ``fixmatch-weight = "used"`` counted no example this round."""
        sent = getattr(self, "_sent", None)
        return super().sent_models(client, ctx) if sent is None else sent

    def uploads(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> dict[str, float | list[float]]:
        """``pseudo-label-share``: the share of the round's unlabeled images (over all steps)
        whose pseudo-label passed the threshold (0 without unlabeled images); where the run
        knows the unlabeled images' true classes (simulation), ``pseudo-label-correct-share``:
        the share whose pseudo-label passed and is the true class (a diagnostic; its ratio to
        ``pseudo-label-share`` is the accuracy of the pseudo-labels trained on)."""
        return self.pseudo_label_uploads(client)
