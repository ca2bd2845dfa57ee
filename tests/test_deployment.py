"""Real deployment on loopback: ``scripts/deploy_local.sh`` starts a real ``flower-superlink``
and three ``flower-supernode`` processes (each with its own node data folder), submits
``flwr run . <connection>`` and waits; the run must finish as completed with all three
nodes training in every round."""

from __future__ import annotations

import csv
import json
import math
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
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir() if not d.name.startswith(".")]  # .locks aside
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

    from fedul_flwr.preflight import resolve_config
    from fedul_flwr.node_data_cli import write_nodes

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
    assert f"failed-replies=1 failed-nodes={dead}(NODE_UNAVAILABLE) " in summary, summary
    assert "clients=3 " in summary, summary  # the restarted node is the same client: its node-key, not its new id
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
    folders and metrics.json. A labels-at-server setting also writes the server's folder,
    which the run reads as ``server-data-dir`` (no SuperNode serves it)."""
    from fedul_flwr.preflight import resolve_config
    from fedul_flwr.node_data_cli import write_nodes

    written = write_nodes(resolve_config(setting), tmp_path / "nodes", 3, max_set_size=max_set_size)
    node_dirs = [d for d in written if d.name != "server"]
    server = "".join(f' server-data-dir="{d}"' for d in written if d.name == "server")
    fed = _Federation(tmp_path, node_dirs)
    runs = tmp_path / "runs"
    try:
        run_id = fed.submit(f'{run_config}{server} num-rounds=2 min-available-nodes=3 min-train-nodes=3 device="cpu" '
                            f'verbose=true output-dir="{runs}" run-name="two-rounds"')  # fmt: skip
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


@pytest.mark.parametrize("method", ["fixmatch"])
def test_labels_at_server_nodes_and_the_servers_folder_train_on_loopback(tmp_path: Path, method: str) -> None:
    """Three unlabeled node folders behind three real SuperNodes and the server's own folder of
    labeled images (``server-data-dir``; all written by the node-data tool from a simulated
    labels-at-server split): the run completes 2 rounds with all three nodes training, the
    server trains on its labels after each aggregation (``server-train-loss`` recorded), and
    the nodes never hold a label."""
    log, node_dirs, metrics = _two_rounds_on_simulated_nodes(
        tmp_path, {"client-setting": "labels-at-server", "num-labeled": 60, "seed": 5},
        f'method="{method}" client-setting="labels-at-server" batch-size=8 fixmatch-mu=2', max_set_size=120,
    )  # fmt: skip
    assert all(math.isfinite(row["server-train-loss"]) for row in metrics[1:]), metrics
    assert metrics[2]["test-accuracy"] > 0.2, metrics
    assert all((d / "unlabeled").is_dir() and not (d / "labeled").exists() for d in node_dirs)
    assert (tmp_path / "nodes" / "server" / "labeled" / "labels.npy").is_file()


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
    from fedul_flwr.preflight import resolve_config
    from fedul_flwr.node_data_cli import write_nodes

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


# --------------------------------------------------------------------------- the docs' commands


DEPLOYMENT_MD = REPO / "docs" / "deployment.md"


def _section(page: Path, heading: str) -> str:
    """The text under ``## <heading>`` of ``page``, up to the next ``## `` heading."""
    return page.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def _blocks(page: Path, heading: str, lang: str = "bash") -> list[str]:
    """The ```<lang> blocks under ``## <heading>`` of ``page``, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```", _section(page, heading), re.M | re.S)


def _documented_block(page: Path, heading: str) -> str:
    """The first ```bash block under ``## <heading>`` of ``page``."""
    return _blocks(page, heading)[0]


def _on_free_ports(text: str, ports: dict[str, str]) -> str:
    """``text`` with each port number of ``ports`` (as a whole word) replaced."""
    return re.sub(r"\b(" + "|".join(map(re.escape, ports)) + r")\b", lambda m: ports[m.group(1)], text)


def _run_in_own_session(script: Path, env: dict[str, str], timeout: float) -> tuple[int, str, list[int]]:
    """Run ``bash script`` in a session of its own; its exit code, output and the processes
    of that session still alive 30 s after it ended (then killed)."""
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
        ended = time.monotonic()
        while _session(proc.pid) and time.monotonic() < ended + 30:
            time.sleep(0.5)
        left = _session(proc.pid)
        print(f"{script.name}: its processes gone {time.monotonic() - ended:.1f} s after it ended")  # shown with -s
    finally:
        for pid in _session(proc.pid):
            os.kill(pid, 9)
    return proc.returncode, out, left


def test_every_documented_supernode_has_its_own_port() -> None:
    """docs/deployment.md and the README start every SuperNode with ``--port`` (Flower's
    default 9094 would make a second SuperNode on the same host fail), and the one-host
    block gives its three SuperNodes three different ports."""
    pages = [REPO / "README.md", DEPLOYMENT_MD]
    for page in pages:
        commands = re.findall(r"^flower-supernode (?:.*\\\n)*.*", page.read_text(), re.M)
        assert commands, page
        assert all(" --port " in c for c in commands), (page, [c for c in commands if " --port " not in c])
    block = _documented_block(DEPLOYMENT_MD, "Three SuperNodes on one host")
    ports = re.findall(r"^flower-supernode .* --port (\d+)", block, re.M)
    assert len(ports) == 3 and len(set(ports)) == 3, block


def test_documented_commands_are_ordered_and_use_absolute_paths() -> None:
    """docs/deployment.md waits for the SuperLink's ``/health`` in the sections that start one
    or submit a run (before ``flwr run``); the TLS section configures the connection over TLS
    and waits for the SuperLink over TLS before it registers a node, names the certificates
    by absolute paths and says who must own the keys (``--owner``); the runs of the
    separate-machines and one-host examples include ones that go on when a node dies
    (``min-available-nodes`` and ``min-train-nodes`` below the node count); the one-host
    recipe keeps the PID of every process it starts and the stop block stops them."""
    text = DEPLOYMENT_MD.read_text()
    for heading in ("2. Start the SuperLink and the SuperNodes", "3. Run and monitor", "Three SuperNodes on one host"):
        body = "\n".join(_blocks(DEPLOYMENT_MD, heading))
        assert "/health" in body, heading
    run_block = _documented_block(DEPLOYMENT_MD, "3. Run and monitor")
    assert run_block.index("/health") < run_block.index("flwr run ")
    tls = _section(DEPLOYMENT_MD, "TLS and SuperNode authentication")
    assert tls.index('root-certificates = "/srv/fedul-certs/ca.crt"') < tls.index("flwr supernode register")
    assert tls.index("https://server.example.org:9092/health") < tls.index("flwr supernode register")
    for flag in ("--root-certificates", "--auth-supernode-private-key", "--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"):
        paths = re.findall(rf"{flag} (\S+)", tls)
        assert paths and all(p.startswith("/") for p in paths), (flag, paths)
    assert "--owner" in tls
    runs = re.findall(r"^flwr run .*", text, re.M)
    tolerant = [r for r in runs if re.search(r"min-available-nodes=2 min-train-nodes=2", r)]
    assert len(tolerant) >= 2, runs  # the separate-machines example and the one-host one
    one_host = _documented_block(DEPLOYMENT_MD, "Three SuperNodes on one host")
    started = re.findall(r"^flower-super(?:link|node) .*&$", one_host, re.M)
    assert len(started) == 4 and one_host.count("echo $! > /tmp/fedul-") == 4, one_host
    (stop,) = _blocks(DEPLOYMENT_MD, "Stop everything")
    assert "/tmp/fedul-superlink.pid" in stop and "/tmp/fedul-supernode-*.pid" in stop


def test_three_supernodes_on_one_host_as_documented(tmp_path: Path) -> None:
    """docs/deployment.md's blocks "Three SuperNodes on one host" (start a SuperLink and three
    SuperNodes, one run on all three; then a run with min-available-nodes=2
    min-train-nodes=2 in which SuperNode 2 is stopped by its PID in round 2) and "Stop
    everything", run by bash as printed but for their ports (free ones instead) and folders
    (temporary ones): the first run completes with all three nodes in every round; the second
    gets an error reply for the stopped node in round 2, trains round 3 on the other two and
    completes, with the node on record; the stop block leaves no process running."""
    from tests.flower_harness import app_dir, flower_env, free_port

    blocks = _blocks(DEPLOYMENT_MD, "Three SuperNodes on one host") + _blocks(DEPLOYMENT_MD, "Stop everything")
    assert len(blocks) == 3
    script_text = "\n".join(blocks)
    script_text = _on_free_ports(script_text, {p: str(free_port()) for p in ("9092", "9094", "9095", "9096")})
    script_text = script_text.replace("/tmp/fedul-", f"{tmp_path}/fedul-").replace("flwr run . ", f"flwr run {app_dir()} ")
    home = tmp_path / "flwr-home"
    home.mkdir()
    script = tmp_path / "one-host.sh"
    script.write_text(f"cd {REPO}\n{script_text}")
    env = {**flower_env(home), "COLUMNS": "250"}  # `flwr ls` prints a table as wide as the terminal
    returncode, out, left = _run_in_own_session(script, env, timeout=900)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(tmp_path.glob("*.log")))
    assert returncode == 0, f"{out[-4000:]}\n{logs}"
    assert out.count("finished:completed") == 2, f"{out[-4000:]}\n{logs}"
    runs = tmp_path / "fedul-runs"
    (first,) = [d for d in runs.iterdir() if d.name != "one-node-dies" and not d.name.startswith(".")]  # .locks aside
    summary = (first / "summary.txt").read_text()
    assert "clients=3 " in summary and "failed-replies=0 " in summary and "rounds=2 " in summary, summary
    assert [row["round"] for row in json.loads((first / "metrics.json").read_text())] == [0, 1, 2]

    rows = json.loads((runs / "one-node-dies" / "metrics.json").read_text())
    trained = {r["round"]: set(r["trained-nodes"]) for r in rows if "trained-nodes" in r}
    assert [len(trained[r]) for r in (1, 2, 3)] == [3, 2, 2], trained
    (dead,) = trained[1] - trained[3]
    summary = (runs / "one-node-dies" / "summary.txt").read_text()
    assert f"failed-replies=1 failed-nodes={dead}(NODE_UNAVAILABLE) " in summary, summary
    assert "clients=3 " in summary and "rounds=3 " in summary and summary.rstrip().endswith("status=ok"), summary
    assert f"fedul-flwr: round 2: 1 of 3 training replies failed: node {dead} (NODE_UNAVAILABLE)" in out, out[-4000:]
    assert summary.strip() in out  # the last line of `flwr log`
    nodes = out.rsplit("Listing all nodes", 1)[1]  # `flwr supernode ls`: the two nodes left, online
    assert nodes.count(" online ") == 2 and str(dead) not in nodes, nodes
    assert not list(tmp_path.glob("fedul-*.pid")), "the stop block removes the PID files"
    assert left == [], "processes left running 30 s after the stop block"


def test_tls_blocks_as_documented(tmp_path: Path) -> None:
    """docs/deployment.md's TLS section on loopback, its commands run by bash as printed but
    for the server's addresses (``127.0.0.1`` for ``server.example.org`` and ``0.0.0.0``,
    ``localhost`` for ``10.0.0.5``), the ports (free ones) and the folders (temporary ones): make_certs.sh, the
    SuperLink over TLS with node authentication, the TLS connection, the health wait, the
    three registrations and organisation 0's SuperNode, which then is ``online``."""
    if not shutil.which("openssl") or not shutil.which("ssh-keygen"):
        pytest.skip("needs openssl and ssh-keygen")
    from fedul_flwr.preflight import resolve_config
    from fedul_flwr.node_data_cli import write_nodes
    from tests.flower_harness import flower_env, free_port

    (node_dir,) = write_nodes(resolve_config({"num-sets": 10}), tmp_path / "nodes", 1, max_set_size=4)
    certs, bash_blocks = tmp_path / "certs", _blocks(DEPLOYMENT_MD, "TLS and SuperNode authentication")
    (toml,) = _blocks(DEPLOYMENT_MD, "TLS and SuperNode authentication", "toml")
    make_certs, superlink, register, supernode = bash_blocks
    ports = {"9092": str(free_port()), "9094": str(free_port())}

    def local(text: str) -> str:
        text = text.replace("server.example.org", "127.0.0.1").replace("10.0.0.5", "localhost")
        text = text.replace("0.0.0.0", "127.0.0.1").replace("/srv/fedul-certs", str(certs))
        return _on_free_ports(text.replace("/data/fedul-node", str(node_dir)), ports)

    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(local(toml))

    def in_background(block: str, log: str) -> str:  # the foreground command of a block, started with `&`
        return block.rstrip().replace("\\\n", " ") + f" > {tmp_path / log} 2>&1 &\n"

    script = tmp_path / "tls.sh"
    script.write_text(
        f"set -e\ncd {REPO}\n{local(make_certs)}{in_background(local(superlink), 'superlink.log')}{local(register)}"
        f"{in_background(local(supernode), 'supernode.log')}"
        "timeout 60 bash -c 'until flwr supernode ls fedul-prod --format json | grep -q \"online\"; do sleep 1; done'\n"
        f"flwr supernode ls fedul-prod --format json > {tmp_path / 'nodes.json'}\n"
        "kill $(jobs -p)\n"
    )
    returncode, out, left = _run_in_own_session(script, flower_env(home), timeout=300)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(tmp_path.glob("*.log")))
    assert returncode == 0, f"{out[-4000:]}\n{logs}"
    nodes = json.loads((tmp_path / "nodes.json").read_text())["nodes"]
    assert sum(n["status"] == "online" for n in nodes) == 1, nodes  # organisation 0's, registered and active
    assert "Failed to activate" not in logs
    assert left == [], "processes left running 30 s after the SuperLink and SuperNode were stopped"


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
