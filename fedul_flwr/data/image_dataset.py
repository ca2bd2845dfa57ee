"""What an image dataset is, as the package holds it: :class:`ImageDataset` (both splits in
memory, ``uint8`` images and ``int64`` labels), :class:`DatasetInfo` (the facts a node must
agree on, known without loading any image), the per-channel :func:`normalize` and
:class:`DatasetError`. Loading lives in :mod:`fedul_flwr.data.datasets` (the registry),
:mod:`fedul_flwr.data.torchvision_datasets`, :mod:`fedul_flwr.data.mnist_sample` and
:mod:`fedul_flwr.data.user_datasets`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["DatasetError", "DatasetInfo", "ImageDataset", "normalize"]


class DatasetError(ValueError):
    """A dataset cannot be loaded: unknown name, bad ``data_dir``, missing or corrupt files,
    or a failed download. The message names the dataset, the folder and the files."""


@dataclass(frozen=True)
class ImageDataset:
    """A fully in-memory image classification dataset.

    Attributes
    ----------
    name : str
        Dataset name, one of :data:`DATASETS`.
    train_x : torch.Tensor
        ``uint8`` training images, shape ``[N, C, H, W]``, values 0..255.
    train_y : torch.Tensor
        ``int64`` training labels, shape ``[N]``, values in ``0 .. num_classes-1``.
    test_x : torch.Tensor
        ``uint8`` test images, shape ``[N_test, C, H, W]``.
    test_y : torch.Tensor
        ``int64`` test labels, shape ``[N_test]``.
    class_names : tuple of str
        Human-readable class names, indexed by label (``len == num_classes``).
    mean, std : tuple of float
        Per-channel normalisation constants on the ``[0, 1]`` scale (``len == C``),
        for use with :func:`normalize`.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    class_names: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def num_classes(self) -> int:
        """Number of classes ``K`` (``len(class_names)``)."""
        return len(self.class_names)

    @property
    def in_channels(self) -> int:
        """Number of image channels ``C``."""
        return int(self.train_x.shape[1])

    @property
    def image_size(self) -> int:
        """Image height ``H`` (images are square: ``H == W``)."""
        return int(self.train_x.shape[2])


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """Scale ``uint8`` images to ``float32`` and standardise each channel.

    Parameters
    ----------
    x : torch.Tensor
        ``uint8`` images, shape ``[N, C, H, W]`` (any device).
    mean, std : sequence of float
        Per-channel constants on the ``[0, 1]`` scale, each of length ``C``.

    Returns
    -------
    torch.Tensor
        ``float32`` tensor of shape ``[N, C, H, W]`` on ``x``'s device, equal to
        ``(x / 255 - mean[c]) / std[c]`` in channel ``c``.
    """
    if x.dim() != 4:
        raise ValueError(f"normalize expects images of shape [N, C, H, W], got {tuple(x.shape)}")
    c = x.shape[1]
    if len(mean) != c or len(std) != c:
        raise ValueError(
            f"normalize: {c} channels but mean has {len(mean)} and std has {len(std)} entries"
        )
    m = torch.tensor(mean, dtype=torch.float32, device=x.device).view(1, c, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=x.device).view(1, c, 1, 1)
    return (x.to(torch.float32) / 255.0 - m) / s


@dataclass(frozen=True)
class DatasetInfo:
    """What a node must agree on with the run's dataset, known without loading any image.

    A deployed SuperNode holds its own images, not the dataset: it needs the class names,
    the image shape and the normalisation constants of the run's dataset to turn its
    images into the tensors f expects.

    Attributes
    ----------
    name : str
        Dataset name, one of :data:`DATASETS`.
    class_names : tuple of str
        The K class names, indexed by label.
    channels : int
        Image channels C.
    image_size : int
        Image height = width, in pixels.
    mean, std : tuple of float
        Per-channel normalisation constants (``len == channels``), as for :func:`normalize`.
    flip : bool
        Whether the classes are invariant under horizontal mirroring, so that augmentation may
        flip images (:mod:`fedul_flwr.augment`): ``True`` for Fashion-MNIST, CIFAR-10 and
        CIFAR-100, ``False`` for digits (MNIST, SVHN) and, unless the run says otherwise, an
        ``hf:`` dataset; the run key ``horizontal-flip`` sets it for any dataset
        (:func:`run_dataset_info`).
    """

    name: str
    class_names: tuple[str, ...]
    channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    flip: bool = False

    def to_json(self) -> str:
        """The facts as a JSON object (what the ServerApp sends the nodes with the run config)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "DatasetInfo":
        """The facts of :meth:`to_json`.

        Raises
        ------
        ValueError
            If ``text`` is not such a JSON object.
        """
        try:
            d = json.loads(text)
            if not isinstance(d["flip"], bool):
                raise ValueError(f"flip={d['flip']!r} is not a bool")
            return cls(str(d["name"]), tuple(str(n) for n in d["class_names"]), int(d["channels"]),
                       int(d["image_size"]), tuple(float(v) for v in d["mean"]), tuple(float(v) for v in d["std"]),
                       d["flip"])  # fmt: skip
        except (TypeError, KeyError, ValueError) as exc:
            raise ValueError(f"not the dataset facts of a run: {text[:80]!r} ({exc})") from None
