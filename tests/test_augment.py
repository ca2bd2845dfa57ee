"""Augmentation of training batches (fedul_flwr.augment) and how the loop applies it."""

from __future__ import annotations

import pytest
import torch

from fedul_flwr.data.datasets import dataset_info, run_dataset_info
from fedul_flwr.data.image_dataset import DatasetError
from fedul_flwr.augment import AUGMENTATIONS, RANDAUGMENT_OPS, Augmentation, RandAugment, build_augmentation
from fedul_flwr.methods.base import LocalTask, Stream
from fedul_flwr.training import augment_generator, iterate_batches


def _images(n: int = 16, channels: int = 1, side: int = 28) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, channels, side, side), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("name", ["weak", "strong", "rotate"])
@pytest.mark.parametrize(("channels", "side", "flip"), [(1, 28, False), (3, 32, True)])
def test_views_keep_shape_and_dtype_and_depend_only_on_the_generator(name: str, channels: int, side: int, flip: bool) -> None:
    x = _images(8, channels, side)
    augment = Augmentation(name, side, flip)
    state = torch.get_rng_state()
    a = augment(x, torch.Generator().manual_seed(5))
    assert torch.equal(torch.get_rng_state(), state)  # the global generator is neither used nor changed
    torch.manual_seed(123)  # a different global state changes nothing
    b = augment(x, torch.Generator().manual_seed(5))
    c = augment(x, torch.Generator().manual_seed(6))
    assert a.shape == x.shape and a.dtype == torch.uint8
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.equal(a, x)


def test_each_image_draws_its_own_parameters() -> None:
    """The same image 16 times in a batch: the weak crops differ between copies."""
    x = _images(1).repeat(16, 1, 1, 1)
    out = Augmentation("weak", 28, False)(x, torch.Generator().manual_seed(0))
    assert len({bytes(o.numpy()) for o in out}) > 8


def test_flips_only_where_the_dataset_allows_them() -> None:
    """A left-to-right ramp, which crops only shift: a mirrored dataset flips some copies
    (their values fall to the right), digits never."""
    ramp = torch.arange(28, dtype=torch.uint8).repeat(1, 28, 1) * 9  # [1, 28, 28], value grows to the right
    x = ramp.unsqueeze(0).repeat(64, 1, 1, 1)
    for dataset, flips in (("mnist", False), ("fashion-mnist", True)):
        out = Augmentation("weak", 28, dataset_info(dataset).flip)(x, torch.Generator().manual_seed(0)).float()
        decreasing = (out[:, 0, 14, 20] < out[:, 0, 14, 8]).any()  # a flipped copy falls to the right
        assert bool(decreasing) == flips, dataset


def test_horizontal_flip_is_a_fact_of_the_dataset_that_the_run_key_sets(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Built-ins keep their own fact under ``auto``; a typed value (bool or string) wins for any
    dataset; an ``hf:`` dataset flips only when the run says so; the fact travels to the nodes."""
    from PIL import Image

    from fedul_flwr.data.image_dataset import DatasetInfo

    for k, name in enumerate(("left", "right")):
        (tmp_path / name).mkdir()
        for i in range(3):
            Image.new("L", (16, 16), 60 * k + i).save(tmp_path / name / f"{i}.png")
    own = f"hf:{tmp_path}"
    cases = [("mnist-sample", "auto", False), ("cifar10", "auto", True), ("fashion-mnist", False, False),
             ("mnist-sample", True, True), ("mnist-sample", "TRUE", True), (own, "auto", False), (own, True, True)]
    for dataset, value, expected in cases:
        info = run_dataset_info({"dataset": dataset, "horizontal-flip": value})
        assert info.flip is expected, (dataset, value)
        assert DatasetInfo.from_json(info.to_json()) == info
    with pytest.raises(DatasetError, match=r"horizontal-flip='sometimes' is not one of \('auto', 'true', 'false'\)"):
        run_dataset_info({"dataset": "mnist-sample", "horizontal-flip": "sometimes"})
    from fedul_flwr.preflight import resolve_config
    from fedul_flwr.data.simulated import load_client

    for value in (True, False):  # a simulated client carries the run's fact to its augmentation
        cfg = resolve_config({"dataset": own, "horizontal-flip": value, "num-sets": 2, "val-fraction": 0.0})
        assert load_client(cfg, 0, 1, frozenset({"unlabeled", "usets"})).flip is value


def test_strong_view_differs_more_than_weak_from_the_image() -> None:
    x = _images(32)
    g = torch.Generator
    weak = Augmentation("weak", 28, False)(x, g().manual_seed(0)).float()
    strong = Augmentation("strong", 28, False)(x, g().manual_seed(0)).float()
    assert (strong - x.float()).abs().mean() > (weak - x.float()).abs().mean()


def test_unknown_augmentation_names_the_choices() -> None:
    with pytest.raises(ValueError, match="augmentation"):
        Augmentation("blur", 28, False)
    assert build_augmentation("none", 28, False) is None
    assert set(AUGMENTATIONS.names()) >= {"none", "weak", "strong", "rotate"}


def test_the_loop_adds_views_and_augments_without_changing_the_batch_order() -> None:
    x, y = _images(20), torch.arange(20)
    weak = Augmentation("weak", 28, False)
    plain = LocalTask({"u": Stream({"x": x, "y": y}, 8)}, lambda m, b: torch.zeros(()))
    viewed = LocalTask({"u": Stream({"x": x, "y": y}, 8, views={"weak": ("x", weak)})}, lambda m, b: torch.zeros(()))
    order = [b["u"]["y"] for b in iterate_batches(plain, torch.Generator().manual_seed(1), torch.device("cpu"), lambda v: v)]
    batches = list(
        iterate_batches(viewed, torch.Generator().manual_seed(1), torch.device("cpu"), lambda v: v.float(), weak, augment_generator(3))
    )
    assert [b["u"]["y"].tolist() for b in batches] == [o.tolist() for o in order]
    first = batches[0]["u"]
    assert first["weak"].dtype == torch.float32 and first["weak"].shape == (8, 1, 28, 28)
    assert not torch.equal(first["x"], x[first["y"]].float())  # the run's augment applied to the images
    with pytest.raises(ValueError, match="views of missing tensors"):
        Stream({"x": x}, 8, views={"strong": ("image", weak)})


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _marker(n: int, side: int = 28, row: int = 14, col: int = 14) -> torch.Tensor:
    """``n`` copies of a black image with one 255 pixel at (row, col)."""
    x = torch.zeros(n, 1, side, side, dtype=torch.uint8)
    x[:, 0, row, col] = 255
    return x


def _positions(out: torch.Tensor) -> torch.Tensor:
    """(row, col) of the brightest pixel of each image ``[n, 1, H, W]`` -> ``[n, 2]``."""
    flat = out[:, 0].flatten(1).argmax(1)
    return torch.stack([flat // out.shape[-1], flat % out.shape[-1]], 1)


def test_weak_crop_offsets_are_uniform_over_the_padding() -> None:
    """Padding 3 at 28: the marker moves by -3..3 pixels on each axis, the 49 shifts about
    equally often, each image with its own shift."""
    out = Augmentation("weak", 28, False)(_marker(4900), torch.Generator().manual_seed(0))
    shift = _positions(out) - 14
    assert int(shift.abs().max()) == 3
    counts = torch.bincount((shift[:, 0] + 3) * 7 + shift[:, 1] + 3, minlength=49).float()
    assert counts.min() > 50 and counts.max() < 150  # expected 100 each


def test_weak_flips_half_of_a_mirrored_batch() -> None:
    x = _marker(2000, col=4)  # off-centre: a flip moves it to the right half
    out = Augmentation("weak", 28, True)(x, torch.Generator().manual_seed(0))
    flipped = (_positions(out)[:, 1] > 14).float().mean()
    assert 0.45 < float(flipped) < 0.55


def test_rotation_angles_are_uniform_within_20_degrees() -> None:
    """A marker 10 pixels right of the centre: its angle about the centre after rotation is
    uniform on [-20, 20] degrees (mean 0, standard deviation 40 / sqrt(12) = 11.5)."""
    out = Augmentation("rotate", 29, False)(_marker(3000, side=29, row=14, col=24), torch.Generator().manual_seed(0))
    kept = out.flatten(1).amax(1) == 255
    pos = _positions(out[kept]).float() - 14
    angle = torch.rad2deg(torch.atan2(pos[:, 0], pos[:, 1]))
    assert kept.float().mean() > 0.9 and angle.abs().max() <= 20 + 6  # one pixel of nearest rounding at radius 10
    assert abs(float(angle.mean())) < 1.0 and 10.0 < float(angle.std()) < 13.0
    assert (angle > 10).float().mean() > 0.2 and (angle < -10).float().mean() > 0.2


def test_randaugment_draws_its_operations_per_image_uniformly() -> None:
    ops, signs, _ = RandAugment(2, 10).draw(14000, torch.Generator().manual_seed(0))
    assert ops.shape == signs.shape == (2, 14000)
    counts = torch.bincount(ops.flatten(), minlength=len(RANDAUGMENT_OPS)).float()
    assert counts.min() > 1800 and counts.max() < 2200  # expected 2000 each
    assert 0.48 < float((signs > 0).float().mean()) < 0.52
    assert (ops[0] != ops[1]).any() and len(set(ops[0, :50].tolist())) > 5  # per image, not per batch


@pytest.mark.parametrize("channels", [1, 3])
def test_each_randaugment_operation_matches_torchvision(channels: int) -> None:
    """Every operation at M = 10, batched, against torchvision's per-image op at the same
    magnitude on uint8 images: geometric ones pixel for pixel, the others within one level."""
    import math

    from torchvision.transforms.v2 import functional as F

    from fedul_flwr.augment import _enhance, _warp

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (16, channels, 28, 28), dtype=torch.uint8, generator=g)
    x = torch.nn.functional.avg_pool2d(x.float(), 3, 1, 1).round().to(torch.uint8)  # natural-ish images
    ra = RandAugment(2, 10)
    reference = {
        "shear-x": lambda im, v: F.affine(im, angle=0.0, translate=[0, 0], scale=1.0, shear=[math.degrees(math.atan(v)), 0.0], center=[0, 0]),
        "shear-y": lambda im, v: F.affine(im, angle=0.0, translate=[0, 0], scale=1.0, shear=[0.0, math.degrees(math.atan(v))], center=[0, 0]),
        "translate-x": lambda im, v: F.affine(im, angle=0.0, translate=[int(v), 0], scale=1.0, shear=[0.0, 0.0]),
        "translate-y": lambda im, v: F.affine(im, angle=0.0, translate=[0, int(v)], scale=1.0, shear=[0.0, 0.0]),
        "rotate": lambda im, v: F.rotate(im, v),
        "brightness": lambda im, v: F.adjust_brightness(im, 1 + v),
        "color": lambda im, v: F.adjust_saturation(im, 1 + v),
        "contrast": lambda im, v: F.adjust_contrast(im, 1 + v),
        "sharpness": lambda im, v: F.adjust_sharpness(im, 1 + v),
        "posterize": lambda im, v: F.posterize(im, int(v)),
        "solarize": lambda im, v: F.solarize(im, 255 * v),
        "autocontrast": lambda im, v: F.autocontrast(im),
        "equalize": lambda im, v: F.equalize(im),
    }  # fmt: skip
    assert set(reference) == set(RANDAUGMENT_OPS) - {"identity"}
    assert (ra.magnitude("translate-x", 28), ra.magnitude("rotate", 28), ra.magnitude("posterize", 28)) == (4.0, 10.0, 7.0)
    for name, ref in reference.items():
        for sign in (1.0, -1.0) if name in ("posterize", "solarize", "autocontrast", "equalize") else (1.0, -1.0):
            value = ra.magnitude(name, 28) * (sign if name not in ("posterize", "solarize") else 1.0)
            values = torch.full((len(x),), value)
            xf = x.float() / 255
            geometric = name in ("shear-x", "shear-y", "translate-x", "translate-y", "rotate")
            ours = _warp(xf, [name] * len(x), values) if geometric else _enhance(name, xf, values)
            ours = (ours * 255).round().to(torch.uint8)
            theirs = torch.stack([ref(im, value) for im in x])
            diff = (ours.int() - theirs.int()).abs()
            assert int(diff.max()) <= (0 if geometric else 1), (name, sign)
    assert not torch.equal(reference["rotate"](x[0], 10.0), x[0])  # the comparison is not vacuous


def test_cutout_erases_one_grey_square_of_2_to_25_percent() -> None:
    cutout = Augmentation("strong", 28, False).stages[-1]
    x = torch.zeros(500, 1, 28, 28)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        out = (cutout(x, torch.Generator()) * 255).round()
    grey = out == 127
    area = grey.flatten(1).float().mean(1)
    assert bool((area > 0).all())  # every image erased
    assert float(area.min()) >= 0.01 and float(area.max()) <= 0.26  # whole pixels around 2-25%
    rows, cols = grey[:, 0].any(2).sum(1), grey[:, 0].any(1).sum(1)
    assert (rows - cols).abs().max() <= 1  # squares
    assert float(area.std()) > 0.03  # each image its own size


@pytest.mark.parametrize("name", ["weak", "strong", "rotate"])
def test_a_batch_is_transformed_in_one_call_per_stage_not_per_image(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stage sees the whole batch at once."""
    augment = Augmentation(name, 28, True)
    sizes: list[int] = []
    stages = list(augment.stages)
    augment.stages = [lambda x, g, s=s: (sizes.append(len(x)), s(x, g))[1] for s in stages]
    augment(_images(64), torch.Generator().manual_seed(0))
    assert sizes == [64] * len(stages)


@CUDA
@pytest.mark.parametrize("name", ["weak", "strong", "rotate"])
def test_views_stay_on_the_cuda_device_with_the_cpu_parameters(name: str) -> None:
    """On a GPU batch: uint8 on the same device, deterministic, and the same parameters as on
    the CPU (a pure shift/flip view is then identical)."""
    x = _images(32, 3, 32)
    augment = Augmentation(name, 32, True)
    a = augment(x.cuda(), torch.Generator().manual_seed(4))
    b = augment(x.cuda(), torch.Generator().manual_seed(4))
    assert a.device.type == "cuda" and a.dtype == torch.uint8 and torch.equal(a, b)
    cpu = augment(x, torch.Generator().manual_seed(4))
    if name == "weak":
        assert torch.equal(a.cpu(), cpu)
    else:
        assert (a.cpu().int() - cpu.int()).abs().gt(1).float().mean() < 0.02


def test_nearest_affine_rotates_uint8_images_as_torchvision_does() -> None:
    """The rotation's sampling: torchvision's ``rotate`` at the same angle, pixel for pixel, on
    the uint8 images themselves, given the map or its inverse."""
    from torchvision.transforms.v2 import functional as F

    from fedul_flwr.augment import _rotation, nearest_affine

    x = _images(6, 3, 32)
    angles = torch.tensor([-20.0, -13.5, -2.0, 0.0, 7.25, 20.0])
    out = nearest_affine(x, _rotation(angles, 32, 32))
    assert out.dtype == torch.uint8
    assert torch.equal(out, nearest_affine(x, _rotation(-angles, 32, 32), inverse=True))
    assert torch.equal(out, torch.stack([F.rotate(im, float(a)) for im, a in zip(x, angles, strict=True)]))


def _augment_through_the_global_generator(augment: Augmentation, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The path before :mod:`fedul_flwr.rng` drew Kornia's parameters: Kornia sampling them
    from torch's global generator, forked and seeded with the batch seed."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    own = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = images
        for stage in augment.stages:
            if out.dtype == torch.uint8 and getattr(stage, "float_input", True):
                out = out.float().div_(255.0)
            out = stage.module(out) if getattr(stage, "kornia", False) else stage(out, own)
    return out if out.dtype == torch.uint8 else out.mul_(255.0).round_().clamp_(0.0, 255.0).to(torch.uint8)


@pytest.mark.parametrize("name", ["weak", "strong", "strong-random"])
@pytest.mark.parametrize(("channels", "side", "flip"), [(1, 28, False), (3, 32, True)])
def test_kornias_flip_and_erasing_draw_from_the_batch_generator_as_kornia_did_from_the_global_one(
    name: str, channels: int, side: int, flip: bool
) -> None:
    """The flip gates and erasing boxes drawn here from the batch's generator are Kornia's own
    draws from its global generator seeded alike: the views are the same bit for bit."""
    augment = Augmentation(name, side, flip)
    for batch in (1, 7, 64):
        x = _images(batch, channels, side)
        for seed in range(4):
            old = _augment_through_the_global_generator(augment, x, torch.Generator().manual_seed(seed))
            assert torch.equal(augment(x, torch.Generator().manual_seed(seed)), old), (batch, seed)


def test_parallel_threads_augment_as_one_thread_does() -> None:
    """Two threads augmenting at once (no lock) give each its own views, those of a lone call."""
    from concurrent.futures import ThreadPoolExecutor

    augment = Augmentation("strong", 32, True)
    x = _images(64, 3, 32)
    alone = [augment(x, torch.Generator().manual_seed(s)) for s in range(8)]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda s: augment(x, torch.Generator().manual_seed(s)), range(8)))
    assert all(torch.equal(a, b) for a, b in zip(alone, together, strict=True))
