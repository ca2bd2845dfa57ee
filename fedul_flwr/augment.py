"""Image augmentation of training batches, shared by every method, batched on the batch's device.

Named augmentations (:data:`AUGMENTATIONS`; the run key ``augment`` picks one for every
method's training images, and FixMatch-style methods build their two views from ``weak`` and
``strong``):

``none``
    The images as they are (default).
``weak``
    FixMatch's weak view (Sohn et al., NeurIPS 2020, Sec. 2.3): a random crop after padding by
    1/8 of the side (4 pixels at 32, 3 at 28, reflected borders) and, only where the run's
    dataset allows it (its classes are invariant under mirroring: not digits, not text;
    :attr:`fedul_flwr.data.datasets.DatasetInfo.flip`, set by the run key
    ``horizontal-flip``), a horizontal flip with probability 1/2.
``strong``
    FixMatch's strong view: the weak view, then RandAugment (Cubuk et al., 2020) with N = 2
    operations at magnitude M = 10 of 31 levels (:class:`RandAugment`), then Cutout (DeVries
    and Taylor, 2017) as a grey (127) square covering 2-25% of the image.
``strong-random``
    The strong view as FixMatch's paper (Sec. 2.3, App. D: "a random magnitude ... for each
    transformation") and USB's and kekmodel's code draw it: the weak view, then RandAugment
    with N = 2 operations whose magnitude is drawn per image and operation uniformly over the
    full range (shear +-0.3, translation +-30% of the side, rotation +-30 degrees, enhance
    factors 1 +- 0.9, posterize 4-8 bits, solarize any threshold; :class:`RandAugment` with
    ``random_magnitude``), then Cutout of a grey square of side up to half the image's,
    centred anywhere and cut off at the border (:class:`Cutout`, USB's ``CutoutAbs``). USB's
    enhance factors lie in [0.05, 0.95] only (they darken, blur and desaturate); these are
    torchvision's symmetric ones.
``rotate``
    A random rotation of up to +-20 degrees (nearest pixel, black corners): what the FedUL
    authors' code applies to MNIST (``transforms.RandomRotation(20)``).

How they run
------------
Every image draws its own parameters, and the whole batch is transformed at once, in a few
kernels on the device the batch lives on (CPU or CUDA): uint8 ``[B, C, H, W]`` in, uint8
``[B, C, H, W]`` out. The geometric ops (crop, rotation, RandAugment's shears, translations
and rotations) are one gather each on the images' own dtype (:func:`nearest_affine`,
:class:`ReflectCrop`); the others run in float32 in [0, 1] and are rounded back to the nearest
level. The flip and the erasing are Kornia's (``kornia.augmentation``: per-sample parameters,
batched kernels), RandAugment's pixel operations Kornia's functional image ops
(``kornia.enhance``), applied to the images that drew each operation, and the affine matrices
Kornia's (``kornia.geometry.transform``). Kornia's own ``RandAugment`` draws its operations
once per *batch* (every image of a call gets the same two); FixMatch's strong view draws them
per image, so the per-image choice is written here (:class:`RandAugment`). Kornia's crop and
warps are not used, for measured reasons: its ``RandomCrop`` cuts the batch image by image in
Python, and its ``warp_affine`` samples through ``grid_sample`` in float (times in
:class:`ReflectCrop` and :func:`nearest_affine`).

Randomness: one draw from the client's generator (run seed, round, node) seeds the batch. The
crop, rotation and RandAugment draw from a CPU generator seeded from it; Kornia's flip and
erasing get their parameters drawn here (:class:`_KorniaStage`, Kornia's own sampling
written with an explicit generator: the same draws, bit for bit, as Kornia's from torch's
global generator seeded alike) from a second CPU generator seeded from the batch seed, and
are given them (``module(images, params=...)``). The views therefore depend only on the
client's generator: the same seed gives the same parameters on every device (the same pixels
on the same device), no process-wide generator is used or changed, and clients training in
parallel threads augment at the same time.

Where the ranges differ from torchvision's ops (this module used ``torchvision.transforms.v2``
per image before; measured against it in ``tests/test_augment.py``):

- The crop and the rotation draw torchvision's ranges (offsets 0..2p in whole pixels; angles
  uniform in [-20, 20] degrees) and sample as torchvision does (nearest pixel, black corners,
  about ((W - 1) / 2, (H - 1) / 2)): the same angle gives the same pixels.
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

import functools
from collections.abc import Callable, Sequence

import kornia.augmentation as ka
import kornia.enhance as ke
import torch
from kornia.geometry.transform import get_rotation_matrix2d, get_shear_matrix2d, invert_affine_transform

from fedul_flwr.registry import Registry
from fedul_flwr.rng import torch_from_seed

__all__ = ["AUGMENTATIONS", "RANDAUGMENT_OPS", "Augmentation", "Cutout", "RandAugment", "ReflectCrop", "build_augmentation"]

Stage = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
"""``stage(images [B, C, H, W], generator) -> same shape``: float in [0, 1], or uint8 where the
stage says ``float_input = False``; ``kornia = True`` marks a stage whose draws come from the
batch's second generator (Kornia's parameters)."""

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


class _KorniaStage:
    """A Kornia augmentation (``RandomHorizontalFlip`` or ``RandomErasing`` with p = 1 and
    ratio 1) as a stage, its parameters drawn from ``generator`` and handed to it.

    The draws are Kornia's (0.9) own, in its order, with ``generator`` in place of torch's
    global generator: the flip's per-image gate ``rand(B) < p``; the erasing's
    ``RectangleEraseGenerator``: areas, aspect ratios (1), x and y positions, each ``rand(B)``
    in float32 (``tests/test_augment.py`` checks them against Kornia's own sampling).
    """

    kornia = True

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def params(self, shape: torch.Size, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Kornia's parameters of this stage for a batch of ``shape`` ``[B, C, H, W]``."""

        b, h, w = shape[0], shape[-2], shape[-1]
        if isinstance(self.module, ka.RandomHorizontalFlip):
            return {"batch_prob": (torch.rand(b, generator=generator) < self.module.p).float(),
                    "forward_input_shape": torch.tensor(shape, dtype=torch.long)}  # fmt: skip
        sampler = self.module._param_generator
        scale = torch.as_tensor(sampler.scale, dtype=torch.float32)
        ratio = torch.as_tensor(sampler.ratio, dtype=torch.float32)
        if self.module.p != 1.0 or not ratio[0] >= 1.0:
            raise ValueError("_KorniaStage: erasing is drawn here with p = 1 and aspect ratios >= 1 only")
        areas = (scale[0] + torch.rand(b, generator=generator) * (scale[1] - scale[0])) * (h * w)
        ratios = ratio[0] + torch.rand(b, generator=generator) * (ratio[1] - ratio[0])
        heights = torch.round((areas * ratios) ** (1 / 2)).clamp(1.0, h)
        widths = torch.round((areas / ratios) ** (1 / 2)).clamp(1.0, w)
        xs = torch.rand(b, generator=generator) * (w - widths + 1)
        ys = torch.rand(b, generator=generator) * (h - heights + 1)
        return {"widths": widths.floor(), "heights": heights.floor(), "xs": xs.floor(), "ys": ys.floor(),
                "values": torch.full((b,), float(sampler.value)), "batch_prob": torch.ones(b),
                "forward_input_shape": torch.tensor(shape, dtype=torch.long)}  # fmt: skip

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self.module(images, params=self.params(images.shape, generator))


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

    def __init__(self, num_ops: int = 2, magnitude: int = 10, num_bins: int = 31, random_magnitude: bool = False) -> None:
        if num_ops < 1 or not 0 <= magnitude < num_bins:
            raise ValueError(f"RandAugment: num_ops must be >= 1 and magnitude in 0..{num_bins - 1}; got {num_ops}, {magnitude}")
        self.num_ops, self.level = num_ops, magnitude / (num_bins - 1)
        self.random_magnitude = random_magnitude
        self.translate = 0.3 if random_magnitude else 150.0 / 331.0  # largest shift, a fraction of the side

    def draw(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Operation indices, signs and levels: three CPU tensors ``[num_ops, batch]`` (long;
        float +-1; float64 in [0, 1], uniform with ``random_magnitude``, else the fixed level)."""
        ops = torch.randint(0, len(RANDAUGMENT_OPS), (self.num_ops, batch), generator=generator)
        signs = torch.where(torch.rand(self.num_ops, batch, generator=generator) < 0.5, -1.0, 1.0)
        if self.random_magnitude:
            levels = torch.rand(self.num_ops, batch, generator=generator, dtype=torch.float64)
        else:
            levels = torch.full((self.num_ops, batch), self.level, dtype=torch.float64)
        return ops, signs, levels

    def magnitude(self, op: str, side: int, level: torch.Tensor | float | None = None) -> torch.Tensor | float:
        """The unsigned magnitude of ``op`` for ``side``-pixel images at ``level`` in [0, 1]
        (a float or a tensor of levels; default: the fixed level), torchvision's table:
        shear tan, pixels, degrees, enhance factor - 1, bits kept (posterize), threshold in
        [0, 1] (solarize); 0 for operations without one."""
        level = self.level if level is None else level
        if op in ("translate-x", "translate-y"):
            shift = self.translate * side * level
            return float(int(shift)) if isinstance(shift, float) else shift.floor()
        if op == "posterize":
            bits = 8 - 4.0 * level
            return float(round(bits)) if isinstance(bits, float) else bits.round()
        if op == "solarize":
            return 1.0 - level
        scale = {"shear-x": 0.3, "shear-y": 0.3, "rotate": 30.0, "brightness": 0.9, "color": 0.9, "contrast": 0.9, "sharpness": 0.9}
        return scale.get(op, 0.0) * level

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
        ops, signs, levels = self.draw(len(images), generator)
        side = images.shape[-1]
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
                value = self.magnitude(name, side, levels[step, rows]).float() * (signs[step, rows] if name in _SIGNED else 1.0)
                picked = rows.to(out.device, non_blocking=True)
                out[picked] = _enhance(name, out[picked], value.to(out.device, torch.float32, non_blocking=True))
            rows = geometric.nonzero().squeeze(1)
            if len(rows):
                names = [RANDAUGMENT_OPS[i] for i in ops[step, rows].tolist()]
                values = torch.stack([self.magnitude(n, side, levels[step, r]) for n, r in zip(names, rows.tolist(), strict=True)]).float()
                picked = rows.to(out.device, non_blocking=True)
                out[picked] = _warp(out[picked], names, values * signs[step, rows])
        return out


def nearest_affine(images: torch.Tensor, matrix: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
    """Warp each image by its own affine map, nearest pixel, black outside: one gather.

    Output pixel (x, y) of image i takes the input pixel nearest to ``matrix[i]^-1 (x, y, 1)``
    (Kornia's and torchvision's convention: ``matrix`` maps input to output coordinates, in
    pixels, the origin at the centre of the top-left pixel), or 0 where that falls outside
    the image. Kornia's ``warp_affine`` computes the same through PyTorch's ``grid_sample``,
    which needs float images: a rotation of 128 (448) uint8 28 x 28 images took 2.5 (4.4) ms
    of CPU time through it and the conversions to float and back, against 1.7 (3.0) ms for
    this gather on the uint8 images (one thread, medians of 40, measured while writing it).

    Parameters
    ----------
    images : torch.Tensor
        ``[B, C, H, W]``, any dtype and device.
    matrix : torch.Tensor
        float ``[B, 2, 3]`` (CPU or the images' device).
    inverse : bool
        ``matrix`` is already the inverse map (output to input coordinates).

    Returns
    -------
    torch.Tensor
        ``[B, C, H, W]``, the dtype and device of ``images``.
    """

    b, c, h, w = images.shape
    inverse = (matrix if inverse else invert_affine_transform(matrix.double())).float().to(images.device)  # [B, 2, 3]
    points = _pixel_grid(h, w, images.device)  # [3, HW]
    source = (inverse @ points).round_().long() + 1  # [B, 2, HW], in the zero-bordered image
    # one black border: every source outside the image clamps onto it
    index = source[:, 1].clamp_(0, h + 1) * (w + 2) + source[:, 0].clamp_(0, w + 1)
    bordered = torch.nn.functional.pad(images, (1, 1, 1, 1)).flatten(2)  # [B, C, (H + 2)(W + 2)]
    return bordered.gather(2, index[:, None, :].expand(b, c, h * w)).view(b, c, h, w)


@functools.lru_cache(maxsize=8)
def _pixel_grid(h: int, w: int, device: torch.device) -> torch.Tensor:
    """float ``[3, H W]``: the homogeneous (x, y, 1) of every pixel, row by row (built once per
    size and device, not per batch)."""
    ys, xs = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
    return torch.stack([xs.flatten(), ys.flatten(), torch.ones_like(xs.flatten())]).float()


def _warp(images: torch.Tensor, names: Sequence[str], values: torch.Tensor) -> torch.Tensor:
    """RandAugment's geometric operations in one warp: image i of ``images`` ``[b, C, H, W]``
    by operation ``names[i]`` with signed magnitude ``values[i]`` (black fill, as torchvision's
    RandAugment; shear about the top-left corner, rotation about the centre)."""

    b, _, h, w = images.shape
    kind = torch.tensor([("shear-x", "shear-y", "translate-x", "translate-y", "rotate").index(n) for n in names])
    zero = torch.zeros(b)
    matrix = get_shear_matrix2d(torch.zeros(b, 2), sx=torch.where(kind == 0, values, zero), sy=torch.where(kind == 1, values, zero))
    matrix = matrix[:, :2].clone()
    matrix[:, 0, 2] += torch.where(kind == 2, values, zero)
    matrix[:, 1, 2] += torch.where(kind == 3, values, zero)
    rotate = kind == 4
    if rotate.any():
        matrix[rotate] = _rotation(values[rotate], h, w)
    return nearest_affine(images, matrix)


def _rotation(degrees: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """float ``[n, 2, 3]``: rotations by ``degrees`` ``[n]`` (counter-clockwise) about the
    pixel-grid centre ((W - 1) / 2, (H - 1) / 2), torchvision's centre."""

    centre = torch.tensor([[(w - 1) / 2, (h - 1) / 2]]).expand(len(degrees), 2)
    return get_rotation_matrix2d(centre, degrees, torch.ones(len(degrees), 2))


def _enhance(name: str, images: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """RandAugment's pixel operation ``name`` on float ``images`` ``[b, C, H, W]`` in [0, 1],
    image i with signed magnitude ``value[i]`` (``[b]``, on the images' device)."""

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
        return ke.posterize(images, bits=value.round().to(torch.int64))
    if name == "solarize":
        return ke.solarize(images, thresholds=value)
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

    float_input = False

    def __init__(self, side: int, padding: int) -> None:
        self.side, self.padding = side, padding

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Crop ``images`` ``[B, C, H, W]`` (H = W = side, any dtype); same shape, dtype and device."""
        b, c, side, pad = len(images), images.shape[1], self.side, self.padding
        offsets = torch.randint(0, 2 * pad + 1, (2, b, 1), generator=generator).to(images.device, non_blocking=True)
        grid = torch.arange(side, device=images.device)
        rows, cols = offsets[0] + grid, offsets[1] + grid  # [B, side] each, into the padded image
        padded = torch.nn.functional.pad(images, (pad, pad, pad, pad), mode="reflect")
        padded = padded.gather(2, rows[:, None, :, None].expand(b, c, side, side + 2 * pad))
        return padded.gather(3, cols[:, None, None, :].expand(b, c, side, side))


def _weak(side: int, flip: bool) -> list[Stage]:

    stages: list[Stage] = [ReflectCrop(side, max(1, side // 8))]
    return stages + [_KorniaStage(ka.RandomHorizontalFlip(p=0.5))] if flip else stages


def _strong(side: int, flip: bool) -> list[Stage]:

    cutout = ka.RandomErasing(scale=(0.02, 0.25), ratio=(1.0, 1.0), value=127 / 255, p=1.0)
    return [*_weak(side, flip), RandAugment(num_ops=2, magnitude=10), _KorniaStage(cutout)]


class Cutout:
    """Cutout as FixMatch's and USB's code draw it (``CutoutAbs``): per image a square of
    side v, uniform on [0, ``max_fraction`` side], centred on a uniformly drawn pixel and cut
    off at the border, filled grey (127); one mask for the batch.

    Parameters
    ----------
    max_fraction : float
        Largest side of the square, a fraction of the image side (0.5).
    """

    def __init__(self, max_fraction: float = 0.5) -> None:
        self.max_fraction = max_fraction

    def draw(self, batch: int, side: int, generator: torch.Generator) -> torch.Tensor:
        """int64 ``[4, batch]``: the squares' x0, x1, y0, y1 (pixels, half-open)."""
        size = torch.rand(batch, generator=generator) * self.max_fraction * side
        centre = torch.rand(2, batch, generator=generator) * side
        low = (centre - size / 2).clamp(min=0).floor()
        high = torch.minimum(low + size, torch.tensor(float(side))).floor()
        return torch.stack([low[0], high[0], low[1], high[1]]).long()

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Cut the squares out of float ``images`` ``[B, C, H, W]`` in [0, 1] (H = W)."""
        box = self.draw(len(images), images.shape[-1], generator).to(images.device, non_blocking=True)
        grid = torch.arange(images.shape[-1], device=images.device)
        xs = (grid >= box[0, :, None]) & (grid < box[1, :, None])  # [B, W]
        ys = (grid >= box[2, :, None]) & (grid < box[3, :, None])  # [B, H]
        mask = ys[:, None, :, None] & xs[:, None, None, :]
        return images.masked_fill(mask, 127 / 255)


def _strong_random(side: int, flip: bool) -> list[Stage]:
    return [*_weak(side, flip), RandAugment(num_ops=2, random_magnitude=True), Cutout(0.5)]


class RandomRotation:
    """Rotate each image by its own angle, uniform on [-``degrees``, ``degrees``], about the
    centre, nearest pixel, black corners (torchvision's ``RandomRotation(degrees)``), as one
    gather (:func:`nearest_affine`) on the images' dtype.

    Parameters
    ----------
    degrees : float
        Largest angle, degrees.
    """

    float_input = False

    def __init__(self, degrees: float) -> None:
        self.degrees = degrees

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Rotate ``images`` ``[B, C, H, W]`` (any dtype); same shape, dtype and device."""
        angles = (torch.rand(len(images), generator=generator) * 2 - 1) * self.degrees
        return nearest_affine(images, _rotation(-angles, images.shape[-2], images.shape[-1]), inverse=True)


def _rotate(side: int, flip: bool) -> list[Stage]:
    return [RandomRotation(20.0)]


AUGMENTATIONS.add("none", lambda side, flip: [])
AUGMENTATIONS.add("weak", _weak)
AUGMENTATIONS.add("strong", _strong)
AUGMENTATIONS.add("strong-random", _strong_random)
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
    flip : bool
        Whether horizontal flips are allowed: the run dataset's
        :attr:`~fedul_flwr.data.datasets.DatasetInfo.flip` (``ClientData.flip``).

    Raises
    ------
    UnknownChoiceError
        On an unknown name (lists the valid ones).
    """

    def __init__(self, name: str, image_side: int, flip: bool) -> None:
        self.name = name
        self.stages = AUGMENTATIONS.get(name)(image_side, bool(flip))

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
        # two CPU generators of the batch seed: the crop, rotation and RandAugment draw from
        # the first, Kornia's flip and erasing from the second (as the global generator,
        # seeded alike, gave them before)
        own, kornia = torch_from_seed(seed), torch_from_seed(seed)
        out = images
        for stage in self.stages:
            if out.dtype == torch.uint8 and getattr(stage, "float_input", True):
                out = out.float().div_(255.0)
            out = stage(out, kornia if getattr(stage, "kornia", False) else own)
        return out if out.dtype == torch.uint8 else out.mul_(255.0).round_().clamp_(0.0, 255.0).to(torch.uint8)

    def __repr__(self) -> str:
        return f"Augmentation({self.name!r})"


def build_augmentation(name: str, image_side: int, flip: bool) -> Augmentation | None:
    """The augmentation ``name`` for these images (horizontal flips where ``flip``), or None
    for ``none``."""
    return None if name == "none" else Augmentation(name, image_side, flip)
