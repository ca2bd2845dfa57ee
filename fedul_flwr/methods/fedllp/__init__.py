"""FedLLP: federated learning from label proportions, a baseline of FedUL.

Lu et al. (ICLR 2022), Sec. 4.1 and App. D, Eq. (18), after Dulac-Arnold et al. (2019):
every U set U_c^m is a *bag* whose class proportions pi_c^m (row m of Pi_c) are known; the
client fits f so that the mean predicted class distribution of each bag matches it,

    d_prop(pi_c^m, pihat_c^m) = - sum_k pi_c^m[k] log pihat_c^m[k],
    pihat_c^m = mean_{x in U_c^m} softmax(f(x)),

and the server averages the clients with FedAvg. This is empirical *proportion* risk
minimisation (EPRM), which the paper argues is inferior to FedUL's classification risk.

Mini-batches (our reading; App. D prints the bag mean with a 1/M_c factor, evidently a
typo for 1/|U_c^m|): batches are *set-stratified* (``llp-batches = "stratified"``,
default): every batch holds a proportional share of every set, and pihat^m is the mean over
the batch's rows of set m. ``"single-set"`` (one set per batch) and ``"whole-set"`` (one
batch per U set) are the alternatives; measured on the embedded MNIST sample (2 clients x
3000 images, 10 sets, 4 rounds of 2 epochs, LeNet, lr 1e-3) single-set batches leave f at
the uniform prediction (88.6% test error, a stationary point of the loss) while stratified
batches reach 6.2% (uniformly random batches: 5.5%). Within a batch, d_prop is averaged over the sets present (a
plain sum over sets would only rescale the gradient, which Adam undoes).

The shared pieces used by FedLLP-VAT live here: :func:`proportion_loss` and
:func:`set_stratified_batches`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods.base import Batch, LocalTask, Method, RoundContext, Stream, register_method
from fedul_flwr.methods.fedllp.settings import LLP_BATCHES, OPTIONS

__all__ = ["FedLLP", "proportion_loss", "set_stratified_batches"]


def proportion_loss(logits: torch.Tensor, set_index: torch.Tensor, priors: torch.Tensor) -> torch.Tensor:
    """Label-proportion loss of a batch, Eq. (18), averaged over the sets in the batch.

    Parameters
    ----------
    logits : torch.Tensor
        float ``[B, K]`` outputs of f.
    set_index : torch.Tensor
        int64 ``[B]`` set (bag) index m of each row, in [0, M).
    priors : torch.Tensor
        float ``[M, K]`` class proportions pi^m of the sets (rows sum to 1).

    Returns
    -------
    torch.Tensor
        Scalar ``mean_{m in batch} -sum_k pi^m[k] log pihat^m[k]`` with
        ``pihat^m = mean_{rows of set m} softmax(logits)`` computed in log space
        (log-mean-exp of log-softmax), so it is finite even for saturated predictions.
        Minimal (given the sets' rows) when every pihat^m equals pi^m; its minimum value is
        then the mean entropy of the pi^m.

    Raises
    ------
    ValueError
        On mismatched shapes or a set index outside [0, M).
    """
    if logits.ndim != 2 or set_index.shape != logits.shape[:1] or priors.ndim != 2:
        raise ValueError(
            f"expected logits [B, K], set_index [B], priors [M, K]; got {tuple(logits.shape)}, "
            f"{tuple(set_index.shape)}, {tuple(priors.shape)}"
        )
    if priors.shape[1] != logits.shape[1]:
        raise ValueError(f"priors have K={priors.shape[1]} classes but logits {logits.shape[1]}")
    if len(set_index) and (int(set_index.min()) < 0 or int(set_index.max()) >= priors.shape[0]):
        raise ValueError(f"set_index must lie in [0, {priors.shape[0]}), got {set_index.unique().tolist()}")
    log_p = F.log_softmax(logits.float(), dim=1)  # [B, K]
    sets, member = torch.unique(set_index, return_inverse=True)  # [S], [B]
    mask = F.one_hot(member, num_classes=len(sets)).T.bool()  # [S, B]
    neg_inf = torch.tensor(-math.inf, dtype=log_p.dtype, device=log_p.device)
    log_sum = torch.logsumexp(torch.where(mask[:, :, None], log_p[None], neg_inf), dim=1)  # [S, K]
    log_mean = log_sum - mask.sum(dim=1, keepdim=True).to(log_p.dtype).log()
    target = priors[sets].to(log_p)
    # 0 * log(0) terms (zero prior, vanishing prediction) are 0, not NaN
    per_set = -(torch.where(target > 0, target * log_mean, torch.zeros_like(log_mean))).sum(dim=1)
    return per_set.mean()


def set_stratified_batches(
    set_index: torch.Tensor, batch_size: int, mode: str = "stratified"
) -> Callable[[torch.Generator], Iterator[torch.Tensor]]:
    """Batch order for bag losses.

    Parameters
    ----------
    set_index : torch.Tensor
        int64 ``[n]`` set index of each training row.
    batch_size : int
        B >= 1.
    mode : str
        - ``"stratified"`` (default): T = ceil(n / B) batches, each holding a proportional
          share (n_m / T rows, +-1) of *every* set, so one step pulls the rows of different
          sets towards different proportions (the discriminative signal);
        - ``"single-set"``: each set cut into ceil(n_m / B) near-equal chunks, one set per
          batch (measured here: on MNIST f stays at the uniform prediction, a stationary
          point, because each step pushes all rows the same way);
        - ``"whole-set"``: one batch per set (the bag is the whole U set).

    Returns
    -------
    Callable[[torch.Generator], Iterator[torch.Tensor]]
        ``batches(generator)``: one epoch's int64 index batches, rows shuffled within each
        set and the batches in random order, all drawn from ``generator``. Every row occurs
        exactly once per epoch.

    Raises
    ------
    ValueError
        If ``batch_size < 1`` or ``mode`` is unknown.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if mode not in LLP_BATCHES:
        raise ValueError(f"unknown LLP batch mode {mode!r}; valid: {LLP_BATCHES}")
    members = [torch.nonzero(set_index == m).flatten() for m in torch.unique(set_index).tolist()]
    num_batches = max(1, math.ceil(len(set_index) / batch_size))

    def batches(generator: torch.Generator) -> Iterator[torch.Tensor]:
        shuffled = [rows[torch.randperm(len(rows), generator=generator)] for rows in members]
        if mode == "stratified":
            parts = [torch.tensor_split(rows, num_batches) for rows in shuffled]
            chunks = [torch.cat([p[t] for p in parts]) for t in range(num_batches)]
        else:
            chunks = []
            for rows in shuffled:
                chunks.extend(torch.tensor_split(rows, 1 if mode == "whole-set" else math.ceil(len(rows) / batch_size)))
        for i in torch.randperm(len(chunks), generator=generator).tolist():
            yield chunks[i]

    return batches


@register_method
class FedLLP(Method):
    """FedLLP (Dulac-Arnold et al., 2019, federated as in Lu et al., App. D): bag
    label-proportion loss per U set, set-stratified batches, FedAvg on the server."""

    name = "fedllp"
    requires = ("unlabeled", "usets")
    options = OPTIONS

    def regulariser(
        self, model: nn.Module, x: torch.Tensor, logits: torch.Tensor, ctx: RoundContext
    ) -> torch.Tensor | None:
        """Extra loss term added to the proportion loss (none for plain FedLLP)."""
        return None

    def local_task(self, client: ClientData, models: nn.ModuleDict, ctx: RoundContext) -> LocalTask:
        """Rows x with their set index; loss = :func:`proportion_loss` against the client's
        (possibly noisy) prior matrix Pi_c ``[M_c, K]``, plus :meth:`regulariser`."""
        assert client.usets is not None and client.unlabeled is not None  # ``requires``
        priors = torch.as_tensor(np.asarray(client.usets.priors), dtype=torch.float32, device=ctx.device)

        def loss(models: nn.ModuleDict, batch: Batch) -> torch.Tensor:
            b = batch["usets"]
            logits = models["f"](b["x"])
            value = proportion_loss(logits, b["set"], priors)
            extra = self.regulariser(models["f"], b["x"], logits, ctx)
            return value if extra is None else value + extra

        set_index = client.usets.set_index
        batches = set_stratified_batches(set_index, self.cfg.batch_size, self.option("llp-batches"))
        stream = Stream({"x": client.unlabeled, "set": set_index}, self.cfg.batch_size, batches=batches)
        return LocalTask({"usets": stream}, loss)
