"""Every check of a run's settings that needs no node's data, run before round 1 and before any
run folder exists (``fedul check``; ``python -m fedul_flwr.checks``).

:mod:`fedul_flwr.config` checks what the settings alone can tell and knows no registry (the
modules that implement methods, strategies and client settings import it). This module sits
above both and adds what needs the registries:

- every key chosen by name is one of its registry's names (the closest one is suggested);
- the method's own options (``Method.options``);
- ``resume=true`` only with a strategy whose whole state a server checkpoint holds, and
  (:func:`check_resume`) only from a checkpoint of the same settings: ``num-rounds`` and the
  keys of :data:`RESUME_FREE_KEYS` may differ, nothing else;
- in simulation (:func:`check_simulation`), where ``client-setting`` builds the clients'
  data: the method is defined for that setting (:func:`method_settings`), every client gets
  ``num-sets`` >= K U sets (Lu et al., ICLR 2022, Theorem 1), a given ``class-prior`` is
  finite and not all zero.

The ServerApp runs :func:`check_before_round_one` first thing, so a refused run ends
``failed`` with one line naming the key and value, and leaves no run folder behind (a rerun
under the same name is not blocked). A deployment's nodes check their own folders
(:mod:`fedul_flwr.data.node_dir`). ``fedul check --run-config "..."`` runs the same checks
on the command line, before ``flwr run``: Flower's own error for an unknown key does not name
it, this one names it and the closest valid key.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedul_flwr.checkpoint import RESUMABLE_STRATEGIES, Checkpoint, CheckpointError, load_checkpoint
from fedul_flwr.config import (
    ConfigError,
    RunConfig,
    compose_config,
    config_from_values,
    default_config,
    describe_sources,
)
from fedul_flwr.registry import closest

__all__ = [
    "RESUME_FREE_KEYS",
    "check_before_round_one",
    "check_resume",
    "check_setting",
    "check_simulation",
    "is_simulation",
    "method_settings",
    "registry_choices",
    "resolve_config",
    "resume_conflicts",
    "validate_config",
]

RESUME_FREE_KEYS: tuple[str, ...] = (
    "num-rounds", "resume", "output-dir", "run-name", "tensorboard", "eval-batch-size", "max-failure-fraction"
)  # fmt: skip
"""Keys a resumed run may set differently from the checkpoint's run: how long it runs, where
its folder is, what is logged and how the central evaluation is batched -- none changes the
training. Every other key (``lr``, ``seed``, which also draws the data split, ...) must be
the same."""


def registry_choices() -> dict[str, tuple[str, ...]]:
    """Valid values of the keys chosen by name, from the registries of the modules that
    implement them."""
    from fedul_flwr.augment import AUGMENTATIONS
    from fedul_flwr.data.datasets import DATASETS
    from fedul_flwr.data.partition import PARTITIONS
    from fedul_flwr.data.simulated import SETTINGS
    from fedul_flwr.data.usets import PRIOR_SCHEMES
    from fedul_flwr.methods import METHODS
    from fedul_flwr.models import MODELS
    from fedul_flwr.strategies import STRATEGIES

    return {
        "augment": AUGMENTATIONS.names(),
        "dataset": DATASETS.names(),
        "partition": PARTITIONS.names(),
        "prior-scheme": PRIOR_SCHEMES.names(),
        "client-setting": SETTINGS.names(),
        "method": METHODS.names(),
        "model": MODELS.names(),
        "strategy": STRATEGIES.names(),
    }


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def validate_config(cfg: RunConfig) -> RunConfig:
    """The checks of ``cfg`` that need the registries (those that do not ran when ``cfg`` was
    parsed, :func:`fedul_flwr.config.config_from_values`); returns ``cfg``.

    Raises
    ------
    ConfigError
        Naming the key and the offending value (and the closest valid name).
    """
    d = cfg.as_dict()
    for key, allowed in registry_choices().items():
        if key == "method" and ":" in d[key]:
            continue  # an import path "module:Class", checked when imported below
        if key == "dataset" and d[key].startswith("hf:"):
            continue  # the user's own dataset, fedul_flwr.data.user_datasets
        _check(d[key] in allowed, f"{key}={d[key]!r} is not one of {allowed}{closest(d[key], allowed)}")
    from fedul_flwr.methods import get_method

    try:
        method = get_method(cfg.method)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    method.check_options(cfg)
    _check(
        not cfg.resume or cfg.strategy in RESUMABLE_STRATEGIES,
        f"resume=true with strategy={cfg.strategy!r}: only {RESUMABLE_STRATEGIES} keep all their state across "
        "rounds on the server (SCAFFOLD's client control variates live on the clients), so only they can be "
        "resumed exactly",
    )
    return cfg


def resolve_config(
    run_config: Mapping[str, Any], given: Iterable[str] | None = None, *, log_sources: bool = False
) -> RunConfig:
    """Compose and check the run configuration (every check that needs no node).

    Parameters
    ----------
    run_config : Mapping[str, Any]
        ``context.run_config`` (Flower) or any dict of dashed keys (tests, scripts). Keys not
        given take the preset's value, else their defaults.
    given : Iterable[str] | None
        The keys the user typed (see :func:`fedul_flwr.config.compose_config`).
    log_sources : bool
        Log once which keys came from the preset and which from the user.

    Returns
    -------
    RunConfig

    Raises
    ------
    ConfigError
        Naming the key and the offending value.
    """
    from fedul_flwr import get_logger

    values, sources = compose_config(run_config, given)
    cfg = validate_config(config_from_values(values))
    if log_sources:
        get_logger(__name__).info("%s", describe_sources(values, sources))
    return cfg


# --------------------------------------------------------------------------- simulation


def method_settings(method: type) -> tuple[str, ...]:
    """The simulated ``client-setting`` values a method class is defined for: its own
    ``settings`` when it names them, else every setting whose clients hold all the parts in
    its ``requires`` (:data:`fedul_flwr.data.simulated.SETTING_PARTS`)."""
    from fedul_flwr.data.simulated import SETTING_PARTS

    declared = tuple(getattr(method, "settings", ()) or ())
    if declared:
        return declared
    needed = set(method.requires)
    return tuple(name for name, parts in SETTING_PARTS.items() if needed <= set(parts))


def check_simulation(cfg: RunConfig) -> None:
    """The checks of a simulation, where ``client-setting`` builds every client's data from the
    run's dataset: the method is defined for that setting (:func:`method_settings`), and what
    the setting builds can be built (:func:`check_setting`).

    Raises
    ------
    ConfigError
        Naming the key(s) and value(s).
    """
    from fedul_flwr.methods import get_method

    method = get_method(cfg.method)
    allowed = method_settings(method)
    _check(
        cfg.client_setting in allowed,
        f"method={cfg.method!r} with client-setting={cfg.client_setting!r}: the method is defined for "
        f"client-setting in {allowed}",
    )
    check_setting(cfg)


def check_setting(cfg: RunConfig) -> None:
    """What ``client-setting`` builds from the run's dataset, checked from the settings alone
    (simulated clients, ``fedul node-data write``): with ``usets`` every value of
    ``num-sets`` is >= K (Lu et al., ICLR 2022, Theorem 1: the [M_c, K] prior matrix needs
    full column rank); with ``pu`` a ``class-prior`` given as numbers is finite and not all
    zero (a zero prior makes the PU risk of every class zero).

    Raises
    ------
    ConfigError
        Naming the key and value.
    """
    from fedul_flwr.data.user_datasets import UserDatasetOptions, any_dataset_info

    num_classes = len(any_dataset_info(cfg.dataset, UserDatasetOptions.from_values(cfg.as_dict())).class_names)
    if cfg.client_setting == "usets":
        short = sorted({m for m in cfg.num_sets if m < num_classes})
        _check(
            not short,
            f"num-sets={','.join(map(str, cfg.num_sets))}: every simulated client needs M_c >= K={num_classes} "
            f"U sets (dataset={cfg.dataset!r}; Lu et al. 2022, Theorem 1), got {short}",
        )
    if cfg.client_setting == "pu" and cfg.class_prior not in ("global", "client"):
        from fedul_flwr.data.pu import class_prior

        try:
            prior = class_prior(cfg.class_prior, num_classes, np.zeros(0, np.int64), np.zeros(0, np.int64))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        _check(bool(np.all(np.isfinite(prior))) and bool(np.any(prior > 0)),
               f"class-prior={cfg.class_prior!r}: a class prior must be finite and not all zero")  # fmt: skip


def is_simulation(grid: object) -> bool:
    """Whether ``grid`` runs simulated clients built by ``client-setting``: Flower's simulation
    engine (its in-memory grid) or an in-process federation of simulated partitions
    (:class:`fedul_flwr.inprocess.InProcessGrid` without node folders). A deployment's
    grid is neither: its nodes bring their own data."""
    from flwr.superlink.grid import InMemoryGrid

    return isinstance(grid, InMemoryGrid) or bool(getattr(grid, "simulated", False))


# --------------------------------------------------------------------------- resume


def resume_conflicts(saved: Mapping[str, Any], cfg: RunConfig) -> list[str]:
    """The settings of ``cfg`` that differ from those a checkpoint was written with, as
    ``"key: <saved> in the checkpoint, <requested> now"``; empty when the run may continue.

    Keys of :data:`RESUME_FREE_KEYS` may differ, and so may the options of methods other
    than the run's. A key the checkpoint lacks (added to the project after it was written)
    counts as its default.
    """
    from fedul_flwr.methods import METHODS

    own = {o.key for o in METHODS.get(cfg.method).options} if cfg.method in METHODS else set()
    foreign = {o.key for name in METHODS.names() for o in METHODS.get(name).options} - own
    defaults = default_config()
    requested = cfg.as_dict()
    conflicts = []
    for key in sorted(requested):
        if key in RESUME_FREE_KEYS or key in foreign:
            continue
        before = saved.get(key, defaults.get(key))
        if before != requested[key]:
            conflicts.append(f"{key}: {before!r} in the checkpoint, {requested[key]!r} now")
    return conflicts


def check_resume(cfg: RunConfig, run_dir: Path) -> Checkpoint:
    """The checkpoint ``resume=true`` continues from, once it is certain the run can go on:
    it exists, its round is below ``num-rounds`` and it was written with the same settings
    (:func:`resume_conflicts`). Reads only; nothing is written.

    Raises
    ------
    CheckpointError
        If ``run_dir`` holds no readable checkpoint.
    ConfigError
        If the run is already at ``num-rounds``, or naming every differing key with both
        values.
    """
    ckpt = load_checkpoint(run_dir)
    _check(
        ckpt.round < cfg.num_rounds,
        f"resume=true: {run_dir} has finished round {ckpt.round} and num-rounds={cfg.num_rounds}; nothing to resume "
        "(set num-rounds higher to continue it)",
    )
    conflicts = resume_conflicts(ckpt.config, cfg)
    _check(
        not conflicts,
        f"resume=true: {run_dir} was run with other settings; only {RESUME_FREE_KEYS} may change on resume: "
        + "; ".join(conflicts),
    )
    return ckpt


def check_before_round_one(cfg: RunConfig, grid: object) -> None:
    """The checks of the settings that need no node's data, run by the ServerApp before
    anything is written: :func:`validate_config`, and :func:`check_simulation` when ``grid``
    simulates its clients (:func:`is_simulation`). (With ``resume=true`` the ServerApp then
    runs :func:`check_resume` on the run folder.)

    Raises
    ------
    ConfigError
        Naming the key(s) and value(s).
    """
    validate_config(cfg)
    if is_simulation(grid):
        check_simulation(cfg)


# --------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``fedul check`` arguments."""
    parser.add_argument(
        "--run-config", action="append", default=[],
        help="the settings you will give `flwr run --run-config`, e.g. 'num-sets=10 seed=1' (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--simulation", action=argparse.BooleanOptionalAction, default=True,
        help="also check what a simulation's client-setting builds (--no-simulation for a deployment)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Resolve and check the settings; print the resolved run in one line (exit 0) or the
    first problem in one line (exit 1)."""
    from flwr.common.config import parse_config_args

    try:
        values = parse_config_args(args.run_config) if args.run_config else {}
        composed, sources = compose_config(values)
        cfg = validate_config(config_from_values(composed))
        if args.simulation:
            check_simulation(cfg)
        if cfg.resume:
            from fedul_flwr.outputs import run_folder

            check_resume(cfg, run_folder(cfg))
    except (ConfigError, CheckpointError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"ok: {describe_sources(composed, sources)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m fedul_flwr.checks``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="fedul check", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
