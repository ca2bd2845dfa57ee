"""Image augmentation of training batches, shared by every method, batched on the batch's device.

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
    operations at magnitude M = 10 of 31 levels (:class:`RandAugment`), then Cutout (DeVries
    and Taylor, 2017) as a grey (127) square covering 2-25% of the image.
``rotate``
    A random rotation of up to +-20 degrees (nearest pixel, black corners): what the FedUL
    authors' code applies to MNIST (``transforms.RandomRotation(20)``).

How they run
------------
Every image draws its own parameters, and the whole batch is transformed at once, in a few
kernels on the device the batch lives on (CPU or CUDA), in float32 in [0, 1]: uint8
``[B, C, H, W]`` in, uint8 ``[B, C, H, W]`` out (rounded to the nearest level). The crop,
flip, rotation and erasing are Kornia's (``kornia.augmentation``: per-sample parameters,
batched kernels); RandAugment's 14 operations are Kornia's functional image ops
(``kornia.enhance``, ``kornia.geometry.transform``) applied to the images that drew each
operation. Kornia's own ``RandAugment`` draws its operations once per *batch* (every image of
a call gets the same two operations); FixMatch's strong view draws them per image, so the
per-image choice is written here (:class:`RandAugment`).

Randomness: one draw from the client's generator (run seed, round, node) seeds the batch. Kornia
samples its parameters from torch's global CPU generator; that draw is confined
(``torch.random.fork_rng``) and seeded from the batch seed, and :class:`RandAugment` draws from a
CPU generator seeded from it too. The views therefore depend only on the client's generator:
the same seed gives the same parameters on every device (the same pixels on the same device),
and the global random state is neither used nor changed.

Where the ranges differ from torchvision's ops (this module used ``torchvision.transforms.v2``
per image before; measured against it in ``tests/test_augment.py``):

- Kornia's ``RandomCrop`` and ``RandomRotation`` draw the same ranges (offsets 0..2p in whole
  pixels; angles uniform in [-20, 20] degrees), with nearest-pixel rotation as torchvision's
  default. Kornia rotates about ((W - 1) / 2, (H - 1) / 2), the pixel-grid centre torchvision
  also uses.
- RandAugment uses torchvision's operation set and magnitudes (Identity, ShearX/Y 0.1,
  TranslateX/Y 4 pixels, Rotate 10 degrees, Brightness/Color/Contrast/Sharpness factor
  1 +- 0.3, Posterize 7 bits, Solarize above 170/255, AutoContrast, Equalize; signed
  magnitudes flip sign with probability 1/2), computed in float: a pixel can land one level
  away from torchvision's integer arithmetic. Brightness is multiplicative, as torchvision's
  and PIL's (Kornia's ``adjust_brightness`` adds); AutoContrast leaves a constant channel as it is,
  as torchvision does (Kornia's ``normalize_min_max`` would map it to 0).
- Cutout: Kornia's ``RandomErasing`` always erases (p = 1) a square of 2-25% of the area that
  lies inside the image; torchvision's gives up after 10 draws that do not fit (never at
  these scales).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from fedul_flwr.registry import Registry

__all__ = ["AUGMENTATIONS", "MIRRORED", "RANDAUGMENT_OPS", "Augmentation", "RandAugment", "ReflectCrop", "build_augmentation"]

MIRRORED = frozenset({"fashion-mnist", "cifar10"})
"""Datasets whose classes are invariant under horizontal mirroring (weak views may flip)."""

Stage = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
"""``stage(images float [B, C, H, W] in [0, 1], generator) -> same shape``."""

StageBuilder = Callable[[int, bool], "list[Stage]"]
AUGMENTATIONS: Registry[StageBuilder] = Registry("augmentation")
"""Builders ``(image side, may flip) -> stages`` (an empty list: identity) by name."""

RANDAUGMENT_OPS = (
    "identity", "shear-x", "shear-y", "translate-x", "translate-y", "rotate",
    "brightness", "color", "contrast", "sharpness", "posterize", "solarize", "autocontrast", "equalize",
)  # fmt: skip
"""RandAugment's operations, torchvision's set (``transforms.v2.RandAugment``), in its order."""
_GEOMETRIC = frozenset({"shear-x", "shear-y", "translate-x", "translate-y", "rotate"})
_SIGNED = frozenset({"shear-x", "shear-y", "translate-x", "translate-y", "rotate", "brightness", "color", "contrast", "sharpness"})


def _kornia_stage(module: torch.nn.Module) -> Stage:
    """A Kornia augmentation as a stage: it draws from torch's global CPU generator, which
    :meth:`Augmentation.__call__` has seeded from the batch seed."""
    return lambda images, generator: module(images)


class RandAugment:
    """RandAugment with operations drawn per image, applied to the whole batch.

    Each of ``num_ops`` steps draws, for every image, one of :data:`RANDAUGMENT_OPS` uniformly
    and a sign for signed magnitudes; the images that drew an operation are transformed
    together (the five geometric operations in one affine warp). Magnitudes are torchvision's
    at level ``magnitude`` of ``num_bins`` (Cubuk et al., 2020; FixMatch uses N = 2, M = 10 of
    31): shear tan = 0.3 m / 30 with the origin at the top-left corner, translation
    int(150 / 331 side m / 30) pixels, rotation 30 m / 30 degrees about the centre, enhance
    factors 1 +- 0.9 m / 30, posterize 8 - round(4 m / 30) bits, solarize above 1 - m / 30.

    Parameters
    ----------
    num_ops : int
        N, operations per image (>= 1).
    magnitude : int
        M, in 0 .. num_bins - 1.
    num_bins : int
        Levels of the magnitude scale (31 as torchvision).

    Raises
    ------
    ValueError
        On N < 1 or M outside 0 .. num_bins - 1.
    """

    def __init__(self, num_ops: int = 2, magnitude: int = 10, num_bins: int = 31) -> None:
        if num_ops < 1 or not 0 <= magnitude < num_bins:
            raise ValueError(f"RandAugment: num_ops must be >= 1 and magnitude in 0..{num_bins - 1}; got {num_ops}, {magnitude}")
        self.num_ops, self.level = num_ops, magnitude / (num_bins - 1)

    def draw(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Operation indices and signs: two CPU tensors ``[num_ops, batch]`` (long; float +-1)."""
        ops = torch.randint(0, len(RANDAUGMENT_OPS), (self.num_ops, batch), generator=generator)
        signs = torch.where(torch.rand(self.num_ops, batch, generator=generator) < 0.5, -1.0, 1.0)
        return ops, signs

    def magnitude(self, op: str, side: int) -> float:
        """The unsigned magnitude of ``op`` at this level for ``side``-pixel images
        (torchvision's table): shear tan, pixels, degrees, enhance factor - 1, bits kept
        (posterize), threshold in [0, 1] (solarize); 0 for operations without one."""
        if op in ("translate-x", "translate-y"):
            return float(int(150.0 / 331.0 * side * self.level))
        if op == "posterize":
            return float(round(8 - 4.0 * self.level))
        if op == "solarize":
            return 1.0 - self.level
        scale = {"shear-x": 0.3, "shear-y": 0.3, "rotate": 30.0, "brightness": 0.9, "color": 0.9, "contrast": 0.9, "sharpness": 0.9}
        return scale.get(op, 0.0) * self.level

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Apply ``num_ops`` per-image operations.

        Parameters
        ----------
        images : torch.Tensor
            float ``[B, C, H, W]`` in [0, 1], any device (C = 1 or 3).
        generator : torch.Generator
            CPU generator of the operations and signs.

        Returns
        -------
        torch.Tensor
            float ``[B, C, H, W]`` in [0, 1] on the same device.
        """
        ops, signs = self.draw(len(images), generator)
        out = images.clone()
        for step in range(self.num_ops):
            geometric = torch.zeros(len(images), dtype=torch.bool)
            for index, name in enumerate(RANDAUGMENT_OPS):
                rows = (ops[step] == index).nonzero().squeeze(1)
                if not len(rows) or name == "identity":
                    continue
                if name in _GEOMETRIC:
                    geometric[rows] = True
                    continue
                value = self.magnitude(name, images.shape[-1]) * (signs[step, rows] if name in _SIGNED else torch.ones(len(rows)))
                picked = rows.to(out.device, non_blocking=True)
                out[picked] = _enhance(name, out[picked], value.to(out.device, torch.float32, non_blocking=True))
            rows = geometric.nonzero().squeeze(1)
            if len(rows):
                names = [RANDAUGMENT_OPS[i] for i in ops[step, rows].tolist()]
                values = torch.tensor([self.magnitude(n, images.shape[-1]) for n in names]) * signs[step, rows]
                picked = rows.to(out.device, non_blocking=True)
                out[picked] = _warp(out[picked], names, values)
        return out


def _warp(images: torch.Tensor, names: Sequence[str], values: torch.Tensor) -> torch.Tensor:
    """One nearest-pixel affine warp of ``images`` ``[b, C, H, W]``, image i by operation
    ``names[i]`` with signed magnitude ``values[i]`` (black fill, as torchvision's RandAugment)."""
    from kornia.geometry.transform import get_rotation_matrix2d, get_shear_matrix2d, warp_affine

    b, _, h, w = images.shape
    kind = torch.tensor([("shear-x", "shear-y", "translate-x", "translate-y", "rotate").index(n) for n in names])
    zero = torch.zeros(b)
    matrix = get_shear_matrix2d(torch.zeros(b, 2), sx=torch.where(kind == 0, values, zero), sy=torch.where(kind == 1, values, zero))
    matrix = matrix[:, :2].clone()
    matrix[:, 0, 2] += torch.where(kind == 2, values, zero)
    matrix[:, 1, 2] += torch.where(kind == 3, values, zero)
    rotate = kind == 4
    if rotate.any():
        centre = torch.tensor([[(w - 1) / 2, (h - 1) / 2]]).expand(int(rotate.sum()), 2)
        matrix[rotate] = get_rotation_matrix2d(centre, values[rotate], torch.ones(int(rotate.sum()), 2))
    return warp_affine(images, matrix.to(images.device, images.dtype), (h, w), mode="nearest", padding_mode="zeros")


def _enhance(name: str, images: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """RandAugment's pixel operation ``name`` on float ``images`` ``[b, C, H, W]`` in [0, 1],
    image i with signed magnitude ``value[i]`` (``[b]``, on the images' device)."""
    import kornia.enhance as ke

    factor = 1.0 + value  # the enhance operations' factor (others read value itself)
    if name == "brightness":
        return (images * factor.view(-1, 1, 1, 1)).clamp_(0.0, 1.0)
    if name == "color":  # saturation: identity on one channel, as torchvision
        return ke.adjust_saturation_with_gray_subtraction(images, factor) if images.shape[1] == 3 else images
    if name == "contrast":
        return ke.adjust_contrast_with_mean_subtraction(images, factor)
    if name == "sharpness":
        return ke.sharpness(images, factor)
    if name == "posterize":
        return ke.posterize(images, bits=int(value[0]))
    if name == "solarize":
        return ke.solarize(images, thresholds=float(value[0]))
    if name == "autocontrast":
        low = images.amin(dim=(2, 3), keepdim=True)
        flat = images.amax(dim=(2, 3), keepdim=True) <= low
        return torch.where(flat, images, ke.normalize_min_max(images, 0.0, 1.0, eps=0.0))
    if name == "equalize":
        return ke.equalize(images)
    raise ValueError(f"RandAugment: unknown operation {name!r}")


class ReflectCrop:
    """Random crop of ``side`` x ``side`` after reflect-padding by ``padding`` pixels, with an
    offset drawn per image (uniform on 0 .. 2 ``padding`` on each axis, as torchvision's
    ``RandomCrop(side, padding, padding_mode="reflect")``), as one gather for the batch.

    Kornia's ``RandomCrop`` draws the same offsets but cuts the batch image by image in Python
    (448 slices and a concatenation per batch) or, in its ``resample`` mode, warps it with a
    bilinear sampler: 4.6-5.3 ms and 8.7-9.7 ms of CPU time against 1.8-1.9 ms for this gather
    on 448 28 x 28 images (one thread, medians of 15, two runs), so the crop is written here.

    Parameters
    ----------
    side : int
        H = W of the images and of the crop.
    padding : int
        Reflected border, pixels (< side).
    """

    def __init__(self, side: int, padding: int) -> None:
        self.side, self.padding = side, padding

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Crop float ``images`` ``[B, C, H, W]`` (H = W = side); same shape and device."""
        b, c, side, pad = len(images), images.shape[1], self.side, self.padding
        offsets = torch.randint(0, 2 * pad + 1, (2, b, 1), generator=generator).to(images.device, non_blocking=True)
        grid = torch.arange(side, device=images.device)
        rows, cols = offsets[0] + grid, offsets[1] + grid  # [B, side] each, into the padded image
        padded = torch.nn.functional.pad(images, (pad, pad, pad, pad), mode="reflect")
        padded = padded.gather(2, rows[:, None, :, None].expand(b, c, side, side + 2 * pad))
        return padded.gather(3, cols[:, None, None, :].expand(b, c, side, side))


def _weak(side: int, flip: bool) -> list[Stage]:
    import kornia.augmentation as ka

    stages: list[Stage] = [ReflectCrop(side, max(1, side // 8))]
    return stages + [_kornia_stage(ka.RandomHorizontalFlip(p=0.5))] if flip else stages


def _strong(side: int, flip: bool) -> list[Stage]:
    import kornia.augmentation as ka

    cutout = ka.RandomErasing(scale=(0.02, 0.25), ratio=(1.0, 1.0), value=127 / 255, p=1.0)
    return [*_weak(side, flip), RandAugment(num_ops=2, magnitude=10), _kornia_stage(cutout)]


def _rotate(side: int, flip: bool) -> list[Stage]:
    import kornia.augmentation as ka

    return [_kornia_stage(ka.RandomRotation(20.0, resample="nearest", p=1.0))]


AUGMENTATIONS.add("none", lambda side, flip: [])
AUGMENTATIONS.add("weak", _weak)
AUGMENTATIONS.add("strong", _strong)
AUGMENTATIONS.add("rotate", _rotate)


class Augmentation:
    """A named augmentation of uint8 image batches (module docstring).

    Kornia is imported on first use: a deployed SuperNode starts a fresh ClientApp process
    for every message, and messages that do not train (FedPU's positive-class query, federated
    evaluation) or runs without augmentation skip the import.

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
        self.stages = AUGMENTATIONS.get(name)(image_side, dataset in MIRRORED)

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Augment each image of a batch with its own random parameters, the batch at once.

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
        if not self.stages or len(images) == 0:
            return images
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        own = torch.Generator().manual_seed(seed)
        devices = [images.device] if images.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            out = images.float().div_(255.0)
            for stage in self.stages:
                out = stage(out, own)
        return out.mul_(255.0).round_().clamp_(0.0, 255.0).to(torch.uint8)

    def __repr__(self) -> str:
        return f"Augmentation({self.name!r})"


def build_augmentation(name: str, image_side: int, dataset: str) -> Augmentation | None:
    """The augmentation ``name`` for these images, or None for ``none``."""
    return None if name == "none" else Augmentation(name, image_side, dataset)
