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
append-only streams are written otherwise: logs (:class:`RunLogHandler`) and TensorBoard's
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
the user removes them (``fedul reproduce --clean --yes``, :func:`remove_tree`). The only files
removed otherwise are the partial temporary files of a writer that was killed mid-write
(:func:`sweep_temporary`, when a folder is taken over or set aside, and in a grid's records),
a failure record once its content is kept in its run folder, and a dangling link of a dataset
cache (:func:`remove`).

Moves and removals. :func:`move` (``os.replace`` and an ``fsync`` of both folders),
:func:`remove` and :func:`remove_tree` (an ``fsync`` of the parent) are the one way a file,
a log or a tree is renamed or removed; each checks the run folder's lock it is given is held,
and :func:`remove_tree` refuses a run folder another live process holds. A run's log is a
:class:`RunLogHandler`. Outside this module no code renames, replaces, unlinks or removes a
file or a tree, or opens a log file (a test walks every module's syntax tree for such calls).

Reads. :func:`read_with` (any binary reader, e.g. ``torch.load`` of a checkpoint) and
:func:`read_json` (records, failure records, metric tables; with the shape and keys they must
have) are the one way a stored file is read; content that is empty, cut short, not JSON or
not of its shape raises :class:`DamagedFile`, one line naming the file and what is wrong.
:func:`set_aside_damaged` renames such a file ``<name>.damaged-<UTC time>`` beside it (a hard
link first, then the old name removed only while it is still the damaged file, so a whole
file another process wrote meanwhile stays): never overwritten, never deleted.

A full device. A write that meets ``ENOSPC``/``EDQUOT``, or a writer's own error while its
device is full (``torch.save``'s ``unexpected pos``), raises :class:`NoSpace` (an ``OSError``):
one line naming the file, about the space it needs and the space free on its mount, the
target unchanged and no temporary file left (:func:`no_space` finds one behind any
exception). A run's log on a full device goes quiet and keeps its :class:`NoSpace`
(:class:`RunLogHandler`) instead of printing a traceback per message. The grid runner stops
on it: it is the device's failure, not a run's.

One module, longer than the project's ~600 lines: the locks and the file operations need each
other (every move and removal checks the run folder's lock it is given, :func:`remove_tree`
takes one, :func:`set_aside` moves a locked folder, a lock records its holder with the store's
:func:`utc_stamp` and tells a dead holder by :func:`sweep_temporary`'s process check), so two
modules would import each other.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import filelock

__all__ = [
    "DAMAGED", "LOCK_DIR", "SET_ASIDE", "Check", "DamagedFile", "FolderLock", "NoSpace", "RunFolderInUse",
    "RunLogHandler", "is_int", "is_number", "list_of", "lock_path", "move", "no_space", "of_type", "optional",
    "read_json", "read_with", "remove", "remove_tree", "set_aside",
    "set_aside_damaged", "set_aside_folders", "sweep_temporary", "utc_stamp", "write_atomic", "write_json",
]  # fmt: skip

LOCK_DIR = ".locks"
"""Folder of an output-dir that holds its run folders' lock files."""
SET_ASIDE = ".set-aside-"
"""What a set-aside folder's name holds between the run's name and the UTC time."""
DAMAGED = ".damaged-"
"""What a set-aside damaged file's name holds between the file's name and the UTC time."""

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


class NoSpace(OSError):
    """The device a file is written to is full (``ENOSPC`` or ``EDQUOT``): not one run's failure
    but the whole command's stop. The message is one line naming the file, about how much
    space it needs and how much is free on which mount.

    Attributes
    ----------
    path : Path
        The file being written (or the folder being made).
    needed : int
        About how many bytes writing it needs (bytes); 0 where unknown.
    at_least : bool
        Whether ``needed`` is only a lower bound (what a writer of unknown size had written
        when the device was full): the message then says "more than".
    free : int
        Bytes free on its file system when the write failed.
    mount : Path
        The mount point of that file system.
    """

    def __init__(self, path: str | os.PathLike[str], needed: int = 0, at_least: bool = False) -> None:
        self.path, self.needed, self.at_least = Path(path), int(needed), bool(at_least)
        self.mount = _mount_of(self.path)
        try:
            self.free = shutil.disk_usage(self.mount).free
        except OSError:
            self.free = 0
        need = f"needs {'more than' if at_least else 'about'} {_megabytes(self.needed)}, " if self.needed else ""
        super().__init__(errno.ENOSPC, f"no space left on device writing {self.path} ({need}{_megabytes(self.free)} "
                         f"free on {self.mount})")  # fmt: skip

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> tuple[Any, ...]:  # crosses a worker's pipe whole
        return (_no_space, (str(self.path), self.needed, self.at_least))

    def needing(self, needed: int) -> NoSpace:
        """The same error with ``needed`` bytes if that is more (e.g. the size of a whole run
        folder, where the failed file was one of its files)."""
        return NoSpace(self.path, needed) if needed > self.needed else self


def _no_space(path: str, needed: int, at_least: bool) -> NoSpace:
    return NoSpace(path, needed, at_least)


def _megabytes(size: int) -> str:
    """A size for the one line of :class:`NoSpace`: bytes, kB or MB, never ``0.0 MB`` for a
    small write (a summary line) or a nearly full device."""
    if size < 1e3:
        return f"{size} bytes"
    if size < 100e3:
        return f"{size / 1e3:.1f} kB"
    return f"{size / 1e6:.1f} MB" if size < 10e6 else f"{size / 1e6:.0f} MB"


def _mount_of(path: Path) -> Path:
    """The mount point of the file system ``path`` (or its nearest existing folder) is on."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


_NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


def no_space(exc: BaseException, path: str | os.PathLike[str]) -> NoSpace | None:
    """The :class:`NoSpace` behind ``exc``, if a full device caused it: ``exc`` or an exception
    it was raised from or during (``__cause__``, ``__context__``) is a :class:`NoSpace` or an
    ``OSError`` with ``errno`` ``ENOSPC``/``EDQUOT`` (named for ``path`` unless it names its
    own file); else ``None``."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, NoSpace):
            return current
        if isinstance(current, OSError) and current.errno in _NO_SPACE_ERRNOS:
            return NoSpace(current.filename or path)
        todo += [current.__cause__, current.__context__]
    return None


def _device_full(folder: Path) -> bool:
    """Whether ``folder``'s file system has (next to) no space left: under 64 KiB, less than a
    write buffer or two (what a writer that does not report ``ENOSPC`` itself, like
    ``torch.save``'s ``unexpected pos``, leaves)."""
    try:
        return shutil.disk_usage(folder).free < 64 * 1024
    except OSError:
        return False


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
    NoSpace
        If the device is full (``ENOSPC``, or a writer's own error while its device is full,
        e.g. ``torch.save``'s ``unexpected pos``): one line naming ``path``, about the space it
        needs (the larger of its old size and what was written before the failure) and the
        space free. ``path`` is then unchanged and no temporary file is left.
    OSError
        If the folder does not exist or cannot be written; ``path`` is then unchanged and no
        temporary file is left.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp")
    size, full = 0, None  # size: of the content where known, else what was written when it failed
    known = isinstance(content, (str, bytes))
    try:
        with open(tmp, "xb") as fh:
            try:
                if isinstance(content, str):
                    content = content.encode("utf-8")
                if isinstance(content, bytes):
                    size = len(content)
                    fh.write(content)
                else:
                    content(fh)
                fh.flush()
                os.fsync(fh.fileno())
            except Exception as exc:
                if no_space(exc, path) is None and not _device_full(path.parent):
                    raise
                size, full = max(size, _tell(fh)), exc
                raise
        os.replace(tmp, path)
    except Exception as exc:
        if full is None and no_space(exc, path) is None:
            raise
        full = exc
    finally:
        tmp.unlink(missing_ok=True)  # before the space free is measured: the partial copy is gone
    if full is not None:
        old = _size(path)
        raise NoSpace(path, max(size, old), at_least=not known and old <= size) from full
    _fsync_folder(path.parent)
    return path


def _tell(fh: IO[bytes]) -> int:
    try:
        return fh.tell()
    except (OSError, ValueError):
        return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


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


class DamagedFile(ValueError):
    """A file of the store whose content cannot be what it should be: empty, cut short, not
    JSON, or not of the shape its reader expects. Its message is one line naming the file
    and what is wrong.

    Attributes
    ----------
    path : Path
        The file.
    reason : str
        What is wrong with it, on one line.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path, self.reason = Path(path), " ".join(str(reason).split())
        super().__init__(f"{self.path} is damaged ({self.reason})")


def read_with(path: str | os.PathLike[str], load: Callable[[IO[bytes]], Any]) -> Any:
    """What ``load`` reads from ``path`` opened for binary reading: the one way a record, a
    failure record, a metric table or a checkpoint is read (e.g. ``lambda fh: torch.load(fh)``).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    OSError
        If it cannot be read (permissions, I/O error).
    DamagedFile
        If it is empty or ``load`` fails on its content (any ``Exception`` but ``OSError``).
    """
    path = Path(path)
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            raise DamagedFile(path, "empty file")
        try:
            return load(fh)
        except OSError:
            raise
        except Exception as exc:  # noqa: BLE001 -- whatever a reader says about bad content
            raise DamagedFile(path, f"{type(exc).__name__}: {exc}") from exc


Check = Callable[[Any], bool]
"""A field's check in a declared schema (:func:`read_json`): true where the value may stand."""


def is_number(value: Any) -> bool:
    """A JSON number (an ``int`` or ``float``, ``NaN`` included; never a ``bool``)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_int(value: Any) -> bool:
    """A JSON integer (never a ``bool``)."""
    return isinstance(value, int) and not isinstance(value, bool)


def of_type(*types: type) -> Check:
    """The check "an instance of one of ``types``" (``bool`` is no ``int`` here)."""
    return lambda value: isinstance(value, types) and not (isinstance(value, bool) and bool not in types)


def optional(check: Check) -> Check:
    """``check``, or ``None`` (JSON ``null``)."""
    return lambda value: value is None or check(value)


class MayBeAbsent:
    """A key of a declared schema that files written before it existed lack: absent, the file
    is still whole; present, its value must pass ``check`` (:func:`read_json`)."""

    def __init__(self, check: Check) -> None:
        self.check = check

    def __call__(self, value: Any) -> bool:
        return self.check(value)


def may_be_absent(check: Check) -> Check:
    """``check`` for a key that older files lack (:class:`MayBeAbsent`)."""
    return MayBeAbsent(check)


def list_of(check: Check) -> Check:
    """A JSON list whose every item passes ``check``."""
    return lambda value: isinstance(value, list) and all(check(v) for v in value)


def _describe(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def read_json(path: str | os.PathLike[str], shape: type | tuple[type, ...] = dict,
              keys: tuple[str, ...] | Mapping[str, Check] = ()) -> Any:  # fmt: skip
    """The JSON value of ``path`` (:func:`read_with`), checked to be a ``shape`` (``dict``: a
    record) holding ``keys``: a tuple of names that must be there, or a declared schema, a
    mapping of each name that must be there to the check its value must pass (e.g.
    ``{"run-id": of_type(str), "wall-time-s": is_number}``), so that a record whose fields
    have wrong types is damaged here, not an error far away in whatever reads the field.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    DamagedFile
        If it is empty, cut short, not UTF-8 JSON, not a ``shape``, lacks one of ``keys`` or
        (a schema) holds a value its check refuses, named with the key.
    """
    value = read_with(path, lambda fh: json.loads(fh.read().decode("utf-8")))
    if not isinstance(value, shape):
        raise DamagedFile(path, f"a JSON {type(value).__name__} where a {getattr(shape, '__name__', shape)} belongs")
    missing = [k for k in keys if k not in value and not (isinstance(keys, Mapping) and isinstance(keys[k], MayBeAbsent))]
    if missing:
        raise DamagedFile(path, "no " + ", ".join(repr(k) for k in missing))
    if isinstance(keys, Mapping):
        for key, check in keys.items():
            if key in value and not check(value[key]):
                raise DamagedFile(path, f"{key!r} is {_describe(value[key])}, not a value it can hold")
    return value


def _check_lock(lock: FolderLock | None, path: Path) -> None:
    if lock is not None and not lock.held:
        raise RuntimeError(f"{path}: changed without holding its lock ({lock.run_dir}, held=False)")


def set_aside_damaged(path: str | os.PathLike[str], lock: FolderLock | None = None,
                      read: Callable[[Path], Any] = read_json) -> Path | None:  # fmt: skip
    """Rename a damaged file (:class:`DamagedFile`) to ``<name>.damaged-<UTC time>`` beside it,
    never overwriting or deleting anything, and ``fsync`` the folder. The new name ends in no
    ``.json``, so no reader of records takes it for one. Returns it; ``None`` where ``path``
    is gone or is no longer damaged (another process wrote a whole file there meanwhile: it
    stays).

    A damaged file is first linked under its new name, and the old name is removed only while
    it still is that same file (same inode), so a whole record written meanwhile by another
    runner (:func:`write_atomic` replaces the name by a new file) is never moved away;
    ``read`` is the reader that found it damaged (raising :class:`DamagedFile`), asked again.

    Raises
    ------
    RuntimeError
        If ``lock`` is given and not held.
    """
    path = Path(path)
    _check_lock(lock, path)
    aside = path.with_name(f"{path.name}{DAMAGED}{utc_stamp(precise=True)}")
    try:
        os.link(path, aside)
    except FileNotFoundError:
        return None
    except OSError:  # no hard links here: a rename, under the caller's lock
        os.rename(path, aside)
        _fsync_folder(path.parent)
        return aside
    try:
        read(aside)
    except DamagedFile:
        same = os.stat(aside).st_ino == _inode(path)
        if same:
            os.unlink(path)
        _fsync_folder(path.parent)
        if same:
            return aside
    os.unlink(aside)  # a whole file took the name meanwhile: the extra name of it goes
    return None


def _inode(path: Path) -> int:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return -1


def move(source: str | os.PathLike[str], target: str | os.PathLike[str], lock: FolderLock | None = None) -> Path:
    """Rename ``source`` to ``target`` (``os.replace``; one file system), then ``fsync`` both
    folders: the one way a file of a run folder, a record or a log is moved. ``lock``: the
    lock of the run folder they belong to, which must be held. Returns ``target``.

    Raises
    ------
    RuntimeError
        If ``lock`` is not held.
    NoSpace
        If the device is full.
    OSError
        If the rename fails.
    """
    source, target = Path(source), Path(target)
    _check_lock(lock, target)
    try:
        os.replace(source, target)
    except OSError as exc:
        raise (no_space(exc, target) or exc) from exc
    _fsync_folder(target.parent)
    if source.parent != target.parent:
        _fsync_folder(source.parent)
    return target


def remove(path: str | os.PathLike[str], lock: FolderLock | None = None, missing_ok: bool = False) -> None:
    """Unlink ``path`` (a file or a link) and ``fsync`` its folder: the one way a single file
    is removed (a failure record whose content was kept elsewhere, a dangling cache link).

    Raises
    ------
    RuntimeError
        If ``lock`` is given and not held.
    FileNotFoundError
        If ``path`` does not exist and not ``missing_ok``.
    """
    path = Path(path)
    _check_lock(lock, path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise
        return
    _fsync_folder(path.parent)


def remove_tree(path: str | os.PathLike[str], lock: FolderLock | None = None) -> None:
    """Delete the folder ``path`` with everything in it and ``fsync`` its parent: the one way a
    tree is removed (set-aside run folders on ``--clean --yes``, a temporary export). A run
    folder whose lock another live process holds is refused.

    Raises
    ------
    RuntimeError
        If ``lock`` is given and not held.
    RunFolderInUse
        If ``lock`` is not given and ``path``'s own lock (:func:`lock_path`) is held.
    """
    path = Path(path)
    _check_lock(lock, path)
    if lock is None and lock_path(path).exists():
        FolderLock.acquire(path).release()  # raises RunFolderInUse when a live process holds it
    shutil.rmtree(path)
    _fsync_folder(path.parent)


class RunLogHandler(logging.FileHandler):
    """A run's log file (``logging.FileHandler``, appended to) that a full device silences
    instead of printing one ``--- Logging error ---`` traceback per message: the first
    ``ENOSPC`` is kept as :attr:`no_space` (a :class:`NoSpace` naming the log), the handler
    writes nothing more, and the run's owner raises it (:meth:`raise_if_full`). Any other
    error is handled as ``logging`` does."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            super().__init__(path)
        except OSError as exc:
            raise (no_space(exc, path) or exc) from exc
        self.no_space: NoSpace | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.no_space is None:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 -- logging's name

        full = no_space(sys.exc_info()[1] or Exception(), self.baseFilename)
        if full is None:
            super().handleError(record)
        elif self.no_space is None:
            self.no_space = NoSpace(self.baseFilename, len(self.format(record)) + 1)

    def close(self) -> None:
        try:
            super().close()
        except OSError as exc:  # the last buffered lines on a full device
            if no_space(exc, self.baseFilename) is None:
                raise
            self.no_space = self.no_space or NoSpace(self.baseFilename)

    def raise_if_full(self) -> None:
        """Raise the :class:`NoSpace` the log met, if any."""
        if self.no_space is not None:
            raise self.no_space


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
        NoSpace
            If the device is full; a lock file or lock folder this call created is removed
            again, so a refused command leaves nothing behind.
        OSError
            If the lock file cannot be created (the message names it).
        """
        run_dir = Path(run_dir)
        path = lock_path(run_dir)
        made_folder, made_file = not path.parent.exists(), not path.exists()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise no_space(exc, path.parent) or OSError(f"cannot create the lock folder {path.parent}: {exc}") from exc

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
        except OSError as exc:
            full = no_space(exc, path)
            if full is None:
                raise
            if lock.is_locked:
                lock.release()
            if made_file:
                path.unlink(missing_ok=True)
            if made_folder:
                with contextlib.suppress(OSError):
                    path.parent.rmdir()  # only if empty
            raise full from None
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
    return move(run_dir, aside, lock)


def set_aside_folders(output_dir: Path) -> list[Path]:
    """The set-aside run folders in ``output_dir`` (:func:`set_aside`), oldest name first."""
    if not output_dir.is_dir():
        return []
    return sorted(p for p in output_dir.iterdir() if p.is_dir() and SET_ASIDE in p.name)
