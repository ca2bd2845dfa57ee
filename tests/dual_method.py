"""A test-only method with several models in flight, to exercise the method interface.

Not a method of any paper: it exists so that the tests (in-process and through a real
``flwr run .``) drive every piece a multi-model method such as HASSLE or FedDB needs, with no
change to the apps. Run it with ``method="tests.dual_method:Dual"``.

- Models: ``a`` (exchanged; trained on labeled images), ``b`` (exchanged; trained on
  unlabeled images with pseudo-labels from ``a`` where the client has labels, by entropy
  minimisation where it has none) and ``c`` (kept on the node in ``context.state``; trained
  on labeled images, or on ``b``'s pseudo-labels).
- Data: requires the ``unlabeled`` part, uses the ``labeled`` part; clients with an odd node
  key ignore their labels (a stand-in for clients without annotations), so they train and
  send only ``b``.
- Batches: B labeled + 2B unlabeled images per step (two streams).
- Uploads: ``num-labeled``, ``num-unlabeled`` and ``probe``, the K-vector of b's mean
  predicted class distribution on the client's unlabeled images.
- Aggregation (:class:`DualAggregation`): ``a`` averaged over the clients that sent it,
  weighted by ``num-labeled``; ``b`` weighted by ``num-unlabeled * K * min_k probe[k]``
  (the uploaded vector is consumed: unbalanced predictors count less).
- Predictors: ``a``, ``b`` and their logit mean ``ensemble``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flwr.app import MetricRecord
from torch import nn

from fedul_flwr.data.client_data import ClientData, LabeledImages
from fedul_flwr.methods import LocalTask, Method, ModelSpec, RoundContext, Stream
from fedul_flwr.methods.base import Batch, Predictor
from fedul_flwr.strategies.per_model import PerModelAggregation
from fedul_flwr.training import LocalLoop, TrainResult


class DualAggregation(PerModelAggregation):
    """``a`` by labeled counts; ``b`` by unlabeled counts times the balance of the probe."""

    model_weight_keys = {"a": "num-labeled"}

    def model_weight(self, model: str, metrics: MetricRecord) -> float:
        if model == "b":
            probe = [float(v) for v in metrics["probe"]]  # type: ignore[union-attr]
            return float(metrics["num-unlabeled"]) * len(probe) * min(probe)
        return super().model_weight(model, metrics)


def labels_of(client: ClientData, ctx: RoundContext) -> LabeledImages | None:
    """The labeled images this client trains with: none on odd node keys."""
    return client.labeled if ctx.node_key % 2 == 0 and client.labeled is not None else None


class Dual(Method):
    """The test-only two-exchanged-model method (module docstring)."""

    name = "dual"
    requires = ("unlabeled",)
    uses = ("labeled",)

    def model_specs(self) -> tuple[ModelSpec, ...]:
        return (ModelSpec("a"), ModelSpec("b"), ModelSpec("c", exchanged=False, kept=True))

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        assert client.unlabeled is not None
        labeled = labels_of(client, ctx)
        unlabeled = Stream({"x": client.unlabeled}, 2 * self.cfg.batch_size)
        if labeled is None:

            def loss_u(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
                x = batch["unlabeled"]["x"]
                p = F.softmax(models["b"](x), dim=1)
                entropy = -(p * p.clamp_min(1e-8).log()).sum(dim=1).mean()
                pseudo = p.detach().argmax(dim=1)
                return entropy + F.cross_entropy(models["c"](x), pseudo)

            return LocalTask({"unlabeled": unlabeled}, loss_u)

        def loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            xl, yl = batch["labeled"]["x"], batch["labeled"]["y"]
            xu = batch["unlabeled"]["x"]
            pseudo = models["a"](xu).detach().argmax(dim=1)
            supervised = F.cross_entropy(models["a"](xl), yl) + F.cross_entropy(models["c"](xl), yl)
            return supervised + F.cross_entropy(models["b"](xu), pseudo)

        return LocalTask({"labeled": Stream({"x": labeled.x, "y": labeled.y}, self.cfg.batch_size), "unlabeled": unlabeled}, loss)

    def local_update(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext, loop: LocalLoop) -> TrainResult:
        trained = ["a", "b", "c"] if labels_of(client, ctx) is not None else ["b", "c"]
        return loop.run(models, self.local_task(client, models, ctx), trained=trained)

    def sent_models(self, client: ClientData, ctx: RoundContext) -> tuple[str, ...]:
        return ("a", "b") if labels_of(client, ctx) is not None else ("b",)

    @torch.no_grad()
    def uploads(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> dict[str, float | list[float]]:
        assert client.unlabeled is not None
        models.eval()
        x = client.to_input(client.unlabeled[:512].to(ctx.device))
        probe = F.softmax(models["b"](x), dim=1).mean(dim=0)
        labeled = labels_of(client, ctx)
        return {
            "num-labeled": float(0 if labeled is None else len(labeled)),
            "num-unlabeled": float(len(client.unlabeled)),
            "probe": [float(v) for v in probe.cpu()],
        }

    def aggregation(self) -> type:
        return DualAggregation

    def predictors(self) -> dict[str, Predictor]:
        return {
            "a": lambda models, x: models["a"](x),
            "b": lambda models, x: models["b"](x),
            "ensemble": lambda models, x: (models["a"](x) + models["b"](x)) / 2,
        }
