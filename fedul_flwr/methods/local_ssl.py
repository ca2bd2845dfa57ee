"""Local semi-supervised learning inside FedAvg: what FixMatch, UDA and MixMatch share.

Each of these methods runs a centralized semi-supervised recipe on every client's own labeled
and unlabeled images and lets the run's strategy (FedAvg) average the models. They share
(:class:`LocalSSL`):

- **the parts and settings**: no part is required; a client trains on the labeled images
  (``labeled``: uint8 ``[n_L, C, H, W]``, int64 ``[n_L]``) and the unlabeled images
  (``unlabeled``: uint8 ``[n_U, C, H, W]``) it holds, in the ``labels-at-clients``, the
  ``annotation-heterogeneity`` and the ``labels-at-server`` settings; a client with neither
  sits the round out;
- **the server's task** in the ``labels-at-server`` setting (clients with unlabeled images
  only): the mean cross-entropy of f on the weak views of the server's labeled images after
  every aggregation (:meth:`LocalSSL.server_task`);
- **the views**: the weak augmentation alpha (crop and, where the dataset allows, flip) of
  the labeled images and the weak and strong (RandAugment, Cutout) views of the unlabeled ones
  (:mod:`fedul_flwr.augment`); the run's ``augment`` does not apply;
- **the streams**: ``labeled`` (B rows a step, drives the local epoch) and ``unlabeled`` (its
  own rows a step, cycled), those the client holds; a client with unlabeled images only
  walks its unlabeled stream once per epoch (:meth:`LocalSSL.ssl_streams`);
- **the consistency step** of FixMatch and UDA (:meth:`LocalSSL.consistency_task`): the
  labeled weak views, the unlabeled weak views and the strong views through the model in one
  forward pass (batch norm sees all), L = CE(labeled) + lambda L_u(weak logits, strong logits)
  with the method's own L_u and mask;
- **the pseudo-label counts** uploaded as ``pseudo-label-share`` (the share of the round's
  unlabeled images whose target passed the method's confidence mask) and, where the
  simulation knows the true classes, ``pseudo-label-correct-share``.

And :func:`mixup`, the convex combination of inputs and targets (Zhang et al., ICLR 2018)
that FedPL and MixMatch mix with.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.augment import Augmentation
from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import Batch, LocalTask, Method, ServerRoundContext, Stream
from fedul_flwr.methods.pseudo_label_counts import PseudoLabelCounts

__all__ = ["SSL_SETTINGS", "LocalSSL", "UnlabeledTerm", "mixup"]

SSL_SETTINGS = ("labels-at-clients", "annotation-heterogeneity", "labels-at-server")
"""The client settings of the local semi-supervised methods."""

UnlabeledTerm = Callable[[torch.Tensor | None, torch.Tensor, dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""``term(weak_logits [n, K] or None, strong_logits [n, K], unlabeled batch) -> (L_u scalar,
int64 targets [n], bool mask [n])``: a method's unlabeled loss of one step and the hard
targets and confidence mask it counts."""


def mixup(a: torch.Tensor, b: torch.Tensor, lam: torch.Tensor | float) -> torch.Tensor:
    """MixUp's convex combination ``lam a + (1 - lam) b`` (Zhang et al., ICLR 2018, Eq. 1).

    Parameters
    ----------
    a, b : torch.Tensor
        ``[N, ...]`` inputs (float images ``[N, C, H, W]``) or targets (``[N, K]``).
    lam : torch.Tensor | float
        One weight in [0, 1] for all rows, or one per row: ``[N]`` (broadcast over the
        trailing dimensions).

    Returns
    -------
    torch.Tensor
        ``[N, ...]``, the dtype of ``a``.
    """
    if isinstance(lam, torch.Tensor):
        lam = lam.to(a.dtype).reshape(-1, *([1] * (a.dim() - 1)))
    return lam * a + (1.0 - lam) * b


class LocalSSL(PseudoLabelCounts, Method):
    """A semi-supervised recipe run on every client's own images (module docstring); a
    subclass supplies ``local_task`` (e.g. through :meth:`consistency_task`)."""

    requires = ()
    uses = ("labeled", "unlabeled")
    setting = "labels-at-clients"
    settings = SSL_SETTINGS
    trains_on_server = True

    def sits_out(self, client: ClientData) -> bool:
        """A client with neither labeled nor unlabeled images (or without a required part)."""
        return super().sits_out(client) or not {"labeled", "unlabeled"} & set(client.parts())

    @staticmethod
    def weak_view(client: ClientData) -> Augmentation:
        """The weak augmentation alpha of this client's images (crop; flip where allowed)."""
        return Augmentation("weak", client.image_shape[1], client.flip)

    @staticmethod
    def strong_view(client: ClientData, name: str) -> Augmentation:
        """The strong augmentation ``name`` (``strong`` or ``strong-random``) of this client's
        images."""
        return Augmentation(name, client.image_shape[1], client.flip)

    @staticmethod
    def known_classes(client: ClientData) -> dict[str, torch.Tensor]:
        """``{"classes": the true classes of the unlabeled images}`` where the run knows them
        (simulation), else ``{}``: the unlabeled stream carries them for the diagnostic
        ``pseudo-label-correct-share`` only; no loss reads them."""
        return {} if client.unlabeled_classes is None else {"classes": client.unlabeled_classes}

    def labeled_stream(self, client: ClientData) -> Stream:
        """The labeled images (``x``), their classes (``y``) and weak views (``weak``), B =
        ``batch-size`` rows a step."""
        assert client.labeled is not None
        return Stream({"x": client.labeled.x, "y": client.labeled.y}, self.cfg.batch_size, images=(),
                      views={"weak": ("x", self.weak_view(client))})  # fmt: skip

    def ssl_streams(self, client: ClientData, unlabeled: Callable[[], Stream]) -> dict[str, Stream]:
        """The streams the client holds: ``labeled`` (:meth:`labeled_stream`, first: it drives
        the epoch) and ``unlabeled`` (built by ``unlabeled()``, only for a client with
        unlabeled images)."""
        streams: dict[str, Stream] = {}
        if "labeled" in client.parts():
            streams["labeled"] = self.labeled_stream(client)
        if "unlabeled" in client.parts():
            streams["unlabeled"] = unlabeled()
        return streams

    def server_task(self, server: ClientData, models: nn.ModuleDict, ctx: ServerRoundContext) -> LocalTask:
        """L_s on the server's labeled images (labels-at-server): the mean cross-entropy of f on
        their weak views (:meth:`labeled_stream`), B images per step."""

        def loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            return F.cross_entropy(models["f"](batch["labeled"]["weak"]), batch["labeled"]["y"])

        return LocalTask({"labeled": self.labeled_stream(server)}, loss)

    # ---------------------------------------------------------------- the consistency step
    def consistency_task(self, streams: dict[str, Stream], lam: float, term: UnlabeledTerm) -> LocalTask:
        """The FixMatch-shaped step: the labeled batch's weak views (``[B, C, H, W]``), the
        unlabeled batch's ``weak`` views (where its stream has them) and ``strong`` views
        (``[n, C, H, W]`` each) through ``f`` in one forward pass; loss = CE(f(weak x), y) +
        lam * L_u, L_u = ``term(weak logits, strong logits, batch)``. A client with one part
        trains the term of that part alone.

        Parameters
        ----------
        streams : dict[str, Stream]
            From :meth:`ssl_streams`; the unlabeled stream has a ``strong`` view.
        lam : float
            Weight of L_u (>= 0).
        term : UnlabeledTerm
            The method's L_u, its hard targets and mask (counted for the uploads).
        """

        def loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            lb, ub = batch.get("labeled", {}), batch.get("unlabeled", {})
            n_l, n_w = len(lb["y"]) if lb else 0, len(ub["weak"]) if "weak" in ub else 0
            parts = [t for t in (lb.get("weak"), ub.get("weak"), ub.get("strong")) if t is not None]
            logits = models["f"](torch.cat(parts))
            total = F.cross_entropy(logits[:n_l], lb["y"]) if n_l else logits.sum() * 0
            self._labeled_rows += n_l
            if ub:
                loss_u, targets, mask = term(logits[n_l : n_l + n_w] if n_w else None, logits[n_l + n_w :], ub)
                self.count(targets, mask, ub)
                total = total + lam * loss_u
            return total

        self.reset_counts()
        return LocalTask(streams, loss)
