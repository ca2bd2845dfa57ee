"""`flwr run .` through a real SuperLink (simulation engine, Ray): the README's main job prints
one line per round, a SCAFFOLD run completes with its client state kept across rounds, a two-model method runs without app changes, and a
second run with the same seed gives identical metrics (the FedPL test: new node ids and a
different actor placement)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.flower_harness import app_dir, printed_lines, superlink

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # see tests/conftest.py


def test_flwr_run_completes_writes_outputs_and_keeps_scaffold_client_state(tmp_path: Path) -> None:
    """SCAFFOLD, the strategy with per-client state, through a real SuperLink and Ray: the run
    completes and writes its outputs, and each node's c_i round counter, read back from its
    ``context.state``, is 1 in round 1 and 2 in round 2 (3 nodes, all sampled)."""
    out = tmp_path / "runs"
    run_config = (f"strategy='scaffold' scaffold-option='I' num-rounds=2 output-dir='{out}' run-name='smoke' batch-size=256 "
                  "verbose=true")  # Flower's aggregation lines are read below
    with superlink(tmp_path) as link:
        log = link.run_to_completion(run_config, "num-supernodes=3 client-resources-num-cpus=1", out / "smoke")
    aggregated = re.findall(r"Aggregated MetricRecord: \{[^}]*'scaffold-cv-rounds': ([0-9.e+]+)", log)
    assert [float(v) for v in aggregated] == [1.0, 2.0], log[-3000:]
    run_dir = out / "smoke"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [row["round"] for row in metrics] == [0, 1, 2]
    assert metrics[2]["test-accuracy"] > metrics[0]["test-accuracy"]
    assert "train-loss" in metrics[1]
    for name in ("config.json", "model.pt", "accuracy.png", "summary.txt"):
        assert (run_dir / name).is_file(), name
    assert "clients=3" in (run_dir / "summary.txt").read_text()


def test_flwr_run_multi_model_method_without_app_changes(tmp_path: Path) -> None:
    """The test-only method of tests/dual_method.py through a real SuperLink and Ray: two
    exchanged models with their own weights, a kept model, a client sending one model."""
    out = tmp_path / "runs"
    run_config = (
        f"method='tests.dual_method:Dual' num-rounds=2 samples-per-client=96 batch-size=16 "
        f"output-dir='{out}' run-name='dual'"
    )
    with superlink(tmp_path) as link:
        link.run_to_completion(run_config, "num-supernodes=3 client-resources-num-cpus=1", out / "dual")
    metrics = json.loads((out / "dual" / "metrics.json").read_text())
    assert [row["round"] for row in metrics] == [0, 1, 2]
    for column in ("test-accuracy", "test-accuracy-b", "test-accuracy-ensemble"):
        assert column in metrics[2]
    assert metrics[2]["test-accuracy"] > metrics[0]["test-accuracy"]  # a learned from the labeled clients
    assert (out / "dual" / "model.pt").is_file() and (out / "dual" / "model-b.pt").is_file()
    assert not (out / "dual" / "model-c.pt").exists()  # c never leaves the nodes


def test_fedpl_metrics_do_not_depend_on_ray_actor_placement(tmp_path: Path) -> None:
    """Two `flwr run`s with the same seed give identical metrics, though the simulation
    engine draws new node ids for each run (replies are summed in partition-id order, not in
    node-id order) and places the clients on different actors: FedPL draws mixup partners and
    weights, and with every draw from the round's generators, two actors (1 CPU each) and one
    actor serving all clients give the same metrics. The torch thread count is pinned
    (client-threads=1): it changes float reduction order. A low threshold (0.1) makes about half of every batch unconfident from round 1 on, so each step
    draws partners and a mixing weight."""
    out = tmp_path / "runs"
    metrics = {}
    with superlink(tmp_path) as link:
        for cpus in (1, 2):
            name = f"cpus{cpus}"
            run_config = (
                f"method='fedpl' fedpl-threshold=0.1 num-rounds=2 samples-per-client=400 client-threads=1 "
                f"output-dir='{out}' run-name='{name}'"
            )
            link.run_to_completion(run_config, f"num-supernodes=3 client-resources-num-cpus={cpus}", out / name)
            metrics[cpus] = json.loads((out / name / "metrics.json").read_text())
    # node ids are drawn anew for every run: the rows list them (trained-nodes, failed-nodes)
    strip = lambda rows: [{k: v for k, v in r.items() if "time" not in k and "nodes" not in k} for r in rows]  # noqa: E731
    assert strip(metrics[1]) == strip(metrics[2])
    assert metrics[1][2]["test-accuracy"] > metrics[1][0]["test-accuracy"]


def test_settings_refused_before_round_1_fail_the_run_in_one_line_and_leave_no_folder(tmp_path: Path) -> None:
    """Through a real SuperLink (simulation engine): ``num-sets=5`` (fewer U sets than MNIST's
    10 classes) is refused by the ServerApp before any client trains, the run ends
    ``finished:failed`` with one log line naming the key and value, no run folder is left,
    and the same run-name then runs with working settings."""
    out = tmp_path / "runs"
    with superlink(tmp_path) as link:
        record, log = link.run_app(f"num-sets=5 num-rounds=1 output-dir='{out}' run-name='same' verbose=true",
                                   "num-supernodes=2 client-resources-num-cpus=1")  # fmt: skip
        assert record.get("status") == "finished:failed", (record, log[-3000:])
        refused = [line for line in log.splitlines() if "run refused before round 1" in line]
        assert len(refused) == 1 and "num-sets=5: every simulated client needs M_c >= K=10" in refused[0], log[-3000:]
        assert "configure_train" not in log  # no client was asked to train
        assert not (out / "same").exists()
        link.run_to_completion(f"num-rounds=1 samples-per-client=200 output-dir='{out}' run-name='same'",
                               "num-supernodes=2 client-resources-num-cpus=1", out / "same")  # fmt: skip


def test_readme_main_job_prints_one_line_per_round(tmp_path: Path) -> None:
    """The README's main job (5 simulated nodes; 3 of its 20 rounds, to keep the suite short), as
    a user runs it (``flwr run --stream``), prints at most 23 lines (40 for 20 rounds): Flower's
    few lines before the app starts, the run folder, one progress line per round (round 0 = the
    initial model) with test accuracy, seconds and ETA, and the summary line; no
    run-configuration dump, no warning the project causes."""
    out = tmp_path / "runs"
    with superlink(tmp_path) as link:
        proc = link.flwr("run", str(app_dir()), link.connection, "--stream", "--federation-config", "num-supernodes=5",
                         "--run-config", f"output-dir='{out}' num-rounds=3", timeout=1200)  # fmt: skip
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert len(printed_lines(text)) <= 23, text
    rounds = [int(r) for r in re.findall(r"round (\d+)/3: test-accuracy \d+\.\d\d%", text)]
    assert rounds == list(range(4)), text
    assert len(re.findall(r"round \d+/3: test-accuracy [0-9.]+%, [0-9.]+s, ETA ", text)) == 3
    assert re.search(r"^fedul-flwr: method=fedul .* rounds=3 failed-replies=0 final-test-accuracy=", text, re.M), text
    for noise in ("ConfigRecord", "run-config", "fraction_evaluate", "FutureWarning", "Traceback"):
        assert noise not in text, noise
