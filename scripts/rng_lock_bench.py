"""Time the parallel cohort's augmentation with and without the process-wide lock.

Two clients of the parallel cohort (``cohort = "parallel"``: threads, one torch thread each,
:func:`fedul_flwr.execution.pinned_threads`) augment FixMatch's strong view of their unlabeled
batches (mu * B images) at the same time. ``locked`` is the path before the seed-stream table
(:mod:`fedul_flwr.rng`): Kornia drew its flip and erasing parameters from torch's global
generator, so every strong augmentation ran under one process-wide lock with that generator
forked and seeded; ``free`` is today's (the parameters drawn from the batch's own generator,
no lock). Both give the same pixels (``tests/test_augment.py``). Prints the median wall time of
a cohort step (every client augments ``--batches`` batches) over ``--repeats`` repeats, and
that of one client alone (what W clients at once take on W idle cores). A control, matrix
products in the same threads (kernels that release Python's lock), says whether the machine
had W free cores at all: where two at once take twice one, the comparison is void.

Usage: ``python scripts/rng_lock_bench.py [--threads 2] [--batches 4] [--repeats 7]
[--images 448] [--side 32]``.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from fedul_flwr.augment import Augmentation
from fedul_flwr.execution import pinned_threads
from fedul_flwr.rng import torch_from_seed

_LOCK = threading.RLock()


def locked(augment: Augmentation, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The strong view as it was drawn before: under the process-wide lock, Kornia sampling
    from torch's global generator forked and seeded with the batch seed."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    own = torch_from_seed(seed)
    with _LOCK, torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)  # the old path, timed here for comparison
        out = images
        for stage in augment.stages:
            if out.dtype == torch.uint8 and getattr(stage, "float_input", True):
                out = out.float().div_(255.0)
            out = stage.module(out) if getattr(stage, "kornia", False) else stage(out, own)
    return out.mul_(255.0).round_().clamp_(0.0, 255.0).to(torch.uint8)


def cohort_step(path, augment: Augmentation, batches: list[torch.Tensor], threads: int) -> float:  # type: ignore[no-untyped-def]
    """Seconds for ``threads`` clients to augment ``batches`` each, at once."""

    def client(index: int) -> None:
        generator = torch_from_seed(index)
        for images in batches:
            path(augment, images, generator)

    start = time.perf_counter()
    if threads == 1:
        client(0)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(client, range(threads)))
    return time.perf_counter() - start


def _matmuls(augment: Augmentation, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The control workload: a product of two 1024 x 1024 matrices (one torch thread)."""
    return torch.mm(_CONTROL, _CONTROL)


_CONTROL = torch.ones(1024, 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, default=4, help="batches each client augments per step")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--images", type=int, default=448, help="images per batch (mu * B: 7 * 64)")
    parser.add_argument("--side", type=int, default=32)
    args = parser.parse_args()
    channels = 3 if args.side == 32 else 1
    augment = Augmentation("strong", args.side, args.side == 32)
    generator = torch_from_seed(0)
    batches = [torch.randint(0, 256, (args.images, channels, args.side, args.side), dtype=torch.uint8, generator=generator)
               for _ in range(args.batches)]  # fmt: skip

    def free(augment: Augmentation, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return augment(images, generator)

    times: dict[str, list[float]] = {"locked": [], "free": [], "one thread": [], "control": [], "control alone": []}
    with pinned_threads(1):
        cohort_step(free, augment, batches, args.threads)  # warm-up (Kornia's imports, caches)
        for _ in range(args.repeats):  # interleaved, so a change of load hits both alike
            times["locked"].append(cohort_step(locked, augment, batches, args.threads))
            times["free"].append(cohort_step(free, augment, batches, args.threads))
            times["one thread"].append(cohort_step(free, augment, batches, 1))
            times["control"].append(cohort_step(_matmuls, augment, batches * 4, args.threads))
            times["control alone"].append(cohort_step(_matmuls, augment, batches * 4, 1))
    print(f"strong view, {args.images} images {channels}x{args.side}x{args.side} per batch, {args.batches} batches "
          f"per client, {args.threads} clients at once, medians of {args.repeats}:")  # fmt: skip
    for name, values in times.items():
        work = "one client alone" if name.endswith(("thread", "alone")) else f"{args.threads} clients at once"
        print(f"  {name:>10}: {statistics.median(values):.3f} s  ({work}; min {min(values):.3f}, max {max(values):.3f})")
    ratio = {k: statistics.median(v) for k, v in times.items()}
    print(f"  locked / free: {ratio['locked'] / ratio['free']:.2f}x; control, {args.threads} at once / alone: "
          f"{ratio['control'] / ratio['control alone']:.2f}x (1.00x: {args.threads} free cores)")  # fmt: skip


if __name__ == "__main__":
    main()
