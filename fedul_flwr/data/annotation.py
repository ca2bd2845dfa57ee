"""The annotation-heterogeneity setting of HASSLE ("federated semi-supervised learning with
annotation heterogeneity", Sec. 3 and 5.1, Table 4, Fig. 6).

    dataset -> partition (Dirichlet) -> **label fraction per client** -> ClientData -> method

Every client is fully labeled (``L``), partially labeled (``P``) or unlabeled (``U``); the
labeled images of a client are its labeled part, the others its unlabeled part (either may be
empty). ``label-layout`` gives the kinds:

- a named layout of the paper for 20 clients (:data:`LAYOUTS`): ``ALL`` (Table 4's 10% and
  20% rows: 1 or 2 fully labeled, the rest of the first 10 partially labeled, 10 unlabeled;
  Fig. 6's "ALL"), ``PL``, ``LPL``, ``UPL``, ``LU`` (Fig. 6);
- a comma list of kinds, one per client (``"L,P,P,U,U"``; ``"P*9"`` repeats);
- or a comma list of label fractions in [0, 1], one per client (``"1,0.3,0"``).

Choices the paper leaves open, made here:

- **How many labels a partially labeled client gets.** With kinds, every ``P`` client labels
  the same fraction a of its images, solved so that the labeled images are ``labeled-share``
  of all training images: a = (share * N - sum_L n_k) / sum_P n_k, which must land in (0, 1)
  (else an error naming the share and the counts). The 10% and 20% rows of Table 4 then hold
  exactly 10% and 20% labels. With fractions given per client the share follows from them.
- **Which images are labeled**: a uniformly random subset of the client's images (rounded to
  the nearest image), drawn from the client's generator.
- The paper's 5% row is garbled in its extraction (no fully labeled client); it is not a
  named layout: give it as kinds or fractions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["LAYOUTS", "label_fractions", "parse_layout"]

LAYOUTS: dict[str, dict[float, str]] = {
    # labeled share -> kinds of the 20 clients (the ALL layout has 1 fully labeled client at 10%, 2 at 20%)
    "ALL": {0.1: "L,P*9,U*10", 0.2: "L*2,P*8,U*10"},
    "PL": {0.0: "P*20"},
    "LPL": {0.0: "L,P*19"},
    "UPL": {0.0: "P*10,U*10"},
    "LU": {0.0: "L*2,U*18"},
}
"""The paper's layouts for 20 clients: name -> {labeled share it is stated for (0: any) -> kinds}."""


def _expand(text: str) -> list[str]:
    out: list[str] = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        kind, _, count = item.partition("*")
        out.extend([kind.strip()] * (int(count) if count else 1))
    return out


def parse_layout(text: str, num_clients: int | None, share: float, key: str = "label-layout") -> list[str | float]:
    """Per client: a kind (``"L"``, ``"P"``, ``"U"``) or a label fraction in [0, 1]; its
    length is the number of clients the layout needs (``num_clients=None``: not checked).

    Raises
    ------
    ValueError
        On an unknown name or kind, a fraction outside [0, 1], a count that is not
        ``num_clients``, or a named layout without a version for ``share`` (names ``key``).
    """
    text = str(text).strip()
    try:
        if text in LAYOUTS:
            versions = LAYOUTS[text]
            kinds = versions.get(round(share, 6), versions.get(0.0))
            if kinds is None:
                raise ValueError(f"layout {text!r} is stated for labeled shares {sorted(versions)}, not {share}")
            values: list[str | float] = list(_expand(kinds))
        else:
            items = _expand(text)
            if all(i in ("L", "P", "U") for i in items):
                values = list(items)
            else:
                unknown = [i for i in items if i not in ("L", "P", "U") and not _is_number(i)]
                if unknown:
                    raise ValueError(f"{unknown[0]!r} is no kind (L, P, U), layout name or fraction")
                values = [float(i) for i in items]
                bad = [v for v in values if not 0.0 <= v <= 1.0]
                if bad:
                    raise ValueError(f"fractions {bad} outside [0, 1]")
        if num_clients is not None and len(values) != num_clients:
            raise ValueError(f"{len(values)} clients in the layout for {num_clients} clients")
        return values
    except ValueError as exc:
        raise ValueError(f"{key}={text!r}: {exc} (names: {sorted(LAYOUTS)}; comma-separated kinds L, P, U "
                         "such as 'L,P*2,U'; or comma-separated fractions)") from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def label_fractions(layout: Sequence[str | float], sizes: Sequence[int], share: float) -> list[float]:
    """The label fraction of every client.

    Parameters
    ----------
    layout : Sequence[str | float]
        From :func:`parse_layout`.
    sizes : Sequence[int]
        n_k, the images of each client.
    share : float
        Wanted share of labeled images over all clients (used with kinds only).

    Returns
    -------
    list[float]
        In [0, 1]: 1 for ``L``, 0 for ``U``, the solved a for ``P``.

    Raises
    ------
    ValueError
        If the partially labeled clients' fraction a is not in (0, 1) (names the share and the
        counts).
    """
    if all(isinstance(v, float) for v in layout):
        return [float(v) for v in layout]
    total = sum(sizes)
    full = sum(n for n, k in zip(sizes, layout, strict=True) if k == "L")
    partial = sum(n for n, k in zip(sizes, layout, strict=True) if k == "P")
    a = 0.0
    if partial:
        a = (share * total - full) / partial
        if not 0.0 < a < 1.0:
            raise ValueError(
                f"labeled-share={share}: the fully labeled clients hold {full} of {total} images and the partially "
                f"labeled ones {partial}, so they would label a fraction {a:.3f} (must be in (0, 1))"
            )
    return [1.0 if k == "L" else 0.0 if k == "U" else a for k in layout]


def labeled_rows(indices: np.ndarray, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Split a client's rows: a uniformly random ``fraction`` (rounded) labeled, the rest unlabeled (both sorted)."""
    n = int(round(fraction * len(indices)))
    chosen = rng.permutation(indices)
    return np.sort(chosen[:n]), np.sort(chosen[n:])
