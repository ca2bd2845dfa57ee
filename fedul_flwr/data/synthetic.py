"""``synthetic-cifar``: a generated, class-structured stand-in for CIFAR-10 (offline, no file).

The peer benchmark (:mod:`fedul_flwr.experiments.peers`) times pfl-research's CIFAR-10
workload on images of CIFAR-10's shape (3 x 32 x 32, 10 classes, 50,000 training and 10,000
test images) without a download. Random pixels with random labels would time the same work
but learn nothing, so the accuracy check of the benchmark (do the simulators reach a
comparable accuracy after the same iterations?) would compare chance with chance. Here each
class k has a smooth template T_k (4 x 4 Gaussian noise per channel, bilinearly upsampled to
32 x 32), and image i of class y_i is

    x_i = clip(128 + 40 * (a_i T_{y_i} + s_i S_i + N_i), 0, 255) as uint8,

with a_i ~ U(0.3, 1.0) a contrast, S_i a smooth distractor drawn like a template (weight
s_i ~ U(0, 1.5)) and N_i pixel noise of standard deviation 2 (clipped to the 8-bit range):
a task ``simple-cnn`` learns over tens of federated rounds, not in one (centrally, SGD at lr
0.1 and batch 10: ~38% test accuracy after 50 steps, ~77% after 250, ~80% after 500). Every draw comes from one generator seeded by a
fixed constant: the same bytes on every machine and in every process.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from fedul_flwr.data.datasets import DATASETS, _builtin
from fedul_flwr.data.image_dataset import DatasetInfo, ImageDataset
from fedul_flwr.rng import torch_from_seed

__all__ = ["INFO", "synthetic_cifar"]

INFO = DatasetInfo("synthetic-cifar", tuple(f"class-{k}" for k in range(10)), 3, 32, (0.5,) * 3, (0.3,) * 3)
"""Its facts: CIFAR-10's shape and class count; normalisation constants of its pixels (mean ~0.50, std ~0.30)."""
_SEED = 20240601
_TRAIN, _TEST = 50_000, 10_000


def _smooth(n: int, generator: torch.Generator) -> torch.Tensor:
    """``[n, 3, 32, 32]`` float: 4 x 4 Gaussian noise per channel, bilinearly upsampled."""
    coarse = torch.randn(n, 3, 4, 4, generator=generator)
    return F.interpolate(coarse, size=(32, 32), mode="bilinear", align_corners=False)


def _images(labels: torch.Tensor, templates: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    n = len(labels)
    out = torch.empty(n, 3, 32, 32, dtype=torch.uint8)
    for start in range(0, n, 10_000):  # chunks bound the float temporaries
        y = labels[start : start + 10_000]
        contrast = torch.empty(len(y), 1, 1, 1).uniform_(0.3, 1.0, generator=generator)
        distractor = torch.empty(len(y), 1, 1, 1).uniform_(0.0, 1.5, generator=generator) * _smooth(len(y), generator)
        noise = 2.0 * torch.randn(len(y), 3, 32, 32, generator=generator)
        x = 128 + 40 * (contrast * templates[y] + distractor + noise)
        out[start : start + len(y)] = x.round().clamp(0, 255).to(torch.uint8)
    return out


@functools.cache
def synthetic_cifar() -> ImageDataset:
    """The dataset (built once per process, ~2 s, 184 MB of uint8).

    Returns
    -------
    ImageDataset
        ``train_x`` uint8 ``[50000, 3, 32, 32]``, ``test_x`` uint8 ``[10000, 3, 32, 32]``,
        balanced labels in random order.
    """
    generator = torch_from_seed(_SEED)
    templates = _smooth(10, generator)
    train_y = torch.randperm(_TRAIN, generator=generator) % 10
    test_y = torch.randperm(_TEST, generator=generator) % 10
    train_x = _images(train_y, templates, generator)
    test_x = _images(test_y, templates, generator)
    return ImageDataset(INFO.name, train_x, train_y, test_x, test_y, INFO.class_names, INFO.mean, INFO.std)


DATASETS.add(INFO.name, _builtin(INFO, lambda root, download: synthetic_cifar()))
