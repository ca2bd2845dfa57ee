"""HASSLE trained by SUMA: clients from fully labeled to unlabeled, dual models aligned by
residual models and a cross-model proximity term.

"Federated Semi-Supervised Learning with Annotation Heterogeneity" (HASSLE, Heterogeneously
Annotated Semi-Supervised LEarning), Sec. 4, Fig. 3, Eqs. 1-12, App. A. Every client may be
fully labeled, partially labeled or unlabeled (the ``annotation-heterogeneity`` setting,
:mod:`fedul_flwr.data.annotation`). Four models travel: a supervised model w_S and an
unsupervised model w_U of the run's architecture, and two residual models r_{U-S}, r_{S-U}
of the same architecture at ``hassle-residual-width`` of its channels (1/4), which learn the
logit difference between the dual models (:mod:`.losses`).

A client's round (Fig. 3; each phase runs the run's local epochs, the other models frozen as
received):

1. with labels (n_L > 0): r_{U-S} by Eqs. 7-9 on the labeled data, then w_S by cross-entropy
   plus (gamma / 2) ||w_S - w_U||^2 towards the *received unsupervised* model (Eqs. 3, 12);
2. with unlabeled data (n_U > 0): pseudo-labels argmax [f(u; w_S^(t-1)) + f(u; r_{U-S})]
   (Eq. 11), then r_{S-U} by Eqs. 7-9 on them, then w_U by cross-entropy on them plus
   (gamma / 2) ||w_U - w_S||^2 towards the received supervised model.

A client sends the models its data trained (w_S and r_{U-S} with labels, w_U and r_{S-U} with
unlabeled data) and its counts n_L, n_U; the server (:class:`HassleAggregation`) averages each
model over the clients that sent it, w_S and r_{U-S} weighted by n_L, w_U and r_{S-U} by n_U
(Eqs. 1, 2, 10), with the run's strategy; a model nobody sent keeps its global value.
Predictors, evaluated centrally every round: SM = f(x; w_S^(t-1)) + f(x; r_{U-S}),
UM = f(x; w_U^(t-1)) + f(x; r_{S-U}), EM = (SM + UM) / 2 (the headline).

**The residual pairs with the dual model it was trained against** (Sec. 4, after Eq. 10:
"we use the global supervised model on the previous round here because the global residual
model r_{U-S}^(t) after aggregation is obtained to learn the difference between w_S^(t-1) and
w_U^(t-1)"). In round t a client trains r_{U-S} against the received w_S^(t); the aggregated
residual corrects w_S^(t), not the w_S^(t+1) aggregated beside it, which was trained on the
same labeled data and already moved by what the residual corrects. So two more models travel
to the clients (never back): ``w_S_prev`` and ``w_U_prev``, the dual models that the global
r_{U-S} and r_{S-U} were last trained against. The server sets them to the round's broadcast
w_S (w_U) whenever it aggregates a new r_{U-S} (r_{S-U}) (:class:`HassleAggregation`); before
the first round they are copies of the initial w_S and w_U. SM, UM and the pseudo-labels of
Eq. 11 use them. ``hassle-pairing = "current"`` pairs each residual with the dual model of the
same round instead (w_S^(t+1) + r_{U-S}^(t+1)); four models travel then.

Choices the paper leaves open, made here (and in :mod:`.losses`):

- **Phase order** (``hassle-phase-order``): Fig. 3 and Eqs. 7-8 train each residual against
  the *received* dual models w_S^(t), w_U^(t); Alg. 1 lists the dual model's update
  (lines 5, 10) before its residual's (lines 6, 11). With the equations as written the order
  changes nothing (the residual never sees the updated dual model), so ``dual-first`` reads
  Alg. 1 as sequential: the dual model trains first and its residual then fits the updated
  local dual model (the base of Eq. 8 and the subtracted model of Eq. 7's target).
  ``residual-first`` (default) is the equations' reading. The aggregated residual then
  corrects the newest dual model, which ``hassle-pairing = "current"`` pairs it with.
- **Local epochs**: the run's ``local-epochs`` for every phase.
- **Temperature** T = ``hassle-temperature`` = 1; **KL direction** KL(target || residual) with
  T^2 scaling (:mod:`.losses`); **lambda** = ``hassle-lambda`` = 1 (the paper's best).
- **gamma** = ``hassle-gamma`` = 0.01 as FedProx's mu: the loss gains (gamma / 2) ||w - w'||^2,
  the squared norm, applied as a gradient term (0 turns the proximity term off: the MPA
  ablation). ``hassle-gamma-form = "sum"`` reads Eq. 12 as written: gamma ||w - w'||^2
  beside the *sum* of the cross-entropy over the client's n examples, i.e. a gradient term
  (2 gamma / n)(w - w') in a batch-mean step (:func:`proximity_weight`); the paper gives no
  value of gamma.
- **Initial weights**: w_S and w_U start from different seeds; ``hassle-shared-init = true``
  starts w_U from w_S's initial weights (the paper does not say).
- **The ``hassle`` preset** sets ``hassle-phase-order = "dual-first"``, ``hassle-pairing =
  "current"``, ``hassle-shared-init = true`` and gamma 100 in Eq. 12's sum form
  (``hassle-gamma-form = "sum"``, ``hassle-gamma = 100``): the best setting of the
  ``hassle-sweep`` grid at its lr 0.01 (Fashion-MNIST 10%, EM over the last 10 rounds, mean of
  seeds 0 and 1: 72.66% against 65.77% with the defaults above, which read the equations, and
  70.15% without gamma 100; FedAvg on the labeled images alone 71.42%). At lr 0.1 it diverged
  at seed 0, with and without gamma 100 (w_U's loss NaN by round 5), so the lr 0.1 presets
  (``hassle-cifar10``, ``hassle-cifar100``) keep the defaults; docs/hassle.md has the runs.
  It keeps one local epoch: two lift EM and FedAvg on the labeled images alike (76.87% and
  77.55% over seeds 0 and 1, from the equations' reading) at twice the time per round.
- **Warm-up** (``hassle-warmup-rounds`` = R, 0): in rounds 1..R no client pseudo-labels or
  trains w_U and r_{S-U} (an unlabeled client sends nothing); w_S and r_{U-S} train as usual.
  The paper has none.
- **Which w_S pairs with r_{U-S}**: the paper's text (Eq. 11 and the inference rule) pairs the
  residual with the dual model of the previous round; App. A says four models travel, which
  cannot carry it. The text wins (``hassle-pairing = "previous"``): six models go to the
  clients, at most four come back. The same-round pairing (``"current"``) stays as a switch;
  docs/hassle.md has what it costs on Fashion-MNIST.
- **EM** is the mean of the SM and UM logits ("mean outputs").
- ``hassle-residual-width`` = 0 removes the residual models (the GRA ablation): pseudo-labels
  from w_S alone (Eq. 5), SM = f(w_S), UM = f(w_U).
- ``hassle-threshold`` = 0: every pseudo-label is kept (the paper's default; Table 6: 0.95).
- Losses are batch means; pseudo-labels are computed once per round, in eval mode, on the
  images as they are (no augmentation: the paper names none).

Per-round diagnostics (train metrics, averaged over the round's clients weighted by their
images n_L + n_U): ``pseudo-label-share``, ``pseudo-label-classes`` (per class; divided by
their sum, the class mix of the pseudo-labels) and ``pseudo-label-correct-share`` (over the
share: their accuracy; simulation only), as FixMatch's (:meth:`Hassle.uploads`); and the test
accuracy of the dual models alone beside SM, UM and EM (:meth:`Hassle.predictors`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from torch import nn

from fedul_flwr import wire
from fedul_flwr.acceleration import PLAIN
from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import Batch, LocalTask, Method, ModelSpec, NothingToTrain, Predictor, RoundContext, Stream, register_method
from fedul_flwr.methods.hassle.losses import pseudo_labels, residual_loss
from fedul_flwr.methods.hassle.settings import GAMMA_FORMS, OPTIONS
from fedul_flwr.strategies.contract import Combining, Contract
from fedul_flwr.strategies.per_model import PerModelAggregation
from fedul_flwr.training import LocalLoop, TrainResult

__all__ = ["TEACHER_LOGITS", "Hassle", "HassleAggregation", "TeacherLogitCache", "proximity_weight", "teacher_forwards"]

NUM_LABELED, NUM_UNLABELED = "num-labeled", "num-unlabeled"
TEACHER_BATCH_CPU = 512
"""Images per forward pass of the teachers on a CPU (at most ``eval-batch-size``): a small
CNN's float32 forward costs ~0.09 ms per image at 256-512 images and ~0.16 ms at 2048 (its
activations leave the cache)."""
PAIRED: dict[str, tuple[str, str]] = {"r_US": ("w_S", "w_S_prev"), "r_SU": ("w_U", "w_U_prev")}
"""Residual model -> (the dual model it is trained against, the copy of that dual model it
was last trained against, sent with ``hassle-pairing = "previous"``)."""


class HassleAggregation(PerModelAggregation):
    """Each model over the clients that sent it: w_S and r_{U-S} weighted by n_L, w_U and
    r_{S-U} by n_U (Eqs. 1, 2, 10); then, where the global arrays hold the paired copies
    (:data:`PAIRED`), each copy becomes the round's broadcast dual model if its residual was
    aggregated this round:

        w_S_prev <- w_S^(t)  if some client sent r_{U-S} in round t, else unchanged,

    so ``w_S_prev + r_US`` is always the residual with the w_S it was trained against (the
    paper's inference rule after Eq. 10)."""

    model_weight_keys = {"w_S": NUM_LABELED, "r_US": NUM_LABELED, "w_U": NUM_UNLABELED, "r_SU": NUM_UNLABELED}
    contract = Contract(Combining.PARTIAL_REPLIES, "hassle's clients send only the models their data trains, "
                        "each model weighted by n_L or n_U")

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """:meth:`PerModelAggregation.aggregate_train`, then the paired copies (class doc)."""
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None:
            return arrays, metrics
        broadcast: ArrayRecord = self.global_arrays
        sent = {wire.model_of(k) for r in replies if not r.has_error() for k in r.content[wire.ARRAYS]}
        copies: dict[str, Array] = {}
        for residual, (dual, paired) in PAIRED.items():
            if residual in sent and any(wire.model_of(k) == paired for k in broadcast):
                copies.update({paired + k[len(dual):]: broadcast[k] for k in broadcast if wire.model_of(k) == dual})
        if copies:
            arrays = ArrayRecord({k: copies.get(k, arrays[k]) for k in arrays})
        return arrays, metrics


def proximity_weight(gamma: float, form: str, n: int) -> float:
    """The weight mu of the proximity term's gradient mu (w - w') in a step on a batch-mean
    loss (Eq. 12; ``hassle-gamma-form``).

    ``mean``: the loss is (gamma / 2) ||w - w'||^2 beside the batch mean, mu = gamma
    (FedProx's form). ``sum``: Eq. 12 as written, sum over the client's n examples of the
    cross-entropy + gamma ||w - w'||^2; divided by n for the batch-mean step, mu = 2 gamma / n.

    Parameters
    ----------
    gamma : float
        gamma >= 0 (0: no term).
    form : str
        ``"mean"`` or ``"sum"``.
    n : int
        Examples the dual model trains on this round (labeled, or pseudo-labels kept).

    Returns
    -------
    float
        mu >= 0 (0 for ``sum`` without examples).

    Raises
    ------
    ValueError
        On an unknown form.
    """
    if form == "mean":
        return gamma
    if form == "sum":
        return 2 * gamma / n if n > 0 else 0.0
    raise ValueError(f"hassle-gamma-form={form!r} must be one of {GAMMA_FORMS}")


@torch.no_grad()
def _logits(modules: list[nn.Module], images: torch.Tensor, client: ClientData, device: torch.device, batch: int) -> torch.Tensor:
    """Sum of the modules' logits on every image (eval mode): ``[n, K]`` on ``device``."""
    for m in modules:
        m.eval()
    out = []
    for i in range(0, len(images), batch):
        x = client.to_input(images[i : i + batch].to(device))
        out.append(sum(m(x).float() for m in modules))
    return torch.cat(out)


class TeacherLogitCache:
    """A dual model's float32 logits on a client's unlabeled images, kept for the next round.

    In round t a client computes f(u; w_S^(t)) on its unlabeled images u (the target of
    r_{S-U}, Eq. 7); in round t+1 its pseudo-labels need f(u; w_S_prev) (Eq. 11), and
    w_S_prev is w_S^(t) (:class:`HassleAggregation`). A client that trained in round t reads
    those logits back instead of running w_S_prev again: the very numbers the forward pass
    computes, since a hit needs the same weights (every parameter and buffer equal), the same
    images (their bytes' BLAKE2 digest), the same node and the same teacher pass (device,
    memory format, images per batch, torch threads). Under ``hassle-pairing = "current"`` Eq. 11's f(u; w_S)
    is the target of the same round: one forward serves both. The entries of the last
    ``generations`` distinct weights are kept, per node ``[n_u, K]`` float32 (a process that
    runs no client twice only misses).
    """

    def __init__(self, generations: int = 2) -> None:
        self._generations = generations
        self._entries: list[tuple[dict[str, torch.Tensor], dict[tuple, tuple[bytes, torch.Tensor]]]] = []
        self.hits = 0
        """Passes read back instead of run (a diagnostic)."""

    def clear(self) -> None:
        """Forget every entry."""
        self._entries = []

    @staticmethod
    def _digest(images: torch.Tensor) -> bytes:
        return hashlib.blake2b(images.detach().cpu().contiguous().numpy().tobytes(), digest_size=32).digest()

    def _entry(self, model: nn.Module) -> dict[tuple, tuple[bytes, torch.Tensor]] | None:
        state = model.state_dict()
        for saved, logits in self._entries:
            if saved.keys() == state.keys() and all(torch.equal(saved[k], v) for k, v in state.items()):
                return logits
        return None

    def logits(self, model: nn.Module, teacher: nn.Module, images: torch.Tensor, key: tuple, client: ClientData,
               device: torch.device, batch: int) -> torch.Tensor:  # fmt: skip
        """f(images; model) ``[n, K]`` float32 on the CPU: read back on a hit, else run by
        ``teacher`` (``model`` as :func:`teacher_forwards` runs it) in batches of ``batch``
        and kept. ``key`` names the node and the teacher pass."""
        digest = self._digest(images)
        entry = self._entry(model)
        if entry is not None and key in entry and entry[key][0] == digest:
            self.hits += 1
            return entry[key][1]
        out = _logits([teacher], images, client, device, batch).cpu()
        if entry is None:
            entry = {}
            self._entries = [*self._entries, ({k: v.detach().clone() for k, v in model.state_dict().items()}, entry)]
            self._entries = self._entries[-self._generations :]
        entry[key] = (digest, out)
        return out


TEACHER_LOGITS = TeacherLogitCache()
"""This process's :class:`TeacherLogitCache` (the clients it runs, round after round)."""


def teacher_forwards(frozen: nn.ModuleDict, loop: LocalLoop) -> nn.ModuleDict:
    """The frozen models as a client's teachers run them (pseudo-labels, the residuals' base
    and target): float32, as they always ran (the loop's ``precision`` covers the trained
    models only), in the loop's memory format (channels-last on a CPU halves a small CNN's
    forward: its max-pooling is ~9x faster in NHWC). Converts ``frozen`` in place (the
    round's own copies).

    Parameters
    ----------
    frozen : nn.ModuleDict
        The received models, copied and frozen for the round.
    loop : LocalLoop
        The round's loop; its ``acceleration`` (None: the plain loop) gives the layout.

    Returns
    -------
    nn.ModuleDict
        Callables ``[B, C, H, W] -> [B, K]`` float32 by model name, in eval mode.
    """
    acc = loop.acceleration if loop.acceleration is not None else dataclasses.replace(PLAIN, device=loop.device)
    return dataclasses.replace(acc, precision="fp32", compile=False).prepare(frozen).eval()


@register_method
class Hassle(Method):
    """HASSLE / SUMA (module docstring)."""

    batched_cohort = False  # two phases over the dual models and their residuals: one client at a time
    name = "hassle"
    requires = ()
    uses = ("labeled", "unlabeled")
    setting = "annotation-heterogeneity"
    settings = ("annotation-heterogeneity", "labels-at-clients")
    options = OPTIONS
    recorded_metrics = ("pseudo-label-share", "pseudo-label-classes", "pseudo-label-correct-share")

    @property
    def residual(self) -> bool:
        """Whether the residual models exist (GRA)."""
        return float(self.option("hassle-residual-width")) > 0

    def model_specs(self) -> tuple[ModelSpec, ...]:
        """w_S, w_U and, with residuals, r_US (r_{U-S}) and r_SU (r_{S-U}) at the residual width."""
        duals = (ModelSpec("w_S"), ModelSpec("w_U", initial="w_S" if self.option("hassle-shared-init") else None))
        if not self.residual:
            return duals
        width = float(self.option("hassle-residual-width"))
        residuals = (ModelSpec("r_US", width=width), ModelSpec("r_SU", width=width))
        if self.option("hassle-pairing") == "current":
            return duals + residuals
        # appended last: the other models keep the initial weights of their index's seed
        return duals + residuals + tuple(ModelSpec(p, trained=False, initial=d) for d, p in PAIRED.values())

    def paired(self, dual: str) -> str:
        """The model that enters SM / UM and Eq. 11 beside ``dual``'s residual: its paired copy
        (``"w_S_prev"``) under ``hassle-pairing = "previous"``, else ``dual`` itself."""
        if self.residual and self.option("hassle-pairing") == "previous":
            return dict(PAIRED.values())[dual]
        return dual

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """The dual models' supervised cross-entropy on the labeled data, or on the unlabeled
        data's pseudo-labels from w_S for a client without labels (what SCAFFOLD's option I
        takes a full gradient of; the round itself is :meth:`local_update`)."""
        if client.labeled is not None:
            x, y, model = client.labeled.x, client.labeled.y, "w_S"
        else:
            assert client.unlabeled is not None
            x, model = client.unlabeled, "w_U"
            y = _logits([models["w_S"]], x, client, ctx.device, self.cfg.eval_batch_size).argmax(dim=1).cpu()

        def loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            return F.cross_entropy(models[model](batch["d"]["x"]), batch["d"]["y"])

        return LocalTask({"d": Stream({"x": x, "y": y}, self.cfg.batch_size)}, loss)

    def _teacher_batch(self, device: torch.device) -> int:
        """Images per forward pass of the teachers (:data:`TEACHER_BATCH_CPU` on a CPU)."""
        batch = int(self.cfg.eval_batch_size)
        return min(batch, TEACHER_BATCH_CPU) if device.type == "cpu" else batch

    def _unlabeled_logits(self, name: str, frozen: nn.ModuleDict, teachers: nn.ModuleDict, client: ClientData,
                          loop: LocalLoop) -> torch.Tensor:  # fmt: skip
        """f(u; ``name``) ``[n_u, K]`` float32 on the client's unlabeled images, through
        :data:`TEACHER_LOGITS`."""
        assert client.unlabeled is not None
        batch = self._teacher_batch(loop.device)
        acc = loop.acceleration
        key = (client.node, str(loop.device), batch, acc is not None and acc.channels_last, torch.get_num_threads())
        return TEACHER_LOGITS.logits(frozen[name], teachers[name], client.unlabeled, key, client, loop.device, batch)

    def _side(
        self, models: nn.ModuleDict, frozen: nn.ModuleDict, teachers: nn.ModuleDict, loop: LocalLoop, client: ClientData,
        x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, dual: str, other: str, residual: str,
    ) -> list[TrainResult]:  # fmt: skip
        """One side of the round: the residual of ``dual`` (Eqs. 7-9) and ``dual`` itself with
        the proximity term towards the frozen ``other`` (Eq. 12), in ``hassle-phase-order``:
        ``residual-first`` fits the residual to the received ``dual``; ``dual-first`` trains
        ``dual`` first and fits the residual to the updated one (Alg. 1's order).

        The residual's frozen base and target logits are computed once per round, in one
        pass over ``x`` before its training (``teachers``: float32, the loop's layout), and
        travel with the batches as the stream's ``base`` and ``target`` rows: the models are
        frozen and the images are not augmented, so every step reads the logits it would
        compute. With the run's ``augment`` the images change per step and the teachers run
        inside each step on the augmented batch, as before."""
        stream = {"d": Stream({"x": x, "y": y, "mask": mask}, self.cfg.batch_size)}

        def dual_loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            b = batch["d"]
            per_row = F.cross_entropy(models[dual](b["x"]), b["y"], reduction="none")
            return (per_row * b["mask"].to(per_row.dtype)).sum() / b["mask"].sum().clamp_min(1)

        def train_dual() -> TrainResult:
            hooks = loop.hooks
            mu = proximity_weight(float(self.option("hassle-gamma")), self.option("hassle-gamma-form"), int(mask.sum()))
            if mu > 0:
                # deferred: cycle fedul_flwr.strategy_hooks -> methods.base -> methods (imports this package) -> strategy_hooks
                from fedul_flwr.strategy_hooks import ProximalTerm, shared_parameters

                params = shared_parameters(models, [dual])  # keyed "<dual>.<parameter>"
                anchor = {f"{dual}.{k}": v for k, v in frozen[other].named_parameters()}
                hooks = hooks + (ProximalTerm(mu, params, anchor),)
            return dataclasses.replace(loop, hooks=hooks).run(models, LocalTask(stream, dual_loss), trained=[dual])

        def train_residual(base: nn.Module) -> TrainResult:
            t, lam = float(self.option("hassle-temperature")), float(self.option("hassle-lambda"))
            target = teachers[other]
            if loop.augment is None:  # the teachers' logits once, read per batch
                batch = self._teacher_batch(loop.device)
                if x is client.unlabeled:  # f(u; w_S): next round's f(u; w_S_prev) (TeacherLogitCache)
                    target_logits = self._unlabeled_logits(other, frozen, teachers, client, loop)
                else:
                    target_logits = _logits([target], x, client, loop.device, batch).cpu()
                rows = {"base": _logits([base], x, client, loop.device, batch).cpu(), "target": target_logits}
                task = {"d": Stream({**stream["d"].tensors, **rows}, self.cfg.batch_size)}

                def res_loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
                    b = batch["d"]
                    return residual_loss(models[residual](b["x"]), b["base"], b["target"], b["y"], t, lam, b["mask"])

                return loop.run(models, LocalTask(task, res_loss), trained=[residual])

            def res_loss_augmented(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
                b = batch["d"]
                with torch.no_grad():
                    base_logits, target_logits = base(b["x"]), target(b["x"])
                return residual_loss(models[residual](b["x"]), base_logits, target_logits, b["y"], t, lam, b["mask"])

            return loop.run(models, LocalTask(stream, res_loss_augmented), trained=[residual])

        if not self.residual:
            return [train_dual()]
        if self.option("hassle-phase-order") == "residual-first":
            return [train_residual(teachers[dual]), train_dual()]
        first = train_dual()
        updated = nn.ModuleDict({dual: copy.deepcopy(models[dual]).requires_grad_(False)})
        return [first, train_residual(teacher_forwards(updated, loop)[dual])]

    def local_update(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext, loop: LocalLoop) -> TrainResult:
        """The round of Fig. 3 (module docstring). The frozen models run as
        :func:`teacher_forwards` makes them."""
        frozen = nn.ModuleDict({k: copy.deepcopy(m).requires_grad_(False) for k, m in models.items()}).eval()
        teachers = teacher_forwards(frozen, loop)
        results: list[TrainResult] = []
        self._sent: tuple[str, ...] = ()
        self._kept = 0.0
        k = client.num_classes
        self._classes, self._correct = torch.zeros(k), 0.0
        if client.labeled is not None and len(client.labeled):
            ones = torch.ones(len(client.labeled), dtype=torch.bool)
            labeled = (client.labeled.x, client.labeled.y, ones)
            results += self._side(models, frozen, teachers, loop, client, *labeled, "w_S", "w_U", "r_US")
            self._sent += ("w_S", "r_US") if self.residual else ("w_S",)
        warm = ctx.server_round <= int(self.option("hassle-warmup-rounds"))  # w_U waits: no pseudo-labels yet
        if client.unlabeled is not None and len(client.unlabeled) and not warm:
            eq11 = [self._unlabeled_logits(self.paired("w_S"), frozen, teachers, client, loop)]
            if self.residual:
                eq11.append(_logits([teachers["r_US"]], client.unlabeled, client, ctx.device, self._teacher_batch(ctx.device)).cpu())
            logits = sum(eq11)  # 0 + f(u; w_S_prev) + f(u; r_US), as the pass over both models adds them
            targets, mask = pseudo_labels(logits, float(self.option("hassle-threshold")))
            targets, mask = targets.cpu(), mask.cpu()
            self._kept = float(mask.float().mean())
            self._classes = torch.bincount(targets[mask], minlength=k).float()
            if client.unlabeled_classes is not None:  # simulation: the diagnostic accuracy
                self._correct = float((mask & (targets == client.unlabeled_classes)).sum())
            if bool(mask.any()):
                unlabeled = (client.unlabeled, targets, mask)
                results += self._side(models, frozen, teachers, loop, client, *unlabeled, "w_U", "w_S", "r_SU")
                self._sent += ("w_U", "r_SU") if self.residual else ("w_U",)
        n = sum(len(p) for p in (client.labeled, client.unlabeled) if p is not None)
        if not results:  # an unlabeled client in the warm-up or without a confident pseudo-label
            why = "in the warm-up (no pseudo-labels yet)" if warm else "no labeled image and no confident pseudo-label"
            raise NothingToTrain(f"{client.node}: {why}")
        steps = sum(r.num_steps for r in results)
        loss = sum(r.loss * r.num_steps for r in results) / steps
        return TrainResult(loss=loss, num_examples=n, num_steps=steps)

    def sent_models(self, client: ClientData, ctx: RoundContext) -> tuple[str, ...]:
        """The models this client's data trained this round."""
        return self._sent

    def uploads(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> dict[str, float | list[float]]:
        """n_L and n_U (the aggregation weights) and, as shares of the client's unlabeled
        images (0 without unlabeled data or in the warm-up), as FixMatch's: those whose
        pseudo-label passed the threshold (``pseudo-label-share``); per class, those kept with
        that class (``pseudo-label-classes``, K floats summing to the share: divided by their
        sum, the class mix of the pseudo-labels trained on); in simulation, those kept with
        their true class (``pseudo-label-correct-share``; over ``pseudo-label-share``: the
        accuracy of the pseudo-labels)."""
        n_u = 0 if client.unlabeled is None else len(client.unlabeled)
        out: dict[str, float | list[float]] = {
            NUM_LABELED: float(0 if client.labeled is None else len(client.labeled)),
            NUM_UNLABELED: float(n_u),
            "pseudo-label-share": self._kept,
            "pseudo-label-classes": [float(c) / max(n_u, 1) for c in self._classes],
        }
        if client.unlabeled_classes is not None:
            out["pseudo-label-correct-share"] = self._correct / max(n_u, 1)
        return out

    def aggregation(self) -> type | None:
        """:class:`HassleAggregation`."""
        return HassleAggregation

    def predictors(self) -> dict[str, Predictor]:
        """EM (headline), SM = f(w_S_prev) + f(r_US), UM = f(w_U_prev) + f(r_SU) (w_S, w_U with
        ``hassle-pairing = "current"``; without residual models SM = f(w_S), UM = f(w_U)); and
        the dual models alone, ``w_S`` and ``w_U`` (the newest), and, under the previous-round
        pairing, ``w_S_prev``: what SM's residual adds to (a diagnostic)."""
        if self.residual:
            s, u = self.paired("w_S"), self.paired("w_U")
            sm = lambda models, x: models[s](x) + models["r_US"](x)  # noqa: E731
            um = lambda models, x: models[u](x) + models["r_SU"](x)  # noqa: E731
        else:
            sm = lambda models, x: models["w_S"](x)  # noqa: E731
            um = lambda models, x: models["w_U"](x)  # noqa: E731
        alone = {"w_S": lambda models, x: models["w_S"](x), "w_U": lambda models, x: models["w_U"](x)}
        if self.paired("w_S") != "w_S":
            alone["w_S_prev"] = lambda models, x: models["w_S_prev"](x)
        return {"EM": lambda models, x: (sm(models, x) + um(models, x)) / 2, "SM": sm, "UM": um, **alone}
