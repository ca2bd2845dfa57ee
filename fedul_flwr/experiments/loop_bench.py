"""The ``loop`` benchmark: whole FedUL local rounds under each execution setting of the loop
(:mod:`fedul_flwr.acceleration`), per model, on the same clients, batches and seeds."""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedul_flwr.acceleration import Acceleration
from fedul_flwr.config import RunConfig
from fedul_flwr.execution import loop_acceleration
from fedul_flwr.experiments.bare_loop import bare_round, build_federation, central_eval
from fedul_flwr.experiments.bench_core import median, say
from fedul_flwr.experiments.tables import markdown_table
from fedul_flwr.methods import get_method
from fedul_flwr.preflight import resolve_config

__all__ = ["loop_markdown", "loop_variants", "section_loop"]



def loop_variants(device: torch.device, cfg: RunConfig, names: Sequence[str]) -> dict[str, Acceleration]:
    """The loop executions compared by the ``loop`` section, by name.

    ``plain``: float32, NCHW, PyTorch's per-parameter Adam, eager (the loop before the
    execution settings existed); ``channels-last`` / ``fused``: plain plus that one change;
    ``defaults``: the run configuration's settings as a client resolves them here
    (``precision=auto``, ``memory-format=auto``, ``fused-optimizer=true``); ``bf16``:
    bf16 autocast + channels-last + fused, forced even without native bfloat16;
    ``compile``: the defaults plus ``torch.compile``.

    Raises
    ------
    SystemExit
        On an unknown variant name.
    """
    plain = Acceleration.plain(device)
    defaults = loop_acceleration(cfg, device)
    table = {
        "plain": plain,
        "channels-last": Acceleration(device, "fp32", channels_last=True),
        "fused": Acceleration(device, "fp32", fused_optimizer=True),
        "defaults": defaults,
        "bf16": Acceleration.resolve(device, precision="bf16"),
        "compile": Acceleration(device, defaults.precision, defaults.channels_last, defaults.fused_optimizer, True),
    }
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"--loop-variants: unknown {unknown}; valid: {','.join(table)}")
    return {n: table[n] for n in names}


def section_loop(args: argparse.Namespace) -> dict[str, Any]:
    """Whole local rounds of FedUL under each loop execution, per model, same clients, batches
    and seeds; repeats interleaved with the variant order rotated."""
    device = torch.device(args.loop_device)
    caps = dict(item.split(":") for item in args.loop_samples.split(",") if item)
    names = args.loop_variants.split(",")
    out: dict[str, Any] = {"setting": {"clients": args.loop_clients, "dataset": args.dataset, "num-sets": args.num_sets,
                                       "device": str(device),
                                       "threads": torch.get_num_threads(), "repeats": args.repeats,
                                       "variants": names}}  # fmt: skip
    for model in args.loop_models.split(","):
        cfg = resolve_config({
            "dataset": args.dataset, "data-dir": args.data_dir, "model": model, "num-sets": args.num_sets,
            "method": "fedul", "samples-per-client": int(caps.get(model, args.samples_per_client)),
        })  # fmt: skip
        method = get_method(cfg.method)(cfg)
        fed = build_federation(cfg, args.loop_clients, device, [method])
        variants = loop_variants(device, cfg, names)
        times: dict[str, list[float]] = {n: [] for n in variants}
        accuracy: dict[str, float] = {}
        samples = 0
        for name, acc in variants.items():  # warm-up round (compiles, allocates), untimed
            state, samples = bare_round(fed, method, fed.initial, 1, acc)
            accuracy[name] = central_eval(fed, state, 1, acceleration=acc)["test-accuracy"]
        for rep in range(args.repeats):
            order = list(variants)[rep % len(variants) :] + list(variants)[: rep % len(variants)]
            for name in order:
                start = time.perf_counter()
                bare_round(fed, method, fed.initial, 1, variants[name])
                times[name].append(time.perf_counter() - start)
            say(f"loop {model} repeat {rep + 1}/{args.repeats}: " + " ".join(f"{n} {times[n][-1]:.2f}s" for n in variants))
        base = median(times[names[0]])
        row: dict[str, Any] = {"images-per-round": samples, "round-s": times, "after-one-round-test-accuracy": accuracy}
        for name, acc in variants.items():
            row[name] = {
                "settings": acc.describe(),
                "median-round-s": median(times[name]),
                "images-per-s": samples / median(times[name]),
                f"speedup-over-{names[0]}": base / median(times[name]),
                "median-of-paired-speedups": median([b / t for b, t in zip(times[names[0]], times[name], strict=True)]),
            }
        out[model] = row
        say(f"loop {model} ({samples} images/round): " + ", ".join(
            f"{n} [{row[n]['settings']}] {row[n]['images-per-s']:.0f} img/s x{row[n][f'speedup-over-{names[0]}']:.2f}"
            for n in variants))  # fmt: skip
    return out


def loop_markdown(loop: Mapping[str, Any]) -> str:
    """The ``loop`` section as a markdown table: images/s per model and variant, the speedup
    over the first variant (ratio of medians; median of the per-repeat ratios in brackets)
    and the test accuracy after one round."""
    names = loop["setting"]["variants"]
    first = names[0]
    lines = []
    models = [m for m in loop if m not in ("setting", "section-wall-s")]
    for model in models:
        row = loop[model]
        for name in names:
            v = row[name]
            lines.append([model, row["images-per-round"], name, v["settings"], f"{v['images-per-s']:.0f}",
                          f"{v[f'speedup-over-{first}']:.2f}x ({v['median-of-paired-speedups']:.2f}x)",
                          f"{100 * row['after-one-round-test-accuracy'][name]:.2f}%"])  # fmt: skip
    head = ["model", "images/round", "variant", "settings", "images/s", f"speedup over {first}", "after-1-round test accuracy"]
    return markdown_table(head, lines)
