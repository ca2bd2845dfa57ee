"""The run store: every file a run or a grid writes goes through this module, and every run
folder has one lock that every process writing, moving or setting it aside takes first.

Writes. :func:`write_atomic` is the one way a file is written: to a temporary file with a
unique name (``.<name>.<pid>-<random>.tmp``) in the same folder, flushed and ``fsync``-ed,
renamed over the target (``os.replace``), and the folder ``fsync``-ed, so a reader sees the old
or the new content, never a part, two writers of one file never share a temporary file, and
the new content survives a power cut once the call returns. Text, bytes and anything that
writes itself to a binary file object (``torch.save``, ``numpy.save``, matplotlib's
``savefig``) go through it: configuration, metric tables, summaries, plots, models,
checkpoints, records, failure records, rendered tables and benchmark results. Only
append-only streams are written otherwise: logs (``logging.FileHandler``) and TensorBoard's
event files; and a node data folder (``fedul node-data write``), the user's data written
once into a fresh folder, not a run's file.

Locks. A run folder ``<output-dir>/<run-name>`` is locked by
``<output-dir>/.locks/<run-name>.lock`` (:class:`FolderLock`), a ``filelock.FileLock``
(``flock`` on POSIX: the kernel drops it when its process dies, whatever killed it) that holds
the PID and host of its holder. The lock lives beside the folder, not in it, so it outlasts
the folder being set aside and a fresh folder being made under the same name. Its file is
never removed (removing a lock file by name can remove another holder's lock); ``filelock``
writes the holder through its ``on_acquired`` hook and never truncates a file another process
holds. A lock is held by the one process that writes the folder: the ServerApp of a
``flwr run``, or a grid runner's cell (set-aside, training, log moves, the record).

Nothing is deleted. A folder that cannot be continued is renamed ``<name>.set-aside-<UTC
time>`` (:func:`set_aside`), with its log and summary; :func:`set_aside_folders` lists them and
the user removes them (``fedul reproduce --clean --yes``). The only files removed otherwise
are the partial temporary files of a writer that was killed mid-write (:func:`sweep_temporary`,
when a folder is taken over or set aside, and in a grid's records).
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import filelock

__all__ = [
    "LOCK_DIR", "SET_ASIDE", "FolderLock", "RunFolderInUse", "lock_path", "set_aside", "set_aside_folders",
    "sweep_temporary", "utc_stamp", "write_atomic", "write_json",
]  # fmt: skip

LOCK_DIR = ".locks"
"""Folder of an output-dir that holds its run folders' lock files."""
SET_ASIDE = ".set-aside-"
"""What a set-aside folder's name holds between the run's name and the UTC time."""

_TEMPORARY = re.compile(r"^\..+\.(\d+)-[0-9a-f]{12}\.tmp$")  # ``.<name>.<pid>-<random>.tmp`` of write_atomic

Content = str | bytes | Callable[[IO[bytes]], Any]
"""What :func:`write_atomic` writes: text (UTF-8), bytes, or a function that writes to a binary
file object."""


def utc_stamp(when: float | None = None, precise: bool = False) -> str:
    """The project's one timestamp format, UTC: ``20261127-204512`` (run folder names), or with
    ``precise`` ``20261127T204512123456`` (set-aside names, unique to the microsecond)."""
    moment = datetime.fromtimestamp(time.time() if when is None else when, timezone.utc)
    return moment.strftime("%Y%m%dT%H%M%S%f" if precise else "%Y%m%d-%H%M%S")


def _fsync_folder(folder: Path) -> None:
    """Make a rename or a new file in ``folder`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], content: Content) -> Path:
    """Replace ``path`` by ``content``, atomically and durably (see the module doc).

    Parameters
    ----------
    path : path-like
        The file; its folder must exist.
    content : str | bytes | callable
        Text (written as UTF-8, newlines as given), bytes, or ``write(fh)`` writing to a binary
        file object (e.g. ``lambda fh: torch.save(obj, fh)``).

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    OSError
        If the folder does not exist or cannot be written; ``path`` is then unchanged and no
        temporary file is left.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "xb") as fh:
            if isinstance(content, str):
                fh.write(content.encode("utf-8"))
            elif isinstance(content, bytes):
                fh.write(content)
            else:
                content(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_folder(path.parent)
    return path


def sweep_temporary(folder: Path) -> list[Path]:
    """Remove the temporary files that :func:`write_atomic` left in ``folder`` when its process
    was killed mid-write (a partial copy of a file, never the file itself): those whose writer's
    PID no longer runs on this host. Returns them."""
    swept = []
    if not folder.is_dir():
        return swept
    for path in folder.iterdir():
        match = _TEMPORARY.match(path.name)
        if match is None or _running(int(match.group(1))):
            continue
        path.unlink(missing_ok=True)
        swept.append(path)
    return swept


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists on this host."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_json(path: str | os.PathLike[str], value: Any, indent: int | None = 1) -> Path:
    """:func:`write_atomic` of ``value`` as JSON (one trailing newline)."""
    return write_atomic(path, json.dumps(value, indent=indent) + "\n")


class RunFolderInUse(RuntimeError):
    """Another live process holds a run folder's lock; the message names its PID and host.

    Attributes
    ----------
    holder : str
        ``PID <pid> on host <host>`` (or why it is unknown).
    """

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


def lock_path(run_dir: Path) -> Path:
    """``<output-dir>/.locks/<run-name>.lock``, the lock file of run folder ``run_dir``."""
    return run_dir.parent / LOCK_DIR / f"{run_dir.name}.lock"


def _holder(path: Path) -> str:
    """``PID <pid> on host <host>`` of a held lock file, from what its holder wrote."""
    try:
        holder = json.loads(path.read_text())
        pid, host = int(holder["pid"]), str(holder["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that is still starting (its lock file names no holder yet)"
    if host == socket.gethostname() and not _running(pid):  # taken since, by one not yet written in
        return "a process that is still starting (its lock file names no holder yet)"
    return f"PID {pid} on host {host}"


@dataclass
class FolderLock:
    """The exclusive lock of one run folder (see the module doc), held by this process until
    :meth:`release` (or its death).

    Attributes
    ----------
    run_dir : Path
        The run folder it locks (which need not exist).
    """

    run_dir: Path
    _lock: filelock.FileLock | None = None

    @classmethod
    def acquire(cls, run_dir: str | os.PathLike[str]) -> FolderLock:
        """Take the lock of ``run_dir`` without waiting (creating ``<output-dir>/.locks``).

        Raises
        ------
        RunFolderInUse
            If another process, or another :class:`FolderLock` of this one, holds it.
        OSError
            If the lock file cannot be created (the message names it).
        """
        run_dir = Path(run_dir)
        path = lock_path(run_dir)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(f"cannot create the lock folder {path.parent}: {exc}") from exc

        def write_holder(fd: int) -> None:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                       "since": utc_stamp()}) + "\n").encode(), 0)  # fmt: skip

        lock = filelock.FileLock(path, blocking=False, thread_local=False, preserve_lock_file=True,
                                 on_acquired=write_holder)  # fmt: skip
        try:
            lock.acquire()
        except filelock.Timeout:
            holder = _holder(path)
            raise RunFolderInUse(
                f"run folder {run_dir} is in use by {holder} (lock file {path}): wait for that run to end, or stop "
                "it, before you resume it or write into its folder",
                holder,
            ) from None
        return cls(run_dir, lock)

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._lock is not None and self._lock.is_locked

    def check(self, run_dir: Path) -> None:
        """Raise ``RuntimeError`` unless this lock is held and is ``run_dir``'s (a guard of the
        operations that move or replace a folder's files)."""
        if not self.held or Path(run_dir) != self.run_dir:
            raise RuntimeError(f"{run_dir}: changed without holding its lock ({self.run_dir}, held={self.held})")

    def release(self) -> None:
        """Drop the lock (idempotent); the lock file stays."""
        if self._lock is not None:
            self._lock.release(force=True)
            self._lock = None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def set_aside(run_dir: Path, lock: FolderLock) -> Path | None:
    """Rename run folder ``run_dir`` to ``<name>.set-aside-<UTC time>`` beside it, with every file
    it holds (logs and summary included); nothing is deleted. ``None`` if there is no folder.

    Raises
    ------
    RuntimeError
        If ``lock`` is not ``run_dir``'s held lock.
    """
    lock.check(run_dir)
    if not run_dir.exists():
        return None
    sweep_temporary(run_dir)
    aside = run_dir.with_name(f"{run_dir.name}{SET_ASIDE}{utc_stamp(precise=True)}")
    run_dir.rename(aside)
    _fsync_folder(run_dir.parent)
    return aside


def set_aside_folders(output_dir: Path) -> list[Path]:
    """The set-aside run folders in ``output_dir`` (:func:`set_aside`), oldest name first."""
    if not output_dir.is_dir():
        return []
    return sorted(p for p in output_dir.iterdir() if p.is_dir() and SET_ASIDE in p.name)
