"""The compared methods through `flwr run .` (a real SuperLink, Flower's simulation engine, Ray):
each of MixMatch, UDA, RSCFed, SemiFL, FedRGD and FedMatch trains above chance (10 classes) in 3
rounds in its own setting, the labels-at-server methods with the server's training recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.flower_harness import superlink

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # see tests/conftest.py

COMMON = "num-rounds=3 samples-per-client=300 batch-size=32 lr=0.003 fixmatch-mu=2 num-labeled=200"
RUNS = {  # method -> its own setting (and what its 3 short rounds need)
    "mixmatch": "client-setting='labels-at-clients' mixmatch-lambda-u=10.0",
    "uda": "client-setting='labels-at-clients'",
    "rscfed": "client-setting='annotation-heterogeneity' label-layout='L,P,U' labeled-share=0.5",
    "semifl": "client-setting='labels-at-server' server-epochs=2",
    "fedrgd": "client-setting='labels-at-server' server-epochs=2",
    "fedmatch": "client-setting='labels-at-server' server-epochs=2",
}


def test_each_compared_method_trains_above_chance_in_three_rounds_through_flwr_run(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    with superlink(tmp_path) as link:
        for method, setting in RUNS.items():
            run_config = f"method='{method}' {setting} {COMMON} output-dir='{out}' run-name='{method}'"
            link.run_to_completion(run_config, "num-supernodes=3 client-resources-num-cpus=1", out / method)
    for method, setting in RUNS.items():
        metrics = json.loads((out / method / "metrics.json").read_text())
        assert [row["round"] for row in metrics] == [0, 1, 2, 3], method
        assert metrics[3]["test-accuracy"] > 0.2, (method, [row["test-accuracy"] for row in metrics])
        if "labels-at-server" in setting:
            assert all(row["server-train-loss"] >= 0 for row in metrics[1:]), method
