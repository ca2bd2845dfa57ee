"""`flwr run .` through a real SuperLink (simulation engine, Ray): the run completes, and a
second run with the same seed gives identical metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.flower_harness import superlink

pytestmark = pytest.mark.slow


def test_flwr_run_completes_writes_outputs_and_repeats_itself(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    logs = {}
    with superlink(tmp_path) as link:
        for name in ("smoke", "again"):  # the simulation engine draws new node ids for each run
            run_config = f"num-rounds=2 output-dir='{out}' run-name='{name}' batch-size=256"
            record, log = link.run_app(
                run_config, "num-supernodes=3 client-resources-num-cpus=1", timeout=420, done_file=out / name / "model.pt"
            )
            assert record.get("status") == "finished:completed", (record, log[-3000:])
            logs[name] = log
    run_dir = out / "smoke"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [row["round"] for row in metrics] == [0, 1, 2]
    assert metrics[2]["test-accuracy"] > metrics[0]["test-accuracy"]
    assert "train-loss" in metrics[1]
    for name in ("config.json", "model.pt", "accuracy.png", "summary.txt"):
        assert (run_dir / name).is_file(), name
    assert "clients=3" in (run_dir / "summary.txt").read_text()
    # same seed, 3 clients, 2 rounds: replies are summed in partition-id order, not in the
    # order of the (random) node ids, so the second run repeats the first to the last bit
    again = json.loads((out / "again" / "metrics.json").read_text())
    strip = lambda rows: [{k: v for k, v in r.items() if "time" not in k} for r in rows]  # noqa: E731
    assert strip(again) == strip(metrics), logs["again"][-3000:]
