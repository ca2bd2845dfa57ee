"""MixMatch on every client (FedAvg + MixMatch): ``method = "mixmatch"``.

Berthelot, Carlini, Goodfellow, Papernot, Oliver and Raffel, "MixMatch: A Holistic Approach to
Semi-Supervised Learning", NeurIPS 2019, Alg. 1 and Eqs. 2-5; run by every client on its own
labeled and unlabeled images, the models averaged by the run's strategy: the "FedAvg+MixMatch"
baseline of HASSLE (Shang et al., Tables 1 and 7).

One step of a client with a labeled batch (x_b, p_b) (p_b one-hot, b = 1..B) and an unlabeled
batch u_b (b = 1..B, as many as labeled images, the paper's batches):

1. K weak augmentations of each image: xhat_b = alpha(x_b), uhat_b,k = alpha_k(u_b)
   (``mixmatch-k``, K = 2; alpha the weak view, :mod:`fedul_flwr.augment`);
2. label guessing (Eq. 6): qbar_b = 1/K sum_k softmax(f(uhat_b,k)), without gradient;
3. sharpening (Eq. 7): q_b = Sharpen(qbar_b, T), Sharpen(p, T)_i = p_i^(1/T) / sum_j p_j^(1/T)
   (``mixmatch-temperature``, T = 0.5); every uhat_b,k takes q_b;
4. MixUp (Eqs. 8-11) over the concatenation W of the B labeled and K B unlabeled rows: one
   random permutation pi of W's rows, per row lambda ~ Beta(alpha, alpha) (``mixmatch-alpha``,
   0.75) and lambda' = max(lambda, 1 - lambda), so the mix stays closer to the row itself;
   (x', p')_i = lambda'_i (x_i, p_i) + (1 - lambda'_i) (x_pi(i), p_pi(i)); X' is the first B
   rows, U' the rest;
5. the loss (Eqs. 2-5): L = L_X + lambda_U(r) L_U,
   L_X = 1/|X'| sum H(p', softmax(f(x'))) (cross-entropy with the mixed soft labels),
   L_U = 1/(K_cls |U'|) sum ||q' - softmax(f(u'))||_2^2 (the squared L2 over the K_cls
   classes, mean over classes and rows), lambda_U = ``mixmatch-lambda-u`` (100).

The guesses, the permutations and the weights come from the client's round generators: the
permutation from ``RoundContext.generator``, the Beta draws from ``RoundContext.rng``; each
step is batched (no per-image loop), on the training device.

Choices, and where the paper and the authors' code (google-research/mixmatch) differ:

- **Ramp-up of lambda_U** (``mixmatch-ramp-up``): the paper and the code ramp lambda_U
  linearly from 0 over the first 16,384 of their 1,048,576 steps (the code's
  ``warmup_kimg = 1024`` at batch 64), 1/64 of the run. Here lambda_U(r) = lambda_U
  min(1, (r - 1) / (ramp num-rounds)) in round r: the same share of the run's rounds, constant
  within a round; round 1 trains L_X alone. 0 turns the ramp off. A short run needs a longer
  ramp: lambda_U = 100 after one or two rounds collapsed 3-round runs on the embedded sample to
  one class (measured in docs/baselines/mixmatch.md; the ``mixmatch-cpu`` preset ramps over half
  its rounds).
- **Mixup partners** come from all of W, labeled and unlabeled alike: the paper's
  W = Shuffle(Concat(X, U)) and the code's default ``mixmode = "xxy.yxy"`` agree. The weights
  are drawn per row (the code's ``Beta(beta, beta).sample([batch, 1, 1, 1])``; the paper
  draws one per pair, the same thing).
- **Batch norm**: the code passes X' and U' through the model in K + 1 interleaved batches
  and keeps only the first one's batch-norm updates (and none of the label guess's); here X'
  and U' go through f in one forward pass (batch norm sees all of them, which the
  interleaving imitates), and the label guess is a forward in training mode without gradient
  whose batch statistics also enter the running averages. A switch for the code's
  interleaving is not provided.
- **Everything else the code does differently is a run key, not the method's**: Adam at lr
  0.002 (``local-optimizer``, ``lr``), decoupled weight decay 0.02 lr, the EMA of the weights
  at 0.999 (``ema-decay``); the code's flag default alpha = 0.5 is overridden to the paper's
  0.75 in its published commands (the default here).
- **A client with one part only** (the annotation-heterogeneity setting): Alg. 1 with the
  other batch empty. A labeled-only client mixes its labeled rows among themselves and trains
  L_X alone; an unlabeled-only client guesses, mixes its K B unlabeled rows among themselves
  and trains lambda_U L_U alone (its unlabeled stream, B images a step, then drives the local
  epoch); one with neither sits out. The reply's weight is n_L where the client has labels,
  else n_U. In a round where lambda_U is 0 (round 1 of the ramp) a client without labels has
  nothing to train and is idle. Alg. 1 assumes labels in every batch; without them, and
  without a confidence threshold, L_U's fixed point is one sharpened class for every image:
  on HASSLE's ``ALL`` layout (10 of 20 clients without labels) the averaged model is at one
  class in 8 of its first 20 rounds (14 with every reply weighted alike), and in none when
  those clients sit out (the ``mixmatch-collapse`` grid, docs/baselines/mixmatch.md).
  ``mixmatch-unlabeled-clients = sit-out`` makes such a client idle; ``train`` (the default,
  the behaviour of the records made before the switch) keeps Alg. 1 with X empty, as above.
- **Labels at the server** (``client-setting=labels-at-server``): the clients hold unlabeled
  images only and train lambda_U L_U alone (as above); the server trains on its labeled images
  after every aggregation as a labeled-only client does (Alg. 1 with U empty: L_X on its
  labeled rows mixed among themselves; :meth:`MixMatch.server_task`).
- No upload beyond the common ones: MixMatch keeps every guessed label (no threshold).

The paper's numbers to compare with (test accuracy, %), FedAvg+MixMatch in HASSLE's Tables 1
and 7 (10% of the images labeled, HASSLE's ``ALL`` layout of 20 clients): Fashion-MNIST 79.67
(FedAvg+FixMatch 80.83, HASSLE EM 84.04); CIFAR-10 59.18, with Dirichlet alpha = 0.01 45.95 and
alpha = 1 69.42. HASSLE's baseline grids (``hassle-baselines``, ``hassle-baselines-cifar10``)
run this column.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.config import ConfigError, RunConfig
from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import Batch, LocalTask, NothingToTrain, RoundContext, ServerRoundContext, Stream, register_method
from fedul_flwr.methods.local_ssl import LocalSSL, mixup
from fedul_flwr.methods.mixmatch.settings import OPTIONS

__all__ = ["MixMatch", "draw_mixup", "guess_labels", "mixmatch_loss", "ramp_weight", "sharpen"]


def sharpen(p: torch.Tensor, temperature: float) -> torch.Tensor:
    """Eq. 7: ``p_i^(1/T) / sum_j p_j^(1/T)`` per row.

    Parameters
    ----------
    p : torch.Tensor
        ``[n, K]`` class distributions.
    temperature : float
        T > 0 (T -> 0: one-hot at the argmax; T = 1: ``p`` itself).

    Returns
    -------
    torch.Tensor
        ``[n, K]``, rows summing to 1. Computed as ``softmax(log p / T)``, which equals the
        power form and does not underflow for small T.
    """
    return F.softmax(torch.log(p.clamp_min(torch.finfo(p.dtype).tiny)) / temperature, dim=1)


def guess_labels(view_logits: torch.Tensor, k: int, temperature: float) -> torch.Tensor:
    """Eqs. 6-7: the sharpened mean softmax of the K views of each unlabeled image.

    Parameters
    ----------
    view_logits : torch.Tensor
        ``[K n, K_cls]`` logits of the K views, view-major (rows ``j n .. (j + 1) n - 1`` are
        view j of images 0..n-1).
    k : int
        K, views per image.
    temperature : float
        T of :func:`sharpen`.

    Returns
    -------
    torch.Tensor
        ``[n, K_cls]`` guessed labels q (no gradient).
    """
    probs = F.softmax(view_logits.detach().float(), dim=1)
    return sharpen(probs.reshape(k, -1, probs.shape[1]).mean(dim=0), temperature)


def draw_mixup(n: int, alpha: float, generator: torch.Generator, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The partners and weights of one MixUp over n rows (Eqs. 8-9).

    Parameters
    ----------
    n : int
        Rows of W.
    alpha : float
        Beta(alpha, alpha)'s parameter (> 0).
    generator : torch.Generator
        Draws the permutation (``RoundContext.generator``).
    rng : np.random.Generator
        Draws the weights (``RoundContext.rng``).

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        int64 ``[n]`` partner of each row (a permutation) and float32 ``[n]`` weights
        lambda' = max(lambda, 1 - lambda) in [0.5, 1], on the CPU.
    """
    partner = torch.randperm(n, generator=generator)
    lam = torch.from_numpy(rng.beta(alpha, alpha, size=n).astype(np.float32))
    return partner, torch.maximum(lam, 1.0 - lam)


def mixmatch_loss(logits: torch.Tensor, targets: torch.Tensor, n_labeled: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eqs. 3-4 on the mixed batch: L_X on its first ``n_labeled`` rows, L_U on the rest.

    Parameters
    ----------
    logits : torch.Tensor
        ``[n, K_cls]`` logits of the mixed rows, X' first.
    targets : torch.Tensor
        ``[n, K_cls]`` their mixed soft labels p' (X') and q' (U').
    n_labeled : int
        |X'| (0 for a client without labels).

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        Scalars L_X (mean cross-entropy with the soft labels) and L_U (mean squared
        difference over rows and classes), each 0 where its part has no row; Eq. 5's loss is
        ``L_X + lambda_U L_U``.
    """
    logits = logits.float()
    zero = logits.sum() * 0
    lx, lu = logits[:n_labeled], logits[n_labeled:]
    loss_x = -(targets[:n_labeled] * F.log_softmax(lx, dim=1)).sum(dim=1).mean() if n_labeled else zero
    loss_u = (targets[n_labeled:] - F.softmax(lu, dim=1)).square().mean() if len(lu) else zero
    return loss_x, loss_u


def ramp_weight(weight: float, server_round: int, num_rounds: int, ramp: float) -> float:
    """lambda_U in round ``server_round`` (from 1): ``weight min(1, (r - 1) / (ramp num_rounds))``
    (0 before round 1); ``weight`` itself where ``ramp`` is 0."""
    if ramp <= 0:
        return weight
    return weight * min(1.0, max(0.0, (server_round - 1) / (ramp * num_rounds)))


@register_method
class MixMatch(LocalSSL):
    """MixMatch on each client's labeled and unlabeled images (module docstring)."""

    name = "mixmatch"
    options = OPTIONS

    @classmethod
    def check_options(cls, cfg: RunConfig) -> None:
        """The options' rules, and ``mixmatch-unlabeled-clients = sit-out`` refused under
        ``labels-at-server``, where no client holds labels and every one would sit out.

        Raises
        ------
        ConfigError
            Naming the key, the value and the rule, or the two keys that exclude each other.
        """
        super().check_options(cfg)
        if cfg.option("mixmatch-unlabeled-clients") == "sit-out" and cfg.client_setting == "labels-at-server":
            raise ConfigError("mixmatch-unlabeled-clients='sit-out' with client-setting='labels-at-server': no client "
                              "holds labels there, so every one would sit out (use 'train')")  # fmt: skip

    def sits_out(self, client: ClientData) -> bool:
        """A client with neither part, or (``mixmatch-unlabeled-clients = sit-out``) one without
        labeled images."""
        unlabeled_only = "labeled" not in client.parts()
        return super().sits_out(client) or (unlabeled_only and self.option("mixmatch-unlabeled-clients") == "sit-out")

    def unlabeled_stream(self, client: ClientData) -> Stream:
        """The unlabeled images (``x``) with K weak views ``weak0`` .. ``weak{K-1}``, B a step."""
        assert client.unlabeled is not None
        weak = self.weak_view(client)
        views = {f"weak{j}": ("x", weak) for j in range(self.option("mixmatch-k"))}
        return Stream({"x": client.unlabeled}, self.cfg.batch_size, images=(), views=views)

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """Streams ``labeled`` (weak view, y) and ``unlabeled`` (K weak views), those the client
        holds; loss of Eqs. 2-5 on the MixMatch batch (module docstring).

        Raises
        ------
        NothingToTrain
            For a client without labels in a round where lambda_U is 0 (round 1 of a ramp, or
            ``mixmatch-lambda-u = 0``): its loss would be 0 and its reply the received model,
            so it is idle instead."""
        k, temperature = int(self.option("mixmatch-k")), float(self.option("mixmatch-temperature"))
        alpha, classes = float(self.option("mixmatch-alpha")), client.num_classes
        lambda_u = ramp_weight(float(self.option("mixmatch-lambda-u")), ctx.server_round, self.cfg.num_rounds,
                               float(self.option("mixmatch-ramp-up")))  # fmt: skip
        if lambda_u == 0 and "labeled" not in client.parts():  # its whole loss would be 0 * L_U
            raise NothingToTrain(f"lambda_U is 0 in round {ctx.server_round} and the client holds no labels")

        def loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            f, lb, ub = models["f"], batch.get("labeled", {}), batch.get("unlabeled", {})
            inputs, targets = [], []
            if lb:
                inputs.append(lb["weak"])
                targets.append(F.one_hot(lb["y"], classes).float())
            if ub:
                views = torch.cat([ub[f"weak{j}"] for j in range(k)])  # [K n, C, H, W], view-major
                with torch.no_grad():
                    guess = guess_labels(f(views), k, temperature)
                inputs.append(views)
                targets.append(guess.repeat(k, 1))
            x, p = torch.cat(inputs), torch.cat(targets)
            partner, lam = draw_mixup(len(x), alpha, ctx.generator, ctx.rng)
            partner, lam = partner.to(x.device, non_blocking=True), lam.to(x.device, non_blocking=True)
            logits = f(mixup(x, x[partner], lam))
            loss_x, loss_u = mixmatch_loss(logits, mixup(p, p[partner], lam), len(lb["y"]) if lb else 0)
            return loss_x + lambda_u * loss_u

        streams = self.ssl_streams(client, lambda: self.unlabeled_stream(client))
        return LocalTask(streams, loss)

    def server_task(self, server: ClientData, models: nn.ModuleDict, ctx: ServerRoundContext) -> LocalTask:
        """The server's training on its labeled images (labels-at-server): the task of a
        labeled-only client (L_X on the labeled rows mixed among themselves), drawing from the
        server's generators."""
        return self.local_task(server, models, ctx)
