"""The ``scale`` benchmark: ``flwr run .`` at 10, 100, 1000 clients on the same total data: time
per round and client, peak memory of the process tree, optionally a py-spy profile."""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fedul_flwr.config import RunConfig
from fedul_flwr.data.simulated import load_run_dataset
from fedul_flwr.experiments.bare_loop import build_federation, central_eval
from fedul_flwr.experiments.bench_core import median, say
from fedul_flwr.experiments.flwr_timing import federation_config, flwr_run
from fedul_flwr.experiments.tables import markdown_table
from fedul_flwr.methods import get_method
from fedul_flwr.preflight import resolve_config

__all__ = ["SCALE_HEAD", "scale_markdown", "scale_rows", "section_scale", "server_step_s"]



def server_step_s(cfg: RunConfig, repeats: int, run_dir: Path) -> float:
    """Median time (s) of the ServerApp's per-round work (checkpoint + central evaluation of
    the method's predictors on the test set) in this process: what a round of ``flwr run``
    spends besides training."""
    fed = build_federation(cfg, 0, torch.device("cpu"), [get_method(cfg.method)(cfg)])
    times = []
    for rep in range(repeats):
        start = time.perf_counter()
        central_eval(fed, fed.initial, rep + 1, run_dir)
        times.append(time.perf_counter() - start)
    return median(times)


def section_scale(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Per-round time and peak memory at N clients, same total data, partial participation."""
    points = []
    for item in args.scale.split(","):
        n, frac = item.split(":")
        points.append((int(n), float(frac)))
    data = load_run_dataset(resolve_config({"dataset": args.scale_dataset, "data-dir": args.data_dir}))
    total_images = int(data.train_y.shape[0])
    out: dict[str, Any] = {"setting": {"dataset": args.scale_dataset, "total-images": total_images}, "points": []}
    for n, frac in points:
        run_config = {
            "dataset": args.scale_dataset,
            "data-dir": args.data_dir,
            "model": args.model,
            "num-sets": args.num_sets,
            "num-rounds": args.scale_rounds,
            "fraction-train": frac,
            "min-available-nodes": n,
            "samples-per-client": args.samples_per_client,
        }
        sampled = max(int(n * frac), 2)  # Flower's FedAvg: int(N * fraction), at least min-train-nodes (2)
        per_client = total_images // n
        if args.samples_per_client:
            per_client = min(per_client, args.samples_per_client)
        say(f"scale: N={n} fraction-train={frac} ({sampled} clients x {per_client} images per round)")
        server_s = server_step_s(resolve_config(run_config), 3, workdir / "server-step")
        spy = Path(args.py_spy) / f"scale-N{n}-f{frac}.txt" if args.py_spy else None
        if spy is not None:
            spy.parent.mkdir(parents=True, exist_ok=True)
        run = flwr_run(run_config, federation_config(n, args.threads), workdir / "scale", py_spy=spy)
        point: dict[str, Any] = {
            "clients": n,
            "fraction-train": frac,
            "clients-per-round": sampled,
            "images-per-client": per_client,
            "images-per-round": sampled * per_client,
            **{k: v for k, v in run.items() if k != "rounds"},
        }
        if "round-s" in run:
            rounds = run["round-s"]
            steady = median(rounds[1:]) if len(rounds) > 1 else median(rounds)
            train = steady - server_s  # minus the server's checkpoint + central evaluation
            point.update(
                {
                    "server-step-s": server_s,
                    "steady-round-s": steady,
                    "steady-train-s": train,
                    "s-per-1k-images": 1000 * train / point["images-per-round"],
                    "ms-per-client": 1000 * train / sampled,
                }
            )
            say(
                f"scale N={n}: {steady:.2f}s/round (server step {server_s:.2f}s), {point['s-per-1k-images']:.3f}s per 1k images, "
                f"{point['ms-per-client']:.0f}ms per client, peak RSS sum {run['peak-rss-mb']:.0f}MB, "
                f"PSS sum {run['peak-pss-mb']:.0f}MB, start-up {run['startup-s']:.1f}s"
            )
        out["points"].append(point)
    return out


def scale_markdown(scale: Mapping[str, Any], label: str = "") -> str:
    """The ``scale`` section as markdown: per-point time per client and the CPU seconds of
    the busiest processes, then the py-spy profile of each point that has one."""
    lines = [markdown_table(SCALE_HEAD, scale_rows(scale, label))]
    for p in scale["points"]:
        prof = p.get("profile")
        if not prof:
            continue
        shares = [[f"{kind} ({100 * cats['share']:.0f}% of samples)", cat, f"{100 * share:.1f}%"]
                  for kind, cats in prof["by-process"].items() for cat, share in cats.items()
                  if cat != "share" and share >= 0.005]  # fmt: skip
        lines += ["", f"py-spy profile of N = {p['clients']}, fraction-train = {p['fraction-train']} "
                  f"({prof['busy-samples']} busy samples at 50 Hz; shares of all busy samples):", "",
                  markdown_table(["process", "category", "share"], shares)]  # fmt: skip
    return "\n".join(lines)


SCALE_HEAD = ["run", "N", "clients x images per round", "steady round (s)", "ms per client", "CPU s by process (whole run)"]


def scale_rows(scale: Mapping[str, Any], label: str = "") -> list[list[str]]:
    """The cells of the ``scale`` table: one row per point, labeled ``label``."""
    rows = []
    for p in scale["points"]:
        cpu = ", ".join(f"{name.replace('python3.11 ', '')} {sec:.0f}" for name, sec in p.get("cpu-s-by-process", [])[:3])
        rows.append([label, str(p["clients"]), f"{p['clients-per-round']} x {p['images-per-client']}",
                     f"{p.get('steady-round-s', float('nan')):.2f}", f"{p.get('ms-per-client', float('nan')):.0f}", cpu])  # fmt: skip
    return rows
