"""A complete dashed-key dict into a checked :class:`~fedul_flwr.config.record.RunConfig`
(:func:`config_from_values`, :func:`config_from_json`), and the checks the settings alone
allow (:func:`check_values`: fixed choice lists, ranges, rules between keys, the run folder's
name). The checks that need the registries are :mod:`fedul_flwr.preflight`'s."""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedul_flwr.config.keys import CHOICES
from fedul_flwr.config.presets import default_config
from fedul_flwr.config.record import (
    CORE_KEYS,
    ConfigError,
    RunConfig,
    parse_positive_ints,
    test_prior_values,
    coerce_value,
)
from fedul_flwr.registry import closest

__all__ = ["check_robust_replies", "check_run_name", "resolve_path", "check_values", "config_from_json", "config_from_values"]

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
            kwargs[field.name] = parse_positive_ints(key, value)
        elif key == "test-prior":
            kwargs[field.name] = value  # parsed below, once the dataset is known
        else:
            kwargs[field.name] = coerce_value(key, value, _FIELD_TYPES[str(field.type)])
    kwargs["test_prior"] = test_prior_values(kwargs["test_prior"])
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
                "shards-per-client", "num-labeled", "server-epochs"):  # fmt: skip
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
    for key in ("data-dir", "server-data-dir"):
        _check(
            not d[key] or os.path.isabs(os.path.expanduser(d[key])),
            f"{key}={d[key]!r} must be absolute: Flower runs the app from its own copy, "
            "so relative paths do not point where you expect",
        )
        if d[key]:
            try:  # a symlink loop: named here, not as a bare OS error later
                resolve_path(d[key])
            except ValueError as exc:
                raise ConfigError(f"{key}={d[key]!r}: {exc}") from None


def resolve_path(text: str) -> Path:
    """``text`` as an absolute path with every symbolic link resolved (``~`` expanded); a path
    that does not exist (yet) is fine.

    Raises
    ------
    ValueError
        "the path cannot be resolved (...)" where a symbolic link loops (Python 3.11-3.12's
        ``resolve`` raises on a loop; from 3.13 it returns, and the loop shows in ``stat``).
    """
    try:
        path = Path(text).expanduser().resolve()
        os.stat(path)
    except FileNotFoundError:
        return path
    except RuntimeError as exc:  # Python < 3.13: "Symlink loop from ..."
        raise ValueError(f"the path cannot be resolved ({exc})") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"the path cannot be resolved (symlink loop: {exc.strerror})") from None
    return path


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


def check_robust_replies(cfg: RunConfig) -> None:
    """The replies a Byzantine-robust strategy needs a round (Bulyan: 4f + 3, Krum and
    Multi-Krum: 2f + 3, f = ``num-malicious-nodes``): ``min-train-nodes`` at least that, and a
    fixed-size cohort. Run by :func:`fedul_flwr.preflight.validate_config` after the
    strategy-against-method check, so a strategy the method refuses is named first.

    Raises
    ------
    ConfigError
        Naming the strategy, ``min-train-nodes`` or ``participation``.
    """
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


def _validate_robustness(cfg: RunConfig) -> None:
    """The keys of the Byzantine-robust strategies and of differential privacy (the replies a
    robust strategy needs: :func:`check_robust_replies`)."""
    _check(cfg.num_malicious_nodes >= 0, f"num-malicious-nodes={cfg.num_malicious_nodes} must be >= 0")
    _check(cfg.num_nodes_to_select >= 1, f"num-nodes-to-select={cfg.num_nodes_to_select} must be >= 1")
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
