"""The Docker files in ``docker/``: structure, versions and mounts are checked everywhere;
``docker compose config`` (or the standalone ``docker-compose config``, e.g. Debian's
``apt install docker-compose``) and ``hadolint`` run where they are installed; where a Docker
daemon runs and Flower's images are present or pullable, the compose stack is brought up for
2 rounds (otherwise that test skips and says why)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import tomllib
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
    """The Dockerfile's FLWR_VERSION is the flwr that pip resolved for the project (the one
    installed here), satisfies pyproject's flwr requirement, every Flower image of the compose
    files defaults to it, and the image build checks it again. When pip resolves a new flwr,
    this fails until docker/ follows."""
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
    assert image_version == FLWR_VERSION, (
        f"docker/ pins flwr {image_version}, pip resolved {FLWR_VERSION}: set ARG FLWR_VERSION in docker/Dockerfile "
        "and the FLWR_VERSION defaults of docker/compose.yaml to it"
    )


def test_build_context_is_only_what_the_dockerfile_copies() -> None:
    """``.dockerignore`` ignores everything (an in-tree ``.venv`` alone is gigabytes) but the
    Dockerfile's COPY sources, and those exactly."""
    lines = [ln.strip() for ln in (DOCKER.parent / ".dockerignore").read_text().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    assert lines[0] == "*"
    allowed = {ln[1:] for ln in lines if ln.startswith("!")}
    copied = set()
    for args in re.findall(r"^COPY (.+)$", (DOCKER / "Dockerfile").read_text(), re.M):
        words = [w for w in args.split() if not w.startswith("--")]
        copied.update(w.rstrip("/") for w in words[:-1])
    assert allowed == copied, (sorted(allowed), sorted(copied))
    assert all((DOCKER.parent / path).exists() for path in allowed)


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


def test_insecure_superlink_is_published_on_loopback_only() -> None:
    """compose.yaml's SuperLink has no TLS, no node authentication and serves the Control API on
    the same port: it is published on 127.0.0.1 only, and no service of that file publishes a
    port on another interface. compose.tls.yaml adds a port on every interface (nodes on
    other machines connect over TLS with registered keys); docs/docker.md says so."""
    base = _load("compose.yaml")["services"]
    assert "--insecure" in base["superlink"]["command"]
    published = {name: service["ports"] for name, service in base.items() if service.get("ports")}
    assert published == {"superlink": ["127.0.0.1:9092:9092"]}
    tls = _load("compose.tls.yaml")["services"]
    assert {name: service["ports"] for name, service in tls.items() if service.get("ports")} == {"superlink": ["9093:9092"]}
    docs = (DOCKER.parent / "docs" / "docker.md").read_text()
    assert "127.0.0.1:9092" in docs and ":9093" in docs


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


def _why_no_compose_stack() -> str | None:
    """Why the compose stack cannot come up on this machine (None: it can): no compose
    command, no reachable Docker daemon, or Flower's images neither present nor pullable."""
    compose = _compose_command()
    if compose is None:
        return "neither docker compose nor docker-compose is installed"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60) if shutil.which("docker") else None
    if info is None or info.returncode != 0:
        detail = "docker is not installed" if info is None else (info.stderr.strip().splitlines() or ["?"])[-1]
        return f"no Docker daemon is reachable ({detail})"
    version = re.search(r"FLWR_VERSION:-([0-9.]+)", (DOCKER / "compose.yaml").read_text())
    assert version is not None
    for image in (f"flwr/superlink:{version[1]}", f"flwr/supernode:{version[1]}", f"flwr/superexec:{version[1]}"):
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0:
            continue
        pulled = subprocess.run(["docker", "pull", image], capture_output=True, text=True, timeout=600)
        if pulled.returncode != 0:
            return f"image {image} is not here and cannot be pulled ({(pulled.stderr.strip().splitlines() or ['?'])[-1]})"
    return None


@pytest.mark.slow
def test_compose_stack_runs_two_rounds(tmp_path: Path) -> None:
    """docker/compose.yaml brought up as documented: 3 node folders, a SuperLink, 3 SuperNodes
    and their SuperExecs; ``flwr run`` finishes 2 rounds and the run folder is copied out of
    the ``runs`` volume. Skips, saying why, where no Docker daemon can run Flower's images."""
    reason = _why_no_compose_stack()
    if reason:
        pytest.skip(reason)
    from fedul_flwr.node_data_cli import main as node_data
    from tests.flower_harness import SuperLink, flower_env

    compose = [*(_compose_command() or []), "-f", str(DOCKER / "compose.yaml")]
    nodes = tmp_path / "nodes"
    assert node_data(["write", "--out", str(nodes), "--num-nodes", str(NODES), "--max-set-size", "20"]) == 0
    env = {**os.environ, "FEDUL_NODES": str(nodes), "COMPOSE_PROJECT_NAME": f"fedul-test-{os.getpid()}"}
    up = subprocess.run([*compose, "up", "--build", "-d"], capture_output=True, text=True, env=env, timeout=1800)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        home = tmp_path / "flwr-home"
        home.mkdir()
        (home / "config.toml").write_text('[superlink]\ndefault = "docker-local"\n\n'
                                          '[superlink.docker-local]\naddress = "127.0.0.1:9092"\ninsecure = true\n')  # fmt: skip
        link = SuperLink(process=None, connection="docker-local", env=flower_env(home), log_file=tmp_path / "link.log")  # type: ignore[arg-type]
        record, log = link.run_app(
            "num-rounds=2 min-available-nodes=3 output-dir='/runs' run-name='compose' samples-per-client=60", "", timeout=900
        )
        assert record.get("status") == "finished:completed", (record, log[-3000:])
        # `docker cp` by container id: the standalone docker-compose (v1) has no `cp`
        container = subprocess.run([*compose, "ps", "-q", "superexec-serverapp"], capture_output=True, text=True,
                                   env=env, timeout=120).stdout.strip()  # fmt: skip
        copied = subprocess.run(["docker", "cp", f"{container}:/runs/compose", str(tmp_path / "out")],
                                capture_output=True, text=True, timeout=300)  # fmt: skip
        assert copied.returncode == 0, copied.stderr
        rows = json.loads((tmp_path / "out" / "metrics.json").read_text())
        assert [r["round"] for r in rows] == [0, 1, 2]
    finally:
        subprocess.run([*compose, "down", "-v"], capture_output=True, env=env, timeout=600)


@pytest.mark.skipif(
    not (shutil.which("openssl") and shutil.which("ssh-keygen")) or os.geteuid() != 0,
    reason="needs openssl, ssh-keygen and root (the owner change happens only as root)",
)
def test_make_certs_hands_only_the_containers_keys_to_their_user(tmp_path: Path) -> None:
    """Run as root into a folder that already holds a file and one SuperNode key:
    ``make_certs.sh`` gives the containers' user (``--owner``) only the private keys the
    containers read and it created (server.key, the new supernode-<i>); the CA key, the
    folder, the certificates and the files that were there before keep their owner."""
    out = tmp_path / "certs"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    old_key = out / "supernode-0"
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f", str(old_key)], check=True)
    proc = subprocess.run(
        ["bash", str(DOCKER.parent / "scripts" / "make_certs.sh"), "--out", str(out), "--nodes", "2",
         "--owner", "49999:49999"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    owner = {p.name: (p.stat().st_uid, p.stat().st_gid) for p in [out, *out.iterdir()]}
    handed = {"server.key", "supernode-1"}
    assert {name for name, ids in owner.items() if ids == (49999, 49999)} == handed, owner
    for name in ("certs", "ca.key", "ca.crt", "server.pem", "notes.txt", "supernode-0", "supernode-0.pub", "supernode-1.pub"):
        assert owner[name] == (0, 0), (name, owner[name])
    assert all((out / name).stat().st_mode & 0o077 == 0 for name in ("ca.key", *handed))  # private keys stay 600
