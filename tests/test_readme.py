"""The README and the docs stay true: the README's test command is what CI runs, the
configuration reference (docs/configuration.md) is what scripts/config_reference.py renders
from the current defaults and describes every key, and the pages point at nothing outside
the repository."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from fedul_flwr.config import default_config

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
REFERENCE = REPO / "docs" / "configuration.md"

_SPEC = importlib.util.spec_from_file_location("config_reference", REPO / "scripts" / "config_reference.py")
assert _SPEC is not None and _SPEC.loader is not None
config_reference = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(config_reference)


def _bash_blocks() -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", README, flags=re.S)]


def test_ci_runs_the_readme_test_command() -> None:
    test_command = next(b for b in _bash_blocks() if b.endswith("pytest"))
    assert test_command in (REPO / ".ci" / "run").read_text()


def test_quickstart_runs_flwr_on_the_embedded_default() -> None:
    first = _bash_blocks()[0]
    assert "pip install -e ." in first and "flwr run ." in first and "--run-config" not in first
    assert default_config()["dataset"] == "mnist-sample"


def test_readme_is_short() -> None:
    assert len(README.splitlines()) <= 300


def test_configuration_reference_is_current() -> None:
    assert REFERENCE.read_text() == config_reference.render(), (
        "docs/configuration.md is stale (defaults, registries or method options changed): "
        "run python scripts/config_reference.py"
    )


def test_generated_config_table_and_reference_are_current() -> None:
    """``scripts/config_reference.py --check``: pyproject's [tool.flwr.app.config] and
    docs/configuration.md are what the keys' declarations generate."""
    checked = subprocess.run([sys.executable, str(REPO / "scripts" / "config_reference.py"), "--check"],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert checked.returncode == 0, checked.stderr


def test_check_finds_a_stale_table_or_page(tmp_path: Path, monkeypatch) -> None:
    text = (REPO / "pyproject.toml").read_text()
    edited = text.replace("\nnum-rounds = 20\n", "\nnum-rounds = 21\n")
    assert edited != text and config_reference.render_pyproject(edited) == text
    stale_page = tmp_path / "configuration.md"
    stale_page.write_text(REFERENCE.read_text().replace("federated rounds", "rounds"))
    monkeypatch.setattr(config_reference, "OUTPUT", stale_page)
    assert config_reference.stale() == [str(stale_page)]
    assert config_reference.main(["--check"]) == 1


def test_every_config_key_is_documented() -> None:
    rows = dict(re.findall(r"^\| `([a-z0-9-]+)` \|.*\| ([^|]*?) \|$", REFERENCE.read_text(), flags=re.M))
    missing = sorted(set(default_config()) - set(rows))
    assert not missing, f"docs/configuration.md lacks {missing}"
    undescribed = sorted(key for key in default_config() if not rows[key].strip())
    assert not undescribed, f"describe {undescribed} in DESCRIPTIONS of scripts/config_reference.py"


def test_docs_point_at_nothing_outside_the_repository() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "api").glob("*.md"))]
    pattern = re.compile(r"issue #|the issue|PAPER_NOTES|METHODS_NOTES|\.\./shared|/work/shared", re.I)
    hits = [f"{page.relative_to(REPO)}:{n}" for page in pages for n, line in enumerate(page.read_text().splitlines(), 1)
            if pattern.search(line)]
    assert not hits, hits
