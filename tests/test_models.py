"""The model registry: sizes of the named architectures, width factors, seeded weights."""

from __future__ import annotations

import pytest
import torch

from fedul_flwr.methods.base import ModelSpec
from fedul_flwr.models import build_model


def _size(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_wrn_28_2_has_fixmatchs_size_and_takes_both_image_sizes() -> None:
    model = build_model("wrn-28-2", 3, 10, 32, seed=0)
    assert _size(model) == 1_467_610  # FixMatch's WRN-28-2: 1.47M
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert build_model("wrn-28-2", 1, 10, 28, seed=0)(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert torch.equal(build_model("wrn-28-2", 3, 10, 32, seed=0).classifier.weight, model.classifier.weight)


def test_resnet8_and_width_factors() -> None:
    """ResNet-8 is ~78k parameters on CIFAR-10; a width of 1/4 scales every channel count
    (LeNet: 20, 50, 500 units -> 5, 12, 125), so the model is about 1/16 as large."""
    full, quarter = build_model("resnet8", 3, 10, 32, seed=0), build_model("resnet8", 3, 10, 32, seed=0, width=0.25)
    assert _size(full) == 78_042 and quarter(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert 10 < _size(full) / _size(quarter) < 20
    lenet = build_model("small-cnn", 1, 10, 28, seed=0, width=0.25)
    assert [m.out_channels for m in lenet.features if isinstance(m, torch.nn.Conv2d)] == [5, 12]
    assert lenet.classifier[1].out_features == 125
    with pytest.raises(ValueError, match="model='wrn-28-2' cannot take width=0.5"):
        build_model("wrn-28-2", 3, 10, 32, width=0.5)
    with pytest.raises(ValueError, match="width 0 must be > 0"):
        ModelSpec("r", width=0)
    with pytest.raises(ValueError, match="initial='r' needs an exchanged model other than itself"):
        ModelSpec("r", initial="r")
    with pytest.raises(ValueError, match="initial='f' needs an exchanged model"):
        ModelSpec("k", exchanged=False, kept=True, initial="f")


def test_the_papers_models_on_the_100_classes_of_cifar100() -> None:
    """FedDB's WRN-28-2 and HASSLE's ResNet-8 with one output per class of CIFAR-100: only the
    last layer grows (90 more rows of 128 (WRN) or 64 (ResNet-8) weights and a bias each)."""
    from fedul_flwr.data.datasets import dataset_info

    info = dataset_info("cifar100")
    k = len(info.class_names)
    wrn = build_model("wrn-28-2", info.channels, k, info.image_size, seed=0)
    resnet8 = build_model("resnet8", info.channels, k, info.image_size, seed=0)
    assert wrn(torch.zeros(2, 3, 32, 32)).shape == (2, 100) and _size(wrn) == 1_467_610 + 128 * 90 + 90
    assert resnet8(torch.zeros(2, 3, 32, 32)).shape == (2, 100) and _size(resnet8) == 78_042 + 64 * 90 + 90


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("side", [24, 25])
def test_small_cnn_pooling_without_gradient_is_the_kernel_bit_for_bit(dtype: torch.dtype, channels_last: bool, side: int) -> None:
    from fedul_flwr.models import MaxPool2x2

    x = torch.randn(3, 5, side, side + 2, generator=torch.Generator().manual_seed(0)).to(dtype)
    x[0, 0, 0, 0] = float("nan")
    x[1, 1, :2, :2] = 0.5  # a tie
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        fast = MaxPool2x2()(x)
    kernel = torch.nn.functional.max_pool2d(x, 2)
    assert fast.shape == kernel.shape and fast.dtype == kernel.dtype
    assert torch.equal(fast.nan_to_num(), kernel.nan_to_num()) and torch.equal(fast.isnan(), kernel.isnan())
    assert fast.is_contiguous(memory_format=torch.channels_last) == channels_last
    assert isinstance(build_model("small-cnn", 1, 10, 28, seed=0).features[1], MaxPool2x2)


def test_small_cnn_pooling_with_gradient_is_the_kernel_s_backward() -> None:
    """A tie's gradient goes to one input, as max_pool2d's (elementwise maxima would split it)."""
    from fedul_flwr.models import MaxPool2x2

    x = torch.zeros(1, 1, 2, 2, requires_grad=True)
    MaxPool2x2()(x).sum().backward()
    assert x.grad is not None and sorted(x.grad.flatten().tolist()) == [0.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize("name", ["small-cnn", "simple-cnn", "paper-cnn", "resnet18", "resnet8", "wrn-28-2"])
def test_seeded_weights_are_those_of_torchs_global_generator_seeded_alike(name: str) -> None:
    """build_model(seed=s) draws from its own generator, bit for bit the weights the model got
    when built while torch's global CPU generator was seeded with s, and leaves the global
    generator as it was."""
    from fedul_flwr.models import MODELS

    if name == "resnet18":
        pytest.importorskip("torchvision")
    channels = 3 if name == "resnet18" else 1
    for seed in (0, 12345):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            reference = MODELS.get(name)(channels, 10, 32).state_dict()
        state = torch.get_rng_state()
        built = build_model(name, channels, 10, 32, seed=seed).state_dict()
        assert torch.equal(torch.get_rng_state(), state)
        assert list(built) == list(reference)
        assert all(torch.equal(built[k], reference[k]) for k in reference), name


def test_a_width_factor_model_is_seeded_as_before() -> None:
    from fedul_flwr.models import MODELS

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        reference = MODELS.get("small-cnn")(1, 10, 28, width=0.25).state_dict()
    built = build_model("small-cnn", 1, 10, 28, seed=3, width=0.25).state_dict()
    assert all(torch.equal(built[k], reference[k]) for k in reference)
