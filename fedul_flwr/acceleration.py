"""How the shared loop runs the models fast: precision, memory format, optimiser kernels, compile.

Nothing here changes *what* is trained -- the method's loss, the batches, the number of steps
-- only how PyTorch executes it (https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html):

- **memory format** (``memory-format``): ``channels-last`` stores images and convolution
  weights as NHWC, which oneDNN (CPU) and cuDNN (GPU) convolve faster than NCHW. ``auto``
  uses it for models with a 2-D convolution. Inputs are converted per batch; the weights
  are converted for training and restored to NCHW afterwards, so what leaves the client is
  always the contiguous NCHW tensor every other part of the project reads.
- **precision** (``precision``): ``bf16`` runs each *model forward* under
  :func:`torch.autocast` in bfloat16 and returns float32 logits; ``fp32`` does not.
  Weights, optimiser state and the method's loss stay float32: the transition layer Q_c and
  the other losses work in log space on probabilities near 0 and 1, where bfloat16's 8-bit
  mantissa would lose the signal, so autocast covers the model alone (PyTorch's advice for
  numerically sensitive regions). ``auto`` chooses ``bf16`` only where the hardware has
  native bfloat16 arithmetic (a CPU with AVX512-BF16 or AMX, a CUDA device that reports
  bf16 support): without it bfloat16 is emulated and slower than float32 (measured by
  ``fedul benchmark --only loop``, see ``docs/performance.md``).
- **optimiser kernels** (``fused-optimizer``): Adam's and SGD's fused implementation (one
  kernel over all parameters), else ``foreach`` (multi-tensor), instead of the per-parameter
  loop PyTorch uses on CPU by default. Same update rule, same order of steps.
- **compile** (``compile``): :func:`torch.compile` of each model's forward, opt-in: it costs
  tens of seconds of compilation per process and was slower than eager for the paper CNN on
  a 2-core CPU.

All settings are deterministic for a fixed seed, machine and thread count; they change the
last bits of the weights compared with the plain loop (different kernels), so records made
with different settings are compared statistically, not bit for bit.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["Acceleration", "PLAIN", "native_bf16"]

PRECISIONS = ("auto", "fp32", "bf16")
MEMORY_FORMATS = ("auto", "channels-last", "contiguous")


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 natively (not by emulation).

    CPU: AVX512-BF16 or AMX tiles (torch's own CPU capability probes). CUDA:
    :func:`torch.cuda.is_bf16_supported` (compute capability 8.0 and later).
    """
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False))
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def has_conv2d(model: nn.Module) -> bool:
    """Whether ``model`` contains a 2-D convolution (the layers channels-last speeds up)."""
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


class _Forward(nn.Module):
    """A model as the loop calls it: NHWC input, autocast forward, float32 output.

    Shares its parameters with ``model`` (no copy); ``train()``/``eval()`` reach the model.
    """

    def __init__(self, model: nn.Module, run: nn.Module, acceleration: Acceleration) -> None:
        super().__init__()
        self.model = model
        self._run = run  # the model itself or its torch.compile wrapper (not a registered child)
        self._acc = acceleration

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """Run the model on ``x`` ``[B, C, H, W]``; floating outputs come back as float32."""
        acc = self._acc
        if acc.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(acc.device.type, dtype=torch.bfloat16, enabled=acc.precision == "bf16"):
            out = self._run(x, *args, **kwargs)
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            return out.float()
        return out


_COMPILED: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Acceleration:
    """Resolved execution settings of the loop on one device.

    Attributes
    ----------
    device : torch.device
        Where the models train.
    precision : str
        ``"fp32"`` or ``"bf16"`` (autocast of model forwards); never ``"auto"`` here.
    channels_last : bool
        NHWC weights and inputs for models with a 2-D convolution.
    fused_optimizer : bool
        The optimiser's fused kernel where torch has one for ``device``, else ``foreach``;
        ``False``: PyTorch's per-parameter loop (the plain loop).
    compile : bool
        :func:`torch.compile` each model's forward (once per model object and process).
    """

    device: torch.device
    precision: str = "fp32"
    channels_last: bool = False
    fused_optimizer: bool = False
    compile: bool = False

    @classmethod
    def resolve(
        cls, device: torch.device | str, *, precision: str = "auto", memory_format: str = "auto",
        fused_optimizer: bool = True, compile: bool = False,
    ) -> Acceleration:  # fmt: skip
        """Settings from the run config's ``precision``, ``memory-format``, ``fused-optimizer``
        and ``compile`` on ``device``.

        Raises
        ------
        ValueError
            On an unknown precision or memory format, or ``bf16`` on a device whose autocast
            has no bfloat16 (names the key and value).
        """
        device = torch.device(device)
        if precision not in PRECISIONS:
            raise ValueError(f"precision={precision!r} is not one of {PRECISIONS}")
        if memory_format not in MEMORY_FORMATS:
            raise ValueError(f"memory-format={memory_format!r} is not one of {MEMORY_FORMATS}")
        if precision == "auto":
            precision = "bf16" if native_bf16(device) else "fp32"
        if precision == "bf16" and not torch.amp.is_autocast_available(device.type):
            raise ValueError(f"precision='bf16': torch has no autocast for device {device.type!r}")
        return cls(device, precision, memory_format != "contiguous", bool(fused_optimizer), bool(compile))

    @classmethod
    def plain(cls, device: torch.device | str = "cpu") -> Acceleration:
        """The plain loop: float32, NCHW, PyTorch's default (per-parameter) optimiser, eager."""
        return cls(torch.device(device))

    def describe(self) -> str:
        """One line for logs and benchmark records, e.g. ``fp32 channels-last fused``."""
        parts = [self.precision, "channels-last" if self.channels_last else "contiguous"]
        parts.append("fused" if self.fused_optimizer else "per-parameter")
        return " ".join(parts + (["compiled"] if self.compile else []))

    # ------------------------------------------------------------------ models
    def _uses_channels_last(self, model: nn.Module) -> bool:
        return self.channels_last and has_conv2d(model)

    def prepare(self, models: nn.ModuleDict) -> nn.ModuleDict:
        """Convert ``models`` in place for training/inference and return the callables the
        method's loss and predictors receive (same names, same parameters).

        Call :meth:`restore` afterwards so the weights are NCHW again.
        """
        forwards = nn.ModuleDict()
        for name, model in models.items():
            cl = self._uses_channels_last(model)
            if cl:
                model.to(memory_format=torch.channels_last)
            run = model
            if self.compile:
                if model not in _COMPILED:
                    _COMPILED[model] = torch.compile(model)
                run = _COMPILED[model]
            settings = self if cl == self.channels_last else Acceleration(
                self.device, self.precision, cl, self.fused_optimizer, self.compile
            )  # fmt: skip
            forwards[name] = _Forward(model, run, settings)
        return forwards

    def restore(self, models: nn.ModuleDict) -> None:
        """Put the weights of ``models`` back into the contiguous NCHW format."""
        if self.channels_last:
            for model in models.values():
                if has_conv2d(model):
                    model.to(memory_format=torch.contiguous_format)

    # ------------------------------------------------------------------ optimiser
    def optimizer(
        self, kind: str, params: Iterable[nn.Parameter], lr: float, momentum: float = 0.0, *,
        weight_decay: float = 0.0, nesterov: bool = False,
    ) -> torch.optim.Optimizer:  # fmt: skip
        """The local optimiser ``kind`` (``"adam"`` or ``"sgd"``, the latter with heavy-ball
        or, with ``nesterov``, Nesterov ``momentum``) over ``params``, with PyTorch's L2
        ``weight_decay`` (``weight_decay * w`` added to each gradient: FixMatch's and FedDB's
        code's 5e-4 with SGD).

        Raises
        ------
        ValueError
            On an unknown optimiser name, momentum or Nesterov with Adam, or Nesterov without
            momentum.
        """
        classes = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}
        if kind not in classes:
            raise ValueError(f"optimizer={kind!r} is not one of {sorted(classes)}")
        if momentum and kind != "sgd":
            raise ValueError(f"local-momentum={momentum} applies to local-optimizer='sgd', not {kind!r}")
        if nesterov and kind != "sgd":
            raise ValueError(f"nesterov=true applies to local-optimizer='sgd', not {kind!r}")
        if nesterov and not momentum:
            raise ValueError("nesterov=true needs local-momentum > 0")
        params = list(params)
        extra: dict[str, Any] = {"momentum": momentum, "nesterov": nesterov} if kind == "sgd" else {}
        extra["weight_decay"] = weight_decay
        if not self.fused_optimizer:
            return classes[kind](params, lr=lr, foreach=False, **extra)
        try:
            return classes[kind](params, lr=lr, fused=True, **extra)
        except RuntimeError:  # no fused kernel for this device / dtype in this torch
            return classes[kind](params, lr=lr, foreach=True, **extra)


PLAIN = Acceleration.plain()
"""The plain float32 NCHW loop on the CPU (what the project trained with before)."""
