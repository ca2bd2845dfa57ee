"""Benchmarks of the training loop and of simulation overhead: loop, Q_c, Flower + Ray, scale, GPU, peers.

Every section runs in this one process on this machine and prints medians over
``--repeats`` repeats and the ratios; ``--out`` writes everything as JSON.

Sections (``--only loop,augment,hassle,qc,client,flower,scale,gpu,peers``; default: all but
``hassle`` and ``peers``):

``loop``
    The loop's execution settings (:mod:`fedul_flwr.acceleration`): whole FedUL local rounds
    (every client's local epoch, ``--loop-clients`` clients, sequentially in this process)
    per model of ``--loop-models``, under each variant of ``--loop-variants`` -- ``plain``
    (float32, NCHW, per-parameter Adam: the loop before the settings existed),
    ``channels-last``, ``fused``, ``defaults`` (the run's defaults as a client resolves
    them on this machine), ``bf16`` (forced) and ``compile`` (opt-in) -- on the same
    clients, initial weights, batch order and seeds. Reports images/s, the speedup over the
    first variant (ratio of medians, and the median of the per-repeat ratios), and the test
    accuracy after one round of each (a sanity check; the accuracy comparison over whole
    runs is the runner's ``loop-check`` grid). ``--loop-samples model:n`` caps the images
    per client of a slow model.
``augment``
    Each augmentation (``weak``, ``strong``, ``rotate``) of a 448-image batch against the
    model's forward + backward + step on it (``small-cnn`` 28 x 28, ``wrn-28-2`` 32 x 32) on
    ``--augment-device``, and a FedUL round with ``augment='rotate'`` against one without
    (:mod:`fedul_flwr.experiments.augment_bench`).
``hassle``
    A round of the ``hassle`` preset (Fashion-MNIST from ``--data-dir``, 8 of 20 clients,
    one torch thread) with this checkout against the same round with the package at git
    revision ``--hassle-baseline`` (the commit before HASSLE's round was made faster), one
    round at a time, alternating, in two worker processes; medians over the rounds
    between the first and the last, their ratio, and the largest differences between the
    two runs' metrics and final weights (:mod:`fedul_flwr.experiments.hassle_bench`). Only
    when named.
``qc``
    FedUL vs supervised FedAvg (``method='supervised' label-fraction=1.0``): the same model,
    initial weights, client tensors (the very same uint8 images: a simulated client's
    ``ClientData.unlabeled`` *is* its ``labeled.x``), batch order and seeds; only the loss
    differs (FedUL: -log Q_c(softmax f(x))[ybar]; supervised: cross-entropy of f). One
    *round* = every client's local training (``train_local``) + FedAvg averaging,
    sequentially in this process; no central evaluation (it is identical for both). Repeats
    are interleaved A B B A A B ... so that drift of the machine's load hits both methods
    alike.
``client``
    The ClientApp's per-message cost around ``train_local``: the real ClientApp through
    :class:`~fedul_flwr.inprocess.InProcessGrid`, a ``--client-images`` client, per model,
    with warm per-process caches and with them emptied before every call.
``flower``
    The whole ``flwr run .`` simulation (a real SuperLink started by
    ``tests/flower_harness.py``, Ray backend, ``client-resources-num-cpus`` CPUs per client)
    vs the bare PyTorch loop doing the identical work sequentially in this process (same
    clients from :func:`~fedul_flwr.data.simulated.load_client` with the parts the method
    needs, the method's ``local_task`` on the ClientApp's
    :class:`~fedul_flwr.methods.base.RoundContext`, ``train_local`` with its ``batch_seed``
    and the client's ``to_input``, FedAvg averaging by hand, checkpoint + central evaluation
    of the method's predictors on the test set after every round). Per-round times of the
    Flower run come from its ``metrics.json`` ``wall-time`` column (differences between
    consecutive rounds; each includes the round's central evaluation); the *fixed start-up
    cost* (submission -> end of the round-0 evaluation: CLI, SuperLink run start, Ray start,
    ServerApp imports and dataset load) and the *first round* (Ray actor start, torch
    import, data and partitions per actor) are reported separately. Steady state = median
    over rounds 2..R. Thread budget: both sides get ``--threads`` (the Ray actor through
    ``client-resources-num-cpus``, this process through ``torch.set_num_threads``).
``scale``
    ``flwr run .`` with ``num-supernodes`` = 10, 100, 1000 on the same total data (full
    MNIST from ``--data-dir``, 60k images; 6000 / 600 / 60 per client, M = 10 sets each),
    with partial participation for the large federations (``fraction-train``), and
    ``min-available-nodes`` = N so every round samples from the whole federation. Reports
    per-round time, the images trained per round, time per 1k images, time per sampled
    client and the peak memory of the whole process tree (SuperLink, ServerApp, Ray and its
    actors) sampled every 0.5 s: sum of RSS (double counts shared pages) and sum of PSS
    (proportional set size, shared pages split among processes).
``peers``
    pfl-research, this project's in-process engine and ``flwr run .`` (Ray) on pfl-research's
    CIFAR-10 workload (or the user's: ``--peers-workload FILE``, ``--peers-model``,
    ``--peers-users``, ``--peers-cohort``, ``--peers-images-per-user``, ``--peers-batch-size``,
    ``--peers-local-epochs``, ``--peers-lr``), interleaved on the same threads
    (:mod:`fedul_flwr.experiments.peers`); ``--pfl-python`` is pfl's own environment. Only
    when named (~20 minutes on 2 cores).
``gpu``
    Only with CUDA: ``paper-cnn`` and ``resnet18`` trained by several clients sharing one GPU
    (``client-resources-num-gpus`` = 1 / clients), once per ``--gpu-precisions`` value
    (default fp32 and bf16 autocast), per-round time and images/s. Otherwise
    prints ``skipped: no CUDA device``.

Examples::

    fedul benchmark --out /tmp/bench.json
    fedul benchmark --only loop --repeats 5
    fedul benchmark --only qc --repeats 5
    fedul benchmark --only scale --scale 10:1.0,100:0.1,1000:0.02
    fedul benchmark --quick        # smoke test, ~2 min
    fedul benchmark --only peers --pfl-python ../pfl-venv/bin/python --out docs/benchmarks/peers.json
    fedul benchmark --only peers --peers-workload my-workload.yaml --peers-cohort 20   # a flag wins over the file
    fedul benchmark --only hassle --data-dir /path/to/torchvision-root --hassle-rounds 6 \\
        --out docs/benchmarks/hassle.json --markdown docs/benchmarks/hassle.md

The ``flower`` and ``scale`` sections start a real SuperLink with the test suite's harness
(``tests/flower_harness.py``), so they run from a source checkout.

This module is the command (its options, the sections it runs, the markdown it renders); each
benchmark family is a module of its own: :mod:`~fedul_flwr.experiments.loop_bench`,
:mod:`~fedul_flwr.experiments.augment_bench`, :mod:`~fedul_flwr.experiments.hassle_bench`,
:mod:`~fedul_flwr.experiments.qc_bench`, :mod:`~fedul_flwr.experiments.client_bench`,
:mod:`~fedul_flwr.experiments.flower_bench`, :mod:`~fedul_flwr.experiments.scale_bench`,
:mod:`~fedul_flwr.experiments.gpu_bench`, :mod:`~fedul_flwr.experiments.peers`; what they
share is in :mod:`~fedul_flwr.experiments.bench_core` (medians, the machine) and
:mod:`~fedul_flwr.experiments.flwr_timing` (a timed ``flwr run .``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from fedul_flwr.experiments.augment_bench import augment_markdown, section_augment
from fedul_flwr.experiments.bench_core import machine_info, say
from fedul_flwr.experiments.client_bench import section_client
from fedul_flwr.experiments.flower_bench import section_flower
from fedul_flwr.experiments.gpu_bench import section_gpu
from fedul_flwr.experiments.hassle_bench import BASELINE_REVISION, hassle_markdown, section_hassle
from fedul_flwr.experiments.loop_bench import loop_markdown, section_loop
from fedul_flwr.experiments.peers import add_peers_arguments, check_peers_arguments, peers_markdown, section_peers
from fedul_flwr.experiments.qc_bench import section_qc
from fedul_flwr.experiments.scale_bench import SCALE_HEAD, scale_markdown, scale_rows, section_scale
from fedul_flwr.experiments.tables import markdown_table
from fedul_flwr.store import write_atomic


SECTIONS = ("loop", "augment", "hassle", "qc", "client", "flower", "scale", "gpu", "peers")


DEFAULT_SECTIONS = tuple(s for s in SECTIONS if s not in ("hassle", "peers"))
"""What runs without ``--only`` (the ``hassle`` section needs Fashion-MNIST and ~10 minutes, the
``peers`` section pfl-research's environment and ~20 minutes)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``fedul benchmark`` (see the module docstring)."""
    p.add_argument("--only", default=",".join(DEFAULT_SECTIONS), help="comma list of sections: " + ",".join(SECTIONS))
    p.add_argument("--repeats", type=int, default=3, help="repeats per measurement (medians are reported)")
    p.add_argument("--out", default="", help="write the results as JSON to this file")
    p.add_argument("--workdir", default="", help="scratch folder (SuperLink homes, run folders); default: a temp dir")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the bare loop = client-resources-num-cpus")
    p.add_argument("--dataset", default="mnist-sample", help="dataset of the qc, flower and gpu sections")
    p.add_argument("--data-dir", default="", help="torchvision root (full MNIST for scale; not needed for mnist-sample)")
    p.add_argument("--model", default="small-cnn")
    p.add_argument("--num-sets", default="10", help="M per client")
    p.add_argument("--samples-per-client", type=int, default=0, help="cap n_c (run-config samples-per-client; 0 = all)")
    p.add_argument("--qc-clients", type=int, default=5)
    p.add_argument("--loop-models", default="small-cnn,paper-cnn,resnet18", help="models of the loop section")
    p.add_argument("--loop-variants", default="plain,channels-last,fused,defaults,bf16",
                   help="loop executions compared (first = reference): plain,channels-last,fused,defaults,bf16,compile")
    p.add_argument("--loop-clients", type=int, default=5, help="clients of a loop-section round")
    p.add_argument("--loop-samples", default="resnet18:256",
                   help="model:n caps of the images per client in the loop section (others: --samples-per-client)")
    p.add_argument("--augment-batch", type=int, default=448, help="images per batch of the augment section")
    p.add_argument("--augment-device", default="cpu", choices=("cpu", "cuda"), help="where the augment section runs")
    p.add_argument("--augment-clients", type=int, default=5, help="clients of the augment section's FedUL rounds")
    p.add_argument("--augment-baseline", default="", help="augment section: also time fedul_flwr/augment.py at this git revision")
    p.add_argument("--feddb-round", action="store_true", help="augment section: also time a FedDB paper-protocol round (GPU)")
    p.add_argument("--feddb-clients", type=int, default=10, help="clients per FedDB round of --feddb-round")
    p.add_argument("--hassle-baseline", default=BASELINE_REVISION, help="hassle section: the git revision compared with this checkout")
    p.add_argument("--hassle-rounds", type=int, default=6, help="hassle section: rounds of each run (medians over rounds 2..R-1)")
    p.add_argument("--hassle-nodes", type=int, default=20, help="hassle section: clients of the federation")
    p.add_argument("--hassle-threads", type=int, default=1, help="hassle section: torch threads of each run")
    p.add_argument("--hassle-dataset", default="", help="hassle section: another dataset than the preset's (e.g. mnist-sample)")
    p.add_argument("--client-images", type=int, default=32, help="images of the client in the client section")
    p.add_argument("--client-calls", type=int, default=7, help="timed ClientApp calls per model in the client section")
    p.add_argument("--client-models", default="small-cnn,paper-cnn,resnet18")
    p.add_argument("--flower-clients", type=int, default=5)
    p.add_argument("--rounds", type=int, default=4, help="rounds of the flower and gpu runs (steady = rounds 2..R)")
    p.add_argument("--scale", default="10:0.5,100:0.1,1000:0.02", help="N:fraction-train points of the scale section")
    p.add_argument("--scale-dataset", default="mnist")
    p.add_argument("--scale-rounds", type=int, default=3)
    p.add_argument("--py-spy", default="", help="folder: profile each scale run with py-spy (raw stacks + summary)")
    p.add_argument("--gpu-clients", type=int, default=4)
    p.add_argument("--gpu-precisions", default="fp32,bf16", help="precision values of the gpu section's runs")
    p.add_argument("--loop-device", default="cpu", help="device of the loop section (cpu or cuda)")
    add_peers_arguments(p)
    p.add_argument("--quick", action="store_true", help="tiny settings (smoke test of the script)")
    p.add_argument("--markdown", default="", help="also write the loop, augment and scale results as markdown tables here")
    p.add_argument("--render", default="", help="only render --markdown from these earlier --out JSONs (comma list; runs nothing)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return finalize_args(p.parse_args(argv))


def finalize_args(args: argparse.Namespace) -> argparse.Namespace:
    """Apply ``--quick`` and check ``--only``."""
    if args.quick:
        args.repeats, args.rounds, args.scale_rounds, args.qc_clients, args.flower_clients = 1, 2, 2, 2, 2
        args.scale, args.samples_per_client = "10:0.2", 300
        args.loop_clients, args.loop_samples, args.augment_batch, args.augment_clients = 2, "resnet18:32", 32, 2
        args.feddb_clients, args.hassle_rounds = 1, 3
        args.peers_iterations, args.peers_warmup, args.peers_ray_rounds, args.peers_threads = 2, 1, 2, "1"
    unknown = set(args.only.split(",")) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"--only: unknown section(s) {sorted(unknown)}; valid: {','.join(SECTIONS)}")
    if "peers" in args.only.split(",") and not args.render:
        check_peers_arguments(args)
    return args


def render_markdown(results: Mapping[str, Any], label: str = "") -> str:
    """Markdown of the ``loop``, ``augment``, ``hassle``, ``scale`` and ``peers`` sections of a results dict (with the
    machine)."""
    m = results["machine"]
    parts = [f"Measured {m['date-utc']} on {m['cpu']} ({m['cpu-count']} cores, {m.get('cpu-capability', '?')}, "
             f"native bf16: {m.get('native-bf16-cpu', '?')}), torch {m['torch']}, flwr {m['flwr']}, "
             f"load average at the start {m['load-average-1-5-15'][0]:.2f}."]  # fmt: skip
    if "loop" in results:
        s = results["loop"]["setting"]
        parts.append(f"Loop: FedUL, {s['clients']} clients of `{s['dataset']}`, M = {s['num-sets']}, "
                     f"{s['threads']} threads, medians of {s['repeats']} interleaved repeats.\n\n" + loop_markdown(results["loop"]))  # fmt: skip
    if "augment" in results:
        parts.append(augment_markdown(results["augment"]))
    if "hassle" in results:
        parts.append(hassle_markdown(results["hassle"]))
    if "scale" in results:
        parts.append(scale_markdown(results["scale"], label))
    if "peers" in results:
        parts.append(peers_markdown(results["peers"], results.get("args", {}).get("peers_ray_rounds")))
    return "\n\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the selected sections; print a summary; write ``--out`` (and ``--markdown``)."""
    return benchmark(parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """``fedul benchmark``."""
    benchmark(finalize_args(args))
    return 0


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Run the sections of ``args``; print a summary; write ``--out`` (and ``--markdown``)."""
    if args.render:
        files = [Path(f) for f in args.render.split(",")]
        results = {f.stem: json.loads(f.read_text()) for f in files}
        for f in files:
            if not isinstance(results[f.stem], dict) or "machine" not in results[f.stem]:
                raise SystemExit(f"--render {f}: not the --out JSON of a benchmark run (it has no 'machine' entry)")
        text = "\n".join(
            (f"### `{f.name}`\n\n" if len(files) > 1 else "") + render_markdown(results[f.stem], f.stem) for f in files
        )
        scales = [(f.stem, results[f.stem]["scale"]) for f in files if "scale" in results[f.stem]]
        if len(scales) > 1:  # one summary table of every scale point first
            rows = [row for stem, scale in scales for row in scale_rows(scale, stem)]
            text = markdown_table(SCALE_HEAD, rows) + "\n\n" + text
        if args.markdown:
            write_atomic(args.markdown, text)
        print(text)
        return results
    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="fedul-bench-"))
    results: dict[str, Any] = {"machine": machine_info(), "args": vars(args)}
    say(f"benchmark: {results['machine']}")
    sections: dict[str, Callable[[], dict[str, Any]]] = {
        "loop": lambda: section_loop(args),
        "augment": lambda: section_augment(args),
        "hassle": lambda: section_hassle(args),
        "qc": lambda: section_qc(args),
        "client": lambda: section_client(args),
        "flower": lambda: section_flower(args, workdir),
        "scale": lambda: section_scale(args, workdir),
        "gpu": lambda: section_gpu(args, workdir),
        "peers": lambda: section_peers(args, workdir),
    }
    for name in args.only.split(","):
        start = time.perf_counter()
        results[name] = sections[name]()
        results[name]["section-wall-s"] = time.perf_counter() - start
        if args.out:  # write as we go: a late section failing keeps the earlier numbers
            write_atomic(args.out, json.dumps(results, indent=1, default=str) + "\n")
    results["machine"]["load-average-end"] = list(os.getloadavg())
    if args.out:
        write_atomic(args.out, json.dumps(results, indent=1, default=str) + "\n")
        say(f"wrote {args.out}")
    if args.markdown:
        write_atomic(args.markdown, render_markdown(results))
        say(f"wrote {args.markdown}")
    return results
