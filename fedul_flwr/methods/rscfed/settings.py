"""The run-config keys RSCFed owns (``rscfed-`` prefix): defaults, rules, meaning.

Defaults are the authors' published run of their code (the README's command line: M = 3
sub-sets of K = 5 clients, distance scale 1e4, 100 where a labeled client is in the sub-set,
labeled weight x6, lambda 0.02, unlabeled lr 0.021 against 0.03) where the paper gives no other
value; :mod:`fedul_flwr.methods.rscfed` says which choices are the paper's and which the code's.
"""

from __future__ import annotations

from fedul_flwr.config import Option

__all__ = ["DISTANCES", "OPTIONS", "STUDENT_VIEWS", "TEACHERS"]

DISTANCES = ("l2", "layer-sum")
"""Values of ``rscfed-distance``: ||w_i - w_avg||_2 over all the model's float arrays as one
vector (the paper's norm), or the sum of the per-array L2 norms (the authors' code)."""
TEACHERS = ("kept", "round")
"""Values of ``rscfed-teacher``: the mean teacher stays on the node across rounds (the authors'
code), or restarts from the received global model every round."""
STUDENT_VIEWS = ("weak", "strong")
"""Values of ``rscfed-student-view``: the student's view of an unlabeled image, a second weak
view (the authors' code: two independent weak augmentations) or a strong one."""


def _positive_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


OPTIONS: tuple[Option, ...] = (
    Option("rscfed-subsets", 3, "M, the random sub-sets of the round's clients, each averaged into a sub-consensus "
           "model (Sec. 3.2; the code's meta_round)",
           check=_positive_int, rule="an integer >= 1"),
    Option("rscfed-subset-size", 5, "K, the clients of each sub-set, drawn without replacement from the round's "
           "replies (all of them where fewer reply; the code's meta_client_num)",
           check=_positive_int, rule="an integer >= 1"),
    Option("rscfed-beta", 1e4, "beta, the scale of the distance reweighting exp(-beta d_i / n_i) in a sub-set of "
           "unlabeled clients only (the code's dist_scale)",
           check=lambda v: v >= 0, rule=">= 0"),
    Option("rscfed-beta-labeled", 100.0, "beta in a sub-set that holds a client with labels (the code's sup_scale, "
           "100 in its published run)",
           check=lambda v: v >= 0, rule=">= 0"),
    Option("rscfed-labeled-factor", 6.0, "the factor of a client with labels in its sub-set's weights, after the "
           "distance reweighting (the code's w_mul_times, 6 in its published run; 1: none)",
           check=lambda v: v > 0, rule="> 0"),
    Option("rscfed-distance", "l2", "the distance d_i of a client's model to its sub-set's average: `l2` (the "
           "paper's norm of the whole model) or `layer-sum` (the code's sum of per-array norms)",
           choices=DISTANCES),
    Option("rscfed-ema-decay", 0.999, "decay of the mean teacher's weight EMA per local step",
           check=lambda v: 0.0 <= v < 1.0, rule="in [0, 1)"),
    Option("rscfed-teacher", "kept", "`kept`: the mean teacher stays on the node across rounds, copied from the "
           "global model the first time the node trains (the authors' code); `round`: it restarts from the "
           "received global model every round",
           choices=TEACHERS),
    Option("rscfed-lambda", 0.02, "weight lambda of the consistency loss on unlabeled images (the code's lambda_u)",
           check=lambda v: v >= 0, rule=">= 0"),
    Option("rscfed-threshold", 0.0, "confidence threshold of the teacher's sharpened prediction: images below it "
           "add no consistency loss (0: every image, as the code trains)",
           check=lambda v: 0.0 <= v <= 1.0, rule="in [0, 1]"),
    Option("rscfed-temperature", 0.5, "temperature T of the sharpening of the teacher's prediction, p^(1/T) "
           "renormalised (the code's 0.5)",
           check=lambda v: v > 0, rule="> 0"),
    Option("rscfed-student-view", "weak", "the student's view of an unlabeled image: `weak` (a second weak "
           "augmentation, the code) or `strong` (RandAugment)",
           choices=STUDENT_VIEWS),
    Option("rscfed-unlabeled-lr-factor", 0.7, "the learning rate of a client without labels, as a factor of `lr` "
           "(the code: 0.021 against 0.03)",
           check=lambda v: v > 0, rule="> 0"),
)
