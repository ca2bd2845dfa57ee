"""Augmentation of training batches (fedul_flwr.augment) and how the loop applies it."""

from __future__ import annotations

import pytest
import torch

from fedul_flwr.augment import AUGMENTATIONS, Augmentation, build_augmentation
from fedul_flwr.methods.base import LocalTask, Stream
from fedul_flwr.training import augment_generator, iterate_batches


def _images(n: int = 16, channels: int = 1, side: int = 28) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, channels, side, side), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("name", ["weak", "strong", "rotate"])
@pytest.mark.parametrize(("channels", "side", "dataset"), [(1, 28, "mnist"), (3, 32, "cifar10")])
def test_views_keep_shape_and_dtype_and_depend_only_on_the_generator(name: str, channels: int, side: int, dataset: str) -> None:
    x = _images(8, channels, side)
    augment = Augmentation(name, side, dataset)
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
    out = Augmentation("weak", 28, "mnist")(x, torch.Generator().manual_seed(0))
    assert len({bytes(o.numpy()) for o in out}) > 8


def test_flips_only_where_the_dataset_allows_them() -> None:
    """A left-to-right ramp, which crops only shift: a mirrored dataset flips some copies
    (their values fall to the right), digits never."""
    ramp = torch.arange(28, dtype=torch.uint8).repeat(1, 28, 1) * 9  # [1, 28, 28], value grows to the right
    x = ramp.unsqueeze(0).repeat(64, 1, 1, 1)
    for dataset, flips in (("mnist", False), ("fashion-mnist", True)):
        out = Augmentation("weak", 28, dataset)(x, torch.Generator().manual_seed(0)).float()
        decreasing = (out[:, 0, 14, 20] < out[:, 0, 14, 8]).any()  # a flipped copy falls to the right
        assert bool(decreasing) == flips, dataset


def test_strong_view_differs_more_than_weak_from_the_image() -> None:
    x = _images(32)
    g = torch.Generator
    weak = Augmentation("weak", 28, "mnist")(x, g().manual_seed(0)).float()
    strong = Augmentation("strong", 28, "mnist")(x, g().manual_seed(0)).float()
    assert (strong - x.float()).abs().mean() > (weak - x.float()).abs().mean()


def test_unknown_augmentation_names_the_choices() -> None:
    with pytest.raises(ValueError, match="augmentation"):
        Augmentation("blur", 28, "mnist")
    assert build_augmentation("none", 28, "mnist") is None
    assert set(AUGMENTATIONS.names()) >= {"none", "weak", "strong", "rotate"}


def test_the_loop_adds_views_and_augments_without_changing_the_batch_order() -> None:
    x, y = _images(20), torch.arange(20)
    weak = Augmentation("weak", 28, "mnist")
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
