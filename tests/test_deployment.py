"""Real deployment on loopback: ``scripts/deploy_local.sh`` starts a real ``flower-superlink``
and three ``flower-supernode`` processes (each with its own node data folder), submits
``flwr run . <connection>`` and waits; the run must finish as completed with all three
nodes training in every round."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "deploy_local.sh"
VENV_BIN = Path(sys.executable).parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(shutil.which(t) for t in ("setsid", "curl", "bash"))
        or not (VENV_BIN / "flower-superlink").exists(),
        reason="needs setsid, curl and flower-superlink next to the test interpreter",
    ),
]


def test_loopback_deployment_three_supernodes(tmp_path: Path) -> None:
    rounds = 2
    env = {**os.environ, "VENV_BIN": str(VENV_BIN), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [
            "bash",
            str(SCRIPT),
            "--workdir",
            str(tmp_path),
            "--port",
            "9540",
            "--nodes",
            "3",
            "--max-set-size",
            "12",
            "--run-config",
            f"num-rounds={rounds} num-sets=10 batch-size=32 verbose=true",  # Flower's aggregation lines are read below
            "--timeout",
            "300",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log")))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{logs}"

    status = json.loads((tmp_path / "status.json").read_text())["runs"][0]
    assert status["status"] == "finished:completed"
    run_log = (tmp_path / "run.log").read_text()
    per_round = re.findall(r"aggregate_train: Received (\d+) results and (\d+) failures", run_log)
    assert per_round == [("3", "0")] * rounds, run_log[-3000:]
    # each SuperNode really ran the ClientApp on its own data folder
    for i in range(3):
        assert (tmp_path / "nodes" / f"node-{i}" / "priors.csv").is_file()
    (run_dir,) = list((tmp_path / "runs").iterdir())
    assert (run_dir / "model.pt").is_file()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [row["round"] for row in metrics] == list(range(rounds + 1))
    # nothing left running
    leftover = subprocess.run(["pgrep", "-f", "127.0.0.1:954[0-3]"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", subprocess.run(["ps", "-ef"], capture_output=True, text=True).stdout


# --------------------------------------------------------------------------- faults


class _Federation:
    """A deployment SuperLink and SuperNodes started from the test, each in its own
    process group (so the SuperExec/ClientApp processes a node spawns go with it)."""

    def __init__(self, tmp_path: Path, node_dirs: list[Path]) -> None:
        from tests.flower_harness import SuperLink, flower_env, free_port

        self.tmp = tmp_path
        self.node_dirs = node_dirs
        self.port = free_port()
        home = tmp_path / "flwr-home"
        home.mkdir()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "dep"\n\n[superlink.dep]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        self.env = flower_env(home)
        self.procs: dict[str, subprocess.Popen] = {}
        self.node_ports = [free_port() for _ in node_dirs]
        self._start("superlink", ["flower-superlink", "--insecure", "--disable-runtime-dependency-installation",
                                  "--host", "127.0.0.1", "--port", str(self.port)])
        self.link = SuperLink(process=self.procs["superlink"], connection="dep", env=self.env,
                              log_file=tmp_path / "superlink.log")
        self._wait_healthy()
        for i in range(len(node_dirs)):
            self.start_node(i)

    def _start(self, name: str, cmd: list[str]) -> None:
        log = (self.tmp / f"{name}.log").open("a")
        self.procs[name] = subprocess.Popen(
            [str(VENV_BIN / cmd[0]), *cmd[1:]], env=self.env, cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )

    def _wait_healthy(self) -> None:
        from tests.flower_harness import wait_healthy

        wait_healthy(self.procs["superlink"], self.port, self.tmp / "superlink.log")

    def start_node(self, i: int) -> None:
        self._start(f"supernode-{i}", ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.port}",
                                       "--port", str(self.node_ports[i]),
                                       "--node-config", f'data-dir="{self.node_dirs[i]}"'])

    def kill(self, name: str, sig: int = 9) -> None:
        import signal

        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def submit(self, run_config: str) -> str:
        """``flwr run`` of the app against this SuperLink (:meth:`SuperLink.submit`); the run id."""
        return self.link.submit(run_config)

    def wait(self, run_id: str, timeout: float = 300) -> tuple[str, str]:
        """Wait for the run on its log stream (:meth:`SuperLink.wait`); its status and log."""
        record, log = self.link.wait(run_id, timeout)
        return str(record.get("status", "")), log

    def close(self) -> None:
        for name in [n for n in self.procs if n != "superlink"] + ["superlink"]:
            if name in self.procs:
                self.kill(name, 15)


def test_supernode_crash_mid_run_then_rejoin(tmp_path: Path) -> None:
    """SIGKILL one of three SuperNodes (and its ClientApp) right after round 1 and restart it
    at once: the round it missed gets an error reply for it once the SuperLink sees its
    heartbeat stop, the run goes on with the other two (min-train-nodes=2), and the
    restarted node trains again in the last round. The record names the dead node by its own
    id (not the SuperLink's, the source of the error reply) in the summary and in the round's
    warning line, and ``clients=`` counts the four nodes that trained (the restarted node
    registers under a new id)."""
    import time

    from fedul_flwr.checks import resolve_config
    from fedul_flwr.node_data import write_nodes

    node_dirs = write_nodes(resolve_config({"num-sets": 10, "seed": 7}), tmp_path / "nodes", 3, max_set_size=12)
    fed = _Federation(tmp_path, node_dirs)
    try:
        runs = tmp_path / "runs"
        run_id = fed.submit(
            f'num-rounds=3 num-sets=10 batch-size=32 min-available-nodes=2 min-train-nodes=2 device="cpu" verbose=true '
            f'output-dir="{runs}" run-name="fault"'
        )

        def rounds_done() -> int:
            try:
                return max(r["round"] for r in json.loads((runs / "fault" / "metrics.json").read_text()))
            except (OSError, ValueError, KeyError):
                return -1

        deadline = time.monotonic() + 240
        while rounds_done() < 1:
            assert time.monotonic() < deadline, "round 1 did not finish in 240 s"
            time.sleep(0.5)
        fed.kill("supernode-2")  # a crash: no goodbye to the SuperLink
        fed.start_node(2)  # the organisation restarts it; it registers as a new node

        status, log = fed.wait(run_id)
    finally:
        fed.close()
    assert status == "finished:completed", log[-4000:]
    per_round = [tuple(map(int, m)) for m in re.findall(r"aggregate_train: Received (\d+) results and (\d+) failures", log)]
    assert len(per_round) == 3, log[-4000:]
    assert per_round[0] == (3, 0)
    assert per_round[1][0] >= 2 and per_round[1][1] == 1  # the crashed node's reply is an error
    assert "Node Unavailable" in log
    assert per_round[2] == (3, 0)  # the restarted node is back
    rows = json.loads((runs / "fault" / "metrics.json").read_text())
    trained = {r["round"]: set(r["trained-nodes"]) for r in rows if "trained-nodes" in r}
    (dead,) = trained[1] - trained[3]  # the killed node trained in round 1, its restart is a new node
    assert dead != 1 and dead not in trained[2]  # 1: the SuperLink's own id
    summary = (runs / "fault" / "summary.txt").read_text()
    assert f"failed-replies=1 failed-nodes={dead}(NODE_UNAVAILABLE) " in summary and "clients=4 " in summary, summary
    assert "status=ok" in summary
    assert f"fedul-flwr: round 2: 1 of 3 training replies failed: node {dead} (NODE_UNAVAILABLE)" in log, log[-4000:]


def test_tls_and_supernode_authentication(tmp_path: Path) -> None:
    """``deploy_local.sh --tls``: every connection over TLS with a fresh local CA, SuperNode
    authentication on, two registered SuperNodes train; one with an unregistered key is
    refused by the SuperLink."""
    if not shutil.which("openssl") or not shutil.which("ssh-keygen"):
        pytest.skip("needs openssl and ssh-keygen")
    env = {**os.environ, "VENV_BIN": str(VENV_BIN), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--tls", "--workdir", str(tmp_path), "--port", "9545", "--nodes", "2",
         "--max-set-size", "12", "--run-config", "num-rounds=1 num-sets=10 batch-size=32 verbose=true", "--timeout", "300"],
        env=env, capture_output=True, text=True, timeout=420,
    )
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log")))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{logs}"
    assert "unregistered key was refused" in proc.stdout
    intruder = (tmp_path / "intruder.log").read_text()
    assert "Failed to activate SuperNode" in intruder
    run_log = (tmp_path / "run.log").read_text()
    assert re.findall(r"aggregate_train: Received (\d+) results and (\d+) failures", run_log) == [("2", "0")]
    assert json.loads((tmp_path / "status.json").read_text())["runs"][0]["status"] == "finished:completed"
    # the SuperLink really speaks TLS only: plain HTTP to its port fails
    config = (tmp_path / "flwr-home" / "config.toml").read_text()
    assert "root-certificates" in config and "insecure" not in config
    for name in ("ca.crt", "server.pem", "server.key", "supernode-0", "supernode-2.pub"):
        assert (tmp_path / "certs" / name).is_file()


def _two_rounds_on_simulated_nodes(
    tmp_path: Path, setting: dict, run_config: str, max_set_size: int, per_aggregation: int = 3
) -> tuple[str, list[Path], list[dict]]:
    """Write three node folders of a simulated ``setting`` with the node-data tool, run
    ``run_config`` on them for 2 rounds behind a real SuperLink and three SuperNodes, check
    that every aggregation got ``per_aggregation`` replies and no failure (all three nodes,
    unless a method aggregates each model over the nodes that sent it); returns the log, the
    folders and metrics.json."""
    from fedul_flwr.checks import resolve_config
    from fedul_flwr.node_data import write_nodes

    node_dirs = write_nodes(resolve_config(setting), tmp_path / "nodes", 3, max_set_size=max_set_size)
    fed = _Federation(tmp_path, node_dirs)
    runs = tmp_path / "runs"
    try:
        run_id = fed.submit(f'{run_config} num-rounds=2 min-available-nodes=3 min-train-nodes=3 device="cpu" verbose=true '
                            f'output-dir="{runs}" run-name="two-rounds"')  # fmt: skip
        status, log = fed.wait(run_id)
    finally:
        fed.close()
    assert status == "finished:completed", log[-4000:]
    per_round = re.findall(r"aggregate_train: Received (\d+) results and (\d+) failures", log)
    assert per_round and set(per_round) == {(str(per_aggregation), "0")}, log[-4000:]
    metrics = json.loads((runs / "two-rounds" / "metrics.json").read_text())
    assert [row["round"] for row in metrics] == [0, 1, 2]
    return log, node_dirs, metrics


def test_positive_unlabeled_nodes_train_fedpu_on_loopback(tmp_path: Path) -> None:
    """Three positive-unlabeled node folders (labeled/, unlabeled/, class_prior.csv written by
    the node-data tool from a simulated PU split) behind three real SuperNodes: FedPU with
    its cross-client term completes 2 rounds with all three nodes training in each, after
    the server has queried the three nodes for their positive classes."""
    log, node_dirs, _ = _two_rounds_on_simulated_nodes(
        tmp_path, {"client-setting": "pu", "positive-classes": "4", "seed": 3},
        'method="fedpu" fedpu-cross-client=true batch-size=16', max_set_size=48,
    )  # fmt: skip
    announced = re.findall(r"fedpu-cross-client: positive classes of nodes \[(.*?)\]", log)
    assert len(announced) == 1 and len(announced[0].split(",")) == 3, log[-4000:]
    assert all((d / "class_prior.csv").is_file() and (d / "unlabeled" / "images.npy").is_file() for d in node_dirs)


def test_labels_at_clients_nodes_train_feddb_on_loopback(tmp_path: Path) -> None:
    """Three node folders with a labeled and an unlabeled part (written by the node-data tool
    from a simulated labels-at-clients split) behind three real SuperNodes: FedDB completes
    2 rounds, each node uploading its APP-U, and the server's DMA weights the three replies."""
    log, node_dirs, metrics = _two_rounds_on_simulated_nodes(
        tmp_path, {"client-setting": "labels-at-clients", "num-labeled": 60, "seed": 2},
        'method="feddb" batch-size=8 fixmatch-mu=2', max_set_size=120,
    )  # fmt: skip
    assert len(re.findall(r"DMA round \d: beta = \[[^\]]+\]", log)) == 2, log[-4000:]
    assert all(len(row["app-u"]) == 10 and len(row["dma-beta"]) == 3 for row in metrics[1:])
    assert all((d / "labeled" / "labels.npy").is_file() and not (d / "class_prior.csv").exists() for d in node_dirs)


def test_annotation_heterogeneity_nodes_train_hassle_on_loopback(tmp_path: Path) -> None:
    """A fully labeled, a partially labeled and an unlabeled node folder (written by the
    node-data tool from a simulated annotation-heterogeneity split) behind three real
    SuperNodes: HASSLE completes 2 rounds, and each of its four models reaches the server from
    exactly the two nodes whose data trains it (w_S and r_US from the labeled ones, w_U and
    r_SU from those with unlabeled images): no node sends a model it may not, nor the copies
    w_S_prev, w_U_prev that it only reads."""
    log, node_dirs, metrics = _two_rounds_on_simulated_nodes(
        tmp_path, {"client-setting": "annotation-heterogeneity", "label-layout": "L,P,U", "labeled-share": 0.5, "seed": 4},
        'method="hassle" batch-size=16', max_set_size=80, per_aggregation=2,
    )  # fmt: skip
    counts = re.findall(r"round \d: replies per model (\{[^}]*\}) \(of 3\)", log)
    assert counts == ["{'w_S': 2, 'w_U': 2, 'r_US': 2, 'r_SU': 2, 'w_S_prev': 0, 'w_U_prev': 0}"] * 2, log[-4000:]
    assert [(d / "labeled").is_dir() for d in node_dirs] == [True, True, False]
    assert [(d / "unlabeled").is_dir() for d in node_dirs] == [False, True, True]
    assert all({"test-accuracy-SM", "test-accuracy-UM"} <= set(row) for row in metrics)


def test_failing_nodes_go_on_record_and_a_failing_majority_stops_the_run(tmp_path: Path) -> None:
    """Two of three real SuperNodes hold a broken node folder (a priors.csv row that does not
    sum to 1), so their ClientApps fail in every round. With the default max-failure-fraction
    (0.5) the run stops in round 1 as failed, with both nodes' NodeDataError; with 1.0 it goes
    on with the good node, and metrics.csv counts 2 failed replies in each of the 2 rounds
    while the summary names both failed nodes and their error type."""
    from fedul_flwr.checks import resolve_config
    from fedul_flwr.node_data import write_nodes

    node_dirs = write_nodes(resolve_config({"num-sets": 10, "seed": 3}), tmp_path / "nodes", 3, max_set_size=12)
    for bad in node_dirs[1:]:
        lines = (bad / "priors.csv").read_text().splitlines()
        lines[2] = lines[2].rsplit(",", 1)[0] + ",0.9"
        (bad / "priors.csv").write_text("\n".join(lines) + "\n")
    fed = _Federation(tmp_path, node_dirs)
    runs = tmp_path / "runs"
    common = (f'num-rounds=2 num-sets=10 batch-size=32 min-available-nodes=3 min-train-nodes=1 device="cpu" verbose=true '
              f'output-dir="{runs}"')  # fmt: skip
    try:
        stopped, stopped_log = fed.wait(fed.submit(f'{common} run-name="stops"'))
        went_on, went_on_log = fed.wait(fed.submit(f'{common} run-name="goes-on" max-failure-fraction=1.0'))
    finally:
        fed.close()
    assert stopped == "finished:failed", stopped_log[-4000:]
    assert "2 of 3 training replies failed, more than max-failure-fraction=0.5 allows" in stopped_log, stopped_log[-4000:]
    assert stopped_log.count("NodeDataError") >= 2 and "priors.csv" in stopped_log
    assert not (runs / "stops" / "checkpoint.pt").exists()
    stopped_summary = (runs / "stops" / "summary.txt").read_text()  # the stopped run's record
    assert "failed-replies=2 " in stopped_summary and "status=failed reason=NoSuccessfulReplyError: round 1: " in stopped_summary

    assert went_on == "finished:completed", went_on_log[-4000:]
    per_round = re.findall(r"aggregate_train: Received (\d+) results and (\d+) failures", went_on_log)
    assert per_round == [("1", "2")] * 2, went_on_log[-4000:]
    with (runs / "goes-on" / "metrics.csv").open() as fh:
        assert [(row["round"], row["failed-replies"]) for row in csv.DictReader(fh)] == [("0", ""), ("1", "2"), ("2", "2")]
    summary = (runs / "goes-on" / "summary.txt").read_text()
    failed = re.search(r"failed-replies=4 failed-nodes=(\d+)\(NodeDataError\),(\d+)\(NodeDataError\) ", summary)
    assert failed and "clients=1 " in summary, summary  # the nodes that trained: the good one


# --------------------------------------------------------------------------- the docs' one-host recipe


def _documented_block(page: Path, heading: str) -> str:
    """The first ```bash block under ``## <heading>`` of ``page``."""
    section = page.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def test_every_documented_supernode_has_its_own_port() -> None:
    """docs/deployment.md and the README start every SuperNode with ``--port`` (Flower's
    default 9094 would make a second SuperNode on the same host fail), and the one-host
    block gives its three SuperNodes three different ports."""
    pages = [REPO / "README.md", REPO / "docs" / "deployment.md"]
    for page in pages:
        commands = re.findall(r"^flower-supernode (?:.*\\\n)*.*", page.read_text(), re.M)
        assert commands, page
        assert all(" --port " in c for c in commands), (page, [c for c in commands if " --port " not in c])
    block = _documented_block(REPO / "docs" / "deployment.md", "Three SuperNodes on one host")
    ports = re.findall(r"^flower-supernode .* --port (\d+)", block, re.M)
    assert len(ports) == 3 and len(set(ports)) == 3, block


def test_three_supernodes_on_one_host_as_documented(tmp_path: Path) -> None:
    """docs/deployment.md's block "Three SuperNodes on one host", run by bash as printed but
    for its ports (free ones instead) and folders (temporary ones): a real SuperLink and three
    SuperNodes on loopback, the run finishes as completed with all three nodes in every round,
    and the block's own ``kill`` stops them."""
    from tests.flower_harness import app_dir, flower_env, free_port

    block = _documented_block(REPO / "docs" / "deployment.md", "Three SuperNodes on one host")
    for port in sorted(set(re.findall(r"\b(909\d)\b", block))):
        block = block.replace(port, str(free_port()))
    block = block.replace("/tmp/fedul-", f"{tmp_path}/fedul-").replace("flwr run . ", f"flwr run {app_dir()} ")
    home = tmp_path / "flwr-home"
    home.mkdir()
    script = tmp_path / "one-host.sh"
    script.write_text(f"cd {REPO}\n{block}")
    env = {**flower_env(home), "COLUMNS": "250"}  # `flwr ls` prints a table as wide as the terminal
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=600)
        deadline = time.monotonic() + 30  # the block's `kill` (SIGTERM): give the processes time to exit
        while _session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _session(proc.pid)
    finally:
        for pid in _session(proc.pid):
            os.kill(pid, 9)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(tmp_path.glob("*.log")))
    assert proc.returncode == 0, f"{out[-4000:]}\n{logs}"
    assert "finished:completed" in out, f"{out[-4000:]}\n{logs}"
    (run_dir,) = list((tmp_path / "fedul-runs").iterdir())
    summary = (run_dir / "summary.txt").read_text()
    assert "clients=3 " in summary and "failed-replies=0 " in summary and "rounds=2 " in summary, summary
    assert [row["round"] for row in json.loads((run_dir / "metrics.json").read_text())] == [0, 1, 2]
    assert left == [], "processes left running after the block's kill"


def _session(sid: int) -> list[int]:
    """The live processes of session ``sid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def test_a_refused_deployment_run_is_one_line_without_traceback(tmp_path: Path) -> None:
    """A setting refused by the ServerApp in a deployment (``flwr-serverapp`` next to a real
    SuperLink): the run ends ``finished:failed``, its log has the project's one line naming
    the key and value and Flower's "ServerApp raised an exception" without the traceback."""
    fed = _Federation(tmp_path, [])
    try:
        status, log = fed.wait(fed.submit(f'num-rounds=-1 output-dir="{tmp_path / "runs"}"'), timeout=180)
    finally:
        fed.close()
    print(log)  # shown with pytest -s: what `flwr log` shows
    assert status == "finished:failed", log
    refused = [line for line in log.splitlines() if "run refused before round 1, nothing written:" in line]
    assert len(refused) == 1 and "num-rounds=-1 must be >= 1" in refused[0], log
    assert "ServerApp raised an exception" in log and "Traceback" not in log, log
    assert not (tmp_path / "runs").exists()
