"""The run's random streams (fedul_flwr.rng): one table, no two streams meeting, and no module
deriving a generator outside it."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

import fedul_flwr
from fedul_flwr import rng
from fedul_flwr.rng import STREAMS

PACKAGE = Path(fedul_flwr.__file__).parent

# calls that derive or seed a generator: only fedul_flwr/rng.py makes them, except these
SEEDING_CALLS = {"SeedSequence", "default_rng", "manual_seed", "seed", "Generator", "RandomState", "PCG64", "fork_rng",
                 "set_rng_state", "manual_seed_all", "setstate", "set_state"}  # fmt: skip
EXCEPTIONS = {
    ("privacy/mechanism.py", "Generator"): "DP noise from the OS's entropy (secrets), never from the run seed",
    ("privacy/mechanism.py", "PCG64"): "DP noise from the OS's entropy (secrets), never from the run seed",
    ("experiments/pfl_driver.py", "manual_seed"): "pfl-research's own training draws from torch's global generator, "
                                                  "in the driver's own process",
    ("experiments/pfl_driver.py", "seed"): "pfl-research's own training draws from numpy's global generator, in the "
                                           "driver's own process",
    ("experiments/augment_bench.py", "Generator"): "the augmentation benchmark's fixed inputs, not a run",
    ("experiments/augment_bench.py", "manual_seed"): "the augmentation benchmark's fixed inputs, not a run",
}  # fmt: skip


def test_every_stream_has_its_own_word_and_a_known_layout() -> None:
    words = [s.word for s in STREAMS.values()]
    assert len(set(words)) == len(words)
    assert all(s.layout in ("keyed", "words", "bare") and s.root in ("run", "batch") for s in STREAMS.values())
    bare_lengths = [len(s.coordinates) for s in STREAMS.values() if s.layout == "bare"]
    assert len(set(bare_lengths)) == len(bare_lengths)  # two bare streams never have as many entries


def _instances(seed: int) -> dict[tuple, tuple[int, ...]]:
    """Every stream at a grid of coordinates -> its seed material (SeedSequence's pool)."""
    out: dict[tuple, tuple[int, ...]] = {}
    grid = {"round": range(1, 13), "node": range(0, 26), "partition": range(0, 26), "index": range(0, 6)}
    for name, stream in STREAMS.items():
        if stream.root == "batch":
            continue
        for coords in itertools.product(*(grid[c] for c in stream.coordinates)):
            if name == "batch":
                batch = rng.stream_seed("batch", seed, *coords)
                for child in (n for n, s in STREAMS.items() if s.root == "batch"):
                    out[(child, seed, *coords)] = tuple(rng.seed_sequence(child, batch).generate_state(4))
            out[(name, seed, *coords)] = tuple(rng.seed_sequence(name, seed, *coords).generate_state(4))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2026])
def test_no_two_streams_meet(seed: int) -> None:
    """Over a grid of rounds, nodes, partitions and model indices no two stream instances share
    seed material (numpy pads entropy with zeros: [s, p] is [s, p, 0], which the table's
    layouts keep apart)."""
    instances = _instances(seed)
    seen: dict[tuple[int, ...], tuple] = {}
    for key, state in instances.items():
        assert state not in seen, f"{key} meets {seen[state]}"
        seen[state] = key


def test_the_kept_streams_have_their_former_values() -> None:
    """The batch order, a method's own streams, augmentation and dropout, and the partitioner
    draw what they drew before the table (the formulas of the modules that held them)."""
    s, r, n = 7, 3, 4
    assert rng.stream_seed("batch", s, r, n) == int(np.random.SeedSequence([s, r, n]).generate_state(1)[0])
    torch_words = int(np.random.SeedSequence([s, r, n, 11]).generate_state(1)[0])
    assert torch.equal(torch.rand(5, generator=rng.torch_generator("method-torch", s, r, n)),
                       torch.rand(5, generator=torch.Generator().manual_seed(torch_words)))  # fmt: skip
    assert np.array_equal(rng.numpy_generator("method-numpy", s, r, n).random(5), np.random.default_rng([s, r, n, 12]).random(5))
    batch = rng.stream_seed("batch", s, r, n)
    for name, word in (("augment", 1), ("dropout", 2)):
        assert rng.stream_seed(name, batch) == int(np.random.SeedSequence([batch, word]).generate_state(1)[0])
    assert np.array_equal(rng.numpy_generator("partition", s).permutation(50), np.random.default_rng(s).permutation(50))
    assert rng.model_seed(s, 0) == s


def test_a_stream_refuses_the_wrong_coordinates() -> None:
    with pytest.raises(TypeError, match="round"):
        rng.stream_seed("batch", 0, 1)
    with pytest.raises(KeyError):
        rng.stream_seed("no-such-stream", 0)


def test_a_torch_generator_lives_on_the_given_device() -> None:
    assert rng.torch_generator("dropout", 5, device="cpu").device.type == "cpu"
    if torch.cuda.is_available():
        assert rng.torch_generator("dropout", 5, device="cuda").device.type == "cuda"


def _seeding_calls(path: Path) -> list[tuple[int, str]]:
    calls = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in SEEDING_CALLS:
                calls.append((node.lineno, name))
    return calls


def test_no_module_derives_a_generator_outside_rng() -> None:
    """No SeedSequence, default_rng, manual_seed, random.seed / np.random.seed, Generator(...),
    fork_rng outside fedul_flwr/rng.py, except the listed ones (each with its reason)."""
    found, used = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "rng.py" or "/_project/" in f"/{rel}":
            continue
        for line, name in _seeding_calls(path):
            if (rel, name) in EXCEPTIONS:
                used.add((rel, name))
            else:
                found.append(f"{rel}:{line}: {name}(...)")
    assert not found, "derive these through fedul_flwr.rng:\n" + "\n".join(found)
    assert used == set(EXCEPTIONS), f"exceptions no longer needed: {set(EXCEPTIONS) - used}"


def test_no_module_uses_pythons_random() -> None:
    """Python's process-wide ``random`` is neither imported nor seeded in the package: who
    trains and who evaluates come from the ``participation``, ``cohort`` and
    ``evaluation-cohort`` streams, not from Flower's ``sample_nodes`` draw."""
    users = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if "/_project/" in f"/{rel}":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if "random" in names or (isinstance(node, ast.ImportFrom) and node.module == "random"):
                users.append(f"{rel}:{node.lineno}")
    assert not users, "draw from a stream of fedul_flwr.rng instead:\n" + "\n".join(users)


def test_building_models_and_augmenting_leave_the_global_generators_alone() -> None:
    from fedul_flwr.augment import Augmentation
    from fedul_flwr.models import build_model

    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    build_model("wrn-28-2", 3, 10, 32, seed=1)
    Augmentation("strong", 32, True)(torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.Generator().manual_seed(0))
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.array_equal(np.random.get_state()[1], numpy_state)
