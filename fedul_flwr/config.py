"""One composed, validated run configuration.

Sources, lowest precedence first:

1. ``[tool.flwr.app.config]`` in ``pyproject.toml`` -- the single source of defaults for
   every knob (Flower also uses it to reject unknown ``--run-config`` keys);
2. the preset ``conf/experiment/<preset>.yaml``, composed with Hydra -- holds only the
   values it changes;
3. the values given with ``flwr run . --run-config "key=value ..."``.

Flower hands the app the defaults already merged with (3). A key whose value differs from
its default is taken as a user override and beats the preset; a user value equal to the
default cannot be told apart from the default, so there the preset wins (documented in the
README). The result is a frozen :class:`RunConfig` that is passed down as plain values.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROJECT_DIR = Path(__file__).resolve().parent.parent
CONF_DIR = PROJECT_DIR / "conf"
PYPROJECT = PROJECT_DIR / "pyproject.toml"

CHOICES: dict[str, tuple[str, ...]] = {
    "dataset": ("mnist-sample", "mnist", "fashion-mnist", "cifar10"),
    "partition": ("iid", "noniid", "dirichlet"),
    "prior-scheme": ("dominant", "uniform"),
    "method": ("fedul",),
    "loss": ("nll", "ce-prob"),
    "model": ("small-cnn", "paper-cnn", "resnet18"),
    "aggregation-weights": ("num-examples", "uniform"),
    "device": ("auto", "cpu", "cuda"),
}


class ConfigError(ValueError):
    """A configuration value or file is invalid; the message names the key and source."""


@dataclass(frozen=True)
class RunConfig:
    """Resolved settings of one run. Field names are the dashed run-config keys with
    underscores; units: ``lr`` per Adam step, fractions in [0, 1], rounds and epochs counts."""

    preset: str
    seed: int
    dataset: str
    data_dir: str
    download: bool
    val_fraction: float
    client_test_fraction: float
    partition: str
    dirichlet_alpha: float
    noniid_majority_classes: int
    noniid_minority_fraction: float
    num_sets: tuple[int, ...]
    prior_scheme: str
    dominant_factor: float
    test_prior: str
    method: str
    loss: str
    model: str
    num_rounds: int
    local_epochs: int
    batch_size: int
    lr: float
    l1_weight: float
    aggregation_weights: str
    fraction_train: float
    min_available_nodes: int
    output_dir: str
    run_name: str
    eval_batch_size: int
    device: str

    def num_sets_of(self, partition_id: int) -> int:
        """M_c of client ``partition_id`` (``num-sets`` cycles over clients)."""
        return self.num_sets[partition_id % len(self.num_sets)]

    def as_dict(self) -> dict[str, Any]:
        """Dashed-key dict (the form of ``--run-config``), ``num-sets`` as a comma string."""
        out = {f.name.replace("_", "-"): getattr(self, f.name) for f in dataclasses.fields(self)}
        out["num-sets"] = ",".join(str(m) for m in self.num_sets)
        return out


@functools.cache
def default_config() -> dict[str, Any]:
    """``[tool.flwr.app.config]`` of the app's ``pyproject.toml`` (flat, dashed keys).

    Raises
    ------
    ConfigError
        If the file or the table is missing.
    """
    try:
        with PYPROJECT.open("rb") as fh:
            table = tomllib.load(fh)["tool"]["flwr"]["app"]["config"]
    except (OSError, KeyError) as exc:
        raise ConfigError(f"{PYPROJECT}: cannot read [tool.flwr.app.config] ({exc})") from exc
    return dict(table)


def load_preset(name: str) -> dict[str, Any]:
    """Compose ``conf/experiment/<name>.yaml`` with Hydra and return its flat values.

    Raises
    ------
    ConfigError
        If the preset does not exist (lists the available ones) or sets an unknown key.
    """
    if not name:
        return {}
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    available = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
    if name not in available:
        raise ConfigError(f"preset={name!r}: no file {CONF_DIR / 'experiment' / name}.yaml; available: {available}")
    try:
        with initialize_config_dir(version_base=None, config_dir=str(CONF_DIR), job_name="fedul"):
            composed = compose(config_name="config", overrides=[f"+experiment={name}"])
    except HydraException as exc:
        raise ConfigError(f"preset={name!r}: {exc}") from exc
    values = OmegaConf.to_container(composed, resolve=True)
    assert isinstance(values, dict)
    unknown = sorted(set(values) - set(default_config()))
    if unknown:
        raise ConfigError(
            f"{CONF_DIR / 'experiment' / name}.yaml sets unknown key(s) {unknown}; "
            f"known keys are those of [tool.flwr.app.config] in {PYPROJECT}"
        )
    return values


def compose_config(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults < preset < user overrides, as a flat dashed-key dict (see module doc).

    Raises
    ------
    ConfigError
        On an unknown key or a bad preset.
    """
    defaults = default_config()
    unknown = sorted(set(run_config) - set(defaults))
    if unknown:
        raise ConfigError(f"unknown run-config key(s) {unknown}; valid keys: {sorted(defaults)}")
    overrides = {k: v for k, v in run_config.items() if v != defaults[k]}
    preset = str(overrides.get("preset", defaults["preset"]))
    return {**defaults, **load_preset(preset), **overrides}


def _parse_num_sets(value: Any) -> tuple[int, ...]:
    try:
        sets = tuple(int(v) for v in str(value).replace(" ", "").split(",") if v)
    except ValueError:
        sets = ()
    if not sets or min(sets) < 1:
        raise ConfigError(f"num-sets={value!r}: expected a positive int or a comma list such as '10,20,30'")
    return sets


def resolve_config(run_config: Mapping[str, Any]) -> RunConfig:
    """Compose and validate the run configuration.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        ``context.run_config`` (Flower) or any dict of dashed keys (tests, scripts).
        Keys not given take their defaults.

    Returns
    -------
    RunConfig

    Raises
    ------
    ConfigError
        Naming the key and the offending value.
    """
    values = compose_config({**default_config(), **dict(run_config)})
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(RunConfig):
        key = field.name.replace("_", "-")
        value = values[key]
        try:
            if field.name == "num_sets":
                value = _parse_num_sets(value)
            elif field.type == "bool":
                if isinstance(value, str):
                    if value.lower() not in ("true", "false"):
                        raise ValueError
                    value = value.lower() == "true"
                value = bool(value)
            elif field.type == "int":
                if isinstance(value, bool) or float(value) != int(value):
                    raise ValueError
                value = int(value)
            elif field.type == "float":
                value = float(value)
            else:
                value = str(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{key}={values[key]!r} is not a valid {field.type}") from exc
        kwargs[field.name] = value
    cfg = RunConfig(**kwargs)
    _validate(cfg)
    return cfg


def _validate(cfg: RunConfig) -> None:
    d = cfg.as_dict()
    for key, allowed in CHOICES.items():
        if d[key] not in allowed:
            raise ConfigError(f"{key}={d[key]!r} is not one of {allowed}")
    for key in ("num-rounds", "local-epochs", "batch-size", "eval-batch-size", "min-available-nodes"):
        if d[key] < 1:
            raise ConfigError(f"{key}={d[key]} must be >= 1")
    for key in ("val-fraction", "client-test-fraction"):
        if not 0.0 <= d[key] < 1.0:
            raise ConfigError(f"{key}={d[key]} must be in [0, 1)")
    if not 0.0 < cfg.fraction_train <= 1.0:
        raise ConfigError(f"fraction-train={cfg.fraction_train} must be in (0, 1]")
    for key in ("lr", "dominant-factor"):
        if not d[key] > 0:
            raise ConfigError(f"{key}={d[key]} must be > 0")
    if cfg.l1_weight < 0:
        raise ConfigError(f"l1-weight={cfg.l1_weight} must be >= 0")
    if cfg.dataset != "mnist-sample" and not cfg.data_dir:
        raise ConfigError(f"dataset={cfg.dataset!r} needs data-dir=/absolute/path (a torchvision root)")
    if cfg.data_dir and not os.path.isabs(os.path.expanduser(cfg.data_dir)):
        raise ConfigError(
            f"data-dir={cfg.data_dir!r} must be absolute: Flower runs the app from its own copy, "
            "so relative paths do not point where you expect"
        )
