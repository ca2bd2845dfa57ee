"""The ``augment`` section of ``fedul benchmark``: augmentation against the model's own work.

Two measurements, each of interleaved repeats in this one process (the first repeat warms up
and is not timed), reported as medians and ratios of medians of the same run:

1. Per batch of ``--augment-batch`` (448) uint8 images on ``--augment-device`` (``cpu`` or
   ``cuda``): each named augmentation (:mod:`fedul_flwr.augment`: ``weak``, ``strong``,
   ``rotate``) against one forward + backward + SGD step of the model on the same batch:
   ``small-cnn`` at 28 x 28 x 1 and ``wrn-28-2`` at 32 x 32 x 3 (random images; the work
   does not depend on the pixels). On CUDA the model step runs under bf16 autocast and every
   timing is closed by ``torch.cuda.synchronize``.
2. A FedUL local round (every client's local epoch, the embedded ``mnist-sample``,
   ``--augment-clients`` clients, M = ``--num-sets``, sequentially in this process) with
   ``augment='rotate'`` against ``augment='none'``: the same clients, weights, batch order
   and seeds.

3. Only with ``--feddb-round``: one round of FedDB's paper protocol (``preset='feddb'``:
   WRN-28-2, 32 x 32 x 3, 100 clients of 500 images with 40 labels each, 10 per round, 5 local
   epochs, B = 64, mu = 7) on CIFAR-shaped synthetic images (random uint8; the work does not
   depend on the pixels), ``--feddb-clients`` sampled clients trained one after another, as a
   GPU shared by the round's clients runs them; the round time and what 800 rounds would take.

``--augment-baseline REV`` adds, to the per-batch comparison, the views of ``fedul_flwr/augment.py``
as it was at the git revision REV of this checkout (e.g. the per-image torchvision views
before the batched ones), timed in the same interleaved repeats.

Targets (docs/performance.md): on 2 CPU threads, strong views of 448 28 x 28 images at most
0.25x the small CNN's step and a rotate round at most 1.10x a round without; on a GPU, strong
views of 448 32 x 32 images at most 1x the WRN-28-2 bf16 step.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from statistics import median
from typing import Any

import torch

from fedul_flwr.augment import Augmentation
from fedul_flwr.data.client_data import ClientData, LabeledImages
from fedul_flwr.data.datasets import dataset_info
from fedul_flwr.data.image_dataset import normalize
from fedul_flwr.experiments.bare_loop import Federation, bare_round, build_federation
from fedul_flwr.experiments.tables import markdown_table
from fedul_flwr.methods import get_method
from fedul_flwr.models import build_model
from fedul_flwr.preflight import resolve_config
from fedul_flwr.server_app import global_models
from fedul_flwr.store import write_atomic

AUGMENT_NAMES = ("weak", "strong", "rotate")
MODEL_SHAPES = {"small-cnn": (1, 28, "mnist"), "wrn-28-2": (3, 32, "cifar10")}
"""model -> (channels, side, the dataset whose flips apply) of the per-batch comparison."""


def _timer(device: torch.device) -> Callable[[Callable[[], Any]], float]:
    """``time(fn)``: seconds of ``fn()``, the device's queue drained before and after."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def time_it(fn: Callable[[], Any]) -> float:
        sync()
        start = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - start

    return time_it


def baseline_module(revision: str) -> Any:
    """``fedul_flwr/augment.py`` as it was at git ``revision`` of this checkout, as a module.

    Raises
    ------
    SystemExit
        If git cannot show that file at that revision.
    """
    root = Path(__file__).resolve().parents[2]
    shown = subprocess.run(["git", "-C", str(root), "show", f"{revision}:fedul_flwr/augment.py"], capture_output=True, text=True)
    if shown.returncode:
        raise SystemExit(f"--augment-baseline {revision}: {shown.stderr.strip()}")
    path = Path(tempfile.mkdtemp(prefix="fedul-augment-baseline-")) / "augment_baseline.py"
    write_atomic(path, shown.stdout)
    spec = importlib.util.spec_from_file_location("augment_baseline", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def per_batch(model_name: str, batch: int, device: torch.device, repeats: int, baseline: Any = None) -> dict[str, Any]:
    """Median seconds of each augmentation (and of ``baseline``'s, a module with an
    ``Augmentation`` class) and of the model step on one batch, interleaved."""
    channels, side, dataset = MODEL_SHAPES[model_name]
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (batch, channels, side, side), dtype=torch.uint8, generator=g).to(device)
    labels = torch.randint(0, 10, (batch,), generator=g).to(device)
    model = build_model(model_name, channels, 10, side, seed=0).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9)
    bf16 = device.type == "cuda"

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = torch.nn.functional.cross_entropy(model(images.float().div(255.0)), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    flip = dataset_info(dataset).flip
    augs = {name: Augmentation(name, side, flip) for name in AUGMENT_NAMES}
    if baseline is not None:  # a revision before DatasetInfo.flip takes the dataset's name
        old = "flip" not in inspect.signature(baseline.Augmentation).parameters
        augs.update({f"{name} (baseline)": baseline.Augmentation(name, side, dataset if old else flip)
                     for name in AUGMENT_NAMES})  # fmt: skip
    time_it = _timer(device)
    times: dict[str, list[float]] = {**{name: [] for name in augs}, "model step": []}
    for rep in range(repeats + 1):
        for name, aug in augs.items():
            seconds = time_it(lambda aug=aug: aug(images, g))
            if rep:
                times[name].append(seconds)
        seconds = time_it(step)
        if rep:
            times["model step"].append(seconds)
    medians = {name: median(values) for name, values in times.items()}
    return {
        "shape": [batch, channels, side, side], "precision": "bf16" if bf16 else "fp32", "seconds": times,
        "median-s": medians, "over-model-step": {name: medians[name] / medians["model step"] for name in augs},
    }  # fmt: skip


def fedul_rounds(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Median seconds of a FedUL local round with ``augment='rotate'`` and with ``'none'``."""
    base = {"dataset": "mnist-sample", "num-sets": args.num_sets, "samples-per-client": args.samples_per_client, "device": device.type}
    methods = {name: get_method("fedul")(resolve_config({**base, "augment": name})) for name in ("none", "rotate")}
    fed = build_federation(methods["none"].cfg, args.augment_clients, device, list(methods.values()))
    time_it = _timer(device)
    times: dict[str, list[float]] = {name: [] for name in methods}
    for rep in range(args.repeats + 1):
        for name in (("none", "rotate") if rep % 2 == 0 else ("rotate", "none")):
            seconds = time_it(lambda name=name: bare_round(fed, methods[name], fed.initial, 1))
            if rep:
                times[name].append(seconds)
    medians = {name: median(values) for name, values in times.items()}
    return {"clients": args.augment_clients, "num-sets": args.num_sets, "seconds": times, "median-s": medians,
            "rotate-over-none": medians["rotate"] / medians["none"]}  # fmt: skip


def feddb_round(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Median seconds of one FedDB round of the paper protocol on synthetic CIFAR-shaped data."""
    overrides = {"local-epochs": 1} if args.quick else {}
    # the images are synthetic: data-dir only satisfies the check that cifar10 has a root
    cfg = resolve_config({"preset": "feddb", "device": device.type, "data-dir": tempfile.gettempdir(), **overrides})
    method = get_method(cfg.method)(cfg)
    info = dataset_info(cfg.dataset)
    per_client, labeled = 50_000 // 100, cfg.num_labeled // 100
    g = torch.Generator().manual_seed(cfg.seed)
    shape = (info.channels, info.image_size, info.image_size)

    def images(n: int) -> torch.Tensor:
        return torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=g)

    clients = [
        ClientData(f"synthetic client {i}", info.class_names, info.mean, info.std, flip=info.flip,
                   labeled=LabeledImages(images(labeled), torch.arange(labeled) % len(info.class_names)),
                   unlabeled=images(per_client - labeled),
                   unlabeled_classes=torch.randint(0, len(info.class_names), (per_client - labeled,), generator=g))
        for i in range(args.feddb_clients)
    ]  # fmt: skip
    models = global_models(cfg, method, info.channels, len(info.class_names), info.image_size).to(device)
    initial = {k: v.detach().clone() for k, v in models.state_dict().items()}
    to_input = lambda x: normalize(x, mean=info.mean, std=info.std)  # noqa: E731
    fed = Federation(cfg, clients, models, initial, method.predictors(), images(0), torch.zeros(0, dtype=torch.long), to_input, device)
    time_it = _timer(device)
    times = [time_it(lambda: bare_round(fed, method, fed.initial, 1)) for _ in range(max(1, args.repeats // 3) + 1)][1:]
    seconds = median(times)
    return {"clients-per-round": args.feddb_clients, "local-epochs": cfg.local_epochs, "model": cfg.model,
            "seconds": times, "median-round-s": seconds, "800-rounds-h": 800 * seconds / 3600}  # fmt: skip


def section_augment(args: argparse.Namespace) -> dict[str, Any]:
    """The section (module docstring): per-batch costs per model, then the FedUL rounds.

    Raises
    ------
    SystemExit
        On ``--augment-device cuda`` without a CUDA device.
    """
    device = torch.device(args.augment_device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--augment-device cuda: no CUDA device here")
    out: dict[str, Any] = {
        "setting": {"device": str(device), "device-name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "threads": torch.get_num_threads(), "batch": args.augment_batch, "repeats": args.repeats},
        "per-batch": {},
    }  # fmt: skip
    baseline = baseline_module(args.augment_baseline) if args.augment_baseline else None
    if baseline is not None:
        out["setting"]["baseline"] = args.augment_baseline
    for model_name in MODEL_SHAPES:
        row = per_batch(model_name, args.augment_batch, device, args.repeats, baseline)
        out["per-batch"][model_name] = row
        print(f"augment {model_name} {row['shape']}: " + ", ".join(
            f"{n} {1e3 * row['median-s'][n]:.1f} ms (x{row['over-model-step'][n]:.2f})" for n in row["over-model-step"])
            + f", model step {1e3 * row['median-s']['model step']:.1f} ms", flush=True)  # fmt: skip
    rounds = fedul_rounds(args, device)
    out["fedul-round"] = rounds
    print(f"augment: FedUL round of {rounds['clients']} clients: none {rounds['median-s']['none']:.2f}s, "
          f"rotate {rounds['median-s']['rotate']:.2f}s (x{rounds['rotate-over-none']:.3f})", flush=True)  # fmt: skip
    if args.feddb_round:
        feddb = feddb_round(args, device)
        out["feddb-round"] = feddb
        print(f"augment: FedDB paper-protocol round ({feddb['clients-per-round']} clients, synthetic 32x32): "
              f"{feddb['median-round-s']:.2f}s; 800 rounds {feddb['800-rounds-h']:.2f} h", flush=True)  # fmt: skip
    return out


def augment_markdown(augment: Mapping[str, Any]) -> str:
    """The section's results as markdown tables (milliseconds, ratios to the model step)."""
    s = augment["setting"]
    rows = []
    for model_name, row in augment["per-batch"].items():
        _, c, h, w = row["shape"]
        cells = [f"{1e3 * row['median-s'][n]:.1f} ms ({row['over-model-step'][n]:.2f}x)" for n in AUGMENT_NAMES]
        rows.append([f"`{model_name}` ({h}x{w}x{c}, {row['precision']})", f"{1e3 * row['median-s']['model step']:.1f} ms", *cells])
        if f"{AUGMENT_NAMES[0]} (baseline)" in row["median-s"]:
            cells = [f"{1e3 * row['median-s'][n + ' (baseline)']:.1f} ms ({row['over-model-step'][n + ' (baseline)']:.2f}x)"
                     for n in AUGMENT_NAMES]  # fmt: skip
            rows.append([f"`{model_name}`, views of `{s['baseline']}`", "", *cells])
    lines = [f"Per batch of {s['batch']} uint8 images on `{s['device']}` ({s['device-name']}, {s['threads']} thread(s)), "
             f"medians of {s['repeats']} interleaved repeats; ratio = augmentation / the model's forward + backward + "
             "SGD step on the same batch:", "", markdown_table(["model (images)", "step", *AUGMENT_NAMES], rows)]  # fmt: skip
    r = augment["fedul-round"]
    lines += ["", f"FedUL local round, `mnist-sample`, {r['clients']} clients, M = {r['num-sets']}: "
              f"`augment='none'` {r['median-s']['none']:.2f} s, `augment='rotate'` {r['median-s']['rotate']:.2f} s: "
              f"**{r['rotate-over-none']:.3f}x**."]  # fmt: skip
    if "feddb-round" in augment:
        f = augment["feddb-round"]
        lines += ["", f"FedDB's paper protocol on synthetic 32 x 32 x 3 images (`{f['model']}`, {f['clients-per-round']} "
                  f"clients per round, {f['local-epochs']} local epochs): {f['median-round-s']:.2f} s per round, "
                  f"{f['800-rounds-h']:.2f} h for 800 rounds."]  # fmt: skip
    return "\n".join(lines)
