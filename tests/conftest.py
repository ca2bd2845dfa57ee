"""Fixtures shared by the test modules."""

from __future__ import annotations

import dataclasses

import pytest

from fedul_flwr import server_app
from fedul_flwr.data.simulated import load_run_dataset


@pytest.fixture
def small_test_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Central evaluation on the first 500 test images, to keep the federations fast."""

    def load(cfg):  # type: ignore[no-untyped-def]
        data = load_run_dataset(cfg)
        return dataclasses.replace(data, test_x=data.test_x[:500], test_y=data.test_y[:500])

    monkeypatch.setattr(server_app, "load_run_dataset", load)
