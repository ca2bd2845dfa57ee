"""The run-config keys FedRGD owns (besides FixMatch's threshold, mu, lambda, strong view and
reply weight, which its clients read): defaults, rules, meaning."""

from __future__ import annotations

from fedul_flwr.config import Option

__all__ = ["OPTIONS"]


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


OPTIONS: tuple[Option, ...] = (
    Option("fedrgd-groups", 2, "FedRGD's groups S per round: the replies are split at random into S groups, each "
           "averaged with the server's model, and the group models averaged (2: the SemiFL authors' "
           "re-implementation; 1: one group, FedAvg with the server's model as one more member)",
           check=_count, rule="an integer >= 1"),
)
