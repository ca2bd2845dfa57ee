"""Config composition: pyproject defaults < Hydra preset < user overrides, and validation."""

from __future__ import annotations

import re
import tomllib

import pytest

from fedul_flwr.config import CONF_DIR, PYPROJECT, ConfigError, default_config, resolve_config


def test_defaults_come_from_pyproject_only() -> None:
    table = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    cfg = resolve_config({})
    assert cfg.as_dict()["lr"] == table["lr"] and cfg.num_sets == (table["num-sets"],)
    # presets must not repeat a default: every value they set differs from pyproject's
    for preset in sorted(CONF_DIR.glob("experiment/*.yaml")):
        for line in preset.read_text().splitlines():
            m = re.match(r"^([a-z0-9-]+):\s*(.+)$", line)
            if m and m.group(1) in table:
                assert str(table[m.group(1)]).lower() != m.group(2).strip("'\" ").lower(), (preset.name, line)


def test_preset_then_user_override() -> None:
    cfg = resolve_config({"preset": "paper-mnist", "data-dir": "/data"})
    assert (cfg.model, cfg.lr, cfg.val_fraction, cfg.dataset) == ("paper-cnn", 1e-4, 0.2, "mnist")
    assert cfg.num_rounds == 100
    # an explicit value that differs from the default beats the preset
    cfg = resolve_config({"preset": "paper-mnist", "data-dir": "/data", "num-rounds": 7, "num-sets": "10,20"})
    assert cfg.num_rounds == 7 and cfg.num_sets == (10, 20) and cfg.model == "paper-cnn"
    assert cfg.num_sets_of(0) == 10 and cfg.num_sets_of(3) == 20


@pytest.mark.parametrize(
    ("override", "culprit"),
    [
        ({"partition": "shards"}, "partition='shards'"),
        ({"num-rounds": 0}, "num-rounds=0"),
        ({"num-sets": "10,x"}, "num-sets='10,x'"),
        ({"lr": "fast"}, "lr='fast'"),
        ({"val-fraction": 1.0}, "val-fraction=1.0"),
        ({"dataset": "mnist", "data-dir": ""}, "needs data-dir"),
        ({"dataset": "mnist", "data-dir": "data"}, "data-dir='data' must be absolute"),
        ({"preset": "nope"}, "preset='nope'"),
        ({"no-such-key": 1}, "no-such-key"),
    ],
)
def test_errors_name_the_key_and_value(override: dict, culprit: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(culprit)):
        resolve_config(override)


def test_every_key_is_a_field() -> None:
    assert set(resolve_config({}).as_dict()) == set(default_config())
