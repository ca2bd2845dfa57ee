"""Image augmentation of training batches, shared by every method.

Named augmentations (:data:`AUGMENTATIONS`; the run key ``augment`` picks one for every
method's training images, and FixMatch-style methods build their two views from ``weak`` and
``strong``):

``none``
    The images as they are (default).
``weak``
    FixMatch's weak view (Sohn et al., NeurIPS 2020, Sec. 2.3): a random crop after padding by
    1/8 of the side (4 pixels at 32, 3 at 28, reflected borders) and, only for datasets whose
    classes are invariant under mirroring (:data:`MIRRORED`: not digits), a horizontal flip
    with probability 1/2.
``strong``
    FixMatch's strong view: the weak view, then RandAugment (Cubuk et al., 2020) with N = 2
    random operations at magnitude M = 10 (of torchvision's 31 levels), then Cutout (DeVries
    and Taylor, 2017) as a grey square of up to half the side (torchvision's
    ``RandomErasing`` with a square aspect ratio and a scale of up to 1/4 of the area).
``rotate``
    A random rotation of up to +-20 degrees: what the FedUL authors' code applies to MNIST
    (``transforms.RandomRotation(20)``).

Every transform is torchvision's (``transforms.v2``) on uint8 ``[C, H, W]`` tensors, applied
per image (each image draws its own parameters), on the device the batch lives on.
torchvision draws its parameters from torch's global generator; here that draw is confined:
each batch forks the global CPU generator, seeds it from the client's generator and restores
it afterwards, so the views depend only on the client's generator (run seed, round, node)
and never on, or change, the global state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from fedul_flwr.registry import Registry

if TYPE_CHECKING:
    from torchvision.transforms import v2

__all__ = ["AUGMENTATIONS", "MIRRORED", "Augmentation", "build_augmentation"]

MIRRORED = frozenset({"fashion-mnist", "cifar10"})
"""Datasets whose classes are invariant under horizontal mirroring (weak views may flip)."""

TransformBuilder = Callable[[int, bool], "v2.Transform | None"]
AUGMENTATIONS: Registry[TransformBuilder] = Registry("augmentation")
"""Builders ``(image side, may flip) -> torchvision transform`` (None: identity) by name."""


def _v2():  # type: ignore[no-untyped-def]
    """torchvision's ``transforms.v2``, imported on first use. A deployed SuperNode starts a
    fresh ClientApp process for every message; importing torchvision there costs ~2
    CPU-seconds (measured; it loads ``torch._dynamo``) in a process that has not built a torch
    optimizer yet (which loads it too; then ~0.2 s), so messages that do not train (FedPU's
    positive-class query, federated evaluation) and runs without augmentation skip it."""
    from torchvision.transforms import v2

    return v2


def _weak(side: int, flip: bool) -> v2.Transform:
    v2 = _v2()
    crop = v2.RandomCrop(side, padding=max(1, side // 8), padding_mode="reflect")
    return v2.Compose([crop, v2.RandomHorizontalFlip()]) if flip else crop


AUGMENTATIONS.add("none", lambda side, flip: None)
AUGMENTATIONS.add("weak", _weak)
AUGMENTATIONS.add(
    "strong",
    lambda side, flip: _v2().Compose(
        [_weak(side, flip), _v2().RandAugment(num_ops=2, magnitude=10),
         _v2().RandomErasing(p=1.0, scale=(0.02, 0.25), ratio=(1.0, 1.0), value=127)]
    ),
)  # fmt: skip
AUGMENTATIONS.add("rotate", lambda side, flip: _v2().RandomRotation(20))


class Augmentation:
    """A named augmentation of uint8 image batches (module docstring).

    Parameters
    ----------
    name : str
        A name of :data:`AUGMENTATIONS`.
    image_side : int
        H = W of the images (the crop size).
    dataset : str
        The run's dataset (flips only for :data:`MIRRORED`).

    Raises
    ------
    UnknownChoiceError
        On an unknown name (lists the valid ones).
    """

    def __init__(self, name: str, image_side: int, dataset: str) -> None:
        self.name = name
        self.transform = AUGMENTATIONS.get(name)(image_side, dataset in MIRRORED)

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Augment each image of a batch with its own random parameters.

        Parameters
        ----------
        images : torch.Tensor
            uint8 ``[B, C, H, W]`` on any device.
        generator : torch.Generator
            CPU generator the parameters are drawn from (one draw per batch seeds them).

        Returns
        -------
        torch.Tensor
            uint8 ``[B, C, H, W]`` on the same device (``images`` itself for ``none``).
        """
        if self.transform is None or len(images) == 0:
            return images
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return torch.stack([self.transform(image) for image in images])

    def __repr__(self) -> str:
        return f"Augmentation({self.name!r})"


def build_augmentation(name: str, image_side: int, dataset: str) -> Augmentation | None:
    """The augmentation ``name`` for these images, or None for ``none``."""
    return None if name == "none" else Augmentation(name, image_side, dataset)
