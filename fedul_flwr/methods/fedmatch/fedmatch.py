"""FedMatch: inter-client consistency and disjoint learning of decomposed parameters.

Jeong et al., "Federated Semi-Supervised Learning with Inter-Client Consistency & Disjoint
Learning", ICLR 2021, Sec. 3; checked against the authors' TensorFlow code
(``models/fedmatch/client.py``, ``server.py``, ``modules/train.py``, ``config.py``).

**Decomposition.** The classifier's parameters are theta = sigma + psi (:mod:`.losses`). The
method's exchanged models are ``sigma`` and ``psi``, two modules of the run's architecture,
plus ``theta``, their sum, which the server sets after every round
(:class:`~.helpers.FedMatchAggregation`) and the predictors evaluate, and the H helper models.
Two models rather than one decomposed module, because the two halves travel and average
apart: a client sends only the half its data trains (sigma with labels, psi with unlabeled
images), each is averaged over its senders with its own weight (n_L, n_U), and under
labels-at-server the clients send psi alone while the server trains sigma. ``theta`` exists
because the central evaluation calls models by name on an input: it is the one model whose
forward is the classifier. Its cost is one more model in each train message. psi starts at
``fedmatch-psi-init`` x sigma (0.2, the code's psi_factor) and theta at (1 + that) x sigma.

**A client's round** (one local loop over both halves; each step):

    L = lambda_s CE(y, f_{sigma + psi*}(x))                                   (labeled x)
      + lambda_ICCS mean_{u: max p(u) >= tau} [ CE(y_hat(u), f_{sigma* + psi}(A(u)))
                                               + 1/H sum_j KL(p_{rho_j}(u) || p(u)) ]
      + lambda_L1 sum |psi| + lambda_L2 sum (sigma* - psi)^2                 (unlabeled u)

with * frozen (its gradient cut), p = softmax f_{sigma* + psi}, A the strong augmentation
(RandAugment, as the code's ``augment(soft=False)``), y_hat the agreement pseudo-label
(:meth:`FedMatch.pseudo_labels`) and rho_j = sigma (received) + psi_j the helpers
(:mod:`.helpers`). One optimiser step takes both gradients: sigma's from the labeled term only,
psi's from the unlabeled terms only -- the code's two steps per batch (sigma, then psi) taken at
once. Weights lambda and tau: ``fedmatch-*`` options (:mod:`.settings`).

Choices, where the paper is silent (the code's unless said):

- **Batches.** The labeled stream drives an epoch (B = ``batch-size`` labeled images per step)
  and the unlabeled batch is ceil(n_U / steps), so an epoch passes over every unlabeled image
  once (the code's ``bsize_u``); without labels the unlabeled stream drives it with B.
- **Means.** The consistency terms are means over the confident images of the batch (0 when
  there are none); the regularisers are sums over every parameter entry, once per step.
- **What is decomposed.** Every parameter of the architecture, biases and batch-norm affine
  parameters included (the code's ResNet-9 has neither); buffers are sigma's.
- **Sending.** psi's entries at or below ``fedmatch-sparsity-threshold`` are set to 0 before
  sending (the code's ``sparsify``); the code's further cut of unchanged entries (its C2S
  accounting, ``delta_thres``) is left out: it changes what travels, not the model.
- **Helpers** travel every ``fedmatch-helper-interval``-th round (10, the code's
  ``h_interval``); in other rounds the agreement and the KL use the local model alone.
- **A client with one part** (annotation heterogeneity): labeled only, L_s alone, sends sigma;
  unlabeled only, the unlabeled terms alone, sends psi; neither, it sits out.
- **Labels at the server** (``client-setting=labels-at-server``): clients hold unlabeled
  images only and send psi; the server trains sigma on its labeled images with psi frozen,
  lambda_s CE, after every aggregation (:meth:`FedMatch.server_task`), then sets theta.

Per-round diagnostics (train metrics): ``pseudo-label-share`` (images above tau),
``pseudo-label-correct-share`` (simulation), ``psi-nonzero-share`` (the share of psi's entries
sent non-zero: its sparsity).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.augment import Augmentation
from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import (
    Batch, LocalTask, Method, ModelSpec, Predictor, RoundContext, ServerRoundContext, Stream, register_method,
)  # fmt: skip
from fedul_flwr.methods.feddb.settings import DPL_PLUGIN_OPTIONS
from fedul_flwr.methods.feddb.debias import APP_U, FedDPL
from fedul_flwr.methods.fedmatch.helpers import HELPERS_SENT, NUM_LABELED, NUM_UNLABELED, FedMatchAggregation, helper_name
from fedul_flwr.methods.fedmatch.losses import (
    Decomposed, agreement_pseudo_labels, consistency, masked_mean, sparsify, sparsity_and_distance, theta_state,
)  # fmt: skip
from fedul_flwr.methods.fedmatch.settings import OPTIONS
from fedul_flwr.methods.pseudo_label_counts import PseudoLabelCounts

if TYPE_CHECKING:  # pragma: no cover
    from fedul_flwr.training import LocalLoop, TrainResult

__all__ = ["DECOMPOSED", "FedMatch"]

DECOMPOSED = "decomposed"
"""The loop's name of the :class:`~.losses.Decomposed` forward of sigma + psi (no parameters)."""


@register_method
class FedMatch(PseudoLabelCounts, FedDPL, Method):
    """FedMatch (module docstring)."""

    name = "fedmatch"
    requires = ()
    uses = ("labeled", "unlabeled")
    setting = "labels-at-clients"
    settings = ("labels-at-clients", "annotation-heterogeneity", "labels-at-server")
    options = OPTIONS + DPL_PLUGIN_OPTIONS
    trains_on_server = True
    batched_cohort = False
    recorded_metrics = ("pseudo-label-share", "pseudo-label-correct-share", "psi-nonzero-share", APP_U)

    # ------------------------------------------------------------------ models
    @property
    def num_helpers(self) -> int:
        """H, ``fedmatch-helpers``."""
        return int(self.option("fedmatch-helpers"))

    def model_specs(self) -> tuple[ModelSpec, ...]:
        """sigma, psi (from psi-init x sigma), theta (from (1 + psi-init) x sigma, never trained:
        the server sets it) and the helpers (never trained, never sent back)."""
        factor = float(self.option("fedmatch-psi-init"))
        return (
            ModelSpec("sigma"),
            ModelSpec("psi", initial="sigma", initial_scale=factor),
            ModelSpec("theta", trained=False, initial="sigma", initial_scale=1.0 + factor),
            *(ModelSpec(helper_name(j), trained=False) for j in range(1, self.num_helpers + 1)),
        )

    def aggregation(self) -> type | None:
        """:class:`~.helpers.FedMatchAggregation` bound to this run's settings."""
        return type("FedMatchAggregation", (FedMatchAggregation,), {
            "run_config": self.cfg, "helpers": self.num_helpers,
            "helper_interval": int(self.option("fedmatch-helper-interval")),
            "threshold": float(self.option("fedmatch-sparsity-threshold")),
        })  # fmt: skip

    def predictors(self) -> dict[str, Predictor]:
        """theta = sigma + psi, the classifier."""
        return {"theta": lambda models, x: models["theta"](x)}

    # ------------------------------------------------------------------ pseudo-labels
    def pseudo_labels(self, probs: torch.Tensor, helper_probs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Agreement-based pseudo-labels (:func:`~.losses.agreement_pseudo_labels`) at tau =
        ``fedmatch-threshold``.

        Parameters
        ----------
        probs : torch.Tensor
            ``[n, K]`` softmax of the local model on the unlabeled batch (no gradient).
        helper_probs : torch.Tensor | None
            ``[H, n, K]`` softmax of the helpers, or ``None`` in a round without helpers.

        Returns
        -------
        (torch.Tensor, torch.Tensor)
            int64 ``[n]`` targets and bool ``[n]`` mask.
        """
        return agreement_pseudo_labels(self.debiased(probs), helper_probs, float(self.option("fedmatch-threshold")))

    def dpl_forward(self, models: nn.ModuleDict) -> nn.Module:
        """The local classifier sigma + psi, whose pseudo-labels ``dpl`` debiases (the helpers'
        predictions stay as they are: APP-U is the client's own model's bias)."""
        return models[DECOMPOSED] if DECOMPOSED in models else Decomposed(models["sigma"], models["psi"])

    # ------------------------------------------------------------------ the client's round
    @staticmethod
    def _has(client: ClientData, part: str) -> bool:
        data = getattr(client, part, None)
        return part in client.parts() and data is not None and len(data) > 0

    def sits_out(self, client: ClientData) -> bool:
        """A client with neither labeled nor unlabeled images."""
        return super().sits_out(client) or not (self._has(client, "labeled") or self._has(client, "unlabeled"))

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """Streams ``labeled`` (x, y; drives the epoch) and ``unlabeled`` (x and its strong view),
        those the client holds; the loss of the module docstring (with ``dpl``, FedDB's debiased
        pseudo-labels: :class:`~fedul_flwr.methods.feddb.debias.FedDPL`)."""
        self.begin_dpl(client, models, ctx)
        streams: dict[str, Stream] = {}
        b = self.cfg.batch_size
        if self._has(client, "labeled"):
            assert client.labeled is not None
            streams["labeled"] = Stream({"x": client.labeled.x, "y": client.labeled.y}, b)
        if self._has(client, "unlabeled"):
            assert client.unlabeled is not None
            n_u = len(client.unlabeled)
            size = math.ceil(n_u / math.ceil(len(client.labeled.y) / b)) if "labeled" in streams else b  # type: ignore[union-attr]
            strong = Augmentation("strong", client.image_shape[1], client.flip)
            known = {} if client.unlabeled_classes is None else {"classes": client.unlabeled_classes}
            streams["unlabeled"] = Stream({"x": client.unlabeled, **known}, size, views={"strong": ("x", strong)})
        own = Decomposed(models["sigma"], models["psi"])
        helpers = [helper_name(j) for j in range(1, int(ctx.broadcast.get(HELPERS_SENT, 0)) + 1)]
        lam_s, lam_c = float(self.option("fedmatch-lambda-s")), float(self.option("fedmatch-lambda-iccs"))
        lam_l1, lam_l2 = float(self.option("fedmatch-lambda-l1")), float(self.option("fedmatch-lambda-l2"))

        def loss(forwards: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            dec = forwards[DECOMPOSED] if DECOMPOSED in forwards else own
            lb, ub = batch.get("labeled"), batch.get("unlabeled")
            total = torch.zeros((), device=next(iter(batch.values()))["x"].device)
            if lb:
                total = total + lam_s * F.cross_entropy(dec(lb["x"], frozen="psi"), lb["y"])
            if ub:
                n = len(ub["x"])
                logits = dec(torch.cat([ub["x"], ub["strong"]]), frozen="sigma")
                log_p = F.log_softmax(logits[:n], dim=1)
                helper_probs = None
                if helpers:
                    with torch.no_grad():
                        helper_probs = torch.stack([F.softmax(forwards[h](ub["x"]), dim=1) for h in helpers])
                targets, mask = self.pseudo_labels(log_p.detach().exp(), helper_probs)
                phi = F.cross_entropy(logits[n:], targets, reduction="none")
                if helper_probs is not None:
                    phi = phi + consistency(log_p, helper_probs)
                total = total + lam_c * masked_mean(phi, mask) + sparsity_and_distance(own._parts[0], own._parts[1], lam_l1, lam_l2)
                self.count(targets, mask, ub)
            return total

        self.reset_counts()
        return self.with_dpl(LocalTask(streams, loss))

    def local_update(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext, loop: LocalLoop) -> TrainResult:
        """The helpers become sigma + their psi, then one loop over sigma (with labels) and psi
        (with unlabeled images); psi is cut at the sparsity threshold before sending."""
        helpers = [helper_name(j) for j in range(1, int(ctx.broadcast.get(HELPERS_SENT, 0)) + 1)]
        self._set_helpers(models, helpers)
        trained = [m for m, part in (("sigma", "labeled"), ("psi", "unlabeled")) if self._has(client, part)]
        run = nn.ModuleDict({"sigma": models["sigma"], "psi": models["psi"],
                             DECOMPOSED: Decomposed(models["sigma"], models["psi"]), **{h: models[h] for h in helpers}})  # fmt: skip
        result = loop.run(run, self.local_task(client, models, ctx), trained=[*trained, DECOMPOSED])  # its mode: training
        self._density = sparsify(models["psi"], float(self.option("fedmatch-sparsity-threshold")))
        self._sent = tuple(trained)
        n = sum(len(p) for p in (client.labeled, client.unlabeled) if p is not None)
        return dataclasses.replace(result, num_examples=n)

    @staticmethod
    @torch.no_grad()
    def _set_helpers(models: nn.ModuleDict, helpers: list[str]) -> None:
        """Each helper model (received as another client's psi) becomes rho_j = sigma + psi_j,
        with sigma's buffers."""
        sigma = models["sigma"].state_dict()
        parameters = {k for k, _ in models["sigma"].named_parameters()}
        for h in helpers:
            models[h].load_state_dict(theta_state(sigma, models[h].state_dict(), parameters))

    def sent_models(self, client: ClientData, ctx: RoundContext) -> tuple[str, ...]:
        """sigma if the client has labeled images, psi if it has unlabeled ones."""
        return getattr(self, "_sent", ())

    def uploads(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> dict[str, float | list[float]]:
        """n_L and n_U (the weights of sigma and psi), ``pseudo-label-share`` (of the round's
        unlabeled rows, those above tau), in simulation ``pseudo-label-correct-share`` (those
        also of their true class), and ``psi-nonzero-share``."""
        out: dict[str, float | list[float]] = {
            NUM_LABELED: float(len(client.labeled)) if self._has(client, "labeled") else 0.0,  # type: ignore[arg-type]
            NUM_UNLABELED: float(len(client.unlabeled)) if self._has(client, "unlabeled") else 0.0,  # type: ignore[arg-type]
            **self.pseudo_label_uploads(client),
            "psi-nonzero-share": float(self._density),
            **self.dpl_uploads(),
        }
        return out

    # ------------------------------------------------------------------ labels at the server
    def server_task(self, server: ClientData, models: nn.ModuleDict, ctx: ServerRoundContext) -> LocalTask:
        """lambda_s CE of sigma + psi* on the server's labeled images, B per step (psi frozen)."""
        assert server.labeled is not None
        own = Decomposed(models["sigma"], models["psi"])
        lam_s = float(self.option("fedmatch-lambda-s"))

        def loss(forwards: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            dec = forwards[DECOMPOSED] if DECOMPOSED in forwards else own
            return lam_s * F.cross_entropy(dec(batch["labeled"]["x"], frozen="psi"), batch["labeled"]["y"])

        return LocalTask({"labeled": Stream({"x": server.labeled.x, "y": server.labeled.y}, self.cfg.batch_size)}, loss)

    def server_update(self, server: ClientData, models: nn.ModuleDict, ctx: ServerRoundContext, loop: LocalLoop) -> TrainResult:
        """sigma trained on :meth:`server_task`, then theta = sigma + psi (psi cut at the
        sparsity threshold) in ``models``."""
        run = nn.ModuleDict({"sigma": models["sigma"], "psi": models["psi"],
                             DECOMPOSED: Decomposed(models["sigma"], models["psi"])})  # fmt: skip
        result = loop.run(run, self.server_task(server, models, ctx), trained=["sigma", DECOMPOSED])
        with torch.no_grad():
            parameters = {k for k, _ in models["sigma"].named_parameters()}
            theta = theta_state(models["sigma"].state_dict(), models["psi"].state_dict(), parameters,
                                float(self.option("fedmatch-sparsity-threshold")))  # fmt: skip
            models["theta"].load_state_dict(theta)
        return result
