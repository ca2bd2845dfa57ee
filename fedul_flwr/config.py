"""One composed, validated run configuration.

Sources, lowest precedence first:

1. ``[tool.flwr.app.config]`` in ``pyproject.toml`` -- the single source of defaults for
   every key (Flower also uses it to reject unknown ``--run-config`` keys);
2. the preset ``conf/experiment/<preset>.yaml``, composed with Hydra -- holds only the
   values it changes;
3. the values the user typed (``flwr run . --run-config "key=value ..."``).

A value the user typed always wins, also when it equals the default: Flower hands the app
the defaults already merged with the user's values (``context.run_config``), so the
ServerApp tells them apart with the run's ``override_config`` (what was typed, kept by the
SuperLink) and passes those keys as ``given``. The server resolves the configuration once,
at the start, logs which keys came from the preset and which from the user, and sends the
resolved settings to the clients in every message (:data:`fedul_flwr.wire.RUN_CONFIG`), so
every node runs with exactly the server's values.

Keys are of two kinds. *Core* keys (data path, federation, strategy, outputs) are fields of
:class:`RunConfig`. A *method's own options* (FedPL's threshold, FedUL's loss, ...) are
declared and validated by the method (``Method.options``); :class:`RunConfig` carries their
values in :attr:`RunConfig.extra`.

This module checks what the settings alone can tell (types, ranges, rules between keys, the
run folder's name) and knows none of the registries: the modules that implement methods,
strategies and client settings import it. The checks that need them (choice lists, a method's
options, a method against the client setting, ...) are in :mod:`fedul_flwr.preflight`, above
both; :func:`fedul_flwr.preflight.resolve_config` composes and checks a configuration fully.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedul_flwr import get_logger
from fedul_flwr.registry import closest

_SOURCE_DIR = Path(__file__).resolve().parent.parent
PROJECT_DIR = _SOURCE_DIR if (_SOURCE_DIR / "pyproject.toml").is_file() else Path(__file__).resolve().parent / "_project"
"""Where ``pyproject.toml`` (the defaults) and ``conf/`` (the presets) are: the source tree (a
checkout, an editable install, a Flower app bundle), else the copy an installed wheel carries
inside the package."""
CONF_DIR = PROJECT_DIR / "conf"
PYPROJECT = PROJECT_DIR / "pyproject.toml"

log = get_logger(__name__)


CHOICES: dict[str, tuple[str, ...]] = {
    "aggregation-weights": ("num-examples", "uniform"),
    "device": ("auto", "cpu", "cuda"),
    "cohort": ("auto", "sequential", "parallel", "batched"),
    "precision": ("auto", "fp32", "bf16"),
    "memory-format": ("auto", "channels-last", "contiguous"),
    "local-optimizer": ("adam", "sgd"),
    "lr-schedule": ("exponential", "cosine", "cosine-annealing"),
    "local-optimizer-state": ("fresh", "kept"),
    "scaffold-option": ("I", "II"),
    "differential-privacy": ("none", "server-fixed", "server-adaptive", "client-local"),
    "participation": ("fixed-size", "poisson"),
}
"""Fixed choice lists of core keys that have no registry of their own (the keys chosen from a
registry are checked by :mod:`fedul_flwr.preflight`, which knows the registries)."""


class ConfigError(ValueError):
    """A configuration value or file is invalid; the message names the key and source."""


@dataclass(frozen=True)
class RunConfig:
    """Resolved settings of one run. Field names are the dashed run-config keys with
    underscores; units: ``lr`` per local optimiser step, fractions in [0, 1], rounds and
    epochs are counts. ``extra`` holds the values of the keys a method owns (its options)."""

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
    shards_per_client: int
    num_sets: tuple[int, ...]
    prior_scheme: str
    dominant_factor: float
    test_prior: tuple[float, ...]
    class_names: str
    image_column: str
    label_column: str
    image_size: int
    horizontal_flip: str
    client_setting: str
    positive_classes: str
    pu_labeled_fraction: float
    class_prior: str
    num_labeled: int
    label_layout: str
    labeled_share: float
    method: str
    model: str
    prior_noise: float
    samples_per_client: int
    num_rounds: int
    local_epochs: int
    batch_size: int
    lr: float
    l1_weight: float
    aggregation_weights: str
    fraction_train: float
    participation: str
    min_available_nodes: int
    strategy: str
    min_train_nodes: int
    max_failure_fraction: float
    local_optimizer: str
    local_momentum: float
    lr_decay: float
    lr_schedule: str
    weight_decay: float
    nesterov: bool
    grad_clip_norm: float
    local_optimizer_state: str
    ema_decay: float
    augment: str
    local_epochs_per_client: str
    proximal_mu: float
    server_lr: float
    server_momentum: float
    beta_1: float
    beta_2: float
    tau: float
    scaffold_option: str
    num_malicious_nodes: int
    num_nodes_to_select: int
    differential_privacy: str
    dp_noise_multiplier: float
    dp_clipping_norm: float
    dp_target_clipped_quantile: float
    dp_clip_norm_lr: float
    dp_clipped_count_stddev: float
    dp_sensitivity: float
    dp_epsilon: float
    dp_delta: float
    dp_publish_unnoised_train_metrics: bool
    dp_publish_unnoised_client_evaluation: bool
    output_dir: str
    run_name: str
    resume: bool
    tensorboard: bool
    verbose: bool
    eval_batch_size: int
    evaluate_every: int
    device: str
    client_threads: int
    cohort: str
    precision: str
    memory_format: str
    fused_optimizer: bool
    compile: bool
    extra: tuple[tuple[str, Any], ...] = ()

    def option(self, key: str) -> Any:
        """Value of a method-owned key (e.g. ``"fedpl-threshold"``).

        Raises
        ------
        KeyError
            If ``key`` is not a method-owned key of this configuration.
        """
        for k, v in self.extra:
            if k == key:
                return v
        raise KeyError(f"{key!r} is not a method option of this run configuration")

    def num_sets_of(self, partition_id: int) -> int:
        """M_c of client ``partition_id`` (``num-sets`` cycles over clients)."""
        return self.num_sets[partition_id % len(self.num_sets)]

    def lr_of(self, server_round: int) -> float:
        """Local step size in round ``server_round`` (from 1 to R = ``num-rounds``).

        ``lr-schedule = "exponential"``: ``lr * lr-decay ** (round - 1)``;
        ``"cosine"``: FixMatch's cosine decay (Sohn et al., NeurIPS 2020, Sec. 4:
        eta cos(7 pi k / (16 K)) over the K training steps) with the round as the step,
        ``lr * cos(7 pi (round - 1) / (16 R))``; ``"cosine-annealing"``: PyTorch's
        ``CosineAnnealingLR`` over the R rounds to 0, as FedDB's code anneals the local step
        size, ``lr * (1 + cos(pi (round - 1) / R)) / 2``; either times
        ``lr-decay ** (round - 1)``. A pure
        function of the round, so a resumed run continues the schedule exactly; the step size
        is constant within a round (a client's steps per round differ between clients).
        """
        r = max(1, server_round) - 1
        lr = self.lr * self.lr_decay**r
        if self.lr_schedule == "cosine":
            lr *= math.cos(7.0 * math.pi * r / (16.0 * self.num_rounds))
        elif self.lr_schedule == "cosine-annealing":
            lr *= (1.0 + math.cos(math.pi * r / self.num_rounds)) / 2.0
        return lr

    def local_epochs_of(self, node_key: int) -> int:
        """Local epochs E_c of the client with node key ``node_key``: ``local-epochs`` unless
        ``local-epochs-per-client`` (a comma list, cycled over node keys) is set."""
        epochs = _parse_positive_ints("local-epochs-per-client", self.local_epochs_per_client, allow_empty=True)
        return epochs[node_key % len(epochs)] if epochs else self.local_epochs

    def as_dict(self) -> dict[str, Any]:
        """Dashed-key dict (the form of ``--run-config``): ``num-sets`` as a comma string,
        ``test-prior`` as given ("uniform" for the uniform prior) -- every key of
        ``[tool.flwr.app.config]``."""
        out = {
            f.name.replace("_", "-"): getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"
        }
        out["num-sets"] = ",".join(str(m) for m in self.num_sets)
        out["test-prior"] = _format_test_prior(self.test_prior)
        out.update(dict(self.extra))
        return out

    def to_json(self) -> str:
        """The settings as a JSON object of dashed keys (what the server sends the clients)."""
        return json.dumps(self.as_dict(), sort_keys=True)


def _format_test_prior(prior: tuple[float, ...]) -> str:
    if len(set(prior)) <= 1:
        return "uniform"
    return ",".join(repr(v) for v in prior)


SERVER_DP = "server-side DP"
"""The source :func:`compose_config` names for ``aggregation-weights='uniform'`` when it sets it
because of ``differential-privacy=server-*`` (not typed by the user)."""
CORE_KEYS: tuple[str, ...] = tuple(f.name.replace("_", "-") for f in dataclasses.fields(RunConfig) if f.name != "extra")


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


def compose_config(
    run_config: Mapping[str, Any], given: Iterable[str] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Defaults < preset < what the user typed, as a flat dashed-key dict (see module doc).

    Parameters
    ----------
    run_config : Mapping[str, Any]
        Values by dashed key: ``context.run_config`` (defaults already merged with the
        user's values by Flower) or any partial dict (tests, scripts).
    given : Iterable[str] | None
        The keys the user typed (Flower: the run's ``override_config``). ``None``: every
        key of ``run_config`` counts as typed.

    Returns
    -------
    (dict[str, Any], dict[str, str])
        The composed values (every key) and where each came from: ``"default"``,
        ``"preset"``, ``"user"``, or :data:`SERVER_DP` for ``aggregation-weights``, set to
        ``uniform`` under server-side DP where the user did not type it.

    Raises
    ------
    ConfigError
        On an unknown key or a bad preset.
    """
    defaults = default_config()
    check_keys(run_config)
    typed = set(run_config) if given is None else set(given)
    check_keys(typed)
    user = {k: run_config[k] for k in typed if k in run_config}
    preset_name = str(user.get("preset", run_config.get("preset", defaults["preset"])))
    preset = load_preset(preset_name)
    values = {**defaults, **preset, **user}
    sources = {k: "user" if k in user else "preset" if k in preset else "default" for k in values}
    server_dp_weights(values, sources)
    return values, sources


def server_dp_weights(values: dict[str, Any], sources: dict[str, str]) -> bool:
    """Under server-side DP (``differential-privacy=server-*``), ``aggregation-weights='uniform'``
    wherever the user did not type the key (a default, a preset's or a grid's value): the
    server's noise z C / n protects each client with multiplier z only under equal weights
    (:mod:`fedul_flwr.privacy`). Sets it in ``values`` (in place) with the source
    :data:`SERVER_DP` (named in the run's configuration line, :func:`describe_sources`); a
    typed value is left for the checks to accept or refuse.

    Parameters
    ----------
    values : dict[str, Any]
        Dashed-key settings.
    sources : dict[str, str]
        Where each came from; ``"user"``: typed by the user.

    Returns
    -------
    bool
        Whether it changed ``aggregation-weights``.
    """
    if not str(values["differential-privacy"]).startswith("server") or sources.get("aggregation-weights") == "user":
        return False
    changed = values["aggregation-weights"] != "uniform"
    values["aggregation-weights"], sources["aggregation-weights"] = "uniform", SERVER_DP
    return changed


def check_keys(keys: Iterable[str]) -> None:
    """Every key of ``keys`` is a run-config key (of ``[tool.flwr.app.config]``).

    Raises
    ------
    ConfigError
        Naming each unknown key with the closest valid key, then every valid key.
    """
    defaults = default_config()
    unknown = sorted(set(keys) - set(defaults))
    if unknown:
        named = ", ".join(f"{k!r}{closest(k, defaults)}" for k in unknown)
        raise ConfigError(f"unknown run-config key(s) {named}; valid keys: {sorted(defaults)}")


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


def coerce_value(key: str, value: Any, kind: type) -> Any:
    """``value`` as ``kind`` (bool / int / float / str; ``"true"`` / ``"false"`` for bool).

    Raises
    ------
    ConfigError
        Naming ``key`` and ``value`` when it is not a valid ``kind``.
    """
    try:
        if kind is bool:
            if isinstance(value, str):
                if value.lower() not in ("true", "false"):
                    raise ValueError
                return value.lower() == "true"
            return bool(value)
        if kind is int:
            if isinstance(value, bool) or float(value) != int(value):
                raise ValueError
            return int(value)
        if kind is float:
            return float(value)
        return str(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConfigError(f"{key}={value!r} is not a valid {kind.__name__}") from exc

def parse_test_prior(spec: str | float | Sequence[float] | np.ndarray, num_classes: int) -> np.ndarray:
    """Parse the test class prior pi.

    Parameters
    ----------
    spec : str, float, or sequence of float
        ``"uniform"`` (case-insensitive) or a comma-separated list ``"0.1,0.2,..."`` of K
        values; a bare number or a sequence is treated like the list of its values.
    num_classes : int
        K.

    Returns
    -------
    np.ndarray
        float64 [K], strictly positive, sums to 1 within 1e-6 (renormalised exactly).

    Raises
    ------
    ValueError
        Naming the value: not a number, wrong length, non-positive or non-finite entry,
        or a sum that differs from 1 by more than 1e-6.
    """
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if isinstance(spec, str):
        text = spec.strip()
        if text.lower() == "uniform":
            return np.full(num_classes, 1.0 / num_classes)
        tokens = [t.strip() for t in text.split(",")]
        values: list[float] = []
        for tok in tokens:
            try:
                values.append(float(tok))
            except ValueError:
                raise ValueError(
                    f"test-prior {spec!r}: {tok!r} is not a number; "
                    f"use 'uniform' or {num_classes} comma-separated probabilities"
                ) from None
    elif isinstance(spec, (int, float, np.floating, np.integer)):
        values = [float(spec)]
    else:
        values = [float(v) for v in spec]
    arr = np.asarray(values, dtype=np.float64)
    if arr.size != num_classes:
        raise ValueError(
            f"test-prior {spec!r}: expected {num_classes} values (one per class), got {arr.size}"
        )
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"test-prior {spec!r}: entries must be finite")
    if np.any(arr <= 0):
        k = int(np.flatnonzero(arr <= 0)[0])
        raise ValueError(f"test-prior {spec!r}: entry {k} = {arr[k]:g} must be > 0")
    if abs(arr.sum() - 1.0) > 1e-6:
        raise ValueError(f"test-prior {spec!r}: entries sum to {arr.sum():.8g}, not 1")
    return arr / arr.sum()



def _parse_test_prior(value: Any) -> tuple[float, ...]:
    """The test prior: ``()`` for ``"uniform"`` (1/K each, K known where it is used), else the
    given numbers, checked on their own; their count is checked against the dataset's K with
    the registries (:func:`fedul_flwr.preflight.validate_config`). Needs no dataset, so a
    deployed node never opens one to read its settings."""
    if isinstance(value, str) and value.strip().lower() == "uniform":
        return ()
    count = len(value.split(",")) if isinstance(value, str) else len(np.atleast_1d(value))
    try:
        return tuple(float(v) for v in parse_test_prior(value, count))
    except ValueError as exc:
        raise ConfigError(f"test-prior: {exc}") from exc


_FIELD_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


def config_from_values(values: Mapping[str, Any]) -> RunConfig:
    """Parse a complete dashed-key dict (no preset is applied here) and check what the settings
    alone can tell (:func:`check_values`); the checks that need the registries are
    :func:`fedul_flwr.preflight.validate_config`.

    The clients build their configuration with it from the server's resolved (and fully
    checked) settings.

    Raises
    ------
    ConfigError
        Naming the key and the offending value (also for a key missing from ``values``).
    """
    defaults = default_config()
    missing = sorted(set(defaults) - set(values))
    if missing:
        raise ConfigError(f"run configuration lacks key(s) {missing}")
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(RunConfig):
        if field.name == "extra":
            continue
        key = field.name.replace("_", "-")
        value = values[key]
        if key == "num-sets":
            kwargs[field.name] = _parse_positive_ints(key, value)
        elif key == "test-prior":
            kwargs[field.name] = value  # parsed below, once the dataset is known
        else:
            kwargs[field.name] = coerce_value(key, value, _FIELD_TYPES[str(field.type)])
    kwargs["test_prior"] = _parse_test_prior(kwargs["test_prior"])
    extra = tuple(
        (key, coerce_value(key, values[key], type(defaults[key]))) for key in sorted(defaults) if key not in CORE_KEYS
    )
    cfg = RunConfig(**kwargs, extra=extra)
    check_values(cfg)
    return cfg


@functools.lru_cache(maxsize=8)
def config_from_json(text: str) -> RunConfig:
    """:func:`config_from_values` of a :meth:`RunConfig.to_json` string (cached: every message of
    a run carries the same text, and the result is frozen).

    Raises
    ------
    ConfigError
        If ``text`` is not a JSON object, or on an invalid value.
    """
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"run configuration is not valid JSON ({exc})") from exc
    if not isinstance(values, dict):
        raise ConfigError("run configuration must be a JSON object of dashed keys")
    return config_from_values(values)


def describe_sources(values: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    """One line naming the preset's keys and the user's keys with their values (and a key set
    for server-side DP, :data:`SERVER_DP`)."""

    def keys(kind: str) -> str:
        chosen = [f"{k}={values[k]!r}" for k in sorted(values) if sources.get(k) == kind]
        return ", ".join(chosen) or "none"

    preset = repr(values["preset"]) if values.get("preset") else "none"
    line = f"run configuration: preset={preset}; from the preset: {keys('preset')}; typed by the user: {keys('user')}"
    if SERVER_DP in sources.values():
        line += f"; set for server-side DP (its noise assumes equal client weights): {keys(SERVER_DP)}"
    return line


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def check_values(cfg: RunConfig) -> None:
    """What the settings alone can tell: the fixed choice lists (:data:`CHOICES`), ranges,
    rules between keys, the run folder's name (:func:`check_run_name`).

    Raises
    ------
    ConfigError
        Naming the key(s) and the offending value.
    """
    d = cfg.as_dict()
    for key, allowed in CHOICES.items():
        _check(d[key] in allowed, f"{key}={d[key]!r} is not one of {allowed}{closest(d[key], allowed)}")
    for key in ("num-rounds", "local-epochs", "batch-size", "eval-batch-size", "evaluate-every", "min-available-nodes",
                "shards-per-client", "num-labeled"):  # fmt: skip
        _check(d[key] >= 1, f"{key}={d[key]} must be >= 1")
    for key in ("val-fraction", "client-test-fraction"):
        _check(0.0 <= d[key] < 1.0, f"{key}={d[key]} must be in [0, 1)")
    _check(0.0 < cfg.pu_labeled_fraction <= 1.0, f"pu-labeled-fraction={cfg.pu_labeled_fraction} must be in (0, 1]")
    _check(0.0 <= cfg.labeled_share <= 1.0, f"labeled-share={cfg.labeled_share} must be in [0, 1]")
    cfg.local_epochs_of(0)  # raises on a malformed local-epochs-per-client
    _check(
        1 <= cfg.min_train_nodes <= cfg.min_available_nodes,
        f"min-train-nodes={cfg.min_train_nodes} must be in [1, min-available-nodes={cfg.min_available_nodes}] "
        "(Flower would wait forever for nodes that never connect)",
    )
    for key in ("proximal-mu", "server-lr", "server-momentum", "beta-1", "beta-2", "prior-noise", "samples-per-client",
                "l1-weight", "client-threads", "local-momentum"):  # fmt: skip
        _check(d[key] >= 0, f"{key}={d[key]} must be >= 0")
    for key in ("server-momentum", "beta-1", "beta-2", "local-momentum"):
        _check(d[key] < 1, f"{key}={d[key]} must be < 1")
    _check(0.0 < cfg.lr_decay <= 1.0, f"lr-decay={cfg.lr_decay} must be in (0, 1]")
    for key in ("weight-decay", "grad-clip-norm"):
        _check(0 <= d[key] < math.inf, f"{key}={d[key]} must be a finite number >= 0 (0: none)")
    _check(0.0 <= cfg.ema_decay < 1.0, f"ema-decay={cfg.ema_decay} must be in [0, 1) (0: no EMA)")
    _check(not cfg.nesterov or (cfg.local_optimizer == "sgd" and cfg.local_momentum > 0),
           f"nesterov=true needs local-optimizer='sgd' with local-momentum > 0 (got {cfg.local_optimizer!r}, "
           f"local-momentum={cfg.local_momentum})")  # fmt: skip
    _check(cfg.cohort != "parallel" or cfg.client_threads <= 1,
           f"cohort='parallel' trains each client on one torch thread; client-threads={cfg.client_threads} asks for more "
           "(use cohort='sequential', or client-threads=0)")  # fmt: skip
    _check(cfg.cohort != "parallel" or cfg.device != "cuda",
           "cohort='parallel' trains clients in threads on a CPU; device='cuda' (use cohort='auto' or 'batched')")  # fmt: skip
    _check(
        cfg.local_momentum == 0 or cfg.local_optimizer == "sgd",
        f"local-momentum={cfg.local_momentum} needs local-optimizer='sgd' (got {cfg.local_optimizer!r})",
    )
    for key in ("tau", "lr", "dominant-factor"):
        _check(d[key] > 0, f"{key}={d[key]} must be > 0")
    _check(0.0 < cfg.fraction_train <= 1.0, f"fraction-train={cfg.fraction_train} must be in (0, 1]")
    _check(
        0.0 <= cfg.max_failure_fraction <= 1.0,
        f"max-failure-fraction={cfg.max_failure_fraction} must be in [0, 1] (1: never stop for failed replies)",
    )
    _validate_robustness(cfg)
    check_run_name(cfg.run_name)
    _check(bool(cfg.run_name) or not cfg.resume,
           "resume=true needs run-name: the run folder <output-dir>/<run-name> to continue")  # fmt: skip
    _check(cfg.image_size >= 0, f"image-size={cfg.image_size} must be >= 0 (0 keeps the dataset's image size)")
    _check(
        not cfg.data_dir or os.path.isabs(os.path.expanduser(cfg.data_dir)),
        f"data-dir={cfg.data_dir!r} must be absolute: Flower runs the app from its own copy, "
        "so relative paths do not point where you expect",
    )


def check_run_name(name: str) -> None:
    """``run-name`` is empty (a name is made up) or one path component: no separator, not
    hidden (no leading ``.``), not absolute, no ``~``, no control character -- so the run folder
    ``<output-dir>/<run-name>`` always lies inside ``output-dir``.

    Raises
    ------
    ConfigError
        Naming ``run-name``, its value and what is wrong with it.
    """
    if not name:
        return
    why = (
        "contains a path separator" if "/" in name or (os.altsep and os.altsep in name) or "\\" in name
        else "is '.' or '..'" if name in (".", "..")
        else "starts with '.' (hidden names such as '.locks' belong to the run store)" if name.startswith(".")
        else "starts with '~'" if name.startswith("~")
        else "contains a control character" if any(ord(c) < 32 or ord(c) == 127 for c in name)
        else "has leading or trailing spaces" if name != name.strip()
        else ""
    )  # fmt: skip
    _check(not why, f"run-name={name!r} {why}; it must be one folder name inside output-dir, such as 'mnist-fedul-s0'")


def _validate_robustness(cfg: RunConfig) -> None:
    """The keys of the Byzantine-robust strategies and of differential privacy."""
    _check(cfg.num_malicious_nodes >= 0, f"num-malicious-nodes={cfg.num_malicious_nodes} must be >= 0")
    _check(cfg.num_nodes_to_select >= 1, f"num-nodes-to-select={cfg.num_nodes_to_select} must be >= 1")
    needed = {"bulyan": 4 * cfg.num_malicious_nodes + 3, "krum": 2 * cfg.num_malicious_nodes + 3,
              "multikrum": 2 * cfg.num_malicious_nodes + 3}.get(cfg.strategy, 0)  # fmt: skip
    _check(
        cfg.min_train_nodes >= needed,
        f"strategy={cfg.strategy!r} with num-malicious-nodes={cfg.num_malicious_nodes} needs at least {needed} replies "
        f"per round (Bulyan: 4f + 3, Krum: 2f + 3), so min-train-nodes={cfg.min_train_nodes} must be >= {needed}",
    )
    _check(
        cfg.participation != "poisson" or not needed,
        f"participation='poisson' with strategy={cfg.strategy!r}: a Poisson round may draw fewer nodes than the "
        f"{needed} replies it needs (min-train-nodes is no floor under Poisson sampling); use participation='fixed-size'",
    )
    d = cfg.as_dict()
    for key in ("dp-noise-multiplier", "dp-clipped-count-stddev"):
        _check(0 <= d[key] < math.inf, f"{key}={d[key]} must be a finite number >= 0")
    for key in ("dp-clipping-norm", "dp-clip-norm-lr", "dp-sensitivity", "dp-epsilon"):
        _check(d[key] > 0, f"{key}={d[key]} must be > 0")
    _check(0.0 < cfg.dp_delta < 1.0, f"dp-delta={cfg.dp_delta} must be in (0, 1)")
    _check(0.0 <= cfg.dp_target_clipped_quantile <= 1.0,
           f"dp-target-clipped-quantile={cfg.dp_target_clipped_quantile} must be in [0, 1]")  # fmt: skip
    _check(
        cfg.differential_privacy != "server-adaptive" or cfg.dp_clipped_count_stddev == 0
        or 2 * cfg.dp_clipped_count_stddev > cfg.dp_noise_multiplier,
        f"dp-clipped-count-stddev={cfg.dp_clipped_count_stddev} must exceed dp-noise-multiplier/2="
        f"{cfg.dp_noise_multiplier / 2:g}: the clipped count and the update share the noise multiplier z, "
        "1/z^2 = 1/z_update^2 + 1/(2 sigma_b)^2 (0: max(cohort/20, z))",
    )
    _check(
        not (cfg.resume and cfg.differential_privacy == "server-adaptive"),
        "resume=true with differential-privacy='server-adaptive': the adapted clipping norm is not checkpointed",
    )


# --------------------------------------------------------------------------- method options


@dataclass(frozen=True)
class Option:
    """A run-config key owned by a method (its default lives in ``[tool.flwr.app.config]``,
    where Flower needs every key).

    Attributes
    ----------
    key : str
        The dashed run-config key, e.g. ``"fedpl-threshold"``.
    check : Callable[[Any], bool]
        True for a valid value.
    rule : str
        What a valid value is, for the error message (e.g. ``"in [0, 1]"``).
    """

    key: str
    check: Callable[[Any], bool] = lambda value: True
    rule: str = ""

    def validate(self, cfg: RunConfig, method: str) -> Any:
        """The option's value in ``cfg``.

        Raises
        ------
        ConfigError
            If the key is not in ``[tool.flwr.app.config]`` or the value breaks the rule.
        """
        try:
            value = cfg.option(self.key)
        except KeyError:
            raise ConfigError(
                f"method {method!r} declares option {self.key!r}, which [tool.flwr.app.config] in {PYPROJECT} lacks"
            ) from None
        _check(bool(self.check(value)), f"{self.key}={value!r} must be {self.rule} (an option of method {method!r})")
        return value
