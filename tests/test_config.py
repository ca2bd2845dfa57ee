"""Config composition: pyproject defaults < Hydra preset < user overrides, and validation."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest

from fedul_flwr.preflight import resolve_config
from fedul_flwr.config import (
    CONF_DIR,
    CORE_KEYS,
    CORE_OPTIONS,
    METHODS_DIR,
    PYPROJECT,
    ConfigError,
    compose_config,
    default_config,
    load_preset,
    preset_files,
)
from fedul_flwr.methods import METHODS


def test_defaults_come_from_pyproject_only() -> None:
    table = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    cfg = resolve_config({})
    assert cfg.as_dict()["lr"] == table["lr"] and cfg.num_sets == (table["num-sets"],)
    assert cfg.as_dict() == {**table, "num-sets": str(table["num-sets"])}  # every default survives parsing
    # presets must not repeat a default: every value they set differs from pyproject's, or from
    # that of the preset they extend (Hydra's defaults list, e.g. feddb-svhn's 1000 labels over feddb's 4000)
    for preset in sorted(preset_files().values()):
        text = preset.read_text()
        parents = [name for name in re.findall(r"^  - ([a-z0-9-]+)$", text, flags=re.M) if name != "_self_"]
        inherited = {k: v for parent in parents for k, v in load_preset(parent).items()}
        for line in text.splitlines():
            m = re.match(r"^([a-z0-9-]+):\s*(.+)$", line)
            if m and m.group(1) in table:
                before = inherited.get(m.group(1), table[m.group(1)])
                assert str(before).lower() != m.group(2).strip("'\" ").lower(), (preset.name, line)


def test_preset_then_user_override() -> None:
    cfg = resolve_config({"preset": "paper-mnist", "data-dir": "/data"})
    assert (cfg.model, cfg.lr, cfg.val_fraction, cfg.dataset) == ("paper-cnn", 1e-4, 0.2, "mnist")
    assert cfg.num_rounds == 100
    # an explicit value beats the preset
    cfg = resolve_config({"preset": "paper-mnist", "data-dir": "/data", "num-rounds": 7, "num-sets": "10,20"})
    assert cfg.num_rounds == 7 and cfg.num_sets == (10, 20) and cfg.model == "paper-cnn"
    assert cfg.num_sets_of(0) == 10 and cfg.num_sets_of(3) == 20


def test_typed_values_equal_to_the_defaults_still_beat_the_preset() -> None:
    typed = {"preset": "paper-mnist", "num-rounds": 20, "model": "small-cnn", "lr": 0.001, "data-dir": "/data"}
    for key in ("num-rounds", "model", "lr"):
        assert typed[key] == default_config()[key]  # the case a "differs from default" rule got wrong
    cfg = resolve_config(typed)
    assert (cfg.num_rounds, cfg.model, cfg.lr) == (20, "small-cnn", 1e-3)
    assert (cfg.val_fraction, cfg.preset) == (0.2, "paper-mnist")  # the rest of the preset applies
    # as Flower hands it to the app: defaults merged with the typed values, plus the typed keys
    fused = {**default_config(), **typed}
    values, sources = compose_config(fused, given=typed.keys())
    assert (values["num-rounds"], values["model"], values["lr"]) == (20, "small-cnn", 0.001)
    assert sources["num-rounds"] == "user" and sources["val-fraction"] == "preset" and sources["seed"] == "default"
    # nothing typed but the preset: the preset wins over every default
    values, _ = compose_config({**default_config(), "preset": "paper-mnist"}, given=["preset"])
    assert (values["num-rounds"], values["model"]) == (100, "paper-cnn")


def test_method_options_belong_to_methods_and_pyproject_lists_them() -> None:
    owned = {o.key for cls in METHODS.items() for o in cls[1].options}
    assert owned and not owned & set(CORE_KEYS)
    assert set(default_config()) == set(CORE_KEYS) | owned  # no key that nobody reads
    declared = {o.key: o.default for options in CORE_OPTIONS.values() for o in options}
    assert set(declared) == set(CORE_KEYS)  # every general key declared, with the default pyproject holds
    assert all(default_config()[k] == v and type(default_config()[k]) is type(v) for k, v in declared.items())
    for name, cls in METHODS.items():
        assert all(default_config()[o.key] == o.default for o in cls.options), name
    with pytest.raises(ConfigError, match=r"fedpl-threshold=2.0 must be in \[0, 1\] \(an option of method 'fedpl'\)"):
        resolve_config({"method": "fedpl", "fedpl-threshold": 2.0})


def test_presets_live_in_their_method_folder_and_compose_across_folders() -> None:
    files = preset_files()
    assert files["feddb-authors"].parent == files["feddb"].parent == METHODS_DIR / "feddb" / "presets"
    assert files["fedpu"].parent.parent.name == "fedpu" and files["table1"].parent.parent.name == "fedul"
    assert files["mnist-iid-small"].parent == CONF_DIR / "experiment"  # a preset of no one method
    # feddb-authors starts from feddb (its defaults list): feddb's values under its own
    authors, base = load_preset("feddb-authors"), load_preset("feddb")
    assert authors["num-rounds"] == base["num-rounds"] == 800 and authors["strategy"] == "fedavgm"


def _preset_tree(tmp_path, monkeypatch, files: dict[str, str]) -> None:
    """Point the preset search at ``tmp_path`` (conf/experiment and method folders there)."""
    import fedul_flwr.config.presets as presets

    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.setattr(presets, "CONF_DIR", tmp_path / "conf")
    monkeypatch.setattr(presets, "METHODS_DIR", tmp_path / "methods")


def test_a_preset_may_start_from_a_preset_of_another_folder(tmp_path, monkeypatch) -> None:
    _preset_tree(tmp_path, monkeypatch, {
        "conf/experiment/base.yaml": "# @package _global_\nnum-rounds: 3\nlr: 0.5\n",
        "methods/m/presets/child.yaml": "# @package _global_\ndefaults:\n  - base\n  - _self_\nlr: 0.25\n",
    })  # fmt: skip
    assert load_preset("child") == {"num-rounds": 3, "lr": 0.25}


def test_a_preset_name_defined_twice_is_refused_naming_both_files(tmp_path, monkeypatch) -> None:
    _preset_tree(tmp_path, monkeypatch, {
        "conf/experiment/twin.yaml": "lr: 0.5\n", "methods/m/presets/twin.yaml": "lr: 0.25\n",
    })  # fmt: skip
    with pytest.raises(ConfigError, match="'twin' is defined twice") as info:
        load_preset("twin")
    assert str(tmp_path / "conf/experiment/twin.yaml") in str(info.value)
    assert str(tmp_path / "methods/m/presets/twin.yaml") in str(info.value)


@pytest.mark.parametrize(
    ("override", "culprit"),
    [
        ({"partition": "stripes"}, "partition='stripes'"),
        ({"num-rounds": 0}, "num-rounds=0"),
        ({"num-sets": "10,x"}, "num-sets='10,x'"),
        ({"lr": "fast"}, "lr='fast'"),
        ({"val-fraction": 1.0}, "val-fraction=1.0"),
        ({"dataset": "mnist", "data-dir": "data"}, "data-dir='data' must be absolute"),
        ({"preset": "nope"}, "preset='nope'"),
        ({"no-such-key": 1}, "no-such-key"),
        ({"test-prior": "0.5,0.5"}, "test-prior"),
        ({"test-prior": "uniformly"}, "test-prior"),
        ({"method": "nope"}, "method='nope'"),
        ({"method": "os:path"}, "method='os:path'"),
    ],
)
def test_errors_name_the_key_and_value(override: dict, culprit: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(culprit)):
        resolve_config(override)


@pytest.mark.parametrize("resolve", ["this-python", "python-3.13"])
@pytest.mark.parametrize("key", ["data-dir", "server-data-dir"])
def test_a_folder_path_that_cannot_be_resolved_names_the_key(tmp_path, monkeypatch, key: str, resolve: str) -> None:
    """A symlink loop is the key's one-line error, not the bare OS error of a later step; also
    where ``Path.resolve`` returns on a loop without raising (Python 3.13 and later)."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    if resolve == "python-3.13":
        monkeypatch.setattr(Path, "resolve", lambda self, strict=False: Path(os.path.abspath(self)))
    with pytest.raises(ConfigError, match=re.escape(f"{key}={str(tmp_path / 'a')!r}: the path cannot be resolved")):
        resolve_config({key: str(tmp_path / "a")})


def test_every_key_is_a_field() -> None:
    assert set(resolve_config({}).as_dict()) == set(default_config())


def test_the_projects_messages_reach_flowers_logger() -> None:
    """Client-side lines (here the thread count a ClientApp sets) go through Flower's ``flwr``
    logger, whose handlers feed the console, ``flwr run --stream`` and ``flwr log``."""
    import logging

    from fedul_flwr.execution import configure_threads

    seen: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    flower = logging.getLogger("flwr")
    flower.addHandler(handler)
    try:
        configure_threads(1)
    finally:
        flower.removeHandler(handler)
    assert any("torch uses 1 thread(s)" in line for line in seen), seen
