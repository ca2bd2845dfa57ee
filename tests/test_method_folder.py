"""A method is one folder: a copy of the project plus the fixture method folder
(tests/fixtures/method_folder/smooth/: its class, its settings with one key of its own, a preset,
a grid) and nothing else but the files generated from the declarations (pyproject's
``[tool.flwr.app.config]`` and docs/configuration.md, rewritten by
``scripts/config_reference.py``) is a project where ``fedul check`` knows the method and its key,
the in-process engine runs it, ``fedul reproduce`` runs its grid, and ``flwr run`` runs it through
a real SuperLink.

Flower (1.42) refuses a ``--run-config`` key that ``[tool.flwr.app.config]`` lacks (the
SuperLink answers "[code: 15] Invalid run configuration", naming no key), so the generated table
must be rewritten after a method folder is added: the last test shows the refusal with the table
not yet rewritten, and the same ``flwr run`` completing once it is.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.flower_harness import BIN, superlink

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "method_folder" / "smooth"
PROJECT_FILES = ("pyproject.toml", "client_app.py", "server_app.py", "README.md", "fedul_flwr", "conf", "scripts",
                 "docs/configuration.md")  # fmt: skip
"""What the copy holds: the app, its presets, the generator and what it writes."""


def _copy_project(dest: Path, with_method: bool = True, regenerate: bool = True) -> Path:
    """The project's files under :data:`PROJECT_FILES` (those git does not ignore) copied to ``dest``; then the
    fixture method folder as ``fedul_flwr/methods/smooth`` and the generated files rewritten."""
    command = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *PROJECT_FILES]
    listed = subprocess.run(command, cwd=REPO, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.decode()[-200:]}")
    for name in listed.stdout.decode().split("\0"):
        if name and (REPO / name).is_file():  # a file deleted in the working tree is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    if with_method:
        shutil.copytree(FIXTURE, dest / "fedul_flwr" / "methods" / "smooth",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    if regenerate:
        wrote = _python(dest, str(dest / "scripts" / "config_reference.py"))
        assert wrote.returncode == 0, wrote.stderr[-3000:]
    return dest


def _env(project: Path) -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(project)}


def _python(project: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python <args>`` in ``project`` with the package imported from there."""
    return subprocess.run([sys.executable, *args], cwd=project, env=_env(project), capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _copy_project(tmp_path_factory.mktemp("project"))


def test_the_generated_files_hold_the_methods_key(project: Path) -> None:
    assert 'smooth-epsilon = 0.1\n' in (project / "pyproject.toml").read_text()
    page = (project / "docs" / "configuration.md").read_text()
    row = next(line for line in page.splitlines() if "`smooth-epsilon`" in line)
    assert "in [0, 1); option of `smooth`" in row and "label smoothing eps" in row
    checked = _python(project, "scripts/config_reference.py", "--check")
    assert checked.returncode == 0, checked.stderr


def test_fedul_check_accepts_the_method_and_its_key(project: Path) -> None:
    fedul = [str(BIN / "fedul"), "check", "--run-config"]
    ok = subprocess.run([*fedul, "method='smooth' smooth-epsilon=0.3"], cwd=project, env=_env(project),
                        capture_output=True, text=True, timeout=600)  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([*fedul, "method='smooth' smooth-epsilon=1.5"], cwd=project, env=_env(project),
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert bad.returncode != 0
    assert "smooth-epsilon=1.5 must be in [0, 1) (an option of method 'smooth')" in bad.stdout + bad.stderr


ROUND = """
import json, sys
from fedul_flwr.client_app import app
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.preflight import resolve_config
from fedul_flwr.server_app import run_federation

rc = {"preset": "smooth-quick", "output-dir": sys.argv[1], "run-name": "inprocess"}
cfg = resolve_config(rc)
outputs = run_federation(InProcessGrid(app, 2, rc), cfg)
print(json.dumps({"rounds": sorted(outputs.rows), "epsilon": cfg.option("smooth-epsilon"), "method": cfg.method}))
"""


def test_the_in_process_engine_runs_the_method_from_its_preset(project: Path, tmp_path: Path) -> None:
    ran = _python(project, "-c", ROUND, str(tmp_path / "runs"))
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result == {"rounds": [0, 1], "epsilon": 0.2, "method": "smooth"}  # the preset's value, found in the folder
    assert (tmp_path / "runs" / "inprocess" / "metrics.json").is_file()


def test_fedul_reproduce_runs_the_grid_in_the_method_folder(project: Path, tmp_path: Path) -> None:
    """The folder's ``grids/smooth-check.yaml`` is a named grid: both columns run one round."""
    out = tmp_path / "grid"
    command = [str(BIN / "fedul"), "reproduce", "--grid", "smooth-check", "--threads", "1", "--out", str(out),
               "--set", "num-rounds=1"]  # fmt: skip
    ran = subprocess.run(command, cwd=project, env=_env(project), capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    records = {p.name: json.loads(p.read_text()) for p in (out / "cpu" / "records").glob("*.json")}
    epsilons = {r["spec"]["column"]: r["config"]["smooth-epsilon"] for r in records.values()}
    assert epsilons == {"smoothed": 0.2, "plain": 0.0}  # the preset's value, and the column's over it
    assert all(r["config"]["method"] == "smooth" and r["last-round"] == 1 for r in records.values())
    assert (out / "cpu" / "results-smooth-check.md").is_file()


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_flwr_run_refuses_the_key_until_the_table_is_rewritten_then_runs_the_method(tmp_path: Path) -> None:
    stale = _copy_project(tmp_path / "stale", regenerate=False)  # the method folder added, the table not rewritten
    out = tmp_path / "runs"
    typed = f"preset='smooth-quick' smooth-epsilon=0.3 output-dir='{out}' run-name='flwr'"
    federation = "num-supernodes=2 client-resources-num-cpus=1"
    with superlink(tmp_path / "link", extra_env={"PYTHONPATH": str(stale)}) as link:
        refused = link.flwr("run", str(stale), link.connection, "--format", "json", "--run-config", typed,
                            "--federation-config", federation)  # fmt: skip
        assert not json.loads(refused.stdout)["success"], refused  # the SuperLink: "Invalid run configuration"
        assert "Invalid run configuration" in refused.stdout, refused
        wrote = _python(stale, "scripts/config_reference.py")
        assert wrote.returncode == 0, wrote.stderr[-3000:]
        submitted = link.flwr("run", str(stale), link.connection, "--format", "json", "--run-config", typed,
                              "--federation-config", federation)  # fmt: skip
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        record, log = link.wait(str(json.loads(submitted.stdout)["run-id"]), timeout=420)
    assert record.get("status") == "finished:completed", (record, log[-3000:])
    metrics = json.loads((out / "flwr" / "metrics.json").read_text())
    assert [row["round"] for row in metrics] == [0, 1]
    config = json.loads((out / "flwr" / "config.json").read_text())
    assert config["method"] == "smooth" and config["smooth-epsilon"] == 0.3  # typed beats the preset's 0.2
