"""Evaluation of predictors: accuracy and loss of each of a method's predictors on labeled images
(:func:`evaluate_predictors`, :func:`evaluate` for one), every model run at most once per batch
and, across rounds, not at all for weights already evaluated (:class:`EvaluationCache`). Runs
under :func:`torch.inference_mode`; the sums stay on the device and are read once at the end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from fedul_flwr.acceleration import PLAIN, Acceleration
from fedul_flwr.methods.base import Predictor
from fedul_flwr.training import ToInput

__all__ = ["EvaluationCache", "evaluate", "evaluate_predictors"]


class _OncePerBatch(Mapping[str, Callable[[torch.Tensor], torch.Tensor]]):
    """The models as predictors see them, each run at most once on a given batch: a second
    predictor asking a model for the same input tensor gets the first call's logits (the
    same numbers: inference is a pure function of the input), so EM = (SM + UM) / 2 costs no
    forward pass beyond SM's and UM's. ``known`` holds logits of this batch already at hand
    (an :class:`EvaluationCache` hit) by model name. Predictors must not change the logits in
    place."""

    def __init__(self, forwards: nn.ModuleDict, known: Mapping[str, torch.Tensor] | None = None) -> None:
        self._forwards = forwards
        self._known = dict(known or {})
        self._seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def __getitem__(self, name: str) -> Callable[[torch.Tensor], torch.Tensor]:
        forward = self._forwards[name]

        def call(x: torch.Tensor) -> torch.Tensor:
            seen = self._seen.get(name)
            if seen is None or seen[0] is not x:
                seen = self._seen[name] = (x, self._known[name] if name in self._known else forward(x))
            return seen[1]

        return call

    def __iter__(self) -> Iterator[str]:
        return iter(self._forwards)

    def __len__(self) -> int:
        return len(self._forwards)

    def logits(self) -> dict[str, torch.Tensor]:
        """The logits of every model a predictor asked for, by name."""
        return {name: logits for name, (_, logits) in self._seen.items()}


class EvaluationCache:
    """The logits of the last evaluation on one image set, by the weights that produced them.

    :func:`evaluate_predictors` given a cache runs no forward pass for a model whose weights
    (parameters and buffers) equal those of a model it ran in the previous call with the
    same cache: it reads that model's logits back, batch by batch, the very numbers the
    forward pass computes (the same kernels on the same batches). HASSLE's ``w_S_prev`` is
    the previous round's ``w_S``: its test logits come from the previous round's evaluation.
    The caller passes the same images, batch size and acceleration with one cache (e.g. one
    cache per test set of a run).
    """

    def __init__(self) -> None:
        self._entries: list[tuple[dict[str, torch.Tensor], list[torch.Tensor]]] = []
        self._shape: tuple[int, int] | None = None
        self.hits = 0
        """Models read back instead of run, over every call (a diagnostic)."""

    def lookup(self, models: nn.ModuleDict, num_images: int, batch_size: int) -> dict[str, list[torch.Tensor]]:
        """Per-batch logits of every model of ``models`` whose weights an entry holds."""
        if self._shape != (num_images, batch_size):
            self._entries, self._shape = [], (num_images, batch_size)
            return {}
        found = {}
        for name, model in models.items():
            state = model.state_dict()
            for saved, logits in self._entries:
                if saved.keys() == state.keys() and all(torch.equal(saved[k], v) for k, v in state.items()):
                    found[name] = logits
                    self.hits += 1
                    break
        return found

    def store(self, models: nn.ModuleDict, logits: Mapping[str, list[torch.Tensor]]) -> None:
        """Keep the per-batch ``logits`` of the models that ran in this call, with a copy of
        their weights (the entries of earlier calls are dropped)."""
        self._entries = [
            ({k: v.detach().clone() for k, v in models[name].state_dict().items()}, batches)
            for name, batches in logits.items()
        ]


def evaluate_predictors(
    models: nn.ModuleDict,
    predictors: Mapping[str, Predictor],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    to_input: ToInput,
    batch_size: int = 2048,
    device: torch.device | str = "cpu",
    acceleration: Acceleration | None = None,
    cache: EvaluationCache | None = None,
) -> dict[str, dict[str, float]]:
    """Test several predictors on labeled data in one pass: prediction = argmax of logits.

    Each batch goes to the device once and each model runs on it once, however many
    predictors use that model (HASSLE's SM, UM and EM share w_S, w_U and the residual models);
    the results are those of :func:`evaluate` on each predictor alone. Runs under
    :func:`torch.inference_mode`; the losses and correct counts are summed on ``device`` and
    read once.

    Parameters
    ----------
    models : nn.ModuleDict
        The models the predictors use (put in eval mode here).
    predictors : Mapping[str, Predictor]
        ``predict(models, x) -> logits [B, K]`` by name.
    x : torch.Tensor
        uint8 ``[n, C, H, W]`` images.
    y : torch.Tensor
        int64 ``[n]`` true labels.
    to_input : Callable[[torch.Tensor], torch.Tensor]
        uint8 images -> float model inputs (per batch, on ``device``).
    batch_size : int
        Images per forward pass.
    device : torch.device | str
        Where the forward passes run.
    acceleration : Acceleration | None
        Precision and memory format of the forward passes (``None``: float32 NCHW).
    cache : EvaluationCache | None
        Logits of the previous call on the same images: a model with the weights of a model
        run then is not run again (:class:`EvaluationCache`); updated here. ``None``: none.

    Returns
    -------
    dict[str, dict[str, float]]
        Per predictor name: ``test-loss`` (mean cross-entropy), ``test-accuracy`` and
        ``test-error`` (fractions in [0, 1]), ``num-examples``.
    """
    device = torch.device(device)
    acc = acceleration if acceleration is not None else dataclasses.replace(PLAIN, device=device)
    models.eval()
    known = cache.lookup(models, len(x), batch_size) if cache is not None else {}
    ran: dict[str, list[torch.Tensor]] = {}
    forwards = acc.prepare(models)
    try:
        with torch.inference_mode():
            loss_sums = {name: torch.zeros((), dtype=torch.float64, device=device) for name in predictors}
            corrects = {name: torch.zeros((), dtype=torch.int64, device=device) for name in predictors}
            for i, start in enumerate(range(0, len(x), batch_size)):
                xb = to_input(x[start : start + batch_size].to(device, non_blocking=True))
                yb = y[start : start + batch_size].to(device, non_blocking=True)
                once = _OncePerBatch(forwards, {name: batches[i] for name, batches in known.items()})
                for name, predict in predictors.items():
                    logits = predict(once, xb)  # type: ignore[arg-type]
                    loss_sums[name] += nn.functional.cross_entropy(logits, yb, reduction="sum")
                    corrects[name] += (logits.argmax(dim=1) == yb).sum()
                for name, logits in once.logits().items():
                    ran.setdefault(name, []).append(logits)
            totals = {name: (float(loss_sums[name]), int(corrects[name])) for name in predictors}
    finally:
        acc.restore(models)
    if cache is not None:
        cache.store(models, ran)
    n = max(1, len(x))
    return {
        name: {"test-loss": loss / n, "test-accuracy": correct / n, "test-error": 1.0 - correct / n, "num-examples": float(len(x))}
        for name, (loss, correct) in totals.items()
    }


def evaluate(models: nn.ModuleDict, predict: Predictor, x: torch.Tensor, y: torch.Tensor, **options: Any) -> dict[str, float]:
    """Test one predictor on labeled data: prediction = argmax of its logits.

    :func:`evaluate_predictors` with the one predictor ``predict``; ``options`` are its
    keyword parameters (``to_input``, ``batch_size``, ``device``, ``acceleration``).

    Returns
    -------
    dict[str, float]
        ``test-loss`` (mean cross-entropy), ``test-accuracy`` and ``test-error`` (fractions
        in [0, 1]), ``num-examples``.
    """
    return evaluate_predictors(models, {"": predict}, x, y, **options)[""]
