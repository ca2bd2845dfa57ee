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
    CIFAR-10 workload, interleaved on the same threads (:mod:`fedul_flwr.experiments.peers`);
    ``--pfl-python`` is pfl's own environment. Only when named (~20 minutes on 2 cores).
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
    fedul benchmark --only peers --pfl-python .pfl-venv/bin/python --out docs/benchmarks/peers.json
    fedul benchmark --only hassle --data-dir /path/to/torchvision-root --hassle-rounds 6 \\
        --out docs/benchmarks/hassle.json --markdown docs/benchmarks/hassle.md

The ``flower`` and ``scale`` sections start a real SuperLink with the test suite's harness
(``tests/flower_harness.py``), so they run from a source checkout.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent.parent
"""The source checkout (its ``tests/flower_harness.py`` starts the SuperLinks)."""

import torch

from fedul_flwr.acceleration import Acceleration, native_bf16
from fedul_flwr.experiments.augment_bench import augment_markdown, section_augment
from fedul_flwr.experiments.bare_loop import bare_round, build_federation, central_eval
from fedul_flwr.experiments.hassle_bench import BASELINE_REVISION, hassle_markdown, section_hassle
from fedul_flwr.experiments.peers import check_peers_arguments, peers_markdown, section_peers
from fedul_flwr.preflight import resolve_config
from fedul_flwr.config import RunConfig
from fedul_flwr.data.simulated import load_run_dataset
from fedul_flwr.methods import RoundContext, get_method
from fedul_flwr.experiments.tables import markdown_table
from fedul_flwr.execution import loop_acceleration
from fedul_flwr.server_app import global_models
from fedul_flwr.store import write_atomic

SECTIONS = ("loop", "augment", "hassle", "qc", "client", "flower", "scale", "gpu", "peers")
DEFAULT_SECTIONS = tuple(s for s in SECTIONS if s not in ("hassle", "peers"))
"""What runs without ``--only`` (the ``hassle`` section needs Fashion-MNIST and ~10 minutes, the
``peers`` section pfl-research's environment and ~20 minutes)."""


# --------------------------------------------------------------------------- helpers


def median(values: Sequence[float]) -> float:
    """Median of ``values`` (NaN for an empty sequence)."""
    return float(statistics.median(values)) if values else float("nan")


def say(text: str) -> None:
    """Print a progress line with the UTC time (flushed: sections take minutes)."""
    print(f"[{datetime.now(timezone.utc).strftime('%H:%M:%S')}] {text}", flush=True)


def machine_info() -> dict[str, Any]:
    """Hardware and software facts recorded next to the numbers."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = float("nan")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gb = int(line.split()[1]) / 2**20
    except OSError:
        pass
    import flwr

    return {
        "date-utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cpu-count": os.cpu_count(),
        "memory-gb": round(mem_gb, 1),
        "load-average-1-5-15": list(os.getloadavg()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "flwr": flwr.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu-capability": torch.backends.cpu.get_cpu_capability(),
        "native-bf16-cpu": native_bf16(torch.device("cpu")),
    }


# --------------------------------------------------------------------------- memory


def _kb_field(path: str, name: str) -> int:
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(name):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _process_name(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
    words = [w for w in cmd.split() if not w.startswith("-")][:2]
    return " ".join(Path(w).name for w in words)[:60] or "?"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (s; 0 if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_memory(root: int) -> list[tuple[str, float, float]]:
    """(name, RSS MB, PSS MB) of every process in ``root``'s tree."""
    out = []
    for pid in process_tree(root):
        rss = _kb_field(f"/proc/{pid}/status", "VmRSS:") / 1024
        pss = _kb_field(f"/proc/{pid}/smaps_rollup", "Pss:") / 1024
        if rss:
            out.append((_process_name(pid), rss, pss))
    return out


class PeakMemory:
    """Sample the memory of a process tree every ``interval`` s in a background thread.

    Attributes
    ----------
    peak_rss_mb, peak_pss_mb : float
        Highest sums seen (MB).
    peak_processes : int
        Most processes seen in the tree.
    at_peak : list[tuple[str, int, int]]
        (process, RSS MB, PSS MB) of each process at the PSS peak.
    cpu : dict[int, tuple[str, float]]
        pid -> (process, CPU seconds used, as last seen).
    """

    def cpu_by_process(self, top: int = 6) -> list[tuple[str, float]]:
        """The ``top`` processes by CPU seconds used during the measurement."""
        return [(name, round(sec, 1)) for name, sec in sorted(self.cpu.values(), key=lambda v: -v[1])[:top]]

    def __init__(self, root: int, interval: float = 0.5) -> None:
        self.root, self.interval = root, interval
        self.peak_rss_mb = self.peak_pss_mb = 0.0
        self.peak_processes = 0
        self.at_peak: list[tuple[str, int, int]] = []
        self.cpu: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            procs = tree_memory(self.root)
            for pid in process_tree(self.root):
                cpu = cpu_seconds(pid)
                if cpu:
                    known = self.cpu.get(pid, ("?", 0.0))[0]
                    self.cpu[pid] = (known if known != "?" else _process_name(pid), cpu)
            rss, pss = sum(p[1] for p in procs), sum(p[2] for p in procs)
            if pss > self.peak_pss_mb:  # the processes at the PSS peak, largest first
                self.at_peak = [(name, round(r), round(q)) for name, r, q in sorted(procs, key=lambda p: -p[2])]
            self.peak_rss_mb = max(self.peak_rss_mb, rss)
            self.peak_pss_mb = max(self.peak_pss_mb, pss)
            self.peak_processes = max(self.peak_processes, len(procs))
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


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


# --------------------------------------------------------------------------- loop


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


# --------------------------------------------------------------------------- qc


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


# --------------------------------------------------------------------------- client


def _clear_client_caches(client_module: Any) -> None:
    """Empty the ClientApp's per-process caches of the model modules and the parsed run
    configuration (if this version of the ClientApp has them): the cost of a message
    without them."""
    for name in ("_module", "_config"):
        cache = getattr(client_module, name, None)
        if cache is not None and hasattr(cache, "cache_clear"):
            cache.cache_clear()


def section_client(args: argparse.Namespace) -> dict[str, Any]:
    """Per-message cost of the ClientApp around the training loop, per model.

    Calls the real ClientApp's ``train`` through :class:`~fedul_flwr.inprocess.InProcessGrid`
    (no Ray) on a client of ``--client-images`` images (one or two batches), with the
    message the ServerApp sends (the exchanged models' arrays, the round and the resolved
    run configuration as JSON), timing the whole call and, inside it, ``train_local``
    (which the ClientApp reaches through ``LocalLoop.run``, so it is timed where that looks
    it up: :mod:`fedul_flwr.training`); overhead = call - train_local (parsing the run
    configuration, data look-up, model construction / weight loading, Q_c, reply arrays).
    With and without a preset (the server composes it once; the client only parses the
    resolved settings, so a preset should cost nothing per message). Calls alternate
    between the ClientApp as it runs (per-process caches warm) and with its caches emptied
    before the call (= building the models and parsing the configuration for every
    message). The ClientApp runs with ``client-threads = --threads``, the thread count of
    the other sections.
    """
    import fedul_flwr.client_app as client_module
    from flwr.app import ArrayRecord, ConfigRecord, RecordDict

    from fedul_flwr import wire
    from fedul_flwr.experiments.timing import timed_train_local
    from fedul_flwr.inprocess import InProcessGrid

    inner: list[float] = []
    out: dict[str, Any] = {"setting": {"images": args.client_images, "calls": args.client_calls}, "runs": []}
    with timed_train_local(inner.append):
        for model_name in args.client_models.split(","):
            for preset in ("", "authors-code"):
                cfg = resolve_config(
                    {
                        "dataset": args.dataset,
                        "data-dir": args.data_dir,
                        "model": model_name,
                        "num-sets": args.num_sets,
                        "samples-per-client": args.client_images,
                        "preset": preset,
                        "client-threads": args.threads,
                    }
                )
                data = load_run_dataset(cfg)
                method = get_method(cfg.method)(cfg)
                state = global_models(cfg, method, data.in_channels, data.num_classes, data.image_size).state_dict()
                settings = cfg.to_json()
                grid = InProcessGrid(client_module.app, 2, cfg.as_dict())
                calls: dict[bool, list[float]] = {True: [], False: []}
                overhead: dict[bool, list[float]] = {True: [], False: []}
                for call in range(2 * args.client_calls + 1):  # the first call builds the client: dropped
                    cached = call % 2 == 1  # interleaved: per-process caches kept / emptied before the call
                    if not cached:
                        _clear_client_caches(client_module)
                    config = ConfigRecord({wire.SERVER_ROUND: call + 1, wire.RUN_CONFIG: settings})
                    content = RecordDict({wire.ARRAYS: ArrayRecord(state), wire.CONFIG: config})
                    msg = grid.create_message(content, "train", 1, "bench")
                    inner.clear()
                    start = time.perf_counter()
                    (reply,) = grid.send_and_receive([msg])
                    elapsed = time.perf_counter() - start
                    if reply.has_error():
                        raise RuntimeError(reply.error.reason)
                    if call:
                        calls[cached].append(elapsed)
                        overhead[cached].append(elapsed - sum(inner))
                entry = {
                    "model": model_name,
                    "preset": preset,
                    "call-ms": 1000 * median(calls[True]),
                    "overhead-ms": 1000 * median(overhead[True]),
                    "uncached-call-ms": 1000 * median(calls[False]),
                    "uncached-overhead-ms": 1000 * median(overhead[False]),
                }
                out["runs"].append(entry)
                say(
                    f"client {model_name} preset={preset or '-'}: per-message overhead {entry['overhead-ms']:.1f}ms "
                    f"(rebuilding model + config every message: {entry['uncached-overhead-ms']:.1f}ms); "
                    f"call {entry['call-ms']:.1f}ms"
                )
    return out


# --------------------------------------------------------------------------- flwr run


# (marker in a stack frame, category), most specific first: where a sampled stack of the
# process tree spends its time (py-spy's "raw" format: "frame;frame;... count" per line)
PROFILE_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("train_local (", "ours: local training (train_local)"),
    ("load_client (", "ours: building a client's data (load_client)"),
    ("_models (", "ours: loading the received weights (client_app._models)"),
    ("central_evaluate (", "ours: server checkpoint + central evaluation"),
    ("get_message_ins (", "Flower: simulation engine polling the LinkState (get_message_ins)"),
    ("to_torch_state_dict (", "Flower: records -> tensors (deserialise)"),
    ("ArrayRecord", "Flower: tensors -> records (serialise)"),
    ("client_app.py", "ours: ClientApp, other"),
    ("ray", "Ray"),
    ("flwr", "Flower, other"),
)


def _process_kind(header: str) -> str:
    for marker, kind in (("default_worker", "Ray worker (client actor)"), ("flwr-simulation", "flwr-simulation (ServerApp + engine)"),
                         ("flower-superlink", "SuperLink"), ("flower-superexec", "SuperExec")):  # fmt: skip
        if marker in header:
            return kind
    return "other"


def summarize_profile(raw: Path) -> dict[str, Any]:
    """Busy samples of a ``py-spy record --subprocesses --format raw`` file by process and
    category (:data:`PROFILE_CATEGORIES`), as fractions of all busy samples."""
    counts: dict[str, dict[str, int]] = {}
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        # py-spy prefixes each stack with the chain of processes from the root to the sampled one
        kind = _process_kind([frame for frame in stack.split(";") if frame.startswith("process ")][-1])
        category = next((c for marker, c in PROFILE_CATEGORIES if marker in stack), "other")
        counts.setdefault(kind, {}).setdefault(category, 0)
        counts[kind][category] += int(count)
        total += int(count)
    return {
        "busy-samples": total,
        "by-process": {
            kind: {"share": sum(c.values()) / total, **{k: v / total for k, v in sorted(c.items(), key=lambda kv: -kv[1])}}
            for kind, c in sorted(counts.items(), key=lambda kv: -sum(kv[1].values()))
        } if total else {},
    }  # fmt: skip


def flwr_run(
    run_config: Mapping[str, Any], federation_config: str, workdir: Path, timeout: float = 1800, memory_every_s: float = 1.0,
    py_spy: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run ``flwr run .`` on a fresh SuperLink (tests/flower_harness.py); time it.

    Memory and CPU of the process tree are sampled every ``memory_every_s`` seconds; each
    sample walks /proc and every process's smaps_rollup (measurable CPU on 2 cores), so the
    timing-only ``flower`` section samples every 5 s. The harness waits for the run's
    ``model.pt`` instead of polling ``flwr ls`` (a Python process every 2 s, which slowed
    the clients training meanwhile). With ``py_spy`` (a file path), ``py-spy record`` samples
    the whole process tree (50 Hz, busy threads only) for the run and writes its raw stacks
    there; the result then has their :func:`summarize_profile`.

    Returns
    -------
    dict
        ``status``, ``rounds`` (metrics.json rows), ``round-s`` (per-round wall times,
        rounds 1..R), ``startup-s`` (submission -> end of the round-0 evaluation),
        ``total-s``, ``peak-rss-mb``, ``peak-pss-mb``, ``peak-processes``.
    """
    superlink = _harness().superlink

    workdir.mkdir(parents=True, exist_ok=True)
    out_dir = workdir / "runs"
    run_name = f"bench-{time.time_ns()}"
    values = {**run_config, "output-dir": str(out_dir), "run-name": run_name}
    text = " ".join(f"{k}='{v}'" if isinstance(v, str) else f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items())
    with superlink(workdir / run_name) as link, PeakMemory(link.process.pid, memory_every_s) as mem:
        spy = None
        if py_spy is not None:
            spy = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "--subprocesses", "--nonblocking", "--rate", "50",
                 "--format", "raw", "--output", str(py_spy), "--pid", str(link.process.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        submitted = time.time()
        record, log = link.run_app(text, federation_config, timeout, done_file=out_dir / run_name / "model.pt")
        total = time.time() - submitted
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            spy.wait(timeout=120)
    status = str(record.get("status", "unknown"))
    run_dir = out_dir / run_name
    rows = json.loads((run_dir / "metrics.json").read_text()) if (run_dir / "metrics.json").exists() else []
    result: dict[str, Any] = {
        "status": status,
        "total-s": total,
        "peak-rss-mb": mem.peak_rss_mb,
        "peak-pss-mb": mem.peak_pss_mb,
        "peak-processes": mem.peak_processes,
        "processes-at-peak": mem.at_peak,
        "cpu-s-by-process": mem.cpu_by_process(),
        "rounds": rows,
    }
    if py_spy is not None and py_spy.exists():
        result["profile"] = summarize_profile(py_spy)
    if not status.endswith("completed") or not rows:
        result["log-tail"] = log[-3000:]
        say(f"flwr run {status}: {log[-1500:]}")
        return result
    wall = [r["wall-time"] for r in sorted(rows, key=lambda r: r["round"])]
    started = (run_dir / "config.json").stat().st_mtime  # RunOutputs.create wrote it at its start
    result["round-s"] = [b - a for a, b in zip(wall, wall[1:])]
    result["eval0-s"] = wall[0]
    result["startup-s"] = started + wall[0] - submitted
    result["final-test-accuracy"] = rows[-1].get("test-accuracy")
    return result


def _federation_config(num_supernodes: int, cpus: float, gpus: float = 0.0) -> str:
    return f"num-supernodes={num_supernodes} client-resources-num-cpus={cpus} client-resources-num-gpus={gpus}"


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
                    run_config, _federation_config(args.flower_clients, args.threads), workdir / "flower", memory_every_s=5.0
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
            "federation-config": _federation_config(args.flower_clients, args.threads),
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


# --------------------------------------------------------------------------- scale


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
        run = flwr_run(run_config, _federation_config(n, args.threads), workdir / "scale", py_spy=spy)
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


# --------------------------------------------------------------------------- gpu


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
        fed_cfg = _federation_config(args.gpu_clients, cpus, round(1.0 / args.gpu_clients, 4))
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


# --------------------------------------------------------------------------- markdown


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


# --------------------------------------------------------------------------- main


@functools.cache
def _harness() -> Any:
    """``tests/flower_harness.py`` of the source checkout (SuperLink start, process trees)."""
    if not (PROJECT / "tests" / "flower_harness.py").is_file():
        raise SystemExit("the flower and scale sections need a source checkout (tests/flower_harness.py)")
    if str(PROJECT) not in sys.path:
        sys.path.insert(0, str(PROJECT))
    from tests import flower_harness

    return flower_harness


def process_tree(root: int) -> list[int]:
    """Pids of ``root`` and its descendants (the test harness's walk)."""
    return _harness().process_tree(root)


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
    p.add_argument("--pfl-python", default="", help="peers: pfl-research's Python (default: .pfl-venv/bin/python here)")
    p.add_argument("--peers-threads", default="1,2", help="peers: torch thread counts measured (comma list)")
    p.add_argument("--peers-iterations", type=int, default=10, help="peers: timed iterations of each system per phase")
    p.add_argument("--peers-warmup", type=int, default=2, help="peers: iterations left out first")
    p.add_argument("--peers-users", type=int, default=1000, help="peers: users of the population (50 images each)")
    p.add_argument("--peers-dataset", default="synthetic-cifar", help="peers: synthetic-cifar, or cifar10 with --data-dir")
    p.add_argument("--peers-ray-rounds", type=int, default=6, help="peers: rounds of the Ray run (0: none)")
    p.add_argument("--peers-precision", action=argparse.BooleanOptionalAction, default=True,
                   help="peers: also time the engine at precision=auto")
    p.add_argument("--peers-batched", action=argparse.BooleanOptionalAction, default=True,
                   help="peers: also time the engine's batched path (at one thread on a CPU)")
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
        "peers": lambda: section_peers(args, workdir, say, flwr_run),
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


if __name__ == "__main__":
    main()
