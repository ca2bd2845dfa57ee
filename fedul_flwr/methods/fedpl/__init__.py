"""FedPL: federated pseudo-labelling with confident/unconfident mixup, a baseline of FedUL.

Lu et al. (ICLR 2022), Sec. 4.1 and App. D, Eq. (14)-(17), after SemiFL (Diao et al.,
2021). Every image of U set m gets the *pseudo label* y_pl = argmax_k Pi_c[m, k], the class
with the largest prior in its set. Per batch the loss is

    L = L_fix + lambda * L_mix                                              (Eq. 14)
    L_fix = l(f(x+), y+)                                                    (Eq. 15)
    L_mix = lam_mix l(f(x_mix), y+) + (1 - lam_mix) l(f(x_mix), y-)         (Eq. 16)
    x_mix = lam_mix x+ + (1 - lam_mix) x-,  lam_mix ~ Beta(a, a)            (Eq. 17)

with l the cross-entropy, a = 0.75, lambda = 0.3, tau = 0.4 (knobs ``fedpl-mixup-alpha``,
``fedpl-mix-weight``, ``fedpl-threshold``).

Our reading of what the paper leaves open (documented, not from the authors' code):

- *confidence* "is given by model predictions": the model's probability of the sample's
  pseudo label, softmax(f(x))[y_pl], computed without gradient; (x+, y+) are the rows with
  confidence >= tau, (x-, y-) the others (the pseudo label of a low-confidence row is kept).
  A row whose set label the model already disagrees with is thus only used, down-weighted,
  inside the mixup term.
- *warm start*: a freshly initialised 10-class model gives every row confidence ~0.1 < tau,
  which would leave L_fix empty forever; a batch without any confident row therefore uses
  all its rows as (x+, y+) (plain pseudo-label training) and has no mix term.
- *pairing*: every low-confidence row is mixed with a confident row of the same batch drawn
  uniformly with replacement; one lam_mix per batch (as in mixup); L_fix and each part of
  L_mix are batch means of the rows they cover.

Randomness comes from the client's round generators (``RoundContext``: run seed, round,
node): the pairing from ``ctx.generator``, lam_mix from ``ctx.rng``, so a run repeats itself
wherever its clients run.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import Batch, LocalTask, Method, RoundContext, Stream, register_method
from fedul_flwr.methods.fedpl.settings import OPTIONS

__all__ = ["FedPL", "mixup_loss", "set_pseudo_labels"]


def set_pseudo_labels(priors: np.ndarray, set_index: torch.Tensor) -> torch.Tensor:
    """Pseudo label of each row: the class with the largest prior in the row's set.

    Parameters
    ----------
    priors : np.ndarray
        ``[M, K]`` class priors of the sets.
    set_index : torch.Tensor
        int64 ``[n]`` set index of each row, in [0, M).

    Returns
    -------
    torch.Tensor
        int64 ``[n]`` ``argmax_k priors[set_index[i], k]`` (ties: the smallest k).

    Raises
    ------
    ValueError
        If ``priors`` is not 2-D or a set index is out of range.
    """
    pi = np.asarray(priors)
    if pi.ndim != 2:
        raise ValueError(f"priors must be [M, K], got shape {pi.shape}")
    if len(set_index) and (int(set_index.min()) < 0 or int(set_index.max()) >= pi.shape[0]):
        raise ValueError(f"set_index must lie in [0, {pi.shape[0]})")
    per_set = torch.from_numpy(pi.argmax(axis=1).astype(np.int64))
    return per_set[set_index.cpu()].to(set_index.device)


def mixup_loss(
    model: nn.Module, x_pos: torch.Tensor, y_pos: torch.Tensor, x_neg: torch.Tensor, y_neg: torch.Tensor, lam: float
) -> torch.Tensor:
    """Eq. (16)-(17): cross-entropy of f on x_mix = lam x+ + (1 - lam) x- against both labels.

    Parameters
    ----------
    x_pos, x_neg : torch.Tensor
        ``[P, ...]`` paired confident / low-confidence inputs.
    y_pos, y_neg : torch.Tensor
        int64 ``[P]`` their (pseudo) labels.
    lam : float
        Mixing weight in [0, 1].

    Returns
    -------
    torch.Tensor
        Scalar ``lam CE(f(x_mix), y+) + (1 - lam) CE(f(x_mix), y-)`` (batch means).
    """
    logits = model(lam * x_pos + (1.0 - lam) * x_neg)
    return lam * F.cross_entropy(logits, y_pos) + (1.0 - lam) * F.cross_entropy(logits, y_neg)


@register_method
class FedPL(Method):
    """FedPL (Diao et al., 2021, as set up in Lu et al., App. D): set-level pseudo labels,
    confident fix loss + lambda * confident/unconfident mixup loss, FedAvg on the server."""

    name = "fedpl"
    requires = ("unlabeled", "usets")
    options = OPTIONS

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """Rows x with their set's pseudo label as target; loss of Eq. (14)."""
        assert client.usets is not None and client.unlabeled is not None  # ``requires``
        tau, weight = self.option("fedpl-threshold"), self.option("fedpl-mix-weight")
        alpha = self.option("fedpl-mixup-alpha")

        def loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            f = models["f"]
            x, y = batch["usets"]["x"], batch["usets"]["y"]
            logits = f(x)
            with torch.no_grad():
                confidence = F.softmax(logits, dim=1).gather(1, y[:, None]).squeeze(1)
            confident = confidence >= tau
            if not bool(confident.any()):  # warm start: no row is confident yet
                return F.cross_entropy(logits, y)
            fix = F.cross_entropy(logits[confident], y[confident])
            unsure = ~confident
            if weight == 0 or not bool(unsure.any()):
                return fix
            pos, neg = torch.nonzero(confident).flatten(), torch.nonzero(unsure).flatten()
            partner = pos[torch.randint(len(pos), (len(neg),), generator=ctx.generator).to(pos.device)]
            lam = float(ctx.rng.beta(alpha, alpha))
            return fix + weight * mixup_loss(f, x[partner], y[partner], x[neg], y[neg], lam)

        targets = set_pseudo_labels(client.usets.priors, client.usets.set_index)
        return LocalTask({"usets": Stream({"x": client.unlabeled, "y": targets}, self.cfg.batch_size)}, loss)
