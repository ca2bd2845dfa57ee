"""The mean teacher of RSCFed's clients without labels: the teacher's weight EMA and the
consistency loss (the teacher's prediction is sharpened by MixMatch's
:func:`fedul_flwr.methods.mixmatch.sharpen`).

Tarvainen and Valpola, "Mean teachers are better role models", NeurIPS 2017, as RSCFed's
clients run it (Liang et al., CVPR 2022, Sec. 3.1; the authors' code): the teacher predicts on
one weak view of an unlabeled image u, its prediction is sharpened, and the student's softmax on
another view is pulled towards it by a squared error; after every student step the teacher's
weights follow the student's,

    theta'_s = d_s theta'_{s-1} + (1 - d_s) theta_s,    d_s = min(d, 1 - 1 / (s + 1)),

s counting the teacher's updates from 0 (Tarvainen and Valpola's warm-up, the authors' code's
``update_ema_variables``): the first update copies the student, and until s = 1 / (1 - d) - 1
the teacher is the plain mean of the student's weights so far.

**The count s across rounds.** A node keeps its teacher's weights between rounds
(``context.state``), not a counter, so the server counts for it
(:class:`TeacherUpdateCounts`): the teacher takes one update per local step of a round the node
trains (its steps all draw an unlabeled batch: the other streams cycle, :mod:`fedul_flwr.training`),
so the updates before round t are the sum of the ``num-steps`` of the node's trained replies of
the run so far, whichever rounds the node was sampled in, sat idle or failed (an idle or failed
round stores no teacher and sends no steps). The server sends that sum in the node's train
message (``rscfed-teacher-updates``). The count is the true one wherever the node's state lives
as long as its node id, as in Flower's runtimes (a restarted SuperNode gets a new id and a new
state): only a reply lost after the node stored its teacher would leave it behind. It is not
in the checkpoint: a resumed run is a new Flower run, whose nodes start with empty states, so
every teacher is new again (s = 0) after a resume, which the resumed run's first round says
in one warning line.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import WARNING
from typing import Any

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from torch import nn

from fedul_flwr import wire

__all__ = ["TEACHER_UPDATES", "TeacherUpdateCounts", "consistency_loss", "ema_update", "teacher_decay"]

TEACHER_UPDATES = "rscfed-teacher-updates"
"""Train-config key of one message: the updates its node's kept teacher has had in the run so
far (:class:`TeacherUpdateCounts`)."""


def teacher_decay(decay: float, updates: float) -> float:
    """d_s = min(d, 1 - 1 / (s + 1)) of the teacher's update number s (from 0).

    Parameters
    ----------
    decay : float
        d in [0, 1).
    updates : float
        s >= 0, the teacher's updates before this one.

    Returns
    -------
    float
    """
    return min(decay, 1.0 - 1.0 / (updates + 1.0))


@torch.no_grad()
def ema_update(teacher: nn.Module, student: nn.Module, decay: float) -> None:
    """theta' <- d theta' + (1 - d) theta over the parameters, in place; the buffers (batch-norm
    statistics) are copied from the student.

    Parameters
    ----------
    teacher, student : nn.Module
        Two modules of the same architecture (parameters in the same order).
    decay : float
        d in [0, 1] (0: the teacher becomes the student).
    """
    mine, theirs = list(teacher.parameters()), list(student.parameters())
    if len(mine) != len(theirs):
        raise ValueError(f"teacher has {len(mine)} parameters, student {len(theirs)}")
    torch._foreach_lerp_([p.data for p in mine], [p.data.to(p.dtype) for p in theirs], 1.0 - decay)
    for b, s in zip(teacher.buffers(), student.buffers(), strict=True):
        b.copy_(s)


def consistency_loss(student_logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """L_u = 1/B sum_b mask_b sum_k (softmax(z_b)_k - q_{b,k})^2.

    Parameters
    ----------
    student_logits : torch.Tensor
        ``[B, K]`` logits of the student's views.
    targets : torch.Tensor
        ``[B, K]`` sharpened teacher probabilities q (no gradient).
    mask : torch.Tensor
        ``[B]`` 1 where the image counts (float or bool).

    Returns
    -------
    torch.Tensor
        Scalar; 0 for an empty batch.
    """
    if len(targets) == 0:
        return student_logits.sum() * 0
    squared = ((F.softmax(student_logits.float(), dim=1) - targets.float()) ** 2).sum(dim=1)
    return (squared * mask.to(squared.dtype)).mean()


class TeacherUpdateCounts:
    """Mixin for Flower strategies: count each node's teacher updates and send the count in its
    train messages (module docstring, "The count s across rounds").

    Attributes
    ----------
    teacher_updates : dict[int, int]
        Node id -> the summed ``num-steps`` of its trained replies in this run.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.teacher_updates: dict[int, int] = {}
        self._resume_told = False

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Any:
        """The strategy's train messages, each with its node's count in its config (and, in the
        first round of a resumed run, one warning line: the nodes' teachers start anew)."""
        resumed_after = int(getattr(self, "round_offset", 0))  # ResumedRounds: the checkpoint's round
        if resumed_after and not self._resume_told:
            self._resume_told = True
            log(WARNING, "rscfed-teacher='kept': the nodes' mean teachers do not outlive the run that stopped after round "
                "%d; each node starts a new one from the global model when it next trains, so the resumed rounds differ "
                "from an uninterrupted run's", resumed_after)  # fmt: skip
        messages = list(super().configure_train(server_round, arrays, config, grid))  # type: ignore[misc]
        for msg in messages:
            records = RecordDict({name: record for name, record in msg.content.items()})
            count = self.teacher_updates.get(msg.metadata.dst_node_id, 0)
            records[wire.CONFIG] = ConfigRecord({**dict(msg.content[wire.CONFIG]), TEACHER_UPDATES: count})
            msg.content = records
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Add each trained reply's ``num-steps`` to its node's count, then aggregate."""
        replies = list(replies)
        for reply in replies:
            if not reply.has_error() and len(reply.content[wire.ARRAYS]):
                node = reply.metadata.src_node_id
                steps = int(reply.content[wire.METRICS].get(wire.NUM_STEPS, 0))
                self.teacher_updates[node] = self.teacher_updates.get(node, 0) + steps
        return super().aggregate_train(server_round, replies)  # type: ignore[misc]
