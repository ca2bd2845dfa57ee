"""The package works installed as a wheel, away from its source tree: the wheel is built,
installed into a fresh virtual environment, and from there the node-data tool writes and
validates node folders and one in-process round of a federation runs, with the defaults and
the presets read from the package's own copy."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

ROUND = """
import json, sys
import fedul_flwr
from fedul_flwr.client_app import app
from fedul_flwr.preflight import resolve_config
from fedul_flwr.config import PROJECT_DIR
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.server_app import run_federation

rc = {"num-rounds": 1, "samples-per-client": 100, "output-dir": sys.argv[1], "run-name": "wheel",
      "preset": "authors-code", "min-available-nodes": 2, "min-train-nodes": 2}
outputs = run_federation(InProcessGrid(app, 2, rc), resolve_config(rc))
print(json.dumps({"package": fedul_flwr.__file__, "project": str(PROJECT_DIR), "rounds": sorted(outputs.rows),
                  "config": resolve_config(rc).as_dict()}))
"""


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_writes_validates_and_runs_a_round(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(wheels)],
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    if built.returncode != 0 and "hatchling" in built.stderr:
        pytest.skip(f"cannot fetch the build backend (no package index?): {built.stderr[-300:]}")
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("fedul_flwr-*.whl")

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())  # fmt: skip
    # the dependencies (torch, flwr, ...) from this environment, not its editable fedul_flwr:
    # a path listed in a .pth file is added as is, its own .pth files are not processed
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                               capture_output=True, text=True, timeout=600)  # fmt: skip
    assert installed.returncode == 0, installed.stderr

    work = tmp_path / "elsewhere"  # no source tree in sight
    work.mkdir()
    tool = env_dir / "bin" / "fedul"
    wrote = subprocess.run([str(tool), "node-data", "write", "--out", str(work / "nodes"), "--num-nodes", "2", "--max-set-size", "4"],
                           cwd=work, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert wrote.returncode == 0, wrote.stderr
    checked = subprocess.run([str(tool), "node-data", "validate", str(work / "nodes" / "node-0"), "--dataset", "mnist"],
                             cwd=work, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert checked.returncode == 0 and "node-0: OK" in checked.stdout, checked.stderr

    ran = subprocess.run([str(python), "-c", ROUND, str(work / "runs")], cwd=work, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["package"].startswith(str(site)) and result["project"] == str(site / "fedul_flwr" / "_project")
    assert result["rounds"] == [0, 1]
    assert result["config"]["loss"] == "ce-prob" and result["config"]["augment"] == "rotate"  # the preset, read from the wheel
    assert (work / "runs" / "wheel" / "metrics.json").is_file()
