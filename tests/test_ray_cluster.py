"""A simulation that outgrows one machine runs on an existing Ray cluster: here a head and one
worker started as separate Ray nodes on loopback with Ray's own CLI, the SuperLink pointed at
the head through ``RAY_ADDRESS``. Flower's Ray backend then joins that cluster (its
``ray.init`` without an address reads ``RAY_ADDRESS``) instead of starting its own, and places
one client actor on each node (1 CPU per node, ``client-resources-num-cpus=1``)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from tests.flower_harness import alive, ray_cluster, superlink

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # see tests/conftest.py


def test_simulation_runs_on_a_two_node_ray_cluster_and_stops_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    run_config = f"num-rounds=2 samples-per-client=96 batch-size=32 output-dir='{out}' run-name='cluster'"
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(ray_cluster(nodes=2, cpus_per_node=1))
        except (RuntimeError, TimeoutError) as exc:
            pytest.skip(f"Ray cannot start a two-node cluster on this machine: {exc}")
        with superlink(tmp_path, {"RAY_ADDRESS": cluster.address}) as link:
            log = link.run_to_completion(run_config, "num-supernodes=4 client-resources-num-cpus=1", out / "cluster")
        placements = cluster.node_ids_of_actors("ClientAppActor")
    assert len(placements) == 2, (placements, log[-3000:])  # one actor per CPU of the cluster
    assert len(set(placements)) == 2, placements  # ... on both nodes
    metrics = json.loads((out / "cluster" / "metrics.json").read_text())
    assert [row["round"] for row in metrics] == [0, 1, 2]
    assert metrics[2]["test-accuracy"] > metrics[0]["test-accuracy"]
    assert len(cluster.stopped) > 2 * 2  # both nodes' raylets, GCS, workers, ... were running
    assert [pid for pid in cluster.stopped if alive(pid)] == []  # ... and all of them are gone
