"""``flwr run .`` as the README runs it (``. scripts/flower-env.sh`` first): the run goes to this
project's own local SuperLink, on ports derived from its FLWR_HOME, even while something
answers on Flower's default 127.0.0.1:39091 (another project's SuperLink); a refused setting
prints one line of the project's and no traceback; ``scripts/stop_superlink.sh`` then finds
and stops that SuperLink.

The settings refused here are refused before round 1 by the ServerApp: a value out of range
(``num-rounds=-1``), a mistyped name (``method='fedull'``) and a preset whose client layout needs
another number of nodes than the federation has (``preset='hassle'``: 20, ``num-supernodes=5``).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.flower_harness import BIN, app_dir, flower_env, printed_lines

REPO = Path(__file__).resolve().parent.parent
ENV_SCRIPT = REPO / "scripts" / "flower-env.sh"
STOP_SCRIPT = REPO / "scripts" / "stop_superlink.sh"
FLOWER_DEFAULT_PORT = 39091



@contextmanager
def _other_superlink() -> Iterator[list[str] | None]:
    """A stand-in for another project's SuperLink on Flower's default port: answers every
    request (``/health`` with 200) and records its path. ``None`` if something else already
    listens there (then that is the other project's SuperLink)."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append(f"{self.command} {self.path}")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        do_GET = do_POST = _answer  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    try:
        server = ThreadingHTTPServer(("127.0.0.1", FLOWER_DEFAULT_PORT), Handler)
    except OSError:
        yield None
        return
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()


def _expected_port(flwr_home: Path) -> int:
    """The HTTP API port flower-env.sh derives from FLWR_HOME (POSIX cksum of its path)."""
    crc = subprocess.run(["cksum"], input=str(flwr_home), capture_output=True, text=True, check=True)
    return 20000 + 2 * (int(crc.stdout.split()[0]) % 5000)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # see tests/conftest.py
@pytest.mark.skipif(not (BIN / "flower-superlink").exists(), reason="needs flower-superlink next to the interpreter")
def test_flwr_run_reaches_this_projects_superlink_and_a_refused_run_is_one_line(tmp_path: Path) -> None:
    home = tmp_path / "project" / ".flwr"  # the user's own FLWR_HOME: the script keeps it
    runs = tmp_path / "runs"
    env = {k: v for k, v in flower_env(home).items() if not k.startswith("FLWR_LOCAL_") and k != "FEDUL_FLWR_ENV"}
    env["COLUMNS"] = "250"
    port = _expected_port(home)
    refused = {
        "num-rounds=-1": ("num-rounds=-1 must be >= 1", "num-supernodes=2"),
        "method='fedull'": ("method='fedull' is not one of", "num-supernodes=2"),
        f"preset='hassle' data-dir='{tmp_path / 'data'}'": (
            "label-layout='ALL' (preset='hassle') lays out 20 clients, the federation has 5 nodes: "
            'run it with --federation-config "num-supernodes=20"', "num-supernodes=5"),
    }  # fmt: skip
    outputs = {}

    def flwr(args: str, timeout: float = 300) -> str:
        done = subprocess.run(["bash", "-c", f". {ENV_SCRIPT} && flwr {args}"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
        return done.stdout + done.stderr

    with _other_superlink() as seen:
        try:
            for setting, (_, federation) in refused.items():
                outputs[setting] = flwr(f"""run {app_dir()} --stream --federation-config "{federation}" """
                                        f"""--run-config "{setting} output-dir='{runs}'" """)  # fmt: skip
            listed = flwr("ls --format json")
        finally:
            stopped = subprocess.run(["bash", str(STOP_SCRIPT)], env={**os.environ, "FLWR_HOME": str(home)},
                                     capture_output=True, text=True, timeout=120)  # fmt: skip
    first = outputs["num-rounds=-1"]
    assert f"Starting local SuperLink on 127.0.0.1:{port}" in first, first
    assert port != FLOWER_DEFAULT_PORT
    if seen is not None:
        assert seen == [], f"the run went to the other SuperLink on {FLOWER_DEFAULT_PORT}: {seen}"
    for setting, (message, _) in refused.items():
        out = outputs[setting]
        print(f"--- flwr run with {setting}\n{out}")  # shown with pytest -s: what a user sees
        lines = [line for line in out.splitlines() if "fedul-flwr: run refused before round 1, nothing written:" in line]
        assert len(lines) == 1 and message in lines[0], out
        assert "Traceback" not in out and "FutureWarning" not in out, out
        assert len(printed_lines(out)) <= 20, out
    assert not runs.exists()  # no run folder for a refused run
    statuses = [run["status"] for run in json.loads(listed)["runs"]]
    assert statuses == ["finished:failed"] * len(refused), listed
    assert stopped.returncode == 0 and re.search(r"stopped SuperLink \d+ ", stopped.stdout), stopped.stdout + stopped.stderr
    with pytest.raises(ConnectionRefusedError):  # our SuperLink is gone: nothing listens on its port
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_a_value_the_user_exported_wins_and_one_this_file_set_is_replaced(tmp_path: Path) -> None:
    """The user's own FLWR_LOCAL_* exports stay; sourcing the script of another checkout
    after this one's replaces what this one set (FLWR_HOME and the ports follow the checkout)."""
    other = tmp_path / "other-checkout"
    (other / "scripts").mkdir(parents=True)
    (other / "scripts" / "flower-env.sh").write_text(ENV_SCRIPT.read_text())
    show = 'echo "$FLWR_HOME $FLWR_LOCAL_SUPERLINK_HTTP_API_PORT $FLWR_LOCAL_CONTROL_API_PORT"'
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLWR_", "FEDUL_FLWR_ENV"))}

    def source(code: str) -> list[str]:
        return subprocess.run(["bash", "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()

    ours = source(f". {ENV_SCRIPT} && {show}")
    assert ours == [str(REPO / ".flwr"), str(_expected_port(REPO / ".flwr")), str(_expected_port(REPO / ".flwr") + 1)]
    switched = source(f". {ENV_SCRIPT} && . {other}/scripts/flower-env.sh && {show}")
    assert switched == [str(other / ".flwr"), str(_expected_port(other / ".flwr")), str(_expected_port(other / ".flwr") + 1)]
    typed = source(f"export FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=41000 && . {ENV_SCRIPT} && . {other}/scripts/flower-env.sh && {show}")
    assert typed[1] == "41000"
