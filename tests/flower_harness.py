"""Run the app through a real Flower SuperLink from tests (headless, isolated, cleaned up).

Starts ``flower-superlink --simulation`` (the same flags ``flwr run`` uses for its local
SuperLink) on free loopback ports with its own ``FLWR_HOME``, submits ``flwr run .`` to it,
waits for the run to finish on its log stream and reads its status with ``flwr ls``
(``flwr run --stream`` exits 0 even when a run failed, so the status is the thing to check).
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


_RAY_DISK_MONITOR = re.compile(r"\(raylet\).*file_system_monitor\.cc:\d+: .* is over \d+% full")


def printed_lines(text: str) -> list[str]:
    """The lines of a ``flwr`` command's output, less Ray's disk-space monitor lines.

    Ray's raylet prints ``... file_system_monitor.cc:...: /tmp/ray/... is over 95% full ...``
    every 10 s while the machine's disk is that full: it reports the machine, not the app,
    so tests that bound what the app prints leave those lines out.
    """
    return [line for line in text.splitlines() if not _RAY_DISK_MONITOR.search(line)]


@functools.cache
def app_dir() -> Path:
    """A copy of the files the app's FAB holds (``pyproject.toml`` and its ``fab-include``
    patterns) in a temporary folder, removed at exit; ``flwr run`` on it submits the same
    FAB (same hash) as ``flwr run .`` in the checkout.

    ``flwr run`` lists every file under the folder it bundles (``os.walk`` and
    ``Path.resolve`` of each) before it applies ``fab-include``: with the ``.venv`` inside
    the checkout that is ~60,000 files and ~9 CPU-seconds per submitted run.
    """
    import atexit
    import shutil
    import tomllib

    stage = Path(tempfile.mkdtemp(prefix="fedul-app-"))
    atexit.register(shutil.rmtree, stage, ignore_errors=True)
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["fab-include"]
    for path in {p for pattern in patterns for p in REPO.glob(pattern) if p.is_file()} | {REPO / "pyproject.toml"}:
        target = stage / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return stage


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def flower_env(flwr_home: Path) -> dict[str, str]:
    """Environment for Flower CLIs: own FLWR_HOME, no telemetry, no update check, no
    runtime dependency installation (offline), the venv's bin first on PATH, and the
    repository on PYTHONPATH (the apps can then import test-only code such as
    ``tests.dual_method``; the installed package is the same checkout)."""
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(flwr_home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
    )
    return env


@dataclass
class SuperLink:
    """A running SuperLink and the connection name ``flwr`` knows it by."""

    process: subprocess.Popen
    connection: str
    env: dict[str, str]
    log_file: Path

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run ``flwr <args>`` from the repo root against this SuperLink's FLWR_HOME."""
        return subprocess.run(
            [str(BIN / "flwr"), *args], cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def wait(self, run_id: str, timeout: float = 600, done_file: Path | None = None) -> tuple[dict, str]:
        """Wait for run ``run_id`` to finish; return its ``flwr ls`` record and its log.

        ``flwr log <id> --stream`` is one process that waits on the SuperLink's log stream
        until the run ends (each ``flwr ls`` is a new Python process, ~2 CPU-seconds, so
        polling with it took a good part of a core from the runs under test); ``flwr ls`` is
        asked once the stream has ended, and again every 5 s only if the run is not finished
        yet (a stream cut short). With ``done_file`` (a file the run writes at its end, e.g.
        its ``model.pt``) nothing talks to the SuperLink until that file exists (checked every
        0.25 s), so that timing runs (fedul benchmark) share the CPU with nothing else.
        """
        deadline = time.monotonic() + timeout
        while done_file is not None and not done_file.exists() and time.monotonic() < deadline:
            time.sleep(0.25)
        log, record = "", {}
        while True:
            try:
                streamed = self.flwr("log", run_id, self.connection, "--stream",
                                     timeout=max(1.0, deadline - time.monotonic()))  # fmt: skip
                log = streamed.stdout or log
            except subprocess.TimeoutExpired as exc:
                out = exc.stdout or b""
                log = out.decode() if isinstance(out, bytes) else out
            listed = self.flwr("ls", self.connection, "--run-id", run_id, "--format", "json")
            if listed.returncode == 0:
                runs = json.loads(listed.stdout).get("runs", [])
                record = runs[0] if runs else {}
            if str(record.get("status", "")).startswith("finished") or time.monotonic() >= deadline:
                break
            time.sleep(5)
        return record, log

    def run_app(
        self, run_config: str, federation_config: str, timeout: float = 600, done_file: Path | None = None
    ) -> tuple[dict, str]:
        """Submit ``flwr run .`` (on :func:`app_dir`) and :meth:`wait` for it to finish.

        Returns
        -------
        (dict, str)
            The run's ``flwr ls`` record and its log.
        """
        return self.wait(self.submit(run_config, federation_config), timeout, done_file)

    def submit(self, run_config: str, federation_config: str = "") -> str:
        """``flwr run`` of the app (:func:`app_dir`) on this SuperLink; returns the run id."""
        args = ["run", str(app_dir()), self.connection, "--format", "json", "--run-config", run_config]
        args += ["--federation-config", federation_config] if federation_config else []
        submitted = self.flwr(*args)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        reply = json.loads(submitted.stdout)
        assert reply.get("success"), reply
        return str(reply["run-id"])

    def run_to_completion(self, run_config: str, federation_config: str, run_dir: Path, timeout: float = 420) -> str:
        """:meth:`run_app`; asserts that the run finished as completed and wrote ``run_dir``
        (its ``model.pt``), and returns its log."""
        record, log = self.run_app(run_config, federation_config, timeout=timeout)
        assert record.get("status") == "finished:completed", (record, log[-3000:])
        assert (run_dir / "model.pt").is_file(), log[-3000:]
        return log


def wait_healthy(process: subprocess.Popen, port: int, log_file: Path | None = None, timeout: float = 60) -> None:
    """Wait until the SuperLink ``process`` answers ``/health`` on ``127.0.0.1:<port>``.

    Raises
    ------
    AssertionError
        If the process exits first (naming its log file).
    TimeoutError
        If it is not healthy within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"flower-superlink exited with {process.returncode}; see {log_file}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"SuperLink did not become healthy within {timeout:g} s; see {log_file}")


@contextmanager
def superlink(tmp_path: Path, extra_env: dict[str, str] | None = None) -> Iterator[SuperLink]:
    """Start a simulation SuperLink on free ports; stop it (and its children) on exit.

    ``extra_env`` is added to the SuperLink's environment (e.g. ``RAY_ADDRESS``: the
    simulation's Ray backend then joins that cluster instead of starting its own)."""
    home = tmp_path / "flwr-home"
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()  # Flower 1.41 serves the Control, Fleet and Runtime APIs on one HTTP port
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "test"\n\n[superlink.test]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    env = {**flower_env(home), **(extra_env or {})}
    log_file = tmp_path / "superlink.log"
    cmd = [
        str(BIN / "flower-superlink"),
        "--insecure",
        "--simulation",
        "--isolation",
        "subprocess",
        "--disable-runtime-dependency-installation",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--database",
        str(tmp_path / "state.db"),
        "--log-file",
        str(log_file),
    ]
    with serving(cmd, env, tmp_path, port, log_file, connection="test") as link:
        yield link


@contextmanager
def serving(cmd: list[str], env: dict[str, str], cwd: Path, port: int, log_file: Path,
            connection: str) -> Iterator[SuperLink]:  # fmt: skip
    """Start the SuperLink ``cmd`` in its own session, wait until it answers on ``port``, yield
    it, and stop its whole process group afterwards (SIGTERM, SIGKILL after 20 s)."""
    process = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                               start_new_session=True)  # fmt: skip
    try:
        wait_healthy(process, port, log_file)
        yield SuperLink(process=process, connection=connection, env=env, log_file=log_file)
    finally:
        try:
            os.killpg(process.pid, 15)
            process.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(process.pid, 9)


# --------------------------------------------------------------------------- Ray cluster


@dataclass
class RayCluster:
    """Ray nodes started by :func:`ray_cluster` (one head, the rest workers)."""

    address: str
    processes: list[subprocess.Popen]
    temp_dir: Path
    stopped: list[int] = field(default_factory=list)  # every process of the nodes, when stopped

    def node_ids_of_actors(self, class_name: str) -> list[str]:
        """Ray node ids of every actor of ``class_name`` the cluster has seen (alive or dead),
        from the GCS actor table (``ray._private.state.actors``: Ray's public state API needs
        the dashboard, which these nodes do not start), read by a separate Python process so
        that this one stays out of Ray."""
        code = (
            "import json, ray; from ray._private import state; "
            f"ray.init(address={self.address!r}, logging_level='ERROR'); "
            f"print(json.dumps([a['Address']['NodeID'] for a in state.actors().values() "
            f"if a.get('ActorClassName') == {class_name!r}]))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_ray_env())
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    def alive_nodes(self) -> int:
        """Number of alive nodes in the cluster (``ray.nodes()`` in a separate process)."""
        code = f"import ray; ray.init(address={self.address!r}, logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_ray_env())
        return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0


def _ray_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(RAY_USAGE_STATS_ENABLED="0", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    env.pop("RAY_ADDRESS", None)
    return env


@contextmanager
def ray_cluster(nodes: int = 2, cpus_per_node: int = 1, timeout: float = 120) -> Iterator[RayCluster]:
    """Start a Ray cluster of ``nodes`` separate Ray nodes on this machine with Ray's own CLI
    (``ray start --head``, then ``ray start --address=...`` per worker), each in the
    foreground (``--block``) in a process group of its own; on exit, stop exactly those
    processes (never ``ray stop``, which would end every Ray session on the machine).

    Raises
    ------
    TimeoutError
        If the nodes are not all alive within ``timeout`` seconds.
    """
    port = free_port()
    address = f"127.0.0.1:{port}"
    # Ray's unix socket paths live under the temp dir and must stay short (< 108 bytes)
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    common = [f"--num-cpus={cpus_per_node}", "--num-gpus=0", "--disable-usage-stats", "--block",
              "--node-ip-address=127.0.0.1"]  # fmt: skip
    head = [str(BIN / "ray"), "start", "--head", f"--port={port}", "--include-dashboard=false",
            f"--temp-dir={temp_dir}", *common]  # fmt: skip
    worker = [str(BIN / "ray"), "start", f"--address={address}", *common]
    processes: list[subprocess.Popen] = []
    cluster = RayCluster(address, processes, temp_dir)
    log = (temp_dir / "cli.log").open("ab")
    try:
        processes.append(subprocess.Popen(head, env=_ray_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        _wait_nodes(cluster, 1, timeout)
        for _ in range(nodes - 1):
            processes.append(
                subprocess.Popen(worker, env=_ray_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
        _wait_nodes(cluster, nodes, timeout)
        yield cluster
    finally:
        cluster.stopped = [pid for process in processes for pid in process_tree(process.pid)]
        for process in reversed(processes):  # workers first, the head last
            _stop_group(process)
        log.close()


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it (from /proc, no psutil needed)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_nodes(cluster: RayCluster, nodes: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in cluster.processes:
            if process.poll() is not None:
                raise RuntimeError(f"'ray start' exited with {process.returncode}; see {cluster.temp_dir / 'cli.log'}")
        if cluster.alive_nodes() >= nodes:
            return
        time.sleep(1)
    raise TimeoutError(f"the Ray cluster did not reach {nodes} alive node(s) in {timeout} s; see {cluster.temp_dir}")


def _stop_group(process: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM the process group of ``process`` (``ray start --block`` then stops the node it
    runs), SIGKILL what is left after ``grace`` seconds."""
    try:
        os.killpg(process.pid, 15)
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait(timeout=10)
    except ProcessLookupError:
        pass


def children(pid: int) -> set[int]:
    """Live child pids of ``pid`` (Linux ``/proc``)."""
    kids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.add(int(stat.parent.name))
    return kids
