"""The ``flower`` benchmark: the whole ``flwr run .`` simulation against a bare PyTorch loop doing
the identical work in this process, in interleaved repeats."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from fedul_flwr.experiments.bare_loop import bare_round, build_federation, central_eval
from fedul_flwr.experiments.bench_core import median, say
from fedul_flwr.experiments.flwr_timing import federation_config, flwr_run
from fedul_flwr.methods import get_method
from fedul_flwr.preflight import resolve_config

__all__ = ["section_flower"]



def section_flower(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """``flwr run .`` vs the bare loop, same work, interleaved repeats."""
    run_config = {
        "dataset": args.dataset,
        "data-dir": args.data_dir,
        "model": args.model,
        "num-sets": args.num_sets,
        "num-rounds": args.rounds,
        "min-available-nodes": args.flower_clients,
        "samples-per-client": args.samples_per_client,
    }
    cfg = resolve_config(run_config)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    setup_start = time.perf_counter()
    method = get_method(cfg.method)(cfg)
    fed = build_federation(cfg, args.flower_clients, device, [method])
    setup_s = time.perf_counter() - setup_start
    bare_rounds: list[list[float]] = []
    bare_acc: list[float] = []
    flwr_runs: list[dict[str, Any]] = []
    samples = 0
    for rep in range(args.repeats):
        order = ("flwr", "bare") if rep % 2 == 0 else ("bare", "flwr")
        for which in order:
            if which == "bare":
                state, rounds = fed.initial, []
                central_eval(fed, state, 0)  # round 0
                for server_round in range(1, args.rounds + 1):
                    start = time.perf_counter()
                    state, samples = bare_round(fed, method, state, server_round)
                    metrics = central_eval(fed, state, server_round, workdir / "bare")
                    rounds.append(time.perf_counter() - start)
                bare_rounds.append(rounds)
                bare_acc.append(metrics["test-accuracy"])
                say(f"flower repeat {rep + 1}: bare rounds {[round(r, 2) for r in rounds]}")
            else:
                run = flwr_run(
                    run_config, federation_config(args.flower_clients, args.threads), workdir / "flower", memory_every_s=5.0
                )
                flwr_runs.append(run)
                say(
                    f"flower repeat {rep + 1}: flwr {run['status']} startup {run.get('startup-s', float('nan')):.1f}s "
                    f"rounds {[round(r, 2) for r in run.get('round-s', [])]}"
                )
    ok = [r for r in flwr_runs if "round-s" in r]
    steady = lambda rounds: median(rounds[1:]) if len(rounds) > 1 else median(rounds)  # noqa: E731
    out: dict[str, Any] = {
        "setting": {
            "clients": args.flower_clients,
            "rounds": args.rounds,
            "images-per-round": samples,
            "model": args.model,
            "dataset": args.dataset,
            "num-sets": args.num_sets,
            "threads": args.threads,
            "federation-config": federation_config(args.flower_clients, args.threads),
            "repeats": args.repeats,
        },
        "bare-setup-s": setup_s,
        "bare-round-s": bare_rounds,
        "bare-final-test-accuracy": bare_acc,
        "flwr-runs": [{k: v for k, v in r.items() if k != "rounds"} for r in flwr_runs],
        "bare-steady-round-s": median([steady(r) for r in bare_rounds]),
        "bare-first-round-s": median([r[0] for r in bare_rounds]),
    }
    if ok:
        out["flwr-steady-round-s"] = median([steady(r["round-s"]) for r in ok])
        out["flwr-first-round-s"] = median([r["round-s"][0] for r in ok])
        out["flwr-startup-s"] = median([r["startup-s"] for r in ok])
        out["flwr-eval0-s"] = median([r["eval0-s"] for r in ok])
        out["flwr-total-s"] = median([r["total-s"] for r in ok])
        out["flwr-peak-rss-mb"] = max(r["peak-rss-mb"] for r in ok)
        out["flwr-final-test-accuracy"] = [r["final-test-accuracy"] for r in ok]
        out["ratio-flwr-over-bare-steady"] = out["flwr-steady-round-s"] / out["bare-steady-round-s"]
        out["flwr-overhead-s-per-round"] = out["flwr-steady-round-s"] - out["bare-steady-round-s"]
        out["ratio-flwr-over-bare-first-round"] = out["flwr-first-round-s"] / out["bare-first-round-s"]
        say(
            f"flower: flwr {out['flwr-steady-round-s']:.2f}s/round (steady) vs bare {out['bare-steady-round-s']:.2f}s/round: "
            f"ratio {out['ratio-flwr-over-bare-steady']:.3f}; flwr start-up {out['flwr-startup-s']:.1f}s, "
            f"first round {out['flwr-first-round-s']:.2f}s (bare {out['bare-first-round-s']:.2f}s, bare setup {setup_s:.1f}s)"
        )
    return out
