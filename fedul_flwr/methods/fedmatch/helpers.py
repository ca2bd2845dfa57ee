"""FedMatch's server side: per-model aggregation of sigma and psi, theta = sigma + psi for the
next round, and each client's helpers (inter-client consistency; Jeong et al., ICLR 2021,
Sec. 3.2).

**Helpers.** After every round the server embeds each client model it received: the softmax
output ``[K]`` of theta_c = sigma_c + psi_c (the client's sigma under labels-at-clients, the
round's global sigma when the client sends psi alone) on one fixed random input, a truncated
Gaussian image (pixel mean 125, sd 125, cut to [0, 255], as the authors' code's ``rgauss``;
drawn once per run from the ``fedmatch-probe`` stream of :mod:`fedul_flwr.rng`). It keeps the
newest psi and embedding of every client it has heard from, by the client's stable node key
(partition id in simulation, a hash of the data folder in deployment; the reply's
``node-key``), since node ids change when a run is resumed or a SuperNode restarts. In a round
t with t % I == 0 (``fedmatch-helper-interval`` I; the code's h_interval), a client with an
embedding gets the psi of the H clients whose embeddings are nearest its own in Euclidean
distance (ties: the smaller node key), as the code's KD-tree query does (an exact
nearest-neighbour search gives the same neighbours; here a brute-force one over at most the
federation's nodes); a client the server has not heard from yet gets none.

**Resume.** The kept psi and embeddings are part of the run's checkpoint (the mixin's
``checkpoint_attributes``, :func:`fedul_flwr.checkpoint.strategy_state`), so a resumed run
chooses and sends the helpers an uninterrupted one does. The node ids of a resumed run are new:
in a round with helpers due, a sampled node whose key the server has not learnt from a reply of
this run is asked for it with one query message
(:func:`~fedul_flwr.strategies.kept_state.ask_node_keys`). A checkpoint written before the
helper state was saved still loads; that run then has helpers again once its clients have sent
psi (one log line says so).

**Wire.** Helpers are per client, so each train message carries its own: the H helper models
are exchanged models of the method (``helper1`` ... ``helperH``, never trained, never sent
back); :meth:`FedMatchAggregation.configure_train` puts the chosen clients' psi in their place
in each client's ``"arrays"`` record and the number it put (``fedmatch-helpers-sent``, 0..H) in
that message's config, read by the client from ``RoundContext.broadcast``. This is the lighter
of the two choices: H extra models per message, where sending every candidate to every client
would cost N. The global arrays keep the helpers' initial weights (placeholders nobody reads).

**Aggregation.** sigma is averaged over the clients that sent it weighted by their labeled
images n_L, psi over those that sent it weighted by their unlabeled images n_U, each by the
run's strategy (:class:`~fedul_flwr.strategies.per_model.PerModelAggregation`); then theta =
sigma + psi (psi's entries at or below ``fedmatch-sparsity-threshold`` left out, the code's
inference-time cut) replaces the ``theta`` model, which the predictors evaluate. Under
labels-at-server the server trains sigma afterwards and sets theta again
(:meth:`~fedul_flwr.methods.fedmatch.fedmatch.FedMatch.server_update`).

**Privacy.** The replies are partial (sigma and psi weighted by different counts, the helpers
never sent back) and each client's psi goes on to other clients as it came: server-side DP
covers neither, so the contract admits ``none`` and ``client-local`` only (under client-local
DP a forwarded psi is a noised reply: post-processing). The checkpoint holds the kept psi as
they came (the run folder is the server's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from logging import INFO
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from torch import nn

from fedul_flwr import wire
from fedul_flwr.config import RunConfig
from fedul_flwr.data.datasets import run_dataset_info
from fedul_flwr.methods.fedmatch.losses import theta_state
from fedul_flwr.models import build_model
from fedul_flwr.rng import numpy_generator
from fedul_flwr.strategies.contract import Combining, Contract
from fedul_flwr.strategies.kept_state import ask_node_keys
from fedul_flwr.strategies.per_model import PerModelAggregation

__all__ = ["HELPERS_SENT", "NUM_LABELED", "NUM_UNLABELED", "FedMatchAggregation", "choose_helpers", "helper_name",
           "probe_image"]  # fmt: skip

NUM_LABELED, NUM_UNLABELED = "num-labeled", "num-unlabeled"
HELPERS_SENT = "fedmatch-helpers-sent"
"""Train-config key of one message: how many helper models it carries (0..H)."""
PROBE_MEAN, PROBE_STD = 125.0, 125.0
"""The random input's pixel distribution before the cut to [0, 255] (the authors' code)."""


def helper_name(j: int) -> str:
    """The model name of helper j (from 1)."""
    return f"helper{j}"


def probe_image(seed: int, channels: int, size: int, mean: Iterable[float], std: Iterable[float]) -> torch.Tensor:
    """The fixed random input ``[1, C, H, W]`` float32, as a model input: pixels from a
    Gaussian (125, 125) truncated to [0, 255] (inverse-CDF sampling), scaled to [0, 1] and
    standardised with the dataset's per-channel ``mean`` and ``std``; drawn from the
    ``fedmatch-probe`` stream of ``seed``."""
    rng = numpy_generator("fedmatch-probe", seed)
    lo, hi = (0.0 - PROBE_MEAN) / PROBE_STD, (255.0 - PROBE_MEAN) / PROBE_STD
    cdf = torch.special.ndtr(torch.tensor([lo, hi], dtype=torch.float64))
    u = torch.from_numpy(rng.uniform(float(cdf[0]), float(cdf[1]), size=(1, channels, size, size)))
    pixels = (PROBE_MEAN + PROBE_STD * torch.special.ndtri(u)).clamp(0.0, 255.0) / 255.0
    m = torch.tensor(list(mean), dtype=torch.float64).view(1, -1, 1, 1)
    s = torch.tensor(list(std), dtype=torch.float64).view(1, -1, 1, 1)
    return ((pixels - m) / s).float()


def choose_helpers(embeddings: Mapping[int, torch.Tensor], node: int, h: int) -> list[int]:
    """The H nodes other than ``node`` whose embeddings are nearest ``node``'s (Euclidean),
    nearest first, ties to the smaller node key; fewer if fewer others are known, none if
    ``node`` has no embedding.

    Parameters
    ----------
    embeddings : Mapping[int, torch.Tensor]
        Node key -> ``[K]`` embedding.
    node : int
        The key of the client being served.
    h : int
        H >= 0.

    Returns
    -------
    list[int]
        The helpers' node keys.
    """
    if node not in embeddings or h <= 0:
        return []
    others = sorted(n for n in embeddings if n != node)
    if not others:
        return []
    distances = torch.stack([embeddings[n] for n in others]).sub(embeddings[node]).norm(dim=1)
    ranked = sorted(zip(distances.tolist(), others))
    return [n for _, n in ranked[:h]]


def _tensors(arrays: ArrayRecord, model: str) -> dict[str, torch.Tensor]:
    """``model``'s arrays of ``arrays`` as float64 tensors, keyed by parameter."""
    prefix = wire.model_prefix(model)
    with wire.decoding():
        return {k[len(prefix):]: torch.from_numpy(np.asarray(arrays[k].numpy(), dtype=np.float64))
                for k in arrays.keys() if k.startswith(prefix)}  # fmt: skip


class FedMatchAggregation(PerModelAggregation):
    """sigma by n_L, psi by n_U, theta = sigma + psi, and per-client helpers (module doc).

    Built for one run by :meth:`FedMatch.aggregation`, which sets :attr:`run_config`,
    :attr:`helpers` and :attr:`helper_interval`.

    Attributes
    ----------
    helper_psi : dict[str, ArrayRecord]
        Node key (as a string) -> the client's newest psi (its ``psi.*`` arrays as it sent them).
    helper_embeddings : dict[str, np.ndarray]
        Node key (as a string) -> the ``[K]`` float32 embedding of the client's newest theta.
    """

    model_weight_keys = {"sigma": NUM_LABELED, "psi": NUM_UNLABELED}
    contract = Contract(Combining.PARTIAL_REPLIES, "fedmatch's clients send sigma weighted by n_L and psi weighted "
                        "by n_U, and the server forwards each client's psi unnoised to other clients as a helper")  # fmt: skip
    checkpoint_attributes = ("helper_psi", "helper_embeddings")
    """The helper state the run's checkpoint holds (:func:`fedul_flwr.checkpoint.strategy_state`)."""
    run_config: ClassVar[RunConfig | None] = None
    helpers: ClassVar[int] = 0
    helper_interval: ClassVar[int] = 1
    threshold: ClassVar[float] = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.helper_psi: dict[str, ArrayRecord] = {}
        self.helper_embeddings: dict[str, np.ndarray] = {}
        self._node_keys: dict[int, int] = {}  # node id -> node key, learnt in this run (never checkpointed)
        self._resume_checked = False

    # ------------------------------------------------------------------ the run's architecture
    def _architecture(self) -> tuple[nn.Module, set[str], torch.Tensor]:
        """(a module of the run's model, its parameter names, the probe input), built once."""
        built = getattr(self, "_built", None)
        if built is None:
            cfg = self.run_config
            if cfg is None:
                raise RuntimeError("FedMatchAggregation needs its run_config (FedMatch.aggregation sets it)")
            info = run_dataset_info(cfg.as_dict())
            # its weights are replaced by each reply's before use; seeded, so torch's global generator is untouched
            module = build_model(cfg.model, info.channels, len(info.class_names), info.image_size,
                                 seed=cfg.seed).double().eval()
            probe = probe_image(cfg.seed, info.channels, info.image_size, info.mean, info.std).double()
            built = self._built = (module, {k for k, _ in module.named_parameters()}, probe)
        return built

    # ------------------------------------------------------------------ theta
    def _with_theta(self, arrays: ArrayRecord) -> ArrayRecord:
        """``arrays`` with ``theta`` set to sigma + psi (psi cut at the threshold)."""
        if not any(wire.model_of(k) == "theta" for k in arrays.keys()):
            return arrays
        _, parameters, _ = self._architecture()
        theta = theta_state(_tensors(arrays, "sigma"), _tensors(arrays, "psi"), parameters, self.threshold)
        prefix = wire.model_prefix("theta")
        out: dict[str, Array] = {}
        for k in arrays.keys():
            if k.startswith(prefix):
                dtype = arrays[k].numpy().dtype
                out[k] = Array(np.ascontiguousarray(theta[k[len(prefix):]].numpy().astype(dtype, copy=False)))
            else:
                out[k] = arrays[k]
        return ArrayRecord(out)

    # ------------------------------------------------------------------ helpers
    def _remember(self, replies: list[Message]) -> None:
        """Keep each psi sent this round and its client's embedding, by node key (module doc)."""
        module, parameters, probe = self._architecture()
        global_sigma = _tensors(self.global_arrays, "sigma")
        for reply in replies:
            if reply.has_error() or wire.NODE_RECORD not in reply.content.config_records:
                continue
            key = int(reply.content[wire.NODE_RECORD][wire.NODE_KEY])
            self._node_keys[reply.metadata.src_node_id] = key
            arrays = reply.content[wire.ARRAYS]
            psi_keys = [k for k in arrays.keys() if wire.model_of(k) == "psi"]
            if not psi_keys:
                continue
            sigma = _tensors(arrays, "sigma") or global_sigma
            theta = theta_state(sigma, _tensors(arrays, "psi"), parameters)
            module.load_state_dict(theta)
            with torch.no_grad():
                embedding = torch.softmax(module(probe), dim=1)[0].float()
            self.helper_psi[str(key)] = ArrayRecord({k: arrays[k] for k in psi_keys})
            self.helper_embeddings[str(key)] = embedding.numpy()

    def _learn_keys(self, grid: Grid, nodes: list[int], config: ConfigRecord) -> None:
        """Ask the sampled nodes whose key this run has not learnt for it, while helper state of
        clients not matched to a node id is held (the first round with helpers after a resume)."""
        unknown = [n for n in nodes if n not in self._node_keys]
        if unknown and set(self.helper_embeddings) - {str(k) for k in self._node_keys.values()}:
            self._node_keys.update(ask_node_keys(grid, unknown, config, "fedmatch helpers"))

    def helpers_of(self, node: int) -> list[int]:
        """The node keys whose psi the node with id ``node`` gets as helpers now
        (:func:`choose_helpers` over the kept embeddings); none while its key is unknown."""
        key = self._node_keys.get(node)
        if key is None:
            return []
        embeddings = {int(k): torch.from_numpy(v) for k, v in self.helper_embeddings.items()}
        return choose_helpers(embeddings, key, self.helpers)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Any:
        """The strategy's train messages, each with its client's helpers in place of the helper
        models and their number in its config (every ``fedmatch-helper-interval``-th round;
        0 otherwise)."""
        messages = list(super().configure_train(server_round, arrays, config, grid))
        if not self.helpers:
            return messages
        if not self._resume_checked:
            self._resume_checked = True
            resumed_after = int(getattr(self, "round_offset", 0))  # ResumedRounds: the checkpoint's round
            if resumed_after and not self.helper_embeddings:
                log(INFO, "fedmatch: the checkpoint of round %d holds no helper state (written before it was saved, or "
                    "no client had sent psi): clients get helpers again once they have sent psi", resumed_after)  # fmt: skip
        due = server_round % self.helper_interval == 0
        if due:
            self._learn_keys(grid, [m.metadata.dst_node_id for m in messages], config)
        for msg in messages:
            chosen = self.helpers_of(msg.metadata.dst_node_id) if due else []
            content = msg.content
            sent = content[wire.ARRAYS]
            if chosen:
                swap: dict[str, Array] = {}
                for j, key in enumerate(chosen, start=1):
                    prefix, target = wire.model_prefix("psi"), wire.model_prefix(helper_name(j))
                    kept = self.helper_psi[str(key)]
                    swap.update({target + k[len(prefix):]: kept[k] for k in kept.keys()})
                sent = ArrayRecord({k: swap.get(k, sent[k]) for k in sent.keys()})
            records = RecordDict({name: record for name, record in content.items()})
            records[wire.ARRAYS] = sent
            records[wire.CONFIG] = ConfigRecord({**dict(content[wire.CONFIG]), HELPERS_SENT: len(chosen)})
            msg.content = records
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Remember the round's psi and embeddings (with helpers), aggregate each model
        (:class:`PerModelAggregation`), then set theta."""
        replies = list(replies)
        if self.helpers and getattr(self, "global_arrays", None) is not None:
            self._remember(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None:
            return arrays, metrics
        return self._with_theta(arrays), metrics

