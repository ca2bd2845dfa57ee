"""``scripts/make_certs.sh``: who may read the keys it writes (docs/deployment.md, "Who may
read the keys"). Run as root, it hands the private keys it creates to ``--owner``; the
other user then reads them, and nothing else of the folder becomes theirs. Run as another
user, every file stays that user's. A bad ``--owner`` is refused before anything is written.
The checks read the files as the other user (``setpriv``), so they need root."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "make_certs.sh"

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("openssl", "ssh-keygen", "setpriv")) or os.geteuid() != 0,
    reason="needs openssl, ssh-keygen, setpriv and root (the owner change happens only as root)",
)


@pytest.fixture
def other_user() -> tuple[int, int]:
    """An unprivileged user's uid and gid (``nobody``)."""
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody'")
    return entry.pw_uid, entry.pw_gid


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder every user can enter (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="fedul-certs-test-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _as(user: tuple[int, int], *cmd: str) -> subprocess.CompletedProcess:
    uid, gid = user
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *cmd],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_owner_reads_the_private_keys_created_for_it(open_dir: Path, other_user: tuple[int, int]) -> None:
    """``--owner <uid>:<gid>`` as root (a SuperLink run outside Docker by another user): that
    user reads server.key and the SuperNode keys, and the public files; not ca.key."""
    out = open_dir / "certs"
    uid, gid = other_user
    proc = subprocess.run(["bash", str(SCRIPT), "--out", str(out), "--nodes", "2", "--owner", f"{uid}:{gid}"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"to {uid}:{gid} (mode 600" in proc.stdout, proc.stdout
    for name in ("server.key", "supernode-0", "supernode-1", "ca.crt", "server.pem", "supernode-0.pub"):
        assert _as(other_user, "cat", str(out / name)).returncode == 0, name
    assert _as(other_user, "cat", str(out / "ca.key")).returncode != 0
    assert {p.name for p in out.iterdir() if p.stat().st_uid == uid} == {"server.key", "supernode-0", "supernode-1"}
    assert all((out / n).stat().st_mode & 0o777 == 0o600 for n in ("ca.key", "server.key", "supernode-0"))
    assert all((out / n).stat().st_mode & 0o777 == 0o644 for n in ("ca.crt", "server.pem", "supernode-1.pub"))


def test_default_owner_is_dockers_user_and_says_so(open_dir: Path, other_user: tuple[int, int]) -> None:
    """Without ``--owner``, as root, the private keys go to 49999 (Flower's Docker images);
    the script says how to name another user, and that other user cannot read them."""
    out = open_dir / "certs"
    proc = subprocess.run(["bash", str(SCRIPT), "--out", str(out), "--nodes", "1"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (out / "server.key").stat().st_uid == 49999 and (out / "supernode-0").stat().st_uid == 49999
    assert "--owner <their user>:<group>" in proc.stdout, proc.stdout
    assert _as(other_user, "cat", str(out / "server.key")).returncode != 0


def test_run_as_another_user_every_file_is_theirs(open_dir: Path, other_user: tuple[int, int]) -> None:
    """Run by an unprivileged user (the one that runs the SuperLink): no owner change, every
    file is that user's, the private keys mode 600; the chown for Docker is only printed."""
    uid, gid = other_user
    os.chown(open_dir, uid, gid)
    out = open_dir / "certs"
    proc = _as(other_user, "bash", str(SCRIPT), "--out", str(out), "--nodes", "1")
    assert proc.returncode == 0, proc.stderr
    assert {(p.stat().st_uid, p.stat().st_gid) for p in out.iterdir()} == {(uid, gid)}
    assert (out / "server.key").stat().st_mode & 0o777 == 0o600
    assert "sudo chown 49999:49999 " in proc.stdout, proc.stdout


@pytest.mark.parametrize("owner", ["nobody", "no-such-user-xyz:no-such-group-xyz"])
def test_a_bad_owner_is_refused_before_anything_is_written(open_dir: Path, owner: str) -> None:
    out = open_dir / "certs"
    proc = subprocess.run(["bash", str(SCRIPT), "--out", str(out), "--owner", owner], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 2 and f"--owner {owner}:" in proc.stderr, (proc.stdout, proc.stderr)
    assert not out.exists()
