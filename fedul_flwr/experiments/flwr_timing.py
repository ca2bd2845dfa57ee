"""Timing a whole ``flwr run .`` (the ``flower``, ``scale``, ``gpu`` and ``peers`` benchmarks).

:func:`flwr_run` submits the app to a fresh SuperLink started by the test suite's harness
(``tests/flower_harness.py`` of the source checkout), times its rounds from the run's
``metrics.json`` and samples the memory and CPU of the whole process tree (SuperLink,
ServerApp, Ray and its actors) from ``/proc`` (:class:`PeakMemory`); with py-spy it also
profiles the tree (:func:`summarize_profile`).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedul_flwr.experiments.bench_core import say

__all__ = ["PROJECT", "PeakMemory", "cpu_seconds", "federation_config", "flwr_run", "process_tree", "summarize_profile",
           "tree_memory"]  # fmt: skip


PROJECT = Path(__file__).resolve().parent.parent.parent
"""The source checkout (its ``tests/flower_harness.py`` starts the SuperLinks)."""


@functools.cache
def _harness() -> Any:
    """``tests/flower_harness.py`` of the source checkout (SuperLink start, process trees)."""
    if not (PROJECT / "tests" / "flower_harness.py").is_file():
        raise SystemExit("the flower and scale sections need a source checkout (tests/flower_harness.py)")
    if str(PROJECT) not in sys.path:
        sys.path.insert(0, str(PROJECT))
    from tests import flower_harness  # deferred: optional, only a source checkout has tests/ (checked above)

    return flower_harness


def process_tree(root: int) -> list[int]:
    """Pids of ``root`` and its descendants (the test harness's walk)."""
    return _harness().process_tree(root)


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


def federation_config(num_supernodes: int, cpus: float, gpus: float = 0.0) -> str:
    """``flwr run``'s ``--federation-config``: N supernodes, CPUs and GPUs per client."""
    return f"num-supernodes={num_supernodes} client-resources-num-cpus={cpus} client-resources-num-gpus={gpus}"
