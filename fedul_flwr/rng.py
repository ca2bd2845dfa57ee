"""The run's random streams: every generator of a run is derived here, from (run seed, stream,
coordinates such as the round and the client), never from a process-wide generator.

The streams (:data:`STREAMS`, name -> :class:`Stream`) each carry a fixed integer *word*, unique
in the table, and fixed coordinates. A stream's seed material is a numpy
:class:`~numpy.random.SeedSequence`; its layout (:attr:`Stream.layout`) is one of

``keyed``
    ``SeedSequence(root, spawn_key=(word, *coordinates))``: the word and the coordinates sit in
    the spawn key, after the entropy padded to numpy's pool of four words, so a keyed stream
    meets no other keyed stream (unique words) and no stream of the two forms below (at most
    four entropy words). New streams are keyed.
``words``
    ``SeedSequence([root, *coordinates, word])``: the form the project used before this table,
    kept bit for bit for a client's own streams of a round (their values drive every run).
``bare``
    ``SeedSequence([root, *coordinates])`` without a word, kept bit for bit: the client's batch
    order (``[seed, round, node]``, rounds from 1) and the partitioner (``[seed]``, which is
    Flower Datasets' ``shuffle(seed)``).

numpy's ``SeedSequence`` pads its entropy with zeros to four words, so ``[a, b]`` and
``[a, b, 0]`` are the same seed material: a stream of (seed, partition) in the bare or words
form would meet the batch stream of node 0 (``[seed, round, 0]``). The streams that had that
form (and the others that could meet a client's round: the Poisson draw ``[seed, round, 21]``,
``samples-per-client`` ``[seed, partition, 1]``, the prior noise, the labeled pools
``[seed, 3..5]``, the validation hold-out, the models other than the first, the node-kept
models ``[seed, index, node]``, which met the batch stream where index = round, and the
supervised label subset, which reused the first model's seed) are keyed since this table;
``tests/test_rng.py`` checks that no two streams meet over a grid of seeds, rounds, nodes and
partitions.

The root is the run's ``seed`` (below 2**32), except for the streams whose root is ``batch``
(a client's batch seed of the round, itself drawn from the ``batch`` stream): parts of a
client's round (they could meet a stream of the run only where a batch seed, a 32-bit hash,
equals the run seed). The first model's weights use the run seed itself as torch's seed.

Generators: :func:`torch_generator` (CPU or the given device), :func:`numpy_generator`,
:func:`stream_seed` (an int, for a seed handed on); :func:`torch_from_seed` and
:func:`numpy_from_seed` turn a seed already drawn from a stream into a generator (a
per-batch augmentation seed, a partitioner's ``seed`` argument). :func:`model_seed` is the seed
of a method's model number i.

Library code that would draw from torch's global generator is given a generator instead:
the ``torch.nn`` initialisers (:func:`init_parameters`, the layers' default
``reset_parameters`` with an explicit generator) and Kornia's flip and erasing
(:mod:`fedul_flwr.augment` draws their parameters). Nothing here seeds or reads ``random``,
numpy's global generator or torch's default generator, and neither does the server: who trains
and who evaluates in a round come from the ``participation``, ``cohort`` and
``evaluation-cohort`` streams (:mod:`fedul_flwr.strategies.participation`), never from the
global ``random`` that Flower's own node sampling draws from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import torch
from torch import nn

__all__ = [
    "STREAMS", "Stream", "init_parameters", "model_seed", "numpy_from_seed", "numpy_generator", "seed_sequence",
    "stream_seed", "torch_from_seed", "torch_generator",
]  # fmt: skip


@dataclass(frozen=True)
class Stream:
    """One random stream of a run.

    Attributes
    ----------
    word : int
        Its fixed word, unique in :data:`STREAMS`.
    coordinates : tuple[str, ...]
        What the stream is drawn per, after the root (e.g. ``("round", "node")``).
    layout : str
        ``keyed``, ``words`` or ``bare`` (module docstring).
    root : str
        ``run`` (the run's seed) or ``batch`` (a client's batch seed of a round).
    meaning : str
        What draws from it.
    """

    word: int
    coordinates: tuple[str, ...]
    layout: str
    root: str
    meaning: str


_S = Stream
STREAMS: Mapping[str, Stream] = MappingProxyType({
    # a client's round: (run seed, round, node key)
    "batch": _S(10, ("round", "node"), "bare", "run", "batch order of a client's round; the root of augment and dropout"),
    "method-torch": _S(11, ("round", "node"), "words", "run", "a method's own torch draws (mixup partners, VAT noise): RoundContext.generator"),
    "method-numpy": _S(12, ("round", "node"), "words", "run", "a method's own numpy draws (a Beta mixing weight): RoundContext.rng"),
    # parts of a client's round: (the round's batch seed)
    "augment": _S(1, (), "words", "batch", "the round's augmentations (one draw per batch seeds its views)"),
    "dropout": _S(2, (), "words", "batch", "dropout masks of the round (on the training device)"),
    # the server
    "participation": _S(21, ("round",), "keyed", "run", "the seeded Poisson draw of who trains in a round"),
    "cohort": _S(22, ("round",), "keyed", "run", "the seeded fixed-size draw of who trains in a round"),
    "evaluation-cohort": _S(23, ("round",), "keyed", "run", "the fixed-size draw of who evaluates in a round"),
    "server-batch": _S(24, ("round",), "keyed", "run", "labels-at-server: batch order of the server's training after a round"),
    "server-method-torch": _S(25, ("round",), "keyed", "run", "labels-at-server: a method's own torch draws in the server's training"),
    "server-method-numpy": _S(26, ("round",), "keyed", "run", "labels-at-server: a method's own numpy draws in the server's training"),
    "consensus": _S(61, ("round",), "keyed", "run", "rscfed: the random sub-sets of a round's replies (the server)"),
    "fedmatch-probe": _S(71, (), "keyed", "run", "fedmatch: the fixed random input the server embeds client models with (the helpers' choice)"),
    "fedrgd-groups": _S(63, ("round",), "keyed", "run", "fedrgd: the random groups of a round's replies (the server)"),
    "model": _S(31, ("index",), "keyed", "run", "initial weights of the exchanged model number index >= 1 (index 0: the run seed)"),
    "node-model": _S(32, ("index", "node"), "keyed", "run", "initial weights of a model kept on a node (never exchanged)"),
    # the simulated data: (run seed[, partition id])
    "partition": _S(40, (), "bare", "run", "the partitioner's draw: Flower Datasets' shuffle(seed), the non-IID owners"),
    "client-data": _S(41, ("partition",), "keyed", "run", "a client's own data draws: its U sets, its local test split"),
    "subsample": _S(43, ("partition",), "keyed", "run", "samples-per-client: which images a client keeps"),
    "prior-noise": _S(44, ("partition",), "keyed", "run", "prior-noise: the noise of a client's class priors"),
    "labeled-pool": _S(45, (), "keyed", "run", "labels-at-clients: the class-balanced labeled pool"),
    "labeled-partition": _S(46, (), "keyed", "run", "labels-at-clients: the labeled pool's partition"),
    "unlabeled-partition": _S(47, (), "keyed", "run", "labels-at-clients: the unlabeled pool's partition"),
    "validation": _S(48, (), "keyed", "run", "the labeled validation hold-out (val-fraction)"),
    "label-subset": _S(51, (), "keyed", "run", "supervised: the labeled subset of label-fraction"),
    "node-folder": _S(52, ("partition",), "keyed", "run", "fedul node-data: the random images a node folder keeps (max size)"),
})  # fmt: skip
"""Every stream of a run, by name (module docstring)."""


def _check(name: str, coordinates: tuple[int, ...]) -> Stream:
    stream = STREAMS[name]
    if len(coordinates) != len(stream.coordinates):
        raise TypeError(f"stream {name!r} is drawn per {stream.coordinates}, got {len(coordinates)} coordinate(s)")
    return stream


def seed_sequence(name: str, root: int, *coordinates: int) -> np.random.SeedSequence:
    """The seed material of stream ``name`` at ``coordinates``.

    Parameters
    ----------
    name : str
        A key of :data:`STREAMS`.
    root : int
        The run's seed, or for the streams of root ``batch`` the client's batch seed.
    *coordinates : int
        One int per :attr:`Stream.coordinates` (e.g. round, node key).

    Raises
    ------
    KeyError
        On an unknown stream.
    TypeError
        On the wrong number of coordinates.
    """
    stream = _check(name, coordinates)
    words = [int(root), *(int(c) for c in coordinates)]
    if stream.layout == "keyed":
        return np.random.SeedSequence(int(root), spawn_key=(stream.word, *(int(c) for c in coordinates)))
    return np.random.SeedSequence(words if stream.layout == "bare" else [*words, stream.word])


def stream_seed(name: str, root: int, *coordinates: int) -> int:
    """A 32-bit int seed of stream ``name`` (:func:`seed_sequence`'s first word): for a seed that
    is handed on (a training loop's batch seed, a model's initial weights)."""
    return int(seed_sequence(name, root, *coordinates).generate_state(1)[0])


def numpy_generator(name: str, root: int, *coordinates: int) -> np.random.Generator:
    """numpy's PCG64 generator of stream ``name`` (:func:`seed_sequence`)."""
    return np.random.Generator(np.random.PCG64(seed_sequence(name, root, *coordinates)))


def torch_generator(name: str, root: int, *coordinates: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator on ``device`` seeded with :func:`stream_seed` of stream ``name``."""
    return torch_from_seed(stream_seed(name, root, *coordinates), device)


def torch_from_seed(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator on ``device`` seeded with ``seed``, a seed already drawn from a stream
    (e.g. an augmentation's per-batch seed, a model's :func:`model_seed`)."""
    return torch.Generator(device=device).manual_seed(int(seed))


def numpy_from_seed(seed: int | list[int]) -> np.random.Generator:
    """numpy's PCG64 generator of ``seed``, a seed already drawn from a stream (a partitioner's
    ``seed`` argument: ``default_rng(seed)``, as Flower Datasets' ``shuffle(seed)``)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))


def model_seed(seed: int, index: int, node_key: int | None = None) -> int:
    """Seed of the initial weights of a method's model number ``index``.

    The server's exchanged models: the first is seeded by the run seed itself, the others by
    the ``model`` stream at ``index``. A model kept on a node (never exchanged): the
    ``node-model`` stream at (``index``, ``node_key``).
    """
    if node_key is not None:
        return stream_seed("node-model", seed, index, node_key)
    return int(seed) if index == 0 else stream_seed("model", seed, index)


# --------------------------------------------------------------------------- initial weights


def _fan_in(weight: torch.Tensor) -> int:
    return nn.init._calculate_fan_in_and_fan_out(weight)[0]


def _default_reset(module: nn.Module, generator: torch.Generator) -> bool:
    """``module.reset_parameters()`` of torch 2.x with ``generator``; False where the module
    type has none here. Linear and Conv: Kaiming-uniform weight (a = sqrt 5), bias uniform in
    +-1/sqrt(fan_in); the norms and parameter-free layers draw nothing."""
    if isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)):
        nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=generator)
        if module.bias is not None:
            fan_in = _fan_in(module.weight)
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            nn.init.uniform_(module.bias, -bound, bound, generator=generator)
        return True
    if isinstance(module, (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)):
        module.reset_parameters()  # ones, zeros and the running statistics: no draw
        return True
    return not any(True for _ in module.parameters(recurse=False)) and not any(True for _ in module.buffers(recurse=False))


def init_parameters(model: nn.Module, generator: torch.Generator) -> nn.Module:
    """Give every layer of ``model`` torch's default initial values, drawn from ``generator``.

    Walks ``model.modules()`` (the order the layers were built in) and runs each layer's
    default ``reset_parameters`` with ``generator``: the same values, bit for bit, as building
    the model while torch's global CPU generator is seeded as ``generator`` (both are mt19937,
    and the draws come in the same order). A model that re-initialises some layers
    afterwards does so itself, also from ``generator``.

    Parameters
    ----------
    model : nn.Module
        Linear, Conv, BatchNorm/GroupNorm/LayerNorm and parameter-free layers.
    generator : torch.Generator
        CPU generator the values are drawn from.

    Returns
    -------
    nn.Module
        ``model``, initialised in place.

    Raises
    ------
    TypeError
        On a layer with parameters of a type whose default initialisation is not written here.
    """
    for module in model.modules():
        if not _default_reset(module, generator) and type(module).__module__.startswith("torch.nn"):
            raise TypeError(f"init_parameters: no default initialisation for {type(module).__name__}")
    return model
