"""The positive-unlabeled client setting (fedul_flwr.data.pu): positive classes per client,
labeled fractions, class priors, and their validation errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedul_flwr.data.pu import assign_positive_classes, class_prior, parse_positive_classes, pu_split

K = 10
ALL = [np.full(K, 100)] * 10  # IID: every client holds every class


def _assign(text: str, clients: int) -> list[tuple[int, ...]]:
    return assign_positive_classes(parse_positive_classes(text, clients, K), ALL[:clients])


@pytest.mark.parametrize(
    ("clients", "division", "overlap"),
    [  # the rows of the paper's Tables 1 and 2 with their overlap marks
        (10, "2", True), (4, "6", True), (2, "9", True), (10, "1", False), (5, "2", False), (2, "5", False),
        (6, "2,3,4,6,7,8", True), (5, "1,2,4,6,7", True), (4, "2,4,6,8", True), (2, "3,7", False),
        (3, "2,3,5", False), (4, "1,2,3,4", False),
    ],
)  # fmt: skip
def test_divisions_cover_every_class_and_overlap_exactly_when_they_sum_past_k(
    clients: int, division: str, overlap: bool
) -> None:
    sets = _assign(division, clients)
    counts = [int(c) for c in division.split(",")] * (clients if "," not in division else 1)
    assert [len(s) for s in sets] == counts[:clients]
    assert set().union(*sets) == set(range(K))
    labeled_twice = sum(len(s) for s in sets) > len(set().union(*sets))
    assert labeled_twice == overlap


def test_explicit_sets_and_what_a_client_cannot_label() -> None:
    spec = parse_positive_classes("0,1,2|3,4,5,6|7,8,9", 3, K)
    assert assign_positive_classes(spec, ALL[:3]) == [(0, 1, 2), (3, 4, 5, 6), (7, 8, 9)]
    holds = [np.full(K, 100), np.full(K, 100), np.array([0] * 7 + [5, 5, 5])]
    with pytest.raises(ValueError, match=r"client 1 holds no image of its positive class\(es\) \[3\]"):
        assign_positive_classes(parse_positive_classes("0,1,2|3,7|4,5,6,8,9", 3, K), [holds[0], holds[2], holds[1]])
    # a division only picks classes the client holds
    sets = assign_positive_classes(parse_positive_classes("7,3", 2, K), [np.full(K, 1), holds[2]])
    assert set(sets[1]) <= {7, 8, 9}


def _holding(*classes: tuple[int, ...]) -> list[np.ndarray]:
    return [np.bincount(np.array(c), minlength=K) * 50 for c in classes]


def test_a_division_the_greedy_walk_cannot_cover_is_repaired_by_a_matching() -> None:
    # the classes held by the 10 clients of MNIST's 2-class shard split (seed 0): walking
    # greedily, client 0 takes class 1 and class 9 is left to nobody
    held = _holding((1, 2, 9), (1, 2, 3), (6, 7, 8), (1, 5), (3, 4, 5), (0, 5, 6), (2, 3), (8, 9), (4, 7), (0, 1, 7))
    sets = assign_positive_classes(parse_positive_classes("1", 10, K), held)
    assert sorted(c for s in sets for c in s) == list(range(K))  # one client per class
    assert all(set(s) <= set(np.flatnonzero(h)) for s, h in zip(sets, held, strict=True))
    # two positive classes each: every class covered, each client labels 2 distinct classes it holds
    sets = assign_positive_classes(parse_positive_classes("2", 10, K), held)
    assert set().union(*sets) == set(range(K)) and all(len(set(s)) == 2 for s in sets)
    assert all(set(s) <= set(np.flatnonzero(h)) for s, h in zip(sets, held, strict=True))
    # no matching exists: classes 8 and 9 are held only by client 9, which labels one class
    held = _holding(*([(0, 1, 2, 3, 4, 5, 6, 7)] * 9), (8, 9))
    with pytest.raises(ValueError, match=r"leaves class\(es\) \[9\] unlabeled"):
        assign_positive_classes(parse_positive_classes("1", 10, K), held)


@pytest.mark.parametrize(
    ("text", "clients", "message"),
    [
        ("2,2", 3, "a division of 2 numbers for 3 clients"),
        ("0", 5, r"counts \[0\] outside"),
        ("11", 2, r"counts \[11\] outside"),
        ("1,1", 2, "sums to 2 < 10 classes"),
        ("0,1|2", 2, r"no client labels class\(es\) \[3, 4, 5, 6, 7, 8, 9\]"),
        ("0,1|1,1,2,3,4,5,6,7,8,9", 2, "must be distinct"),
        ("two", 2, "positive-classes='two'"),
    ],
)
def test_bad_positive_classes_name_the_key_and_value(text: str, clients: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_positive_classes(text, clients, K)


def test_pu_split_labels_the_fraction_of_each_positive_class_and_nothing_else() -> None:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(K), 30)
    indices = rng.permutation(len(labels))[:200] + 1000  # rows of the training set
    client_labels = labels[indices - 1000]
    split = pu_split(indices, client_labels, (2, 5), 0.5, np.random.default_rng([7, 3]))
    lab = {int(i): int(labels[i - 1000]) for i in split.labeled}
    for c in (2, 5):
        held = int((client_labels == c).sum())
        assert sum(v == c for v in lab.values()) == max(1, round(0.5 * held))
    assert set(lab.values()) == {2, 5}  # only positive classes are labeled
    assert np.intersect1d(split.labeled, split.unlabeled).size == 0
    assert np.array_equal(np.sort(np.concatenate([split.labeled, split.unlabeled])), np.sort(indices))
    again = pu_split(indices, client_labels, (2, 5), 0.5, np.random.default_rng([7, 3]))
    assert np.array_equal(again.labeled, split.labeled)  # a pure function of the client's generator
    other = pu_split(indices, client_labels, (2, 5), 0.5, np.random.default_rng([8, 3]))
    assert not np.array_equal(other.labeled, split.labeled)
    with pytest.raises(ValueError, match="pu-labeled-fraction=0 must be in"):
        pu_split(indices, client_labels, (2,), 0, rng)


def test_class_prior_kinds_and_errors() -> None:
    pool = np.repeat(np.arange(K), [10] * 9 + [30])
    unlabeled = np.array([0, 0, 1, 9])
    np.testing.assert_allclose(class_prior("global", K, pool, unlabeled), [10 / 120] * 9 + [30 / 120])
    np.testing.assert_allclose(class_prior("client", K, pool, unlabeled), [0.5, 0.25] + [0.0] * 7 + [0.25])
    np.testing.assert_allclose(class_prior("0.08", K, pool, unlabeled), [0.08] * K)  # misspecified (Table 7)
    with pytest.raises(ValueError, match="3 numbers for 10 classes"):
        class_prior("0.1,0.2,0.7", K, pool, unlabeled)
    with pytest.raises(ValueError, match="entries must be in"):
        class_prior("1.5", K, pool, unlabeled)
    with pytest.raises(ValueError, match="is not 'global', 'client'"):
        class_prior("paper", K, pool, unlabeled)


# --------------------------------------------------------------------------- simulated source
def test_simulated_pu_clients_of_the_embedded_sample() -> None:
    from fedul_flwr.preflight import resolve_config
    from fedul_flwr.data.client_data import MissingPartError
    from fedul_flwr.data.simulated import load_client, load_run_dataset

    cfg = resolve_config({"client-setting": "pu", "positive-classes": "2", "pu-labeled-fraction": 0.5})
    train_y = load_run_dataset(cfg).train_y
    parts = frozenset({"labeled", "unlabeled", "positive-classes", "class-prior"})
    clients = [load_client(cfg, k, 5, parts) for k in range(5)]
    assert [c.positive_classes for c in clients] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]  # 5 x 2, no overlap
    for c in clients:
        assert c.labeled is not None and c.unlabeled is not None and c.class_prior is not None
        assert set(c.labeled.y.tolist()) == set(c.positive_classes)  # only positives are labeled
        held = len(c.labeled) + len(c.unlabeled)
        assert 0.5 * 0.2 * held * 0.8 < len(c.labeled) < 0.5 * 0.2 * held * 1.2  # half of 2 of 10 classes
        np.testing.assert_allclose(c.class_prior, np.bincount(train_y.numpy(), minlength=10) / len(train_y), atol=0.01)
        assert set(c.parts()) == {"labeled", "unlabeled", "positive-classes", "class-prior"}
    again = load_client.__wrapped__(cfg, 3, 5, parts)  # rebuilt, not from the cache: the same split
    assert torch.equal(again.labeled.x, clients[3].labeled.x)
    with pytest.raises(MissingPartError, match="usets"):
        clients[0].require("fedul", ("unlabeled", "usets"))
    wrong = resolve_config({"client-setting": "pu", "positive-classes": "1,1,1,1,1"})
    with pytest.raises(ValueError, match=r"positive-classes='1,1,1,1,1': the division sums to 5 < 10"):
        load_client(wrong, 0, 5, parts)


def test_shards_partition_deals_whole_class_sorted_shards() -> None:
    from fedul_flwr.data.partition import partition_pool

    labels = np.repeat(np.arange(K), 100)  # 1000 images, 100 per class
    parts = partition_pool(labels, 10, K, "shards", 3, shards_per_client=2)  # 20 shards of 50 images
    assert all(len(p) == 100 for p in parts)
    assert len(np.unique(np.concatenate(parts))) == 1000  # disjoint, all dealt
    for p in parts:  # a shard is one class (50 images of a 100-image class): 1 or 2 classes per client
        counts = np.bincount(labels[p], minlength=K)
        assert set(counts[counts > 0].tolist()) <= {50, 100}
    again = partition_pool(labels, 10, K, "shards", 3, shards_per_client=2)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    with pytest.raises(ValueError, match="shards-per-client must be >= 1"):
        partition_pool(labels, 10, K, "shards", 3, shards_per_client=0)


# --------------------------------------------------------------------------- node folders
def test_pu_node_folder_round_trip_and_its_errors(tmp_path) -> None:
    from fedul_flwr.preflight import resolve_config
    from fedul_flwr.data.node_folder.layout import NodeDataError
    from fedul_flwr.data.node_folder.reader import load_node_dir
    from fedul_flwr.data.datasets import run_dataset_info
    from fedul_flwr.node_data_cli import write_nodes

    cfg = resolve_config({"client-setting": "pu", "positive-classes": "10"})  # one node labels every class
    info = run_dataset_info(cfg)
    (node,) = write_nodes(cfg, tmp_path / "nodes", 1, max_set_size=30)
    facts = {"class_names": info.class_names, "image_size": info.image_size, "channels": info.channels,
             "mean": info.mean, "std": info.std}  # fmt: skip
    client = load_node_dir(node, **facts)
    assert set(client.parts()) == {"labeled", "unlabeled", "positive-classes", "class-prior"}
    assert client.positive_classes == tuple(sorted(set(client.labeled.y.tolist())))
    assert client.class_prior.shape == (10,) and abs(client.class_prior.sum() - 1) < 1e-6
    prior = node / "class_prior.csv"
    header = prior.read_text().splitlines()[0]
    for text, message in [
        (header + "\n" + ",".join(["0.1"] * 9) + ",1.5\n", r"line 2, class '9 - nine': 1.5 is outside \[0, 1\]"),
        (header + "\n" + ",".join(["0.1"] * 9) + ",x\n", r"line 2, class '9 - nine': 'x' is not a number"),
        (header + "\n" + ",".join(["0.1"] * 9) + "\n", "line 2: 9 values for 10 classes"),
        ("a,b\n0.5,0.5\n", "line 1: header must be the run's class names"),
        (header + "\n" + ",".join(["0.1"] * 10) + "\n" + ",".join(["0.1"] * 10) + "\n", "needs exactly one row of 10 class priors, found 2"),
    ]:
        prior.write_text(text)
        with pytest.raises(NodeDataError, match=str(prior).replace(".", r"\.") + ": " + message):
            load_node_dir(node, **facts)
