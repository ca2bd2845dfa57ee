"""The positive-unlabeled (PU) client setting of FedPU (Lin et al., ICML 2022, Sec. 3.1).

    dataset -> partition -> **the client's setting (PU)** -> ClientData -> method

Client k labels only its *positive classes* CP_k, and of those only a fraction of the images
(paper: 1/2; Table 6: 1/3, 1/2, 2/3); everything else on the client -- the rest of its
positive-class images and all images of its negative classes C \\ CP_k -- is its unlabeled
set U_k. The union of the CP_k covers every class. Class priors pi are known.

Choices the paper leaves open, made here:

- **Which classes are positive.** The paper gives the number of positive classes per client
  (a *division*, e.g. ``[2,3,4,6,7,8]``) and whether the sets overlap, not the classes.
  Here client k takes the next d_k classes in a fixed cyclic order of the classes it holds
  (its most frequent first), continuing where client k-1 stopped, so the sets cover all
  classes as soon as the division sums to at least K, and they overlap exactly when it sums
  to more than K -- which reproduces the paper's overlap marks for every row of Tables 1
  and 2. A client only labels classes it holds images of. Where that greedy walk leaves a
  class unlabeled (non-IID shards: a client holds only 2-3 classes), the sets are repaired by
  a bipartite matching of classes to clients (each class to one client that holds it, at most
  d_k classes per client), kept closest to the greedy picks; only if no matching covers every
  class is it an error. An explicit list per client can be given instead.
- **Which images are labeled.** A uniformly random ``labeled_fraction`` of each positive
  class on the client (rounded to the nearest image, at least one), drawn from the client's
  generator.
- **The class prior pi.** ``global``: the class proportions of the whole training pool
  (the paper's pi, ~0.1 per class on MNIST); ``client``: the class proportions within the
  client's unlabeled set (the authors' code, ``priorlist``); or a value given by the user
  (one number for every class, or K numbers: a misspecified prior, Table 7).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedul_flwr.data.partition import named_classes

__all__ = ["PUSplit", "assign_positive_classes", "class_prior", "parse_positive_classes", "pu_split"]


@dataclass(frozen=True)
class PositiveSpec:
    """Parsed ``positive-classes`` value: a division (numbers per client) or explicit sets."""

    division: tuple[int, ...] | None = None
    explicit: tuple[tuple[int, ...], ...] | None = None


def parse_positive_classes(text: str, num_clients: int | None, num_classes: int, key: str = "positive-classes",
                           class_names: Sequence[str] | None = None) -> PositiveSpec:  # fmt: skip
    """Parse the ``positive-classes`` setting.

    Forms: ``"2"`` (every client has 2 positive classes), ``"2,3,4,6,7,8"`` (the division:
    client k has d_k, one number per client), ``"0,1|2,3|4"`` (the explicit classes of each
    client, ``|`` between clients). ``num_clients=None`` (a federation of unknown size, as
    ``fedul check`` without ``num-supernodes``) checks the form and the classes alone.

    Raises
    ------
    ValueError
        On a malformed value, a count outside [1, K], a class outside [0, K), a division or
        list whose length is not the number of clients, or explicit sets that do not cover
        every class (the message names ``key`` and the value; classes by ``class_names``
        where given).
    """
    text = str(text).strip().strip("[]")
    try:
        if "|" in text:
            sets = tuple(_whole_numbers(part) for part in text.split("|"))
            if num_clients is not None and len(sets) != num_clients:
                raise ValueError(f"{len(sets)} sets for {num_clients} clients")
            for k, classes in enumerate(sets):
                bad = [c for c in classes if not 0 <= c < num_classes]
                if bad or not classes or len(set(classes)) != len(classes):
                    raise ValueError(f"client {k}: classes {list(classes)} must be distinct, in [0, {num_classes})")
            missing = sorted(set(range(num_classes)) - {c for s in sets for c in s})
            if missing:
                raise ValueError(f"no client labels class(es) {named_classes(missing, class_names)}: the positive sets must cover every class")
            return PositiveSpec(explicit=sets)
        counts = _whole_numbers(text)
        if not counts:
            raise ValueError("no count given")
        if len(counts) == 1 and num_clients is not None:
            counts = counts * num_clients
        if num_clients is not None and len(counts) != num_clients:
            raise ValueError(f"a division of {len(counts)} numbers for {num_clients} clients")
        bad = sorted({c for c in counts if not 1 <= c <= num_classes})
        if bad:
            raise ValueError(f"counts {bad} outside [1, {num_classes}]")
        if sum(counts) < num_classes and (num_clients is not None or len(counts) > 1):
            raise ValueError(f"the division sums to {sum(counts)} < {num_classes} classes: some class is never labeled")
        return PositiveSpec(division=counts)
    except ValueError as exc:
        raise ValueError(f"{key}={text!r}: {exc}") from None


def _whole_numbers(text: str) -> tuple[int, ...]:
    """``"2,3"`` -> ``(2, 3)``; a token that is not a whole number raises ``ValueError`` naming it."""
    tokens = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in tokens if not t.lstrip("+-").isdecimal()]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a whole number; give a count ('2'), one count per client ('2,3,4') "
                         "or each client's classes ('0,1|2,3')")
    return tuple(int(t) for t in tokens)


def assign_positive_classes(spec: PositiveSpec, class_counts: Sequence[np.ndarray],
                            class_names: Sequence[str] | None = None) -> list[tuple[int, ...]]:  # fmt: skip
    """The positive classes CP_k of every client.

    Parameters
    ----------
    spec : PositiveSpec
        From :func:`parse_positive_classes`.
    class_counts : Sequence[np.ndarray]
        Per client, int ``[K]``: how many images of each class it holds.
    class_names : sequence of str, optional
        The K class names, for the messages.

    Returns
    -------
    list[tuple[int, ...]]
        Sorted class indices per client.

    Raises
    ------
    ValueError
        If a client is asked to label a class it holds no image of (explicit sets), holds
        fewer classes than its count, or the assignment leaves a class unlabeled (names the
        client, the class and the counts).
    """
    num_classes = len(class_counts[0])
    if spec.explicit is not None:
        for k, classes in enumerate(spec.explicit):
            absent = [c for c in classes if class_counts[k][c] == 0]
            if absent:
                raise ValueError(f"positive-classes: client {k} holds no image of its positive class(es) {named_classes(absent, class_names)}")
        return [tuple(sorted(s)) for s in spec.explicit]
    assert spec.division is not None
    covered = np.zeros(num_classes, dtype=int)
    out: list[tuple[int, ...]] = []
    cursor = 0  # where the cyclic order continues
    for k, count in enumerate(spec.division):
        held = [c for c in range(num_classes) if class_counts[k][c] > 0]
        if len(held) < count:
            raise ValueError(f"positive-classes: client {k} holds {len(held)} classes, fewer than its {count} positive classes")
        # cyclic order from the cursor, restricted to the classes this client holds; classes
        # no client labels yet come first, so the union covers all classes when it can
        order = [(cursor + j) % num_classes for j in range(num_classes)]
        order = [c for c in order if c in held]
        order.sort(key=lambda c: covered[c] > 0)  # stable: keeps the cyclic order within each group
        chosen = tuple(sorted(order[:count]))
        covered[list(chosen)] += 1
        cursor = (max(order[:count], key=lambda c: (c - cursor) % num_classes) + 1) % num_classes
        out.append(chosen)
    if np.all(covered > 0):
        return out
    held = [np.flatnonzero(counts > 0) for counts in class_counts]
    cover = _cover_every_class(spec.division, held, out)
    missing = [c for c in range(num_classes) if c not in cover]
    if missing:
        raise ValueError(
            f"positive-classes: division {list(spec.division)} leaves class(es) {named_classes(missing, class_names)} unlabeled on these clients "
            "(a client can only label classes it holds)"
        )
    repaired = []
    for k, count in enumerate(spec.division):  # the matched classes, then the greedy picks, then the rest held
        classes = [c for c, owner in cover.items() if owner == k]
        classes += [c for c in dict.fromkeys((*out[k], *map(int, held[k]))) if c not in classes][: count - len(classes)]
        repaired.append(tuple(sorted(int(c) for c in classes)))
    return repaired


def _cover_every_class(division: Sequence[int], held: Sequence[np.ndarray], preferred: Sequence[tuple[int, ...]]) -> dict[int, int]:
    """Class -> the client that labels it, one client per class, at most ``division[k]``
    classes per client and only classes it holds: a maximum bipartite matching by augmenting
    paths (Kuhn), trying first the clients whose greedy pick had the class. Classes no
    matching can cover are left out."""
    owner: dict[int, int] = {}
    load = [0] * len(division)

    def place(c: int, visited: set[int]) -> bool:
        clients = sorted((k for k, h in enumerate(held) if c in h), key=lambda k: c not in preferred[k])
        for k in clients:
            if k in visited:
                continue
            visited.add(k)
            if load[k] < division[k]:
                owner[c], load[k] = k, load[k] + 1
                return True
            for other in [o for o, kk in owner.items() if kk == k]:  # free a slot of k by moving one of its classes
                if place(other, visited):
                    owner[c] = k
                    return True
        return False

    for c in sorted({int(c) for h in held for c in h}):
        place(c, set())
    return owner


@dataclass(frozen=True)
class PUSplit:
    """Row indices of one client's PU split (into the dataset's training set).

    Attributes
    ----------
    labeled : np.ndarray
        int64 ``[n_P]``: labeled images of the positive classes (sorted).
    unlabeled : np.ndarray
        int64 ``[n_U]``: every other image of the client (sorted).
    positive_classes : tuple[int, ...]
        CP_k.
    """

    labeled: np.ndarray
    unlabeled: np.ndarray
    positive_classes: tuple[int, ...]


def pu_split(
    indices: np.ndarray, labels: np.ndarray, positive_classes: Sequence[int], labeled_fraction: float,
    rng: np.random.Generator, class_names: Sequence[str] | None = None,
) -> PUSplit:  # fmt: skip
    """Split one client's images into labeled positives and the unlabeled rest.

    Parameters
    ----------
    indices : np.ndarray
        int ``[n]``: the client's rows of the training set.
    labels : np.ndarray
        int ``[n]``: their true classes (used to build the split, then dropped for U).
    positive_classes : Sequence[int]
        CP_k.
    labeled_fraction : float
        Share of each positive class that is labeled, in (0, 1].
    rng : np.random.Generator
        The client's generator.
    class_names : sequence of str, optional
        The K class names, for the messages.

    Raises
    ------
    ValueError
        If ``labeled_fraction`` is not in (0, 1] or a positive class has no image here.
    """
    if not 0.0 < labeled_fraction <= 1.0:
        raise ValueError(f"pu-labeled-fraction={labeled_fraction} must be in (0, 1]")
    labeled = []
    for c in sorted(positive_classes):
        rows = indices[labels == c]
        if len(rows) == 0:
            raise ValueError(f"positive class {named_classes(c, class_names)} has no image on this client")
        n = min(len(rows), max(1, int(round(labeled_fraction * len(rows)))))
        labeled.append(rng.choice(rows, n, replace=False))
    labeled_rows = np.sort(np.concatenate(labeled)).astype(np.int64)
    unlabeled_rows = np.setdiff1d(indices, labeled_rows).astype(np.int64)
    return PUSplit(labeled_rows, unlabeled_rows, tuple(sorted(positive_classes)))


def class_prior(kind: str, num_classes: int, pool_labels: np.ndarray, unlabeled_labels: np.ndarray) -> np.ndarray:
    """The class prior pi ``[K]`` a client is told.

    Parameters
    ----------
    kind : str
        ``"global"`` (class proportions of the training pool, the paper), ``"client"`` (class
        proportions of the client's unlabeled set, the authors' code), one number (every
        class, e.g. ``"0.08"``: Table 7) or K comma-separated numbers.
    num_classes : int
        K.
    pool_labels, unlabeled_labels : np.ndarray
        Labels of the training pool and of the client's unlabeled images.

    Returns
    -------
    np.ndarray
        float64 ``[K]``, entries in [0, 1]. Not renormalised when given by the user: a
        misspecified prior is what Table 7 studies.

    Raises
    ------
    ValueError
        On an unknown kind, a malformed number, the wrong count, or entries outside [0, 1]
        (names ``class-prior`` and the value).
    """
    if kind == "global":
        return np.bincount(pool_labels, minlength=num_classes) / max(1, len(pool_labels))
    if kind == "client":
        return np.bincount(unlabeled_labels, minlength=num_classes) / max(1, len(unlabeled_labels))
    try:
        values = [float(v) for v in str(kind).split(",")]
    except ValueError:
        raise ValueError(f"class-prior={kind!r} is not 'global', 'client', a number or {num_classes} numbers") from None
    if len(values) == 1:
        values = values * num_classes
    if len(values) != num_classes:
        raise ValueError(f"class-prior={kind!r}: {len(values)} numbers for {num_classes} classes")
    prior = np.asarray(values, dtype=np.float64)
    if np.any(prior < 0) or np.any(prior > 1):
        raise ValueError(f"class-prior={kind!r}: entries must be in [0, 1]")
    return prior
