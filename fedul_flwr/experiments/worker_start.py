"""The first steps of a ``--jobs`` worker process, before any heavy import: it dies with its
runner.

A worker is spawned (``multiprocessing``'s ``spawn``), so before its run starts it imports
torch, Flower and the app: seconds, more under load. Those seconds must not leave an orphan
when its runner is killed (even by SIGKILL), so this module imports nothing heavy and its
:func:`start`, the process's target, first

* on Linux asks the kernel to SIGKILL the process when its parent dies
  (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, through ``ctypes``): immediate, whatever the process
  is doing. The kernel sends it when the *thread* that spawned the worker ends: the runner
  spawns its workers from its main thread (:func:`fedul_flwr.experiments.workers.run_in_workers`
  sets a signal handler, which only the main thread may), which lives as long as the runner;
* checks once that the runner is still its parent (it may have died before the ``prctl``);
* starts the portable watchdog (:func:`watch_parent`, every platform): within about
  :data:`ORPHAN_EXIT_S` + 0.2 s of the runner's death, the worker stops (SIGTERM:
  ``status=stopped``), then ends outright;

and only then unpickles its run (and with it the runner, torch and the app). The kernel
frees the run folder's lock (``flock``) with the process; a checkpoint is replaced
atomically, and a killed writer's temporary files are swept by the next run of the folder.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection

__all__ = ["ORPHAN_EXIT_S", "die_with_parent", "start", "watch_parent"]

PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal the kernel sends this process when its parent dies (Linux)."""

ORPHAN_EXIT_S = 1.0
"""Seconds a worker whose runner died has to stop on SIGTERM (writing ``status=stopped``)
before its watchdog ends it with ``os._exit``; with the watchdog's 0.1 s polling, a worker is
gone within about 1.2 s of its runner's death where the kernel's parent-death signal is not
available (every platform but Linux)."""


def die_with_parent(parent: int) -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux
    ``prctl(PR_SET_PDEATHSIG, SIGKILL)``), then end it at once (``os._exit``) if ``parent`` is
    already gone (the worker re-parented before the ``prctl``). Returns whether the kernel
    took the request (``False`` elsewhere: the watchdog alone then)."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)
    return armed


def watch_parent(parent: int) -> None:
    """A worker's watchdog: poll ``os.getppid()`` every 0.1 s; once the runner ``parent`` is gone
    (the worker was re-parented), send this process SIGTERM (the run stops between two Python
    steps: ``status=stopped``, its checkpoint holding the last finished round), and
    :data:`ORPHAN_EXIT_S` later end it with ``os._exit`` whatever it is still doing (a torch
    call, a thread pool's join, a global evaluation). Portable: it needs only ``os.getppid``."""
    while os.getppid() == parent:
        time.sleep(0.1)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(ORPHAN_EXIT_S)
    os._exit(128 + signal.SIGTERM)


def start(conn: Connection, payload: bytes, parent: int) -> None:
    """A ``--jobs`` worker process's target: die with the runner ``parent``
    (:func:`die_with_parent`, :func:`watch_parent`), then unpickle ``payload``, a pair
    ``(body, item)`` (:func:`fedul_flwr.experiments.workers.run_in_worker` and its run), which
    imports torch, Flower and the app (seconds), and call ``body(conn, item)``."""
    die_with_parent(parent)
    threading.Thread(target=watch_parent, args=(parent,), name="fedul-runner-watchdog", daemon=True).start()
    body, item = pickle.loads(payload)
    body(conn, item)
