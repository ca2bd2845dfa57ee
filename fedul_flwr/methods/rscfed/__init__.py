"""RSCFed: random sampling consensus federated semi-supervised learning (``method = "rscfed"``).

Liang, Lin, Fu, Zhu and Li, "RSCFed: Random Sampling Consensus Federated Semi-supervised
Learning", CVPR 2022; the authors' code (XMed-Lab/RSCFed: ``train_main.py``,
``local_supervised.py``, ``local_unsupervised.py``, ``FedAvg.py``). Clients are fully labeled
or unlabeled (the ``annotation-heterogeneity`` setting; HASSLE's Tables 1 and 7 also run it
with partially labeled clients). Two parts:

**Local training** (one model ``f`` travels; :class:`RSCFed`). A client with labels minimises
the cross-entropy on weak views (crop and flip) of its labeled images x_b,

    L_s = 1/B sum_b CE(f(alpha(x_b)), y_b).

A client with unlabeled images u_b trains ``f`` as the student of a mean teacher ``teacher``
(kept on the node, :mod:`.teacher`): the teacher's prediction on one weak view is sharpened,
q_b = sharpen(softmax(f(alpha(u_b); theta')), T), and the student's softmax on a second view
is pulled towards it,

    L_u = 1/B sum_b 1[max q_b >= tau] || softmax(f(alpha'(u_b); theta)) - q_b ||_2^2,
    L   = L_s + lambda L_u,

after each step theta' <- d theta' + (1 - d) theta. A partially labeled client has both terms.
The server (:class:`~fedul_flwr.methods.rscfed.consensus.ConsensusAggregation`) averages M
random sub-sets of K clients each with distance-reweighted weights and then the M
sub-consensus models (the equations are in :mod:`.consensus`).

Where this follows the paper and where the authors' code (the paper's full text was not at
hand when this was written: the paper's side below is its abstract, its Sec. 3 as the
project's description of it gives it, and the method's claims as the authors filed them; the
code was read in full):

- **Sub-sets from one round's training** (paper and code differ in kind). The code samples M
  sub-sets of K clients from *all* clients and trains a client once per sub-set it lands in (a
  client drawn twice trains twice from the same global model); here the round's sampled
  clients (``fraction-train``) train once and the server draws the M sub-sets from their
  replies, each without replacement, independently across sub-sets (the code's
  ``random.sample`` per sub-set), from the ``consensus`` stream at (run seed, round). Where
  fewer than K clients reply, every sub-set holds them all.
- **The distance** d_i: the paper's ||w_i - wbar||_2 of the whole model (``rscfed-distance =
  "l2"``, default); the code sums the L2 norms of each array (``"layer-sum"``). Only float
  arrays count.
- **The reweighting** a_i = p_i exp(-beta d_i / n_i), with the code's division by the client's
  images n_i; beta is the code's ``dist_scale`` (1e4, ``rscfed-beta``) in a sub-set of
  unlabeled clients and its ``sup_scale`` (100 in the authors' published run,
  ``rscfed-beta-labeled``) in one holding a client with labels; a client with labels then
  gains the factor ``w_mul_times`` (6 in that run, ``rscfed-labeled-factor``). "A client with
  labels" is here any client with n_L > 0 (partially labeled ones too).
- **The global model** is the plain mean of the M sub-consensus models (paper and code).
- **The mean teacher** (the code): the teacher starts from the global model the first time the
  node trains on unlabeled images and then stays on the node across rounds (``rscfed-teacher =
  "kept"``); ``"round"`` restarts it from the received global model every round. Its decay
  warms up as the code's, d_s = min(d, 1 - 1/(s + 1)) over its updates s (:mod:`.teacher`;
  d = ``rscfed-ema-decay`` = 0.999). A node keeps only models between rounds, so the server
  counts the teacher's earlier updates s for it, the summed local steps of the node's trained
  rounds of the run, and sends the count in its train message
  (:class:`~fedul_flwr.methods.rscfed.teacher.TeacherUpdateCounts`): the true count whichever
  rounds the node was sampled in or sat out (the expected share (t - 1) * ``fraction-train``
  times the steps per round, used before, was exact only where every client trains every
  round). A new teacher starts from 0. Whether the teacher is new is read from its weights: a
  kept model the node never stored holds its seeded initial weights
  (:meth:`RSCFed.fresh_teacher`).
- **Resume** (``resume=true``): the teacher lives in the node's state, and a resumed run is a
  new Flower run whose nodes start with empty states: with ``rscfed-teacher = "kept"`` every
  teacher starts again from the global model (s = 0) in the node's first round after the
  resume, so the resumed rounds differ from an uninterrupted run's (the server's checkpoint
  cannot hold what the nodes keep). With ``"round"`` nothing outlives a round on the node and
  a resumed run repeats the uninterrupted one (``tests/test_baselines_resume.py``).
- **Views**: the code's teacher and student see two independent weak views (crop and flip),
  ``rscfed-student-view = "weak"``; ``"strong"`` gives the student RandAugment.
- **Pseudo-labels**: the code sharpens with T = 0.5 and trains on every image (its confidence
  threshold 0.9 only counts the confident ones in its log): ``rscfed-threshold = 0``.
- **Loss**: the code's squared error summed over classes and averaged over the batch, lambda
  = ``rscfed-lambda`` = 0.02 (its lambda_u; its ramp-up is off, 0 warm-up epochs).
- **Learning rates**: the code's unlabeled clients step at 0.021 and the labeled at 0.03;
  here a client without labels steps at ``rscfed-unlabeled-lr-factor`` (0.7) times ``lr``.
  SCAFFOLD's option II divides by the run's ``lr``: with it, set the factor to 1.
- **An epoch** is a pass over the client's larger part (labeled or unlabeled), B images of each
  part per step (the code's batch size for both); the reply's n_i is n_L + n_U (the code
  weighs a client by all its images).
- The code starts from a warm-up checkpoint trained on the labeled client; runs here start
  from the run's initial weights.

Per-round diagnostics (train metrics): ``num-labeled`` (n_L, read by the consensus),
``pseudo-label-share`` (the share of the unlabeled images seen whose sharpened teacher
prediction passed tau; 1 with tau = 0) and, in simulation, ``pseudo-label-correct-share``
(those whose teacher argmax is also the true class).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.augment import Augmentation
from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import Batch, LocalTask, Method, ModelSpec, RoundContext, Stream, register_method
from fedul_flwr.methods.rscfed.consensus import ConsensusAggregation
from fedul_flwr.methods.rscfed.settings import OPTIONS
from fedul_flwr.methods.mixmatch import sharpen
from fedul_flwr.methods.pseudo_label_counts import PseudoLabelCounts
from fedul_flwr.methods.rscfed.teacher import TEACHER_UPDATES, TeacherUpdateCounts, consistency_loss, ema_update, teacher_decay
from fedul_flwr.models import build_model
from fedul_flwr.rng import model_seed

if TYPE_CHECKING:  # pragma: no cover
    from fedul_flwr.training import LocalLoop, TrainResult

__all__ = ["RSCFed"]

TEACHER = "teacher"


@register_method
class RSCFed(PseudoLabelCounts, Method):
    """RSCFed's clients (module docstring) and its consensus aggregation."""

    name = "rscfed"
    requires = ()
    uses = ("labeled", "unlabeled")
    setting = "annotation-heterogeneity"
    settings = ("annotation-heterogeneity", "labels-at-clients")
    batched_cohort = False  # the teacher follows the student's weights after every step, which a cohort stacks
    options = OPTIONS
    recorded_metrics = ("pseudo-label-share", "pseudo-label-correct-share")

    def model_specs(self) -> tuple[ModelSpec, ...]:
        """``f`` (exchanged, trained) and the mean ``teacher`` (kept on the node, not trained by
        the optimiser: it follows ``f`` by EMA)."""
        return (ModelSpec("f"), ModelSpec(TEACHER, exchanged=False, kept=True, trained=False))

    def sits_out(self, client: ClientData) -> bool:
        """A client with neither labeled nor unlabeled images."""
        return super().sits_out(client) or not {"labeled", "unlabeled"} & set(client.parts())

    def fresh_teacher(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> bool:
        """Whether the node's teacher was never stored: it still holds the initial weights the
        node seeds a kept model with (run seed, its index, the node key). A teacher that took one
        EMA step from a trained student never equals them.

        Returns
        -------
        bool
        """
        index = [s.name for s in self.model_specs()].index(TEACHER)
        channels, size, _ = client.image_shape
        seeded = build_model(self.cfg.model, channels, client.num_classes, size,
                             seed=model_seed(self.cfg.seed, index, ctx.node_key)).state_dict()  # fmt: skip
        held = models[TEACHER].state_dict()
        return held.keys() == seeded.keys() and all(torch.equal(held[k].cpu(), v) for k, v in seeded.items())

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """Streams ``labeled`` (a weak view and y) and ``unlabeled`` (the teacher's weak view and
        the student's view), those the client holds, the larger first (it drives the epoch);
        loss L_s + lambda L_u (module docstring), one forward of ``f`` over the labeled and the
        student's views. While :meth:`local_update` trains, each step after the first first
        moves the teacher towards the student's weights."""
        side = client.image_shape[1]
        weak = Augmentation("weak", side, client.flip)
        student = Augmentation(self.option("rscfed-student-view"), side, client.flip)
        streams: dict[str, Stream] = {}
        if "labeled" in client.parts():
            assert client.labeled is not None
            streams["labeled"] = Stream({"x": client.labeled.x, "y": client.labeled.y}, self.cfg.batch_size, images=(),
                                        views={"weak": ("x", weak)})  # fmt: skip
        if "unlabeled" in client.parts():
            assert client.unlabeled is not None
            known = {} if client.unlabeled_classes is None else {"classes": client.unlabeled_classes}
            unlabeled = Stream({"x": client.unlabeled, **known}, self.cfg.batch_size, images=(),
                               views={"teacher": ("x", weak), "student": ("x", student)})  # fmt: skip
            first = "labeled" in streams and unlabeled.num_rows <= streams["labeled"].num_rows
            streams = {**streams, "unlabeled": unlabeled} if first else {"unlabeled": unlabeled, **streams}
        lam, tau, temperature = float(self.option("rscfed-lambda")), float(self.option("rscfed-threshold")), float(self.option("rscfed-temperature"))
        decay = float(self.option("rscfed-ema-decay"))

        def loss(forwards: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            lb, ub = batch.get("labeled", {}), batch.get("unlabeled", {})
            if ub and self._training:
                if self._steps:  # the teacher follows the student's step before this one
                    ema_update(models[TEACHER], models["f"], teacher_decay(decay, self._earlier + self._steps - 1))
                self._steps += 1
            n_l = len(lb["y"]) if lb else 0
            logits = forwards["f"](torch.cat([t for t in (lb.get("weak"), ub.get("student")) if t is not None]))
            total = F.cross_entropy(logits[:n_l], lb["y"]) if n_l else logits.sum() * 0
            if ub:
                with torch.no_grad():
                    targets = sharpen(F.softmax(forwards[TEACHER](ub["teacher"]).float(), dim=1), temperature)
                    confidence, guess = targets.max(dim=1)
                    mask = confidence >= tau
                self.count(guess, mask, ub)
                total = total + lam * consistency_loss(logits[n_l:], targets, mask)
            return total

        self.reset_counts()
        self._steps = 0
        self._earlier, self._training = 0, False
        return LocalTask(streams, loss)

    def local_update(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext, loop: LocalLoop) -> TrainResult:
        """The shared loop on :meth:`local_task` over ``f``: the teacher first starts from the
        received ``f`` where it is new (or every round with ``rscfed-teacher = "round"``), its
        update count from 0 then and from the server's count (``rscfed-teacher-updates``)
        otherwise, and follows the last step after the loop; a client without labels steps at
        ``rscfed-unlabeled-lr-factor`` times the lr. The reply's count is n_L + n_U."""
        parts = client.parts()
        new = "unlabeled" in parts and (self.option("rscfed-teacher") == "round" or self.fresh_teacher(client, models, ctx))
        if new:
            models[TEACHER].load_state_dict(models["f"].state_dict())
        if "labeled" not in parts:
            loop = dataclasses.replace(loop, lr=loop.lr * float(self.option("rscfed-unlabeled-lr-factor")))
        task = self.local_task(client, models, ctx)
        self._earlier = 0 if new else int(ctx.broadcast.get(TEACHER_UPDATES, 0))  # the server's count (teacher.py)
        self._training = True
        try:
            result = loop.run(models, task, trained=["f"])
        finally:
            self._training = False
        if self._steps:
            decay = teacher_decay(float(self.option("rscfed-ema-decay")), self._earlier + self._steps - 1)
            ema_update(models[TEACHER], models["f"], decay)
        n = sum(len(p) for p in (client.labeled, client.unlabeled) if p is not None)
        return dataclasses.replace(result, num_examples=n)

    def uploads(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> dict[str, float | list[float]]:
        """``num-labeled`` (n_L), ``pseudo-label-share`` and, in simulation,
        ``pseudo-label-correct-share`` (module docstring; 0 without unlabeled images)."""
        out: dict[str, float | list[float]] = {
            "num-labeled": float(0 if client.labeled is None else len(client.labeled)),
            **self.pseudo_label_uploads(client),
        }
        return out

    def aggregation(self) -> type | None:
        """:class:`~fedul_flwr.methods.rscfed.consensus.ConsensusAggregation` with this run's
        seed and options, and with a kept teacher
        :class:`~fedul_flwr.methods.rscfed.teacher.TeacherUpdateCounts` (the teachers' counts)."""
        settings = {
            "seed": int(self.cfg.seed), "subsets": int(self.option("rscfed-subsets")),
            "subset_size": int(self.option("rscfed-subset-size")), "beta": float(self.option("rscfed-beta")),
            "beta_labeled": float(self.option("rscfed-beta-labeled")),
            "labeled_factor": float(self.option("rscfed-labeled-factor")), "distance": self.option("rscfed-distance"),
        }  # fmt: skip
        counted = (TeacherUpdateCounts,) if self.option("rscfed-teacher") == "kept" else ()  # "round": always s = 0
        return type("ConsensusAggregation", (*counted, ConsensusAggregation), settings)
