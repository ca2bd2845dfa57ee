"""Classifiers f: a small CPU-friendly CNN, the paper's MNIST CNN, a CIFAR ResNet-18 and WRN-28-2.

FedUL trains f through a fixed transition layer, but what is exchanged, aggregated and
finally used for prediction is f alone (Lu et al., ICLR 2022, Sec. 3). Every model maps
images ``[B, C, H, W]`` (float32, normalised) to class logits ``[B, K]``.

- ``small-cnn`` (default): LeNet, the MNIST backbone of the paper's Sec. 4.1 (2 conv layers
  with 20 and 50 channels, 5x5, + FC 500; ~0.43M parameters); fast on a CPU. Takes a width
  factor (HASSLE's residual models: 1/4 of the channels).
- ``paper-cnn``: App. D, Table D.2: 3 conv (64, 64, 128 channels, 5x5, BN) + FC
  6272-2048-512-K with BN (~14.2M parameters on MNIST).
- ``resnet18``: App. D, Table D.3: torchvision's ResNet-18 with a 3x3 stride-1 stem and no
  max-pool (the usual CIFAR adaptation), trained from scratch.
- ``resnet8``: the CIFAR ResNet-8 of He et al. (CVPR 2016; 3 stages of one basic block,
  16/32/64 channels, ~78k parameters), HASSLE's CIFAR model; takes a width factor.
- ``wrn-28-2``: Wide ResNet 28-2 (Zagoruyko and Komodakis, BMVC 2016), the model of FixMatch's
  and FedDB's CIFAR experiments (~1.47M parameters); torchvision has no CIFAR-style WRN.
- ``simple-cnn``: pfl-research's ``simple_cnn`` (the CIFAR-10 model of its benchmarks, Granqvist
  et al., 2024): 2 conv layers (32, 64 channels, 3x3) + max-pool + FC 128, dropout 0.25 and
  0.5 (~1.6M parameters on 32x32x3); the model of the peer benchmark.

Dropout (:class:`Dropout`) draws its masks from the generator the training loop gives it
(:data:`DROPOUT_GENERATOR`, seeded from the client's batch seed), never from torch's global
generator: a client's masks are a function of (run seed, round, node), whichever thread or
process trains it.

Every model has K outputs, K the run's dataset's number of classes (100 on CIFAR-100:
FedDB's and HASSLE's CIFAR-100 columns train WRN-28-2 and ResNet-8 with 100 outputs).
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable

import torch
from torch import nn

from fedul_flwr.registry import Registry
from fedul_flwr.rng import init_parameters, torch_from_seed

ModelFactory = Callable[..., nn.Module]
MODELS: Registry[ModelFactory] = Registry("model")
"""Model factories ``(in_channels, num_classes, image_size[, width]) -> nn.Module`` by name;
those with a ``width`` keyword scale their channels by it."""


DROPOUT_GENERATOR: contextvars.ContextVar[torch.Generator | None] = contextvars.ContextVar("dropout_generator", default=None)
"""The generator :class:`Dropout` draws its masks from in this thread (the training loop sets
it per client and round; on the training device)."""
DROPOUT_MASKS: contextvars.ContextVar[dict[str, torch.Tensor] | None] = contextvars.ContextVar("dropout_masks", default=None)
"""Masks drawn beforehand, by the layer's ``cohort_name`` (the batched cohort,
:mod:`fedul_flwr.cohort`, draws each client's masks from its own generator and hands them to
its batched forward)."""


class Dropout(nn.Dropout):
    """``nn.Dropout(p)`` whose masks come from :data:`DROPOUT_GENERATOR`.

    In training mode each element of ``x`` is kept with probability 1 - p and scaled by
    1 / (1 - p) (Srivastava et al., JMLR 2014), the mask drawn by ``torch.bernoulli`` from the
    context's generator (or, in a batched cohort, the mask drawn beforehand from the client's
    generator, :data:`DROPOUT_MASKS`); in eval mode it is the identity. Shapes: any, unchanged.

    Raises
    ------
    RuntimeError
        In training mode with no generator set: a mask from torch's global generator would
        depend on which thread ran first.
    """

    cohort_name = ""
    """Its name in the model, set by the batched cohort (the key of :data:`DROPOUT_MASKS`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Drop elements of ``x`` (class docstring)."""
        if not self.training or self.p == 0:
            return x
        masks = DROPOUT_MASKS.get()
        if masks is not None and self.cohort_name in masks:
            return x * masks[self.cohort_name].to(x.dtype) / (1.0 - self.p)
        generator = DROPOUT_GENERATOR.get()
        if generator is None:
            raise RuntimeError("Dropout in training mode needs a generator in models.DROPOUT_GENERATOR (the training loop sets it)")
        keep = torch.empty(x.shape, device=x.device, dtype=torch.float32).bernoulli_(1.0 - self.p, generator=generator)
        return x * keep.to(x.dtype) / (1.0 - self.p)


def _scaled(channels: int, width: float) -> int:
    """``channels * width`` rounded, at least 1."""
    return max(1, int(round(channels * width)))


class MaxPool2x2(nn.MaxPool2d):
    """``nn.MaxPool2d(2)`` (2x2 windows, stride 2, no padding; an odd last row or column is
    dropped) whose forward pass without gradient is two elementwise maxima of strided views
    (rows, then columns) instead of the pooling kernel: the same numbers bit for bit (a
    maximum is exact; NaN propagates in both), 2-5x faster on a CPU in channels-last float32
    and bfloat16 (the kernel was as slow as the convolution before it when evaluating a
    small CNN). With gradient it is the kernel, whose backward sends a tie's gradient to one
    input (the maxima would split it).

    Shapes: ``[B, C, H, W]`` -> ``[B, C, H // 2, W // 2]``, in the input's memory format.
    """

    def __init__(self) -> None:
        super().__init__(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pool ``x`` ``[B, C, H, W]`` (class docstring)."""
        if torch.is_grad_enabled() and x.requires_grad:
            return super().forward(x)
        h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
        rows = torch.maximum(x[..., 0:h:2, :w], x[..., 1:h:2, :w])
        return torch.maximum(rows[..., 0::2], rows[..., 1::2])


@MODELS.register("small-cnn")
class SmallCNN(nn.Module):
    """LeNet (LeCun et al., 1998; the Caffe variant), the MNIST backbone named in the paper's
    Sec. 4.1: Conv(C,20,5)-MaxPool(2)-ReLU-Conv(20,50,5)-MaxPool(2)-ReLU-FC(50*s*s,500)-ReLU-
    FC(500,K), with s = ((H-4)/2-4)/2 (4 on 28x28 inputs, 5 on 32x32). ~0.43M parameters on
    MNIST; no batch norm, so FedAvg has no running statistics to average. ``width`` scales
    the 20, 50 and 500 units (rounded, at least 1)."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, width: float = 1.0) -> None:
        super().__init__()
        side = ((image_size - 4) // 2 - 4) // 2
        c1, c2, hidden = _scaled(20, width), _scaled(50, width), _scaled(500, width)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 5),
            MaxPool2x2(),
            nn.ReLU(inplace=True),
            nn.Conv2d(c1, c2, 5),
            MaxPool2x2(),
            nn.ReLU(inplace=True),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c2 * side * side, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` -> logits ``[B, K]``."""
        return self.classifier(self.features(x))


@MODELS.register("simple-cnn")
def simple_cnn(in_channels: int, num_classes: int, image_size: int) -> nn.Sequential:
    """pfl-research's ``simple_cnn`` (``benchmarks/model/pytorch/cnn.py``) on NCHW inputs:
    Conv(C,32,3)-ReLU-Conv(32,64,3)-ReLU-MaxPool(2)-Dropout(0.25)-Flatten-FC(64 s s,128)-ReLU-
    Dropout(0.5)-FC(128,K), s = (H - 4) // 2; Glorot-uniform weights as pfl's (its
    ``Transpose2D`` of NHWC inputs is left out: inputs here are NCHW). The layers are at the
    same indices as pfl's minus that transpose, so the two share state-dict keys.

    Shapes: ``[B, C, H, W]`` float -> logits ``[B, K]``.
    """
    side = (image_size - 4) // 2
    model = nn.Sequential(
        nn.Conv2d(in_channels, 32, kernel_size=3), nn.ReLU(), nn.Conv2d(32, 64, kernel_size=3), nn.ReLU(),
        nn.MaxPool2d(2), Dropout(0.25), nn.Flatten(), nn.Linear(side * side * 64, 128), nn.ReLU(),
        Dropout(0.5), nn.Linear(128, num_classes),
    )  # fmt: skip
    _glorot_uniform(model)
    return model


def _glorot_uniform(model: nn.Module, generator: torch.Generator | None = None) -> None:
    """pfl's Glorot-uniform weights of every Conv2d and Linear of ``model`` (after their defaults)."""
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(module.weight, generator=generator)


@MODELS.register("paper-cnn")
class PaperCNN(nn.Module):
    """The paper's MNIST network (App. D, Table D.2).

    Conv(C,64,5,1,2)-BN-ReLU-MaxPool(2) -> Conv(64,64,5,1,2)-BN-ReLU-MaxPool(2) ->
    Conv(64,128,5,1,2)-BN-ReLU -> FC(128*(H/4)^2, 2048)-BN-ReLU -> FC(2048,512)-BN-ReLU ->
    FC(512,K). On 28x28 inputs 128*7*7 = 6272, as in the table.
    """

    def __init__(self, in_channels: int, num_classes: int, image_size: int) -> None:
        super().__init__()
        side = image_size // 4

        def conv(cin: int, cout: int, pool: bool) -> list[nn.Module]:
            layers: list[nn.Module] = [nn.Conv2d(cin, cout, 5, 1, 2), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
            return layers + [nn.MaxPool2d(2, 2)] if pool else layers

        self.features = nn.Sequential(*conv(in_channels, 64, True), *conv(64, 64, True), *conv(64, 128, False))
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(128 * side * side, 2048),
            nn.BatchNorm1d(2048),
            nn.ReLU(inplace=True),
            nn.Linear(2048, 512),
            nn.BatchNorm1d(512),
            nn.ReLU(inplace=True),
            nn.Linear(512, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` -> logits ``[B, K]``."""
        return self.classifier(self.features(x))


@MODELS.register("resnet18")
def cifar_resnet18(in_channels: int, num_classes: int, image_size: int = 32) -> nn.Module:
    """torchvision ResNet-18 (random init) with a 3x3/1 stem and no max-pool for 32x32 inputs
    (App. D, Table D.3)."""
    from torchvision.models import resnet18  # deferred: import cost (torchvision.models ~2 s), only this model needs it

    model = resnet18(weights=None, num_classes=num_classes)
    model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


class _BasicBlock(nn.Module):
    """ResNet basic block: Conv3x3-BN-ReLU-Conv3x3-BN + shortcut (1x1 conv + BN when the shape
    changes), ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout),
        )  # fmt: skip
        self.shortcut = (
            nn.Identity() if cin == cout and stride == 1
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, cin, H, W]`` -> ``[B, cout, H / stride, W / stride]``."""
        return torch.relu(self.body(x) + self.shortcut(x))


@MODELS.register("resnet8")
class ResNet8(nn.Module):
    """CIFAR ResNet-8 (He et al., CVPR 2016, Sec. 4.2 with n = 1): Conv3x3(C, 16)-BN-ReLU -> one
    basic block each at 16, 32, 64 channels (strides 1, 2, 2) -> global average pool -> FC(64, K);
    ~78k parameters on CIFAR-10. ``width`` scales every channel count (rounded, at least 1)."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, width: float = 1.0) -> None:
        super().__init__()
        c = [_scaled(n, width) for n in (16, 32, 64)]
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c[0], 3, 1, 1, bias=False), nn.BatchNorm2d(c[0]), nn.ReLU(inplace=True),
            _BasicBlock(c[0], c[0], 1), _BasicBlock(c[0], c[1], 2), _BasicBlock(c[1], c[2], 2),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )  # fmt: skip
        self.classifier = nn.Linear(c[2], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` -> logits ``[B, K]``."""
        return self.classifier(self.features(x))


class _WideBasic(nn.Module):
    """Pre-activation basic block of a Wide ResNet: BN-ReLU-Conv3x3-BN-ReLU-Conv3x3 + shortcut
    (a 1x1 convolution when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(cin, momentum=0.001), nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(cout, momentum=0.001), nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.act = nn.LeakyReLU(0.1, inplace=True)
        self.shortcut = None if cin == cout and stride == 1 else nn.Conv2d(cin, cout, 1, stride, 0, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, cin, H, W]`` -> ``[B, cout, H / stride, W / stride]``."""
        pre = self.act(self.bn1(x))
        out = self.conv2(self.act(self.bn2(self.conv1(pre))))
        return out + (x if self.shortcut is None else self.shortcut(pre))


@MODELS.register("wrn-28-2")
class WideResNet(nn.Module):
    """Wide ResNet WRN-d-k (Zagoruyko and Komodakis, BMVC 2016) as FixMatch uses it (Sohn et
    al., NeurIPS 2020, App. B; LeakyReLU 0.1, batch-norm momentum 0.001): Conv3x3(C, 16) ->
    3 groups of (d - 4) / 6 pre-activation blocks with 16k, 32k, 64k channels (strides 1, 2,
    2) -> BN-ReLU -> global average pool -> FC(64k, K). Default d = 28, k = 2 (~1.47M
    parameters on CIFAR-10).

    Raises
    ------
    ValueError
        If (depth - 4) is not a multiple of 6.
    """

    def __init__(self, in_channels: int, num_classes: int, image_size: int, depth: int = 28, widen: int = 2) -> None:
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f"WRN depth {depth}: (depth - 4) must be a multiple of 6")
        blocks, widths = (depth - 4) // 6, [16, 16 * widen, 32 * widen, 64 * widen]
        layers: list[nn.Module] = [nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)]
        for group, stride in zip(range(3), (1, 2, 2), strict=True):
            for b in range(blocks):
                layers.append(_WideBasic(widths[group] if b == 0 else widths[group + 1], widths[group + 1],
                                         stride if b == 0 else 1))  # fmt: skip
        layers += [nn.BatchNorm2d(widths[3], momentum=0.001), nn.LeakyReLU(0.1, inplace=True),
                   nn.AdaptiveAvgPool2d(1), nn.Flatten()]  # fmt: skip
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(widths[3], num_classes)
        _wrn_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` -> logits ``[B, K]``."""
        return self.classifier(self.features(x))


def _wrn_init(model: nn.Module, generator: torch.Generator | None = None) -> None:
    """FixMatch's WRN initialisation (after the layers' defaults): Kaiming-normal convolutions
    (fan-out, leaky ReLU), Glorot-normal linear weights, zero biases."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="leaky_relu", generator=generator)
        elif isinstance(m, nn.Linear):
            nn.init.xavier_normal_(m.weight, generator=generator)
            nn.init.zeros_(m.bias)


def _resnet18_init(model: nn.Module, generator: torch.Generator) -> None:
    """Replay of building :func:`cifar_resnet18` with torch's global generator, from
    ``generator``: torchvision's ResNet-18 first gets every layer's default values, its 7x7 stem
    included (then replaced, its draws spent), then torchvision's Kaiming-normal convolutions
    (fan-out, ReLU; the old stem first), then the new 3x3 stem its default values."""
    stem = model.conv1
    with torch.device("meta"):  # torchvision's own stem, its values drawn below
        model.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
    model.conv1.to_empty(device="cpu")
    init_parameters(model, generator)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu", generator=generator)
    model.conv1 = init_parameters(stem, generator)


_REINIT: dict[str, Callable[[nn.Module, torch.Generator], None]] = {"simple-cnn": _glorot_uniform, "wrn-28-2": _wrn_init}
"""The models that re-initialise layers after the defaults (in their constructor), from a generator."""

MIN_IMAGE_SIZE: dict[str, int] = {"small-cnn": 16, "paper-cnn": 4, "resnet18": 4, "resnet8": 4, "wrn-28-2": 4, "simple-cnn": 6}
"""The smallest image side (pixels) each model accepts: LeNet's two 5x5 convolutions and 2x2
poolings leave no pixel below 16, ``simple-cnn``'s two 3x3 convolutions and pooling none below 6; the others pool or stride to 1/4 of the side (``paper-cnn``
also needs a side divisible by 4)."""


def check_input_size(name: str, image_size: int) -> None:
    """Whether model ``name`` can take ``image_size x image_size`` images (:data:`MIN_IMAGE_SIZE`).

    Raises
    ------
    ValueError
        Naming the model, its minimum (or divisor) and the size, with the ``image-size=N`` hint.
    """
    least = MIN_IMAGE_SIZE.get(name, 1)
    if image_size < least:
        raise ValueError(f"model={name!r} needs images of at least {least}x{least} pixels, got {image_size}x{image_size} "
                         f"(set image-size={max(least, 32)} to resize them, or choose another model)")  # fmt: skip
    if name == "paper-cnn" and image_size % 4:
        raise ValueError(f"model={name!r} needs an image size divisible by 4, got {image_size} (set image-size="
                         f"{image_size + (-image_size) % 4} to resize them)")  # fmt: skip


def build_model(
    name: str, in_channels: int, num_classes: int, image_size: int, *, seed: int | None = None, width: float = 1.0
) -> nn.Module:
    """Build a classifier by name.

    Parameters
    ----------
    name : str
        A name registered in :data:`MODELS`.
    in_channels, num_classes, image_size : int
        C, K and H (= W) of the dataset.
    seed : int | None
        Seed of the initial weights: the model is built on the meta device and its layers
        then get their default values (and the model's own re-initialisation) from a CPU
        generator seeded with ``seed`` (:func:`fedul_flwr.rng.init_parameters`): the values
        torch's global generator seeded with ``seed`` gave, bit for bit, without touching
        it (clients build models in parallel threads). ``None``: torch's global RNG.
    width : float
        Channel width factor (> 0) for the models that take one (``small-cnn``, ``resnet8``).

    Returns
    -------
    nn.Module
        Maps ``[B, C, H, W]`` float32 to logits ``[B, K]``.

    Raises
    ------
    UnknownChoiceError
        On an unknown name (lists the valid ones).
    ValueError
        On an image size the CNNs cannot take (paper-cnn: not divisible by 4; small-cnn:
        below 16), or a width other than 1 for a model without a width factor.
    """
    factory = MODELS.get(name)
    kwargs: dict[str, float] = {}
    if width != 1.0:
        if not width > 0 or "width" not in inspect.signature(factory).parameters:
            raise ValueError(f"model={name!r} cannot take width={width} (width factors: small-cnn, resnet8; > 0)")
        kwargs["width"] = width
    check_input_size(name, image_size)
    if seed is None:
        return factory(in_channels, num_classes, image_size, **kwargs)
    with torch.device("meta"):
        model = factory(in_channels, num_classes, image_size, **kwargs)
    model = model.to_empty(device="cpu")
    generator = torch_from_seed(seed)
    if name == "resnet18":
        _resnet18_init(model, generator)
        return model
    init_parameters(model, generator)
    if name in _REINIT:
        _REINIT[name](model, generator)
    return model
