"""The ``qc`` benchmark: FedUL against supervised FedAvg on the same model, clients, batches and
seeds, in interleaved repeats (the cost of FedUL's Q_c transition layer)."""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from fedul_flwr.experiments.bare_loop import bare_round, build_federation
from fedul_flwr.experiments.bench_core import median, say
from fedul_flwr.methods import get_method
from fedul_flwr.preflight import resolve_config

__all__ = ["section_qc"]



def section_qc(args: argparse.Namespace) -> dict[str, Any]:
    """FedUL vs supervised FedAvg, same model, data, batches; interleaved repeats."""
    base = {
        "dataset": args.dataset,
        "data-dir": args.data_dir,
        "model": args.model,
        "num-sets": args.num_sets,
        "samples-per-client": args.samples_per_client,
    }
    cfgs = {
        "fedul": resolve_config({**base, "method": "fedul"}),
        "supervised": resolve_config({**base, "method": "supervised", "label-fraction": 1.0}),
    }
    methods = {name: get_method(cfg.method)(cfg) for name, cfg in cfgs.items()}
    device = torch.device("cpu")
    fed = build_federation(cfgs["supervised"], args.qc_clients, device, [methods["supervised"], methods["fedul"]])
    times: dict[str, list[float]] = {"fedul": [], "supervised": []}
    samples = 0
    for method in methods.values():  # warm-up round, untimed
        bare_round(fed, method, fed.initial, 1)
    for rep in range(args.repeats):
        order = ("fedul", "supervised") if rep % 2 == 0 else ("supervised", "fedul")
        for name in order:
            start = time.perf_counter()
            _, samples = bare_round(fed, methods[name], fed.initial, 1)
            times[name].append(time.perf_counter() - start)
        say(f"qc repeat {rep + 1}/{args.repeats}: fedul {times['fedul'][-1]:.2f}s supervised {times['supervised'][-1]:.2f}s")
    out: dict[str, Any] = {
        "setting": {
            "clients": args.qc_clients,
            "images-per-round": samples,
            "model": args.model,
            "dataset": args.dataset,
            "num-sets": args.num_sets,
            "batch-size": cfgs["fedul"].batch_size,
            "threads": torch.get_num_threads(),
            "repeats": args.repeats,
        },
        "round-s": times,
    }
    for name in times:
        out[f"{name}-median-round-s"] = median(times[name])
        out[f"{name}-images-per-s"] = samples / median(times[name])
    out["ratio-fedul-over-supervised"] = out["fedul-median-round-s"] / out["supervised-median-round-s"]
    paired = [a / b for a, b in zip(times["fedul"], times["supervised"], strict=True)]
    out["ratio-median-of-paired"] = median(paired)
    say(
        f"qc: fedul {out['fedul-median-round-s']:.3f}s/round ({out['fedul-images-per-s']:.0f} img/s), supervised "
        f"{out['supervised-median-round-s']:.3f}s/round ({out['supervised-images-per-s']:.0f} img/s), "
        f"ratio {out['ratio-fedul-over-supervised']:.3f} (median of paired ratios {out['ratio-median-of-paired']:.3f})"
    )
    return out
