"""Fixtures shared by the test modules, and how the suite runs in parallel.

``pytest`` runs one pytest-xdist worker per core (``-n auto --dist loadgroup`` in
pyproject.toml). Two rules keep the workers out of each other's way:

- every test that starts Ray (``flwr run .`` in simulation, the Ray-cluster test) is in the
  ``xdist_group("ray")``, so they run one after another on one worker: ``ray.init()``
  without an address joins the latest cluster that ``ray start`` began on the machine, so
  two at once could share (and count) each other's actors;
- each worker's torch uses ``cores // workers`` threads, so in-process training does not
  oversubscribe the cores the other workers use.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import pytest
import torch

from fedul_flwr import server_app
from fedul_flwr.data.simulated import load_run_dataset

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // _WORKERS))


def use_small_test_set(patch: Callable[[object, str, object], None] = setattr) -> None:
    """Central evaluation on the first 500 test images, to keep the federations fast: every
    module that loads the run's dataset (the server, ``hassle_components``, a test that
    imports ``load_run_dataset`` afterwards) sees the same 500. ``patch`` is
    ``monkeypatch.setattr`` in a test, plain ``setattr`` in a child process a test starts."""
    from fedul_flwr.data import simulated
    from fedul_flwr.experiments import hassle_components

    def load(cfg):  # type: ignore[no-untyped-def]
        data = load_run_dataset(cfg)
        return dataclasses.replace(data, test_x=data.test_x[:500], test_y=data.test_y[:500])

    for module in (server_app, simulated, hassle_components):
        patch(module, "load_run_dataset", load)


@pytest.fixture
def small_test_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`use_small_test_set` for one test."""
    use_small_test_set(monkeypatch.setattr)
