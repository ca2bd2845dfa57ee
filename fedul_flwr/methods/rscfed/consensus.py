"""RSCFed's random sub-sampling consensus with distance-reweighted model aggregation, as a
strategy mixin.

Liang et al., "RSCFed: Random Sampling Consensus Federated Semi-supervised Learning", CVPR
2022, Sec. 3.2-3.3. In round t the server splits the round's replies M times into random
sub-sets S_1 .. S_M of K clients each (drawn without replacement within a sub-set,
independently across sub-sets, so a client may sit in several or in none). Sub-set m is
averaged into a sub-consensus model with weights that shrink with a client's distance to the
sub-set's plain average (DMA, the paper's distance-reweighted model aggregation):

    p_i = n_i / sum_{j in S_m} n_j,            wbar_m = sum_{i in S_m} p_i w_i,
    d_i = || w_i - wbar_m ||,
    a_i = p_i exp(-beta_m d_i / n_i) (x c for a client with labels),
    alpha_{m,i} = a_i / sum_{j in S_m} a_j,    w_m = sum_{i in S_m} alpha_{m,i} w_i,

with n_i the client's images, beta_m = ``rscfed-beta-labeled`` where S_m holds a client with
labels and ``rscfed-beta`` otherwise, and c = ``rscfed-labeled-factor`` (the authors' code's
sup_scale / dist_scale and w_mul_times). The global model is the mean of the sub-consensus
models, w^{t+1} = (1/M) sum_m w_m. That is one weighted mean of the client models,

    w^{t+1} = sum_i omega_i w_i,    omega_i = (1/M) sum_{m : i in S_m} alpha_{m,i},

so :class:`ConsensusAggregation` only replaces each reply's weight by omega_i (a client in no
sub-set is left out) and the run's strategy does the arithmetic: FedAvg gives the equations
above, FedProx the same with its clients' proximal term, FedAvgM / FedAdam / FedYogi /
FedAdagrad their server step on the consensus model's pseudo-gradient, FedNova its
normalised average with the weights omega_i, SCAFFOLD its control variates beside it. The
robust strategies (FedMedian, FedTrimmedAvg, Krum, MultiKrum, Bulyan) ignore weights and would
drop the consensus silently: the contract refuses them (:data:`ConsensusAggregation.contract`).

The sub-sets come from the ``consensus`` stream of :mod:`fedul_flwr.rng` at (run seed, round),
over the replies in the order of the clients' node keys: a seeded run repeats its sub-sets.
The a_i are computed in the log domain (a softmax), so a large beta d_i / n_i gives a weight
near 0, never a division by zero.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from logging import INFO
from typing import ClassVar

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log

from fedul_flwr import wire
from fedul_flwr.rng import numpy_generator
from fedul_flwr.strategies.contract import Combining, Contract

__all__ = ["ConsensusAggregation", "consensus_weights", "draw_subsets", "subset_weights"]


def draw_subsets(seed: int, server_round: int, num_clients: int, subsets: int, size: int) -> np.ndarray:
    """The M random sub-sets of a round, as indices into its replies.

    Parameters
    ----------
    seed : int
        The run's seed.
    server_round : int
        The round (from 1).
    num_clients : int
        n >= 1, the replies that sent a model.
    subsets : int
        M >= 1.
    size : int
        K >= 1; min(K, n) clients per sub-set.

    Returns
    -------
    np.ndarray
        int64 ``[M, min(K, n)]``: each row distinct indices in [0, n), drawn without
        replacement from the ``consensus`` stream at (seed, round).

    Raises
    ------
    ValueError
        If n, M or K is below 1.
    """
    if num_clients < 1 or subsets < 1 or size < 1:
        raise ValueError(f"sub-sets need n, M, K >= 1, got n={num_clients}, M={subsets}, K={size}")
    rng = numpy_generator("consensus", seed, server_round)
    k = min(size, num_clients)
    return np.stack([rng.choice(num_clients, size=k, replace=False) for _ in range(subsets)]).astype(np.int64)


def subset_weights(
    arrays: Sequence[Sequence[np.ndarray]], sizes: np.ndarray, labeled: np.ndarray, *, beta: float,
    beta_labeled: float, labeled_factor: float, distance: str = "l2",
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The DMA weights alpha of one sub-set (module docstring).

    Parameters
    ----------
    arrays : Sequence[Sequence[np.ndarray]]
        Per client of the sub-set (S of them), its model's float arrays in one order.
    sizes : np.ndarray
        ``[S]`` images n_i > 0.
    labeled : np.ndarray
        bool ``[S]``: whether the client holds labels.
    beta, beta_labeled : float
        The distance scale without / with a client with labels in the sub-set (>= 0).
    labeled_factor : float
        c > 0, the factor of a client with labels.
    distance : str
        ``"l2"``: ||w_i - wbar||_2 over all arrays as one vector; ``"layer-sum"``: the sum of
        the per-array L2 norms.

    Returns
    -------
    (np.ndarray, np.ndarray)
        alpha ``[S]`` (sums to 1) and the distances d ``[S]``.

    Raises
    ------
    ValueError
        On an unknown distance or a size <= 0.
    """
    n = np.asarray(sizes, dtype=np.float64)
    if np.any(n <= 0):
        raise ValueError(f"client sizes must be > 0, got {n.tolist()}")
    if distance not in ("l2", "layer-sum"):
        raise ValueError(f"rscfed-distance={distance!r} is not 'l2' or 'layer-sum'")
    p = n / n.sum()
    squares = np.zeros((len(n), len(arrays[0])), dtype=np.float64)  # [S, arrays]
    for a in range(len(arrays[0])):
        stack = np.stack([np.asarray(client[a], dtype=np.float64).ravel() for client in arrays])  # [S, P_a]
        squares[:, a] = ((stack - p @ stack) ** 2).sum(axis=1)
    d = np.sqrt(squares.sum(axis=1)) if distance == "l2" else np.sqrt(squares).sum(axis=1)
    scale = beta_labeled if bool(np.any(labeled)) else beta
    logits = np.log(p) - scale * d / n + np.where(labeled, np.log(labeled_factor), 0.0)
    alpha = np.exp(logits - logits.max())
    return alpha / alpha.sum(), d


def consensus_weights(
    arrays: Sequence[Sequence[np.ndarray]], sizes: np.ndarray, labeled: np.ndarray, subsets: np.ndarray, *,
    beta: float, beta_labeled: float, labeled_factor: float, distance: str = "l2",
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """omega, each client's weight in the mean of the M sub-consensus models.

    Parameters
    ----------
    arrays : Sequence[Sequence[np.ndarray]]
        Per client of the round (n of them), its model's float arrays in one order.
    sizes, labeled : np.ndarray
        ``[n]`` images n_i and whether the client holds labels.
    subsets : np.ndarray
        int ``[M, K]`` indices into the clients (:func:`draw_subsets`).
    beta, beta_labeled, labeled_factor, distance
        As :func:`subset_weights`.

    Returns
    -------
    (np.ndarray, np.ndarray)
        omega ``[n]`` (sums to 1; 0 for a client in no sub-set) and alpha ``[M, K]``.
    """
    sizes, labeled = np.asarray(sizes, dtype=np.float64), np.asarray(labeled, dtype=bool)
    omega = np.zeros(len(arrays), dtype=np.float64)
    alphas = np.zeros(subsets.shape, dtype=np.float64)
    for m, members in enumerate(subsets):
        alphas[m], _ = subset_weights([arrays[i] for i in members], sizes[members], labeled[members], beta=beta,
                                      beta_labeled=beta_labeled, labeled_factor=labeled_factor, distance=distance)  # fmt: skip
        np.add.at(omega, members, alphas[m] / len(subsets))
    return omega, alphas


class ConsensusAggregation:
    """Mixin for Flower strategies: RSCFed's sub-sampled, distance-reweighted consensus as
    each reply's weight omega_i (module docstring).

    Attributes
    ----------
    seed : int
        The run's seed (the sub-sets' stream).
    subsets, subset_size : int
        M and K.
    beta, beta_labeled, labeled_factor : float
        The distance scales without / with a labeled client in the sub-set, and c.
    distance : str
        ``"l2"`` or ``"layer-sum"``.
    size_key, labeled_key : str
        The reply metrics holding n_i and the client's labeled images.
    """

    seed: ClassVar[int] = 0
    subsets: ClassVar[int] = 3
    subset_size: ClassVar[int] = 5
    beta: ClassVar[float] = 1e4
    beta_labeled: ClassVar[float] = 100.0
    labeled_factor: ClassVar[float] = 6.0
    distance: ClassVar[str] = "l2"
    size_key: ClassVar[str] = wire.NUM_EXAMPLES
    labeled_key: ClassVar[str] = "num-labeled"
    contract: ClassVar[Contract] = Contract(
        Combining.REWEIGHTED, "rscfed weighs each client by its distance to random sub-sets' averages",
        refuses=(Combining.ROBUST_SELECTION,),
    )
    """Reweighted: omega_i depends on every client's model. The robust strategies ignore reply
    weights, so they are refused (:func:`fedul_flwr.strategies.contract.strategy_refusal`)."""

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The strategy's aggregation of the replies in a sub-set, each weighted by omega_i.

        Returns
        -------
        (ArrayRecord | None, MetricRecord | None)
            ``(None, None)`` (the global model stays) when no reply carries a model.
        """
        ok = [r for r in replies if not r.has_error() and len(r.content[wire.ARRAYS])]
        if not ok:
            return None, None
        record = ok[0].content[wire.ARRAYS]
        keys = [k for k in record if np.issubdtype(record[k].numpy().dtype, np.floating)]
        arrays = [[r.content[wire.ARRAYS][k].numpy() for k in keys] for r in ok]
        metrics = [r.content[wire.METRICS] for r in ok]
        sizes = np.array([float(m[self.size_key]) for m in metrics])
        labeled = np.array([float(m.get(self.labeled_key, 0.0)) > 0 for m in metrics])
        chosen = draw_subsets(self.seed, server_round, len(ok), self.subsets, self.subset_size)
        omega, alphas = consensus_weights(arrays, sizes, labeled, chosen, beta=self.beta, beta_labeled=self.beta_labeled,
                                          labeled_factor=self.labeled_factor, distance=self.distance)  # fmt: skip
        log(INFO, "RSCFed round %d: sub-sets %s, weights %s, omega %s", server_round, chosen.tolist(),
            np.round(alphas, 4).tolist(), np.round(omega, 4).tolist())  # fmt: skip
        key = self.weighted_by_key  # type: ignore[attr-defined]
        views = []
        for reply, weight in zip(ok, omega, strict=True):
            if weight <= 0:
                continue  # in no sub-set this round
            content = RecordDict({name: rec for name, rec in reply.content.items()})
            content[wire.METRICS] = MetricRecord({**reply.content[wire.METRICS], key: float(weight)})
            view = copy.copy(reply)
            view.content = content
            views.append(view)
        return super().aggregate_train(server_round, views)  # type: ignore[misc]
