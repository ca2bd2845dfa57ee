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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["consistency_loss", "ema_update", "teacher_decay"]


def teacher_decay(decay: float, updates: float) -> float:
    """d_s = min(d, 1 - 1 / (s + 1)) of the teacher's update number s (from 0).

    Parameters
    ----------
    decay : float
        d in [0, 1).
    updates : float
        s >= 0, the updates before this one (may be an estimate, hence a float).

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
