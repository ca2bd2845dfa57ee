"""SemiFL: alternate training of the server on its labels and of the clients on their
pseudo-labelled images, with a fix and a mix loss and static batch normalization.

Diao et al., "SemiFL: Semi-Supervised Federated Learning for Unlabeled Clients with Alternate
Training", NeurIPS 2022, Sec. 3 and Alg. 1; the authors' code is
``diaoenmao/SemiFL-Semi-Supervised-Federated-Learning-for-Unlabeled-Clients-with-Alternate-Training``
(``src/modules/modules.py``, ``src/models/wresnet.py``, ``src/data.py``).

Each round (``client-setting=labels-at-server``, the paper's own setting):

1. **Server.** The aggregate of the clients' models is fine-tuned on the server's labeled images
   (the cross-entropy of their weak views, ``server-epochs`` epochs:
   :meth:`FixMatch.server_task <fedul_flwr.methods.fixmatch.fixmatch.FixMatch.server_task>`), as
   once before round 1; then, with ``semifl-sbn`` (default), the model's batch-norm statistics are
   recomputed on the server's images (sBN, :mod:`fedul_flwr.methods.semifl.sbn`).
2. **Client, once per round before training.** The received global model predicts every
   unlabeled image's weak view in eval mode (the server's sBN statistics):
   p_n = softmax(f(alpha(u_n))), yhat_n = argmax p_n, kept where max p_n >= tau
   (``pseudo_labels_from`` of :class:`~fedul_flwr.methods.pseudo_labels.ThresholdedPseudoLabels`,
   tau = ``fixmatch-threshold``, 0.95). The pseudo-labels stay fixed for the round's local
   epochs. D_fix holds the confident images, D_mix all the unlabeled images with their
   pseudo-labels.
3. **Client training**, per step on a batch (x_f, y_f) of D_fix and a batch (x_m, y_m) drawn
   with replacement from D_mix (as many rows):

       L_fix = CE(f(A(x_f)), y_f),
       L_mix = lam CE(f(x_mix), y_f) + (1 - lam) CE(f(x_mix), y_m),
       x_mix = lam alpha(x_f) + (1 - lam) alpha(x_m),    lam ~ Beta(a, a),
       L = L_fix + L_mix,

   with A the strong and alpha the weak view, a = ``semifl-mixup-alpha`` (0.75), lam drawn
   once per step from the round's ``ctx.rng``. L_mix is FedPL's mixup loss
   (:func:`fedul_flwr.methods.fedpl.mixup_loss`). A client none of whose images passes tau
   has nothing to train: its reply is idle (no model, left out of the aggregation), as the
   authors' code leaves such a client out.

**Labels at the clients** (``labels-at-clients``, ``annotation-heterogeneity``): FedDB's
Tables 1-3 run SemiFL there, "adopting its client-side training due to the lack of training
samples on the server". A client then also trains its labeled images, beside the unlabeled
loss: L = CE(f(alpha(x_l)), y_l) + lambda (L_fix + L_mix), lambda = ``fixmatch-lambda`` (1);
there is no server training and no sBN (the server holds no images; batch-norm statistics are
averaged as the strategy averages every array).

Choices (the paper is the default; the code's choices where it is silent):

- **Steps and batch sizes.** Without labels D_fix drives the local epoch: ceil(|D_fix| / B)
  steps of B confident images (the code's client loop over the fix data, batch 10). With labels
  the labeled images drive it (B a step, FixMatch's step as in this repository's FixMatch) and
  D_fix and D_mix give mu B rows a step each (mu = ``fixmatch-mu``), cycled.
- **D_mix partners** are drawn with replacement from all the client's unlabeled images with
  their pseudo-labels, confident or not (the code's ``MixDataset``); a step mixes as many
  partners as it has fix rows.
- **Forward passes.** The labeled weak views and the fix strong views go through f in one pass;
  the mixed images in a second (the code's separate calls of f for the fix and the mix input).
- **Eval-mode pseudo-labels** (the code's ``make_dataset``: ``model.train(False)``) with the
  global model's running statistics: after sBN, those of the server's images.
- **sBN on the server's labeled images only** (``semifl-sbn``): the code's default
  (``sbn=1``) pools the server's and the clients' images, which a server cannot do; its
  ``sbn=0`` is the server's data, our reading of the paper's "server data". The small CNN
  (``small-cnn``) has no batch norm: there sBN changes nothing.
- **Server optimiser and momentum** are the run's: the authors' server step (SGD lr 1, momentum
  0.5 on the clients' mean) is ``strategy=fedavgm server-momentum=0.5`` (the
  ``semifl-server`` preset), the server's fine-tuning uses the run's local optimiser
  (the code's SGD 0.03, Nesterov momentum 0.9, weight decay 5e-4, gradient clipping 1).
- **SemiFL-FedDPL** (``dpl = true``, FedDB's plug-in,
  :class:`~fedul_flwr.methods.feddb.debias.DebiasedPseudoLabels`): APP-U is the mean of the
  round's one pseudo-labelling pass (the received model's predictions on the weak views of all
  of D_u, Eq. 8), the very predictions it debiases; no second pass, so SemiFL and SemiFL-FedDPL
  see the same weak views for one seed. The pseudo-labels are fixed for the round, so APP-U is
  not updated per epoch (the update would change only the uploaded ``app-u``, which no server
  reads for SemiFL).
- **Aggregation weight**: ``fixmatch-weight`` (``epoch``: |D_fix| without labels, n_L with
  them); the code averages the active clients with equal weights (``aggregation-weights=
  uniform``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import Batch, LocalTask, NothingToTrain, RoundContext, ServerRoundContext, Stream, register_method
from fedul_flwr.methods.feddb.settings import DPL_PLUGIN_OPTIONS
from fedul_flwr.methods.feddb.debias import APP_U, predict_weak
from fedul_flwr.methods.fedpl import mixup_loss
from fedul_flwr.methods.fixmatch.fixmatch import FixMatch
from fedul_flwr.methods.pseudo_labels import ThresholdedPseudoLabels
from fedul_flwr.methods.semifl.sbn import static_batch_norm
from fedul_flwr.methods.semifl.settings import OPTIONS

if TYPE_CHECKING:  # pragma: no cover
    from fedul_flwr.training import LocalLoop, TrainResult

__all__ = ["SemiFL", "with_replacement"]


def with_replacement(num_rows: int, batch_size: int) -> Callable[[torch.Generator], Iterator[torch.Tensor]]:
    """A stream order (:attr:`fedul_flwr.methods.base.Stream.batches`) of ceil(n / B) batches of
    B row indices drawn uniformly with replacement from ``range(num_rows)``.

    Raises
    ------
    ValueError
        If ``num_rows`` or ``batch_size`` is < 1.
    """
    if num_rows < 1 or batch_size < 1:
        raise ValueError(f"sampling with replacement needs rows and a batch size >= 1, got {num_rows}, {batch_size}")

    def batches(generator: torch.Generator) -> Iterator[torch.Tensor]:
        for _ in range(math.ceil(num_rows / batch_size)):
            yield torch.randint(num_rows, (batch_size,), generator=generator)

    return batches


@register_method
class SemiFL(ThresholdedPseudoLabels, FixMatch):
    """SemiFL's clients (fix and mix losses on once-per-round pseudo-labels) and server
    (fine-tuning on the labels, static batch norm); module docstring."""

    name = "semifl"
    settings = ("labels-at-server", "labels-at-clients", "annotation-heterogeneity")
    options = FixMatch.options + OPTIONS + DPL_PLUGIN_OPTIONS
    recorded_metrics = (*FixMatch.recorded_metrics, APP_U)
    trains_on_server = True

    def server_update(
        self, server: ClientData, models: nn.ModuleDict, ctx: ServerRoundContext, loop: LocalLoop
    ) -> TrainResult | None:
        """The fine-tuning on the server's labeled images (FixMatch's server task), then sBN on
        them where ``semifl-sbn`` is set (:func:`~fedul_flwr.methods.semifl.sbn.static_batch_norm`)."""
        result = super().server_update(server, models, ctx, loop)
        if self.option("semifl-sbn") and server.labeled is not None:
            static_batch_norm(models["f"], server.labeled.x, server.to_input, ctx.device, self.cfg.eval_batch_size)
        return result

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """Streams ``labeled`` (where the client has labels: weak views; drives the epoch),
        ``fix`` (the confident unlabeled images, their pseudo-labels, weak and strong views) and
        ``mix`` (every unlabeled image with its pseudo-label, weak view, drawn with
        replacement); loss = CE(labeled) + lambda (L_fix + L_mix) (module docstring).

        Raises
        ------
        NothingToTrain
            For a client without labels none of whose pseudo-labels passes tau.
        """
        weak, strong = self.views(client)
        streams: dict[str, Stream] = {}
        if "labeled" in client.parts():
            streams["labeled"] = self.labeled_stream(client)
        self.kept_share, self.correct_share = 0.0, None
        unlabeled = client.unlabeled if "unlabeled" in client.parts() else None
        probs = None if unlabeled is None else predict_weak(
            models["f"], models["f"], unlabeled, weak, ctx.generator, client.to_input, ctx.device, self.cfg.eval_batch_size)
        # FedDB's plug-in (dpl): APP-U is the mean of these very predictions (Eq. 8); the
        # pseudo-labels are fixed for the round, so no per-epoch update
        self.begin_dpl(client, models, ctx, probs=probs, per_epoch=False)
        if unlabeled is not None and probs is not None:
            targets, mask = (t.cpu() for t in self.pseudo_labels_from(probs))
            self.kept_share = float(mask.float().mean())
            if client.unlabeled_classes is not None:  # diagnostics only: true classes in simulation
                self.correct_share = float((mask & (targets == client.unlabeled_classes)).float().mean())
            if bool(mask.any()):
                size = self.cfg.batch_size * (self.option("fixmatch-mu") if streams else 1)
                streams["fix"] = Stream({"x": unlabeled[mask], "y": targets[mask]}, size, images=(),
                                        views={"weak": ("x", weak), "strong": ("x", strong)})  # fmt: skip
                streams["mix"] = Stream({"x": unlabeled, "y": targets}, size, images=(), views={"weak": ("x", weak)},
                                        batches=with_replacement(len(targets), size))  # fmt: skip
        if not streams:
            n_u = 0 if client.unlabeled is None else len(client.unlabeled)
            raise NothingToTrain(f"no pseudo-label of the client's {n_u} unlabeled images "
                                 f"reached tau = {self.option('fixmatch-threshold')}")  # fmt: skip
        lam_u, alpha = float(self.option("fixmatch-lambda")), float(self.option("semifl-mixup-alpha"))

        def loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            f = models["f"]
            lb, fb, mb = batch.get("labeled"), batch.get("fix"), batch.get("mix")
            n_l = len(lb["y"]) if lb else 0
            logits = f(torch.cat([t for t in (lb and lb["weak"], fb and fb["strong"]) if t is not None]))
            total = F.cross_entropy(logits[:n_l], lb["y"]) if lb else logits.sum() * 0
            self._labeled_rows += n_l
            if fb and mb:
                n = min(len(fb["y"]), len(mb["y"]))
                lam = float(ctx.rng.beta(alpha, alpha))
                mix = mixup_loss(f, fb["weak"][:n], fb["y"][:n], mb["weak"][:n], mb["y"][:n], lam)
                total = total + lam_u * (F.cross_entropy(logits[n_l:], fb["y"]) + mix)
                self._kept += len(fb["y"])
            return total

        self.reset_counts()
        return self.with_dpl(LocalTask(streams, loss))

    def uploads(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> dict[str, float | list[float]]:
        """``pseudo-label-share``: the share of the client's unlabeled images whose pseudo-label
        passed tau at the start of the round (0 without unlabeled images); in simulation also
        ``pseudo-label-correct-share``, the share kept with their true class (a diagnostic)."""
        out: dict[str, float | list[float]] = {"pseudo-label-share": self.kept_share, **self.dpl_uploads()}
        if self.correct_share is not None:
            out["pseudo-label-correct-share"] = self.correct_share
        return out
