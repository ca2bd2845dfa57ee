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
    "method": ("fedul", "fedpl", "fedllp", "fedllp-vat", "supervised"),
    "llp-batches": ("stratified", "single-set", "whole-set"),
    "loss": ("nll", "ce-prob"),
    "model": ("small-cnn", "paper-cnn", "resnet18"),
    "aggregation-weights": ("num-examples", "uniform"),
    "device": ("auto", "cpu", "cuda"),
    "strategy": ("fedavg", "fedprox", "scaffold", "fednova", "fedavgm", "fedadam", "fedyogi", "fedadagrad"),
    "local-optimizer": ("adam", "sgd"),
    "scaffold-option": ("I", "II"),
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
    class_names: str
    method: str
    loss: str
    model: str
    label_fraction: float
    prior_noise: float
    samples_per_client: int
    fedpl_threshold: float
    fedpl_mixup_alpha: float
    fedpl_mix_weight: float
    llp_batches: str
    vat_weight: float
    vat_epsilon: float
    vat_xi: float
    num_rounds: int
    local_epochs: int
    batch_size: int
    lr: float
    l1_weight: float
    aggregation_weights: str
    fraction_train: float
    min_available_nodes: int
    strategy: str
    min_train_nodes: int
    local_optimizer: str
    local_epochs_per_client: str
    proximal_mu: float
    server_lr: float
    server_momentum: float
    beta_1: float
    beta_2: float
    tau: float
    scaffold_option: str
    output_dir: str
    run_name: str
    resume: bool
    eval_batch_size: int
    device: str

    def num_sets_of(self, partition_id: int) -> int:
        """M_c of client ``partition_id`` (``num-sets`` cycles over clients)."""
        return self.num_sets[partition_id % len(self.num_sets)]

    def local_epochs_of(self, partition_id: int) -> int:
        """Local epochs E_c of client ``partition_id``: ``local-epochs`` unless
        ``local-epochs-per-client`` (a comma list, cycled over partition ids) is set."""
        epochs = _parse_positive_ints("local-epochs-per-client", self.local_epochs_per_client, allow_empty=True)
        return epochs[partition_id % len(epochs)] if epochs else self.local_epochs

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
    return _parse_positive_ints("num-sets", value)


def _parse_positive_ints(key: str, value: Any, allow_empty: bool = False) -> tuple[int, ...]:
    """``"1,2,5"`` -> ``(1, 2, 5)``; raises :class:`ConfigError` naming ``key`` otherwise."""
    text = str(value).replace(" ", "")
    try:
        values = tuple(int(v) for v in text.split(",") if v)
    except ValueError:
        values = (0,)
    if (values and min(values) < 1) or (not values and not (allow_empty and not text)):
        raise ConfigError(f"{key}={value!r}: expected a positive int or a comma list such as '1,2,5'")
    return values


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
    cfg.local_epochs_of(0)  # raises on a malformed local-epochs-per-client
    if cfg.min_train_nodes < 1 or cfg.min_train_nodes > cfg.min_available_nodes:
        raise ConfigError(
            f"min-train-nodes={cfg.min_train_nodes} must be in [1, min-available-nodes={cfg.min_available_nodes}] "
            "(Flower would wait forever for nodes that never connect)"
        )
    for key in ("proximal-mu", "server-lr", "server-momentum", "beta-1", "beta-2"):
        if d[key] < 0:
            raise ConfigError(f"{key}={d[key]} must be >= 0")
    for key in ("server-momentum", "beta-1", "beta-2"):
        if d[key] >= 1:
            raise ConfigError(f"{key}={d[key]} must be < 1")
    if not cfg.tau > 0:
        raise ConfigError(f"tau={cfg.tau} must be > 0")
    if not 0.0 < cfg.label_fraction <= 1.0:
        raise ConfigError(f"label-fraction={cfg.label_fraction} must be in (0, 1]")
    if not 0.0 <= cfg.fedpl_threshold <= 1.0:
        raise ConfigError(f"fedpl-threshold={cfg.fedpl_threshold} must be in [0, 1]")
    for key in ("prior-noise", "samples-per-client", "fedpl-mix-weight", "vat-weight", "vat-epsilon"):
        if d[key] < 0:
            raise ConfigError(f"{key}={d[key]} must be >= 0")
    for key in ("fedpl-mixup-alpha", "vat-xi"):
        if not d[key] > 0:
            raise ConfigError(f"{key}={d[key]} must be > 0")
    if not 0.0 < cfg.fraction_train <= 1.0:
        raise ConfigError(f"fraction-train={cfg.fraction_train} must be in (0, 1]")
    for key in ("lr", "dominant-factor"):
        if not d[key] > 0:
            raise ConfigError(f"{key}={d[key]} must be > 0")
    if cfg.l1_weight < 0:
        raise ConfigError(f"l1-weight={cfg.l1_weight} must be >= 0")
    if cfg.resume:
        from fedul_flwr.checkpoint import RESUMABLE_STRATEGIES

        if not cfg.run_name:
            raise ConfigError("resume=true needs run-name: the run folder <output-dir>/<run-name> to continue")
        if cfg.strategy not in RESUMABLE_STRATEGIES:
            raise ConfigError(
                f"resume=true with strategy={cfg.strategy!r}: only {RESUMABLE_STRATEGIES} keep all their state across "
                "rounds on the server (SCAFFOLD's client control variates live on the clients), so only they can be "
                "resumed exactly"
            )
    if cfg.dataset != "mnist-sample" and not cfg.data_dir:
        raise ConfigError(f"dataset={cfg.dataset!r} needs data-dir=/absolute/path (a torchvision root)")
    if cfg.data_dir and not os.path.isabs(os.path.expanduser(cfg.data_dir)):
        raise ConfigError(
            f"data-dir={cfg.data_dir!r} must be absolute: Flower runs the app from its own copy, "
            "so relative paths do not point where you expect"
        )
