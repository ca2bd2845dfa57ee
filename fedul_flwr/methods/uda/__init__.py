"""UDA on every client (FedAvg + UDA): ``method = "uda"``.

Xie, Dai, Hovy, Luong and Le, "Unsupervised Data Augmentation for Consistency Training",
NeurIPS 2020, Eq. 1 and Sec. 3.2; run by every client on its own labeled and unlabeled images,
the models averaged by the run's strategy, as the "UDA" baseline of FedMatch's protocol
(Jeong et al., ICLR 2021) that FedPU's Table 5 reports.

A client with labeled images (x_b, y_b) and unlabeled images u_b minimises, per step,

    L = 1/B sum_b CE(f(alpha(x_b)), y_b)
        + lambda * 1/(mu B) sum_b 1[max_k p_b,k > beta] KL(q_b || softmax(f(A(u_b)))),
    p_b = softmax(f(alpha(u_b))),   q_b = softmax(f(alpha(u_b)) / tau)     (no gradient),

with alpha the weak and A the strong augmentation (RandAugment, :mod:`fedul_flwr.augment`),
beta the confidence mask (``uda-threshold``, 0.8), tau the softmax temperature that sharpens
the target (``uda-temperature``, 0.4), lambda = ``uda-lambda`` (1) and mu = ``uda-mu`` (7)
unlabeled images per labeled one. The labeled, target and strong views go through f in one
forward pass (:meth:`~fedul_flwr.methods.local_ssl.LocalSSL.consistency_task`, FixMatch's
step); UDA differs from FixMatch only in its unlabeled term: a sharpened *soft* target and a
KL divergence where FixMatch takes the hard argmax and a cross-entropy.

Choices:

- **The target view** (``uda-target-view``): ``weak`` (default), the weak augmentation of
  the unlabeled image, as FixMatch's comparison and FedMatch's baselines run UDA; ``original``
  the image as it is, UDA's Eq. 1 (p(y | x) of the unaugmented x).
- **The mask** is strict (max p > beta) and on the unsharpened p, as UDA's code
  (``tf.greater(largest_prob, uda_confidence_thresh)`` on ``softmax(ori_logits)``); masked
  images count in the mean (1/(mu B)), as in the code's ``reduce_mean`` of the masked loss.
  ``uda-threshold = 0`` and ``uda-temperature = 1`` turn masking and sharpening off, as the
  authors' CIFAR-10 image scripts run (their flags' default -1).
- **Strong view** (``uda-strong-augment``): as FixMatch's, RandAugment with N = 2 at a fixed
  magnitude (``strong``) or at a random one per image and operation with Cutout
  (``strong-random``, closer to UDA's code, which samples the magnitude).
- **Not here**: training signal annealing (TSA, UDA's Sec. 3.2 / App.; off by default in the
  authors' image code, whose CIFAR-10 and SVHN scripts leave its ``tsa`` flag empty),
  domain-relevance data filtering, and the authors' per-dataset unlabeled batch ratios (their
  CIFAR-10 GPU script uses 5; the default 7 is FixMatch's mu, at which FixMatch's comparison
  ran UDA).
- **A client with one part only** (annotation-heterogeneity) trains the term of what it
  holds: the CE alone on labeled images, lambda times the consistency term alone on
  unlabeled ones (the unlabeled stream, mu B images a step, then drives the epoch); one with
  neither sits out. The reply's weight is n_L where the client has labels, else n_U.
- **Labels at the server** (``client-setting=labels-at-server``): the clients hold unlabeled
  images only and train lambda times the consistency term alone; the server trains the CE on
  the weak views of its labeled images after every aggregation
  (:meth:`~fedul_flwr.methods.local_ssl.LocalSSL.server_task`), FedMatch's protocol.
- Uploads, as FixMatch's: ``pseudo-label-share`` (the share of the round's unlabeled images
  that passed beta) and, in simulation, ``pseudo-label-correct-share`` (passed, and the
  target's argmax is the true class).

The paper's numbers to compare with (test accuracy, %): FedPU's Table 5 (Lin et al., ICML
2022), CIFAR-10 in FedMatch's protocol (100 clients, 5 labeled images per class each): UDA
47.45 IID and 46.31 non-IID (FixMatch 47.2 / 46.2, FedMatch 52.13 / 52.25, FedPU 58.25 / 55.2).
The grid ``fedpu-table5-cifar10`` runs that table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.augment import Augmentation
from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import LocalTask, RoundContext, Stream, register_method
from fedul_flwr.methods.local_ssl import LocalSSL
from fedul_flwr.methods.uda.settings import OPTIONS

__all__ = ["UDA", "masked_kl", "sharpened_targets"]


def sharpened_targets(logits: torch.Tensor, temperature: float, threshold: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """UDA's target of an unlabeled batch (Sec. 3.2), without gradient.

    Parameters
    ----------
    logits : torch.Tensor
        ``[n, K]`` logits of the target views.
    temperature : float
        tau > 0: the target is ``softmax(logits / tau)`` (sharper for tau < 1).
    threshold : float
        beta: the mask keeps the rows whose largest ``softmax(logits)`` is > beta.

    Returns
    -------
    (torch.Tensor, torch.Tensor, torch.Tensor)
        float ``[n, K]`` targets q, int64 ``[n]`` their argmax, bool ``[n]`` mask.
    """
    logits = logits.detach().float()
    confidence, hard = F.softmax(logits, dim=1).max(dim=1)
    return F.softmax(logits / temperature, dim=1), hard, confidence > threshold


def masked_kl(targets: torch.Tensor, strong_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """UDA's consistency term: mean over the batch of mask * KL(q || softmax(strong logits)).

    Parameters
    ----------
    targets : torch.Tensor
        ``[n, K]`` target distributions q (rows sum to 1; zeros allowed).
    strong_logits : torch.Tensor
        ``[n, K]`` logits of the strong views.
    mask : torch.Tensor
        ``[n]`` 1 where the row counts, 0 where not (bool or float).

    Returns
    -------
    torch.Tensor
        Scalar ``1/n sum_b mask_b sum_k q_bk (log q_bk - log p_bk)``, masked rows counted in
        n; 0 for an empty batch.
    """
    if len(targets) == 0:
        return strong_logits.sum() * 0
    log_p = F.log_softmax(strong_logits.float(), dim=1)
    kl = (torch.xlogy(targets, targets) - targets * log_p).sum(dim=1)
    return (kl * mask.to(kl.dtype)).mean()


def _unaugmented(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The images as they are (``uda-target-view = "original"``); draws nothing."""
    return images


@register_method
class UDA(LocalSSL):
    """UDA on each client's labeled and unlabeled images (module docstring)."""

    name = "uda"
    recorded_metrics = ("pseudo-label-share", "pseudo-label-correct-share")
    options = OPTIONS

    def unlabeled_stream(self, client: ClientData) -> Stream:
        """The unlabeled images (``x``) with their target views (``weak``: the weak
        augmentation or the image itself, ``uda-target-view``) and strong views, mu B a step."""
        assert client.unlabeled is not None
        target: Augmentation | object = self.weak_view(client) if self.option("uda-target-view") == "weak" else _unaugmented
        strong = self.strong_view(client, self.option("uda-strong-augment"))
        return Stream({"x": client.unlabeled, **self.known_classes(client)}, self.option("uda-mu") * self.cfg.batch_size,
                      images=(), views={"weak": ("x", target), "strong": ("x", strong)})  # type: ignore[dict-item]  # fmt: skip

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """Streams ``labeled`` and ``unlabeled``, those the client holds; loss = CE + lambda *
        masked KL (module docstring)."""
        tau, beta = float(self.option("uda-temperature")), float(self.option("uda-threshold"))

        def term(weak_logits: torch.Tensor | None, strong_logits: torch.Tensor, batch: dict[str, torch.Tensor]):  # type: ignore[no-untyped-def]
            assert weak_logits is not None  # UDA's stream has target views
            targets, hard, mask = sharpened_targets(weak_logits, tau, beta)
            return masked_kl(targets, strong_logits, mask), hard, mask

        streams = self.ssl_streams(client, lambda: self.unlabeled_stream(client))
        return self.consistency_task(streams, float(self.option("uda-lambda")), term)

    def uploads(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> dict[str, float | list[float]]:
        """``pseudo-label-share`` and, in simulation, ``pseudo-label-correct-share`` of the
        round (:meth:`~fedul_flwr.methods.local_ssl.LocalSSL.pseudo_label_uploads`)."""
        return self.pseudo_label_uploads(client)
