"""Debiased pseudo-labels (DPL) of FedDB, on FixMatch: ``method = "fixmatch-dpl"``.

Zhu et al., "Debiasing Federated Semi-Supervised Learning" (FedDB), IJCAI 2024, Sec. 4.1,
Alg. 1 and Alg. 3. A client's pseudo-labels inherit the class bias of its model; DPL removes
it with the client's *average prediction on unlabeled data* (APP-U):

    p_n  = softmax(f(alpha(u_n); w))                                  (u_n in D_u)
    pbar = 1/N_u sum_n p_n                                            (Eq. 8, APP-U)
    ptilde_n[y] = (p_n[y] / pbar[y]) / sum_k (p_n[k] / pbar[k])       (Eq. 14)
    yhat_n = argmax ptilde_n, kept where max ptilde_n > tau.

Eq. 14 is Bayes' rule moving the posterior from the training prior (estimated by pbar) to the
uniform target prior of a balanced test set (Eqs. 9-13). Per round (Alg. 1, before the local
epochs): the received global model predicts the weak views of all of D_u in eval mode; pbar,
the debiased pseudo-labels and their mask are computed once and stay fixed for the round's
local epochs; the strong views are trained on them (FixMatch's L_u). APP-U is then updated by
an exponential moving average once per local epoch, in Alg. 3's order: pbar^e is computed at
line 12, *before* the epoch's update at line 16, with the weights w^{e-1} that epoch e starts
from (w^0 = the received global model):

    pbar^e = 1/N_u sum_n softmax(f(alpha(u_n); w^{e-1})),   pbar <- gamma pbar + (1 - gamma) pbar^e,

so after E epochs pbar averages the predictions of w^0, ..., w^{E-1} (the final weights w^E
never enter). The client uploads the final pbar (a K-vector metric, ``app-u``) with its
model; the server's DMA (:mod:`fedul_flwr.strategies.dma`, method ``feddb``) uses it.

Choices the paper leaves open:

- gamma (``dpl-ema``) = 0.5, the authors' code's coefficient (the paper gives none).
- ``dpl-app-u-update = "epoch"`` (default, the paper): pbar^e over all of D_u before each
  epoch, one extra forward pass over the weak views. ``"step"`` (the authors' code,
  ``modules.py``): at every step, pbar <- gamma pbar + (1 - gamma) mean softmax of the weak
  views of that batch's confident images, from the training forward pass, i.e. with the
  weights before that step's update (the weak views then go through it too). Both use the
  weights before the update they precede; neither uses the weights after an update.
- Predictions for pseudo-labels and for APP-U are made in eval mode (batch norm's running
  statistics), as in the authors' code.

APP-U and its updates are kept by :class:`~fedul_flwr.methods.feddb.debias.DebiasedPseudoLabels`,
the same object that adds DPL to other methods as a plug-in (``dpl = true``); here it is always on
and starts from the round's pseudo-labelling pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import LocalTask, RoundContext, Stream, register_method
from fedul_flwr.methods.feddb.debias import APP_U, DebiasedPseudoLabels, debias, debiased_pseudo_labels, predict_weak
from fedul_flwr.methods.feddb.settings import DPL_OPTIONS
from fedul_flwr.methods.fixmatch.fixmatch import FixMatch

__all__ = ["APP_U", "DebiasedPseudoLabels", "FixMatchDPL", "debias", "debiased_pseudo_labels", "predict_weak"]


@register_method
class FixMatchDPL(FixMatch):
    """FixMatch with debiased pseudo-labels, computed once per round (module docstring)."""

    name = "fixmatch-dpl"
    requires = ("labeled", "unlabeled")  # APP-U is over the unlabeled part; the labels anchor it
    settings = ("labels-at-clients", "annotation-heterogeneity")
    trains_on_server = False
    recorded_metrics = (APP_U, *FixMatch.recorded_metrics)
    options = FixMatch.options + DPL_OPTIONS

    def unlabeled_stream(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> Stream:
        """The unlabeled images with this round's debiased pseudo-labels (``pseudo``) and mask
        (``mask``) from the received global model, and their strong views (plus the weak ones
        under ``dpl-app-u-update = "step"``). Starts the round's APP-U
        (:class:`~fedul_flwr.methods.feddb.debias.DebiasedPseudoLabels`, from this very pass)."""
        assert client.unlabeled is not None  # ``requires``
        weak, strong = self.views(client)
        probs = predict_weak(models["f"], models["f"], client.unlabeled, weak, ctx.generator, client.to_input,
                             ctx.device, self.cfg.eval_batch_size)  # fmt: skip
        per_epoch = self.option("dpl-app-u-update") == "epoch"
        self.dpl = DebiasedPseudoLabels(self, client, models, ctx, probs=probs, per_epoch=per_epoch, always=True)
        targets, mask = debiased_pseudo_labels(probs, self.dpl.app_u, self.option("fixmatch-threshold"))
        self.kept_share = float(mask.float().mean())
        classes = self.known_classes(client).get("classes")  # diagnostics only: true classes in simulation
        self.correct_share = None if classes is None else float((mask.cpu() & (targets.cpu() == classes)).float().mean())
        views = {"strong": ("x", strong)}
        if not per_epoch:
            views["weak"] = ("x", weak)
        size = self.option("fixmatch-mu") * self.cfg.batch_size
        return Stream({"x": client.unlabeled, "pseudo": targets.cpu(), "mask": mask.cpu()}, size, images=(), views=views)

    def pseudo_labels(self, weak_logits: torch.Tensor | None, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The round's fixed pseudo-labels; under ``"step"`` also the code's per-step APP-U
        update from the weak views of the confident images."""
        mask = batch["mask"]
        if weak_logits is not None and bool(mask.any()):
            self.dpl.update(F.softmax(weak_logits.detach().float()[mask], dim=1).mean(dim=0))
        return batch["pseudo"], mask

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """FixMatch's task on the debiased pseudo-labels; under ``"epoch"`` APP-U is updated
        before every local epoch, with the weights the epoch starts from (Alg. 3, line 12)."""
        task = super().local_task(client, models, ctx)
        return self.dpl.chained(task)

    def uploads(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> dict[str, float | list[float]]:
        """``app-u``: the client's final APP-U (K floats) and ``pseudo-label-share``, the
        share of its unlabeled images kept at the start of the round; in simulation also
        ``pseudo-label-correct-share``, the share kept with their true class (a diagnostic)."""
        out: dict[str, float | list[float]] = {**self.dpl.uploads(), "pseudo-label-share": self.kept_share}
        if self.correct_share is not None:
            out["pseudo-label-correct-share"] = self.correct_share
        return out
