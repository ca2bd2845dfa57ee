"""The ``gpu`` benchmark: ``paper-cnn`` and ``resnet18`` trained by several clients sharing one
CUDA card through ``flwr run .``, per precision."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch

from fedul_flwr.config import RunConfig
from fedul_flwr.experiments.bare_loop import build_federation
from fedul_flwr.experiments.bench_core import median, say
from fedul_flwr.experiments.flwr_timing import federation_config, flwr_run
from fedul_flwr.methods import RoundContext, get_method
from fedul_flwr.preflight import resolve_config

__all__ = ["round_examples", "section_gpu"]



def round_examples(cfg: RunConfig, num_clients: int) -> int:
    """Images the clients of a full round train per epoch: the sum over clients of n_c, the
    rows of the first stream of the method's local task (what each client reports as
    ``num-examples``), from the same clients the ClientApp loads."""
    method = get_method(cfg.method)(cfg)
    fed = build_federation(cfg, num_clients, torch.device("cpu"), [method])
    return sum(
        method.local_task(client, fed.models, RoundContext(cfg.seed, 1, pid)).num_examples
        for pid, client in enumerate(fed.clients)
    )


def section_gpu(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """paper-cnn and resnet18 with several clients sharing one GPU (CUDA only)."""
    if not torch.cuda.is_available():
        say("gpu: skipped: no CUDA device")
        return {"skipped": "no CUDA device"}
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "runs": []}
    cpus = max(1, (os.cpu_count() or 2) // args.gpu_clients)
    for model, precision in ((m, p) for m in ("paper-cnn", "resnet18") for p in args.gpu_precisions.split(",")):
        run_config = {
            "precision": precision,
            "dataset": args.dataset,
            "data-dir": args.data_dir,
            "model": model,
            "num-sets": args.num_sets,
            "num-rounds": args.rounds,
            "min-available-nodes": args.gpu_clients,
            "device": "cuda",
        }
        fed_cfg = federation_config(args.gpu_clients, cpus, round(1.0 / args.gpu_clients, 4))
        run = flwr_run(run_config, fed_cfg, workdir / "gpu")
        images = round_examples(resolve_config(run_config), args.gpu_clients)
        entry: dict[str, Any] = {"model": model, "precision": precision, "federation-config": fed_cfg, "images-per-round": images}
        entry.update({k: v for k, v in run.items() if k != "rounds"})
        if "round-s" in run:
            rounds = run["round-s"]
            entry["steady-round-s"] = median(rounds[1:]) if len(rounds) > 1 else median(rounds)
            entry["images-per-s"] = images / entry["steady-round-s"]
            say(f"gpu {model} {precision}: {entry['steady-round-s']:.2f}s/round, {entry['images-per-s']:.0f} img/s ({fed_cfg})")
        out["runs"].append(entry)
    return out
