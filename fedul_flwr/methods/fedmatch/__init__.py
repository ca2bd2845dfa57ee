"""FedMatch inside any strategy: ``method = "fedmatch"`` (:mod:`.fedmatch`).

Jeong et al., "Federated Semi-Supervised Learning with Inter-Client Consistency & Disjoint
Learning", ICLR 2021: parameters decomposed into sigma (labels) and psi (unlabeled images),
inter-client consistency with helper models the server picks per client (:mod:`.helpers`),
agreement-based pseudo-labels (:mod:`.losses`); in the labels-at-clients, annotation-heterogeneity
and labels-at-server settings.
"""

from __future__ import annotations

from fedul_flwr.methods.fedmatch.fedmatch import FedMatch

__all__ = ["FedMatch"]
