"""What one client holds: the general container every setting and every method shares.

    dataset -> partition -> the client's setting -> **ClientData** -> method -> training loop

A client's data has up to five *parts*; a setting fills those it has, a method names those it
needs (``Method.requires``) and :meth:`ClientData.require` turns a missing part into one
clear error naming the method, the part and the node:

``"labeled"``
    images with their true labels (supervised reference; later FixMatch, FedDB, HASSLE);
``"unlabeled"``
    images without labels;
``"usets"``
    the U-set structure of the unlabeled images (FedUL, Lu et al., ICLR 2022, Eq. 6): the
    set index m of every unlabeled image (its surrogate label) and the prior matrix Pi_c;
``"positive-classes"``
    the classes the client labels (positive-unlabeled setting, FedPU);
``"class-prior"``
    the client's class prior pi [K] (FedPU).

Images stay ``uint8 [n, C, H, W]`` here; they become model inputs only per batch, on the
training device (:meth:`ClientData.to_input`: scaling and per-channel normalisation; data
augmentation runs at the same place). The simulated source
(:mod:`fedul_flwr.data.simulated`) and the deployed source (:mod:`fedul_flwr.data.node_folder.layout`)
both build this container.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from fedul_flwr.data.image_dataset import normalize

__all__ = ["PARTS", "SEMI_SUPERVISED_PARTS", "ClientData", "LabeledImages", "MissingPartError", "USetIndex"]

PARTS: tuple[str, ...] = ("labeled", "unlabeled", "usets", "positive-classes", "class-prior")
SEMI_SUPERVISED_PARTS: frozenset[str] = frozenset({"labeled", "unlabeled"})
"""The parts a client of labeled and unlabeled images may lack (``ClientData.optional_parts``)."""


class MissingPartError(ValueError):
    """A method needs a part of the client's data that this node does not hold."""


@dataclass(frozen=True)
class LabeledImages:
    """Images with their true labels.

    Attributes
    ----------
    x : torch.Tensor
        uint8 ``[n, C, H, W]``.
    y : torch.Tensor
        int64 ``[n]`` class indices in ``[0, K)``.
    """

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.dtype != torch.uint8 or self.x.ndim != 4:
            raise ValueError(f"labeled images must be uint8 [n, C, H, W], got {self.x.dtype} {tuple(self.x.shape)}")
        if self.y.shape != self.x.shape[:1]:
            raise ValueError(f"{len(self.y)} labels for {len(self.x)} images")

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclass(frozen=True)
class USetIndex:
    """The U-set structure of a client's unlabeled images (Lu et al., ICLR 2022, Sec. 3).

    Attributes
    ----------
    set_index : torch.Tensor
        int64 ``[n_u]``: the set m of each unlabeled image (row-aligned with
        ``ClientData.unlabeled``), i.e. its surrogate label ybar = m.
    priors : np.ndarray
        float64 ``[M_c, K]``: the prior matrix Pi_c the method is told (rows sum to 1).
    """

    set_index: torch.Tensor
    priors: np.ndarray

    @property
    def num_sets(self) -> int:
        """M_c."""
        return int(self.priors.shape[0])

    @property
    def surrogate_prior(self) -> np.ndarray:
        """float64 ``[M_c]``: pibar_c[m] = n_{c,m} / n_c (Theorem 1)."""
        counts = np.bincount(self.set_index.numpy(), minlength=self.num_sets)
        return counts / counts.sum()


@dataclass(frozen=True)
class ClientData:
    """One client's data, in parts (see the module docstring).

    Attributes
    ----------
    node : str
        Who holds it, for error messages: ``"partition 3 of 5"`` or the node folder.
    class_names : tuple[str, ...]
        The K class names.
    mean, std : tuple[float, ...]
        Per-channel normalisation constants of the run's dataset (``len == C``).
    labeled : LabeledImages | None
        Images with true labels.
    unlabeled : torch.Tensor | None
        uint8 ``[n_u, C, H, W]`` images without labels.
    usets : USetIndex | None
        Set index of every unlabeled image and the prior matrix.
    positive_classes : tuple[int, ...] | None
        Classes the client labels (positive-unlabeled setting).
    class_prior : np.ndarray | None
        float64 ``[K]`` class prior of the client.
    test : LabeledImages | None
        Optional labeled local test split (client-side evaluation only).
    unlabeled_classes : torch.Tensor | None
        int64 ``[n_u]``: the true classes of the unlabeled images, where the run knows them
        (simulation only; empty when a simulated client has no unlabeled image). Never
        trained on: methods read it only for diagnostics (FixMatch's share of correct
        pseudo-labels).
    optional_parts : frozenset[str]
        Parts this client may lack by its setting's design: in the annotation-heterogeneity
        setting (and a deployed node of labeled + unlabeled images) a fully labeled client
        has no unlabeled part and an unlabeled client no labeled part. A method that requires
        such a part does not fail on the client: the client sits the round out
        (:meth:`fedul_flwr.methods.base.Method.sits_out`).
    flip : bool
        Whether augmentation may mirror these images horizontally: the run dataset's
        :attr:`~fedul_flwr.data.image_dataset.DatasetInfo.flip`.
    """

    node: str
    class_names: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    labeled: LabeledImages | None = None
    unlabeled: torch.Tensor | None = None
    usets: USetIndex | None = None
    positive_classes: tuple[int, ...] | None = None
    class_prior: np.ndarray | None = None
    test: LabeledImages | None = None
    unlabeled_classes: torch.Tensor | None = None
    optional_parts: frozenset[str] = frozenset()
    flip: bool = False

    def __post_init__(self) -> None:
        if self.unlabeled is not None and (self.unlabeled.dtype != torch.uint8 or self.unlabeled.ndim != 4):
            raise ValueError(
                f"{self.node}: unlabeled images must be uint8 [n, C, H, W], got "
                f"{self.unlabeled.dtype} {tuple(self.unlabeled.shape)}"
            )
        n_u = 0 if self.unlabeled is None else len(self.unlabeled)
        if self.unlabeled_classes is not None and tuple(self.unlabeled_classes.shape) != (n_u,):
            raise ValueError(f"{self.node}: {tuple(self.unlabeled_classes.shape)} true classes for {n_u} unlabeled images")
        if self.usets is not None:
            if self.usets.set_index.shape != (n_u,):
                raise ValueError(f"{self.node}: {len(self.usets.set_index)} set indices for {n_u} unlabeled images")

    @property
    def num_classes(self) -> int:
        """K."""
        return len(self.class_names)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of the client's images.

        Raises
        ------
        MissingPartError
            If the client holds no images at all.
        """
        for x in (self.unlabeled, None if self.labeled is None else self.labeled.x, None if self.test is None else self.test.x):
            if x is not None:
                return int(x.shape[1]), int(x.shape[2]), int(x.shape[3])
        raise MissingPartError(f"{self.node}: holds no images")

    def parts(self) -> tuple[str, ...]:
        """The parts this client holds, in :data:`PARTS` order."""
        held = {
            "labeled": self.labeled is not None and len(self.labeled) > 0,
            "unlabeled": self.unlabeled is not None and len(self.unlabeled) > 0,
            "usets": self.usets is not None,
            "positive-classes": self.positive_classes is not None,
            "class-prior": self.class_prior is not None,
        }
        return tuple(p for p in PARTS if held[p])

    def require(self, method: str, parts: Iterable[str]) -> None:
        """Check that this client holds every part ``method`` needs (or may lack it: see
        ``optional_parts``).

        Raises
        ------
        MissingPartError
            Naming the method, the missing part(s), the node and what it does hold.
        ValueError
            On a part name that is not one of :data:`PARTS`.
        """
        needed = tuple(parts)
        unknown = [p for p in needed if p not in PARTS]
        if unknown:
            raise ValueError(f"method {method!r} asks for unknown data part(s) {unknown}; parts are {PARTS}")
        missing = [p for p in needed if p not in self.parts() and p not in self.optional_parts]
        if missing:
            raise MissingPartError(
                f"method {method!r} needs the {' and '.join(repr(p) for p in missing)} part of the client's data, "
                f"but {self.node} holds only {list(self.parts()) or 'nothing'}"
            )

    def to_input(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 images ``[B, C, H, W]`` (any device) -> float32 model input on the same device:
        ``(x / 255 - mean[c]) / std[c]`` per channel."""
        return normalize(x, self.mean, self.std)
