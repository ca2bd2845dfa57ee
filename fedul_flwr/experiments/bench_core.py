"""What every benchmark shares: medians, progress lines, and the machine a number was taken on."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import flwr
import torch

from fedul_flwr.acceleration import native_bf16

__all__ = ["cpu_model", "machine_info", "median", "say"]


def median(values: Sequence[float]) -> float:
    """Median of ``values`` (NaN for an empty sequence)."""
    return float(statistics.median(values)) if values else float("nan")


def say(text: str) -> None:
    """Print a progress line with the UTC time (flushed: sections take minutes)."""
    print(f"[{datetime.now(timezone.utc).strftime('%H:%M:%S')}] {text}", flush=True)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), ``"unknown"`` where it cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def machine_info() -> dict[str, Any]:
    """Hardware and software facts recorded next to the numbers."""
    cpu = cpu_model()
    mem_gb = float("nan")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gb = int(line.split()[1]) / 2**20
    except OSError:
        pass
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
