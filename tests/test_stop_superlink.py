"""``scripts/stop_superlink.sh`` stops this project's local SuperLink by its PID and no other:
two real ``flower-superlink`` processes started the way ``flwr run .`` starts its local one
(``--log-file $FLWR_HOME/local-superlink/superlink.log``), each with its own FLWR_HOME; the
script, given one FLWR_HOME, stops that SuperLink only. The README and the docs point at the
script, never at ``pkill -f``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.flower_harness import alive, flower_env, free_port, wait_healthy

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "stop_superlink.sh"
BIN = Path(sys.executable).parent


def _start_local_superlink(home: Path) -> tuple[subprocess.Popen, int]:
    """A simulation SuperLink with the command line of Flower's local one, on a free port."""
    port = free_port()
    log = home / "local-superlink" / "superlink.log"
    log.parent.mkdir(parents=True)
    cmd = [str(BIN / "flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
           "--host", "127.0.0.1", "--port", str(port), "--database", str(home / "local-superlink" / "state.db"),
           "--log-file", str(log)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=flower_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    return proc, port


@pytest.mark.slow
@pytest.mark.skipif(not (BIN / "flower-superlink").exists(), reason="needs flower-superlink next to the interpreter")
def test_stops_only_the_superlink_of_its_flwr_home(tmp_path: Path) -> None:
    mine, other = tmp_path / "project" / ".flwr", tmp_path / "elsewhere" / ".flwr"
    started = [_start_local_superlink(mine), _start_local_superlink(other)]
    try:
        for proc, port in started:
            wait_healthy(proc, port)
        (link, _), (other_link, _) = started
        env = {**os.environ, "FLWR_HOME": str(mine)}
        dry = subprocess.run(["bash", str(SCRIPT), "--dry-run"], env=env, capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0 and f"would stop SuperLink {link.pid} " in dry.stdout, dry.stdout + dry.stderr
        assert alive(link.pid)
        done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert re.findall(r"stopped SuperLink (\d+)", done.stdout) == [str(link.pid)]
        link.wait(timeout=20)
        assert alive(other_link.pid), "the other FLWR_HOME's SuperLink was stopped too"
        again = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and "no SuperLink" in again.stdout
    finally:
        for proc, _ in started:
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=20)


def test_readme_and_docs_stop_the_superlink_with_the_script() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    assert not [p.name for p in pages if re.search(r"pkill|killall", p.read_text())]
    assert "scripts/stop_superlink.sh" in (REPO / "README.md").read_text()
