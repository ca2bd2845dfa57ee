"""The Docker files in ``docker/`` (no Docker daemon here: structure, versions and mounts are
checked; ``docker compose config`` (or the standalone ``docker-compose config``, e.g. Debian's
``apt install docker-compose``) and ``hadolint`` run too where they are installed)."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import tomllib
import warnings
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

DOCKER = Path(__file__).resolve().parent.parent / "docker"
FLWR_VERSION = importlib.metadata.version("flwr")
NODES = 3
CERTS = "${FEDUL_CERTS:?set FEDUL_CERTS to the folder scripts/make_certs.sh wrote}"  # no default in the repo


def _load(name: str) -> dict:
    return yaml.safe_load((DOCKER / name).read_text())


def test_images_use_one_flwr_version_within_the_projects_requirement() -> None:
    """The Dockerfile's FLWR_VERSION satisfies pyproject's flwr requirement, every Flower image
    of the compose files defaults to it, and the image build checks it again; a different
    flwr installed here is reported (a warning), not a failure: pip may resolve any version the
    requirement allows."""
    dockerfile = (DOCKER / "Dockerfile").read_text()
    (image_version,) = re.findall(r"^ARG FLWR_VERSION=(\S+)$", dockerfile, re.M)
    assert re.search(r"^FROM flwr/superexec:\$\{FLWR_VERSION\}$", dockerfile, re.M)
    project = tomllib.loads((DOCKER.parent / "pyproject.toml").read_text())["project"]
    requirement = next(Requirement(d) for d in project["dependencies"] if Requirement(d).name == "flwr")
    assert requirement.specifier.contains(image_version), (image_version, str(requirement))
    assert "req.specifier.contains(v)" in dockerfile  # the build refuses a base image outside it
    for compose in ("compose.yaml", "compose.tls.yaml"):
        for name, svc in _load(compose)["services"].items():
            if "image" in svc and svc["image"].startswith("flwr/"):
                assert svc["image"].endswith(f":${{FLWR_VERSION:-{image_version}}}"), (compose, name)
    if FLWR_VERSION != image_version:
        warnings.warn(f"installed flwr {FLWR_VERSION} differs from the Docker images' {image_version}", stacklevel=1)


def test_each_supernode_has_its_own_data_and_clientapp() -> None:
    services = _load("compose.yaml")["services"]
    assert services["superlink"]["image"].startswith("flwr/superlink:")
    assert "--insecure" in services["superlink"]["command"]
    mounts = set()
    for i in range(NODES):
        node, app = services[f"supernode-{i}"], services[f"superexec-clientapp-{i}"]
        assert node["image"].startswith("flwr/supernode:")
        cmd = node["command"]
        assert cmd[cmd.index("--node-config") + 1] == 'data-dir="/data"'
        assert cmd[cmd.index("--superlink") + 1] == "superlink:9092"
        assert app["command"][-1] == f"supernode-{i}:9094"
        (volume,) = app["volumes"]
        assert volume.startswith("${FEDUL_NODES:?") and volume.endswith(f"}}/node-{i}:/data:ro")  # no default in the repo
        mounts.add(volume)
        assert app["build"]["dockerfile"] == "docker/Dockerfile"
    assert len(mounts) == NODES
    assert services["superexec-serverapp"]["command"][-1] == "superlink:9092"
    # the state and run volumes are handed to Flower's container user before anyone writes
    owner = services["volume-owner"]
    assert owner["user"] == "root" and owner["entrypoint"][:3] == ["chown", "-R", "49999:49999"]
    assert set(owner["volumes"]) == {"superlink-state:/state", "runs:/runs"}
    for name in ("superlink", "superexec-serverapp"):
        assert services[name]["depends_on"]["volume-owner"] == {"condition": "service_completed_successfully"}


def test_tls_overlay_uses_the_files_make_certs_writes() -> None:
    base = _load("compose.yaml")["services"]
    tls = _load("compose.tls.yaml")["services"]
    assert set(tls) <= set(base)
    link = tls["superlink"]["command"]
    assert "--insecure" not in link and "--enable-supernode-auth" in link
    for flag, target in (("--ssl-ca-certfile", "ca.crt"), ("--ssl-certfile", "server.pem"), ("--ssl-keyfile", "server.key")):
        assert link[link.index(flag) + 1] == f"/certs/{target}"
        assert f"{CERTS}/{target}:/certs/{target}:ro" in tls["superlink"]["volumes"]
    for i in range(NODES):
        cmd = tls[f"supernode-{i}"]["command"]
        assert "--insecure" not in cmd
        assert cmd[cmd.index("--auth-supernode-private-key") + 1] == "/keys/supernode"
        assert f"{CERTS}/supernode-{i}:/keys/supernode:ro" in tls[f"supernode-{i}"]["volumes"]
    script = (DOCKER.parent / "scripts" / "make_certs.sh").read_text()
    for name in ("ca.crt", "server.pem", "server.key", "supernode-$i"):
        assert name in script


def _compose_command() -> list[str] | None:
    """``docker compose`` (v2 plugin) where it works, else the standalone ``docker-compose``."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


@pytest.mark.skipif(_compose_command() is None, reason="neither docker compose nor docker-compose is installed")
def test_docker_compose_config_accepts_the_files() -> None:
    compose = _compose_command()
    assert compose is not None
    for files in (["compose.yaml"], ["compose.yaml", "compose.tls.yaml"]):
        args = [a for f in files for a in ("-f", str(DOCKER / f))]
        env = {**os.environ, "FEDUL_NODES": "/srv/nodes", "FEDUL_CERTS": "/srv/certs"}
        proc = subprocess.run([*compose, *args, "config", "-q"], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        unset = {k: v for k, v in env.items() if k != "FEDUL_NODES"}  # the node folders must be named
        proc = subprocess.run([*compose, *args, "config", "-q"], capture_output=True, text=True, env=unset)
        assert proc.returncode != 0 and "FEDUL_NODES" in proc.stderr


@pytest.mark.skipif(not shutil.which("hadolint"), reason="hadolint is not installed")
def test_hadolint() -> None:
    proc = subprocess.run(["hadolint", str(DOCKER / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
