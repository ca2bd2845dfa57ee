"""`flwr run .` through a real SuperLink (simulation engine, Ray): the run completes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.flower_harness import superlink

pytestmark = pytest.mark.slow


def test_flwr_run_completes_and_writes_outputs(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    run_config = f"num-rounds=2 output-dir='{out}' run-name='smoke' batch-size=256"
    with superlink(tmp_path) as link:
        record, log = link.run_app(
            run_config, "num-supernodes=3 client-resources-num-cpus=1", timeout=420, done_file=out / "smoke" / "model.pt"
        )
    assert record.get("status") == "finished:completed", (record, log[-3000:])
    run_dir = out / "smoke"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [row["round"] for row in metrics] == [0, 1, 2]
    assert metrics[2]["test-accuracy"] > metrics[0]["test-accuracy"]
    assert "train-loss" in metrics[1]
    for name in ("config.json", "model.pt", "accuracy.png", "summary.txt"):
        assert (run_dir / name).is_file(), name
    assert "clients=3" in (run_dir / "summary.txt").read_text()
