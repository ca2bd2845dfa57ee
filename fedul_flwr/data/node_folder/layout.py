"""The layout of one deployed node's data, a folder on its own disk: the file and folder names,
the report of a checked folder (:class:`NodeDataReport`) and its error (:class:`NodeDataError`).

In a real federation each organisation runs a SuperNode next to its data and starts it with
``flower-supernode --node-config "data-dir=/path/to/node"``. The folder holds one or more of
three *parts* (the parts of :class:`~fedul_flwr.data.client_data.ClientData` it provides),
plus optional metadata and a local test split::

    U sets ("unlabeled" + "usets" parts; both files or neither):
    <dir>/priors.csv              header ``set,<class name 1>,...,<class name K>``; one row
                                  per U set: the set's name, then its K class priors
                                  Pi_c[m, :] (non-negative, summing to 1 within 1e-3)
    <dir>/sets/<set name>/        one folder per row of priors.csv, holding EITHER image
                                  files (:data:`IMAGE_SUFFIXES`; any file names)
                                  OR one ``images.npy``: uint8 ``[n, H, W]`` or ``[n, H, W, C]``

    labeled images ("labeled" part; optional):
    <dir>/labeled/images.npy      uint8 ``[n_l, H, W]`` or ``[n_l, H, W, C]``
    <dir>/labeled/labels.npy      int labels ``[n_l]`` in ``0..K-1`` (both files)

    <dir>/labeled/<class name>/   or, instead of the two files: one folder per class (named
                                  as the run's classes; a node may hold some of them) of
                                  image files (:data:`IMAGE_SUFFIXES`)

    plain unlabeled images ("unlabeled" part without set structure; optional):
    <dir>/unlabeled/images.npy    uint8 ``[n_u, H, W]`` or ``[n_u, H, W, C]``, or image files;
                                  only allowed when the node has no U sets (else the
                                  "unlabeled" part would be ambiguous)

    an image folder (the "labeled" part, alone):
    <dir>/<class name>/<image>    ``data-dir`` may point straight at the user's own image
                                  folder, one sub-folder per class as above, when it holds
                                  none of ``priors.csv``, ``sets/``, ``labeled/``, ``unlabeled/``

    class prior ("class-prior" part; optional, FedPU):
    <dir>/class_prior.csv         header ``<class name 1>,...,<class name K>``, one row of K
                                  finite values in [0, 1], not all zero: the class prior pi
                                  the node is told

    <dir>/meta.json               optional: ``{"dataset": ..., "image_size": H,
                                  "channels": C, "class_names": [...]}``; checked against
                                  the run when present
    <dir>/test/images.npy         optional labeled local test split (client-side evaluation
    <dir>/test/labels.npy         only): uint8 images and int labels ``[n_t]`` as in labeled/

Accepted combinations: U sets, labeled, or plain unlabeled images alone; U sets + labeled;
labeled + plain unlabeled (+ ``class_prior.csv``: a positive-unlabeled node of FedPU, whose
``labeled/`` holds the labeled images of its positive classes). A node with U sets provides the parts ``unlabeled`` (the set
images concatenated in ``priors.csv`` row order) and ``usets`` (the set index of every one of
those images and the prior matrix); ``labeled/`` provides ``labeled`` (e.g. the same pool
with its true labels, for the supervised reference) and ``positive-classes`` (the classes that
occur in its labels); ``unlabeled/`` provides ``unlabeled``; ``class_prior.csv`` provides
``class-prior``.

The row order of ``priors.csv`` gives the set index m, i.e. the surrogate label ybar = m of
every image in ``sets/<name of row m>/`` (Lu et al., ICLR 2022, Eq. 6). Image files of a
set are read in sorted file-name order. Every image (a file or a row of ``images.npy``) is
decoded by the project's one decoder, :mod:`fedul_flwr.data.images`, with the rules of the
run's own dataset: converted to the run's channels, resized to its image size when the run
sets ``image-size`` (``resize``), else of exactly that size.
Hidden files (``.*``) are ignored; any other file in ``sets/<name>/``, ``labeled/`` or
``unlabeled/`` is an error, so no image is silently skipped. Images stay uint8 (the model
input is computed per batch, :meth:`ClientData.to_input`).

:func:`~fedul_flwr.data.node_folder.reader.validate_node_dir` reads everything and checks it; it never writes, moves or deletes
anything. Every problem raises :class:`NodeDataError`, whose message names the file, the row
(CSV line) or the value; in particular:

- ``priors.csv`` without ``sets/`` or ``sets/`` without ``priors.csv`` (names the missing one);
- ``unlabeled/`` together with U sets (names both paths);
- none of U sets, ``labeled/``, ``unlabeled/`` (names the folder, lists the three layouts);
- a malformed CSV row, a set folder without row or row without folder, an unreadable or
  wrongly shaped image, a label outside ``0..K-1`` (file and position), a ``meta.json``
  that contradicts the run.

:func:`~fedul_flwr.data.node_folder.reader.load_node_dir` validates and returns a :class:`~fedul_flwr.data.client_data.ClientData`.
:func:`~fedul_flwr.data.node_folder.writer.write_node_dir` writes such a folder from a labeled dataset and simulated U sets
(demos, tests), optionally with a labeled part, refusing to overwrite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedul_flwr.data.images import IMAGE_SUFFIXES

__all__ = [
    "ARRAY_FILE",
    "CLASS_PRIOR_FILE",
    "IMAGE_SUFFIXES",
    "LABELED_DIR",
    "LABELS_FILE",
    "LAYOUTS",
    "META_FILE",
    "PRIORS_FILE",
    "PRIOR_ROW_TOLERANCE",
    "SETS_DIR",
    "TEST_DIR",
    "UNLABELED_DIR",
    "NodeDataError",
    "NodeDataReport",
]

PRIORS_FILE = "priors.csv"
SETS_DIR = "sets"
META_FILE = "meta.json"
TEST_DIR = "test"
LABELED_DIR = "labeled"
UNLABELED_DIR = "unlabeled"
ARRAY_FILE = "images.npy"
LABELS_FILE = "labels.npy"
CLASS_PRIOR_FILE = "class_prior.csv"
PRIOR_ROW_TOLERANCE = 1e-3
"""Largest accepted |sum of a priors.csv row - 1|; accepted rows are renormalised exactly."""
LAYOUTS: tuple[str, ...] = (
    f"U sets: {PRIORS_FILE} + {SETS_DIR}/<set name>/",
    f"labeled images: {LABELED_DIR}/{ARRAY_FILE} + {LABELED_DIR}/{LABELS_FILE}",
    f"plain unlabeled images: {UNLABELED_DIR}/{ARRAY_FILE}",
    "an image folder: <class name>/<image files>",
)
"""The three accepted data layouts of a node folder (at least one must be present)."""
PART_ORDER: tuple[str, ...] = ("labeled", "unlabeled", "usets", "positive-classes", "class-prior")


class NodeDataError(ValueError):
    """A node's data folder is missing, malformed or does not match the run; the message
    names the file, the CSV line / set or the offending value."""


@dataclass(frozen=True)
class NodeDataReport:
    """What :func:`validate_node_dir` found (no image data, only a description).

    Attributes
    ----------
    path : pathlib.Path
        The node's folder (resolved).
    set_names : tuple[str, ...]
        The M_c set names, in ``priors.csv`` row order (= surrogate label order); empty for
        a node without U sets.
    set_sizes : tuple[int, ...]
        Number of images of each set.
    set_formats : tuple[str, ...]
        ``"npy"`` or ``"files"`` per set.
    priors : np.ndarray
        float64 ``[M_c, K]`` prior matrix, rows renormalised to sum to 1 (``[0, K]`` without
        U sets).
    class_names : tuple[str, ...]
        The K class names (the run's, equal to the CSV header).
    channels, image_size : int
        Image shape ``[C, H, H]``.
    condition_number : float
        2-norm condition number of the prior matrix over the classes present (``nan``
        without U sets).
    absent_classes : tuple[str, ...]
        Classes whose priors column is all zero (the node's sets hold none of them); empty
        without U sets.
    num_test : int
        Size of the labeled local test split (0 when absent).
    num_labeled : int
        Size of the labeled part ``labeled/`` (0 when absent).
    num_unlabeled : int
        Number of plain unlabeled images ``unlabeled/`` (0 when absent); the images of the
        U sets are counted by ``set_sizes``.
    positive_classes : tuple[str, ...]
        Names of the classes that occur in ``labeled/`` (empty without it).
    class_prior : np.ndarray or None
        float64 ``[K]`` from ``class_prior.csv`` (``None`` when absent).
    """

    path: Path
    set_names: tuple[str, ...]
    set_sizes: tuple[int, ...]
    set_formats: tuple[str, ...]
    priors: np.ndarray = field(repr=False)
    class_names: tuple[str, ...]
    channels: int
    image_size: int
    condition_number: float
    absent_classes: tuple[str, ...]
    num_test: int
    num_labeled: int = 0
    num_unlabeled: int = 0
    positive_classes: tuple[str, ...] = ()
    class_prior: np.ndarray | None = field(default=None, repr=False)

    @property
    def num_sets(self) -> int:
        """M_c (0 without U sets)."""
        return len(self.set_names)

    @property
    def num_images(self) -> int:
        """n_c, images over all sets."""
        return int(sum(self.set_sizes))

    @property
    def parts(self) -> tuple[str, ...]:
        """The :class:`~fedul_flwr.data.client_data.ClientData` parts this node provides, in
        the order ``("labeled", "unlabeled", "usets", "positive-classes", "class-prior")``."""
        held = {
            "labeled": self.num_labeled > 0,
            "unlabeled": self.num_unlabeled + self.num_images > 0,
            "usets": self.num_sets > 0,
            "positive-classes": self.num_labeled > 0,
            "class-prior": self.class_prior is not None,
        }
        return tuple(p for p in PART_ORDER if held[p])

    def summary(self) -> str:
        """A human-readable multi-line summary (for the ``validate`` command)."""
        shape = f"{self.channels}x{self.image_size}x{self.image_size}"
        lines = [
            f"{self.path}: OK",
            f"  parts {list(self.parts)}, images of {shape}, K={len(self.class_names)} classes",
        ]
        if self.num_labeled:
            lines.append(f"  labeled: {self.num_labeled} images with labels of classes {list(self.positive_classes)}")
        if self.class_prior is not None:
            lines.append(f"  class prior: {', '.join(f'{v:.3g}' for v in self.class_prior)}")
        if self.num_unlabeled:
            lines.append(f"  unlabeled: {self.num_unlabeled} images without set structure")
        if self.num_sets:
            lines.append(
                f"  U sets: {self.num_sets} sets, {self.num_images} images of {shape}, "
                f"cond(Pi)={self.condition_number:.2f}"
            )
        if self.absent_classes:
            lines.append(f"  classes absent from this node's sets (zero priors column): {list(self.absent_classes)}")
        lines.append(f"  labeled local test split: {self.num_test} images" if self.num_test else "  no local test split")
        if self.num_sets:
            width = max(len(n) for n in self.set_names)
            for name, size, fmt, row in zip(self.set_names, self.set_sizes, self.set_formats, self.priors):
                top = int(np.argmax(row))
                lines.append(
                    f"  {name:<{width}}  {size:>7} images ({fmt})  max prior {row[top]:.3f} ({self.class_names[top]})"
                )
        return "\n".join(lines)
