"""The README stays true: its test command is what CI runs, its knob table covers every key."""

from __future__ import annotations

import re
from pathlib import Path

from fedul_flwr.config import default_config

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def _bash_blocks() -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", README, flags=re.S)]


def test_ci_runs_the_readme_test_command() -> None:
    test_command = next(b for b in _bash_blocks() if b.endswith("pytest"))
    assert test_command in (REPO / ".ci" / "run").read_text()


def test_quickstart_runs_flwr_on_the_embedded_default() -> None:
    first = _bash_blocks()[0]
    assert "pip install -e ." in first and "flwr run ." in first and "--run-config" not in first
    assert default_config()["dataset"] == "mnist-sample"


def test_every_config_key_is_documented() -> None:
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \|", README, flags=re.M))
    missing = sorted(set(default_config()) - documented)
    assert not missing, f"README config table lacks {missing}"
