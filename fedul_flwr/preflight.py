"""Every check of a run's settings that needs no node's data, run before round 1 and before any
run folder exists (``fedul check``; ``python -m fedul_flwr.preflight``).

:mod:`fedul_flwr.config` checks what the settings alone can tell and knows no registry (the
modules that implement methods, strategies and client settings import it). This module sits
above both and adds what needs the registries:

- every key chosen by name is one of its registry's names (the closest one is suggested);
- the method's own options (``Method.options``);
- ``resume=true`` only with a strategy whose whole state a server checkpoint holds, and
  (:func:`check_resume`) only from a checkpoint of the same settings: ``num-rounds``, the
  :data:`OUTPUT_KEYS` and, in float32, ``device`` may differ, nothing else (:func:`run_settings`,
  the same rule the grid runner's records follow);
- in simulation (:func:`check_simulation`), where ``client-setting`` builds the clients'
  data: the method is defined for that setting (:func:`method_settings`), every client gets
  ``num-sets`` >= K U sets (Lu et al., ICLR 2022, Theorem 1), a given ``class-prior`` is
  finite and not all zero, and a client layout that names one entry per client (HASSLE's
  ``label-layout``, FedPU's ``positive-classes`` per client) has one per node of the
  federation (:func:`check_federation_size`).

The ServerApp runs :func:`check_before_round_one` first thing, so a refused run ends
``failed`` with one line naming the key and value, and leaves no run folder behind (a rerun
under the same name is not blocked). A deployment's nodes check their own folders
(:mod:`fedul_flwr.data.node_folder.layout`). ``fedul check --run-config "..."`` runs the same checks
on the command line, before ``flwr run``: Flower's own error for an unknown key does not name
it, this one names it and the closest valid key; given ``--federation-config
"num-supernodes=N"`` (as ``flwr run`` takes it) it also checks the layouts against N.
"""

from __future__ import annotations

import argparse
import sys
import time
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
    "DEVICE_FREE_PRECISION",
    "OUTPUT_KEYS",
    "RESUME_FREE_KEYS",
    "aggregation_contract",
    "check_aggregation_contract",
    "check_before_round_one",
    "check_clients",
    "check_dataset",
    "check_label_layout",
    "check_federation_size",
    "check_resume",
    "check_resumed_federation",
    "check_setting",
    "check_node_counts",
    "check_simulation",
    "federation_nodes",
    "is_simulation",
    "laid_out_clients",
    "method_settings",
    "registry_choices",
    "resolve_config",
    "resume_conflicts",
    "run_finished",
    "run_settings",
    "validate_config",
]

OUTPUT_KEYS: tuple[str, ...] = (
    "resume", "output-dir", "run-name", "verbose", "tensorboard", "eval-batch-size", "max-failure-fraction"
)  # fmt: skip
"""Settings that change only what a run writes, prints or logs, where its folder is, how the
central evaluation is batched or when a failing run gives up -- never what it trains. Two
runs that differ only in these are one run: for a resumed checkpoint
(:data:`RESUME_FREE_KEYS`) and for the grid runner's records
(:func:`fedul_flwr.experiments.runner.run_grid`) alike."""
DEVICE_FREE_PRECISION = "fp32"
"""With this ``precision``, ``device`` is free too (:func:`run_settings`): float32 on ``cpu``
and on ``cuda`` computes the same model (the runs differ by floating-point rounding only),
so a run may stop on one device and continue on the other, and its record counts for either.
(``precision=auto`` resolves to bfloat16 autocast on one device and float32 on the other.)"""
SCHEDULE_KEYS: tuple[str, ...] = ("cohort",)
"""Settings that change only how a round's clients are scheduled on the machine (one after
another, in threads, as one batched model): the replies differ by floating-point rounding
only (``tests/test_cohort.py``), as on another device in float32, so they are free like it: a
record or checkpoint made on one path counts for the others."""
RESUME_FREE_KEYS: tuple[str, ...] = ("num-rounds", *OUTPUT_KEYS)
"""Keys a resumed run may set differently from the checkpoint's run: how long it runs and
:data:`OUTPUT_KEYS` (and ``device`` in float32, :data:`DEVICE_FREE_PRECISION`). Every other
key (``lr``, ``seed``, which also draws the data split, ...) must be the same."""


def run_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved settings that can change what a run trains: all of ``config`` but the
    options of methods other than its ``method`` (:attr:`Method.options`), the
    :data:`OUTPUT_KEYS`, the :data:`SCHEDULE_KEYS`, and ``device`` where ``precision`` is
    :data:`DEVICE_FREE_PRECISION`. So a checkpoint or a record written before another method
    gained an option, with another ``verbose``, or on the other device in float32 still
    matches its run.

    Parameters
    ----------
    config : Mapping[str, Any]
        Resolved dashed-key settings (:meth:`RunConfig.as_dict`, a checkpoint's or a
        record's ``config``).

    Returns
    -------
    dict[str, Any]
        The settings that identify the run (``num-rounds`` among them).
    """
    from fedul_flwr.methods import METHODS

    method = str(config.get("method", default_config()["method"]))
    own = {o.key for o in METHODS.get(method).options} if method in METHODS else set()
    foreign = {o.key for name in METHODS.names() for o in METHODS.get(name).options} - own
    free = {*OUTPUT_KEYS, *SCHEDULE_KEYS, *foreign, *(("device",) if config.get("precision") == DEVICE_FREE_PRECISION else ())}
    return {k: v for k, v in config.items() if k not in free}


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
    from fedul_flwr.data.datasets import DATASETS
    from fedul_flwr.data.image_dataset import DatasetError

    try:
        DATASETS.get(cfg.dataset)  # a name, or a registered prefix (hf:...)
    except DatasetError as exc:
        raise ConfigError(f"dataset={cfg.dataset!r}: {exc}") from None
    for key, allowed in registry_choices().items():
        if key == "method" and ":" in d[key]:
            continue  # an import path "module:Class", checked when imported below
        if key == "dataset":
            continue  # checked above, by the registry itself
        _check(d[key] in allowed, f"{key}={d[key]!r} is not one of {allowed}{closest(d[key], allowed)}")
    from fedul_flwr.methods import get_method

    try:
        method = get_method(cfg.method)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    method.check_options(cfg)
    if cfg.test_prior:  # () is uniform
        classes = len(_dataset_facts(cfg).class_names)
        _check(
            len(cfg.test_prior) == classes,
            f"test-prior={','.join(f'{v:g}' for v in cfg.test_prior)!r}: expected {classes} values (the classes of "
            f"dataset={cfg.dataset!r}), got {len(cfg.test_prior)}",
        )
    check_aggregation_contract(cfg)
    from fedul_flwr.privacy.accounting import check_numbers

    try:
        check_numbers(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _check(
        cfg.local_optimizer_state == "fresh" or cfg.differential_privacy == "none",
        f"local-optimizer-state='kept' with differential-privacy={cfg.differential_privacy!r}: the kept state "
        "travels to the server un-noised (it carries the client's gradients); use local-optimizer-state='fresh'",
    )
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


def aggregation_contract(cfg: RunConfig) -> Any:
    """The run's method's aggregation contract (:mod:`fedul_flwr.strategies.contract`): the
    ``contract`` of its aggregation mixin (``Method.aggregation()``), ``None`` when it has none
    (the strategy aggregates as it is), :data:`~fedul_flwr.strategies.contract.MISSING_CONTRACT`
    when the mixin declares none."""
    from fedul_flwr.methods import get_method
    from fedul_flwr.strategies.contract import MISSING_CONTRACT

    mixin = get_method(cfg.method)(cfg).aggregation()
    return None if mixin is None else getattr(mixin, "contract", MISSING_CONTRACT)


def check_aggregation_contract(cfg: RunConfig) -> None:
    """``differential-privacy``, ``dp-noise-multiplier`` and ``aggregation-weights`` against how
    the run's strategy and method combine the replies and what they send
    (:func:`fedul_flwr.strategies.contract.dp_refusal`).

    Raises
    ------
    ConfigError
        In one line naming the keys, their values and why the combination is refused.
    """
    from fedul_flwr.strategies.contract import dp_refusal

    why = dp_refusal(cfg.differential_privacy, cfg.aggregation_weights, cfg.strategy, cfg.method,
                     aggregation_contract(cfg), cfg.dp_noise_multiplier, cfg.as_dict())  # fmt: skip
    _check(why is None, str(why))


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
    num_classes = len(_dataset_facts(cfg).class_names)
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


def laid_out_clients(cfg: RunConfig) -> tuple[str, int] | None:
    """The key whose value lays out the simulated clients one by one, and how many clients it
    lays out: HASSLE's ``label-layout`` (a named layout of the paper: 20; a list: its length)
    with ``client-setting=annotation-heterogeneity``. ``None`` when the settings fit any
    number of clients.

    Raises
    ------
    ConfigError
        If the layout cannot be read (an unknown name or kind, a named layout without a
        version for ``labeled-share``).
    """
    if cfg.client_setting != "annotation-heterogeneity":
        return None
    from fedul_flwr.data.annotation import parse_layout

    try:
        return "label-layout", len(parse_layout(cfg.label_layout, None, cfg.labeled_share))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_node_counts(cfg: RunConfig, num_nodes: int) -> None:
    """A simulation's ``min-available-nodes`` (and so ``min-train-nodes``, at most it) against
    its ``num_nodes`` nodes (``num-supernodes``): Flower waits without a time limit for
    ``min-available-nodes`` nodes to connect, and a simulation never gets more than it has. (A
    deployment's node count is unknown: there the run waits, as Flower does.)

    Raises
    ------
    ConfigError
        In one line naming the key, its value and the federation's size.
    """
    _check(cfg.min_available_nodes <= num_nodes,
           f"min-available-nodes={cfg.min_available_nodes} with a simulated federation of {num_nodes} nodes "
           f"(num-supernodes={num_nodes}): the run would wait forever for nodes that never connect; give "
           f"min-available-nodes <= {num_nodes} (min-train-nodes <= it), or "
           f'--federation-config "num-supernodes={cfg.min_available_nodes}"')  # fmt: skip


def check_federation_size(cfg: RunConfig, num_nodes: int) -> None:
    """A simulation's settings against its number of nodes (``num-supernodes``): a client
    layout (:func:`laid_out_clients`) lays out exactly ``num_nodes`` clients, and with
    ``client-setting=pu`` a ``positive-classes`` given per client has one entry per node.

    Raises
    ------
    ConfigError
        In one line naming the key, its value, the count it needs and the federation's.
    """
    laid_out = laid_out_clients(cfg)
    if laid_out is not None and laid_out[1] != num_nodes:
        key, needed = laid_out
        preset = f" (preset={cfg.preset!r})" if cfg.preset else ""
        raise ConfigError(
            f"{key}={cfg.as_dict()[key]!r}{preset} lays out {needed} clients, the federation has {num_nodes} nodes: "
            f'run it with --federation-config "num-supernodes={needed}", or give {key} for {num_nodes} clients'
        )
    if cfg.client_setting == "pu":
        from fedul_flwr.data.pu import parse_positive_classes

        try:
            names = _dataset_facts(cfg).class_names
            parse_positive_classes(cfg.positive_classes, num_nodes, len(names), class_names=names)
        except ValueError as exc:
            raise ConfigError(f"{exc} (the federation has {num_nodes} nodes)") from None
    if cfg.client_setting == "annotation-heterogeneity":
        check_dataset(cfg)  # the layout is checked on the partition of the (checked) dataset
        check_label_layout(cfg, num_nodes)


def check_label_layout(cfg: RunConfig, num_nodes: int) -> None:
    """HASSLE's clients (``client-setting=annotation-heterogeneity``) as the partition of the
    run's dataset into ``num_nodes`` clients gives them: some client holds labels, the
    partially labeled clients' fraction solves to a value in (0, 1), and each of them gets at
    least one labeled and one unlabeled image (:func:`fedul_flwr.data.annotation.label_fractions`; a fraction is
    rounded to whole images as :func:`~fedul_flwr.data.annotation.labeled_rows` rounds it).
    Loads the dataset (cached).

    Raises
    ------
    ConfigError
        In one line naming ``label-layout`` and ``labeled-share``, the client and its counts.
    """
    from fedul_flwr.data.annotation import parse_layout
    from fedul_flwr.data.simulated import client_label_fractions, client_rows

    try:
        fractions = client_label_fractions(cfg, num_nodes)
    except ValueError as exc:
        raise ConfigError(f"label-layout={cfg.label_layout!r}: {exc}") from None
    kinds = parse_layout(cfg.label_layout, num_nodes, cfg.labeled_share)
    _check(any(f > 0 for f in fractions), f"label-layout={cfg.label_layout!r} with labeled-share={cfg.labeled_share}: "
           "no client holds a labeled image; a semi-supervised federation needs labels somewhere")  # fmt: skip
    for k, (kind, fraction) in enumerate(zip(kinds, fractions, strict=True)):
        n = len(client_rows(cfg, k, num_nodes)[0])
        labeled = int(round(fraction * n))
        partial = kind == "P" or (isinstance(kind, float) and 0.0 < kind < 1.0)
        _check(
            not partial or 0 < labeled < n,
            f"label-layout={cfg.label_layout!r} with labeled-share={cfg.labeled_share}: partially labeled client {k} "
            f"holds {n} images and would label {labeled} of them (fraction {fraction:.3f}); it needs at least one "
            "labeled and one unlabeled image",
        )


def check_clients(cfg: RunConfig, num_nodes: int) -> None:
    """Every simulated client of a federation of ``num_nodes`` built as its node will build it
    (:func:`fedul_flwr.data.simulated.load_client`, cached per process), so what the
    partition and ``client-setting`` cannot make of the dataset -- more U sets than a
    client's images, more labels than a class holds -- is refused before round 1 instead of
    failing every client in it. Needs the checked dataset (:func:`check_dataset`).

    Raises
    ------
    ConfigError
        In one line naming the client and the cause.
    """
    from fedul_flwr.data.simulated import load_client
    from fedul_flwr.methods import get_method

    method = get_method(cfg.method)
    wanted = frozenset(method.requires) | frozenset(getattr(method, "uses", ()))
    for i in range(num_nodes):
        try:
            load_client(cfg, i, num_nodes, wanted)
        except ValueError as exc:
            raise ConfigError(f"client {i} of {num_nodes} (client-setting={cfg.client_setting!r}): {exc}") from None


def _dataset_facts(cfg: RunConfig) -> Any:
    """The run's :class:`~fedul_flwr.data.datasets.DatasetInfo` (a refusal as a ConfigError)."""
    from fedul_flwr.data.datasets import run_dataset_info
    from fedul_flwr.data.image_dataset import DatasetError

    try:
        return run_dataset_info(cfg.as_dict())
    except DatasetError as exc:
        raise ConfigError(str(exc)) from None


def check_dataset(cfg: RunConfig) -> int:
    """Every image of the run's dataset, decoded and checked once (cached per process: the
    run then uses the same tensors), and the method's models against its image size: an
    unreadable or truncated file, an image of another size, one class only, an empty class,
    images smaller than a model accepts (:func:`fedul_flwr.models.check_input_size`).

    Returns
    -------
    int
        The number of images read (training and test split).

    Raises
    ------
    ConfigError
        In one line naming the file, row or key and the cause.
    """
    from fedul_flwr.data.datasets import run_dataset
    from fedul_flwr.data.image_dataset import DatasetError
    from fedul_flwr.methods import get_method
    from fedul_flwr.models import check_input_size

    try:
        data = run_dataset(cfg.as_dict())
    except DatasetError as exc:
        raise ConfigError(str(exc) if "dataset=" in str(exc) else f"dataset={cfg.dataset!r}: {exc}") from None
    for spec in get_method(cfg.method)(cfg).model_specs():
        try:
            check_input_size(spec.arch or cfg.model, data.image_size)
        except ValueError as exc:
            raise ConfigError(f"dataset={cfg.dataset!r}: {exc}") from None
    return len(data.train_y) + len(data.test_y)


def federation_nodes(grid: object, settle: float = 1.0, timeout: float = 60.0) -> int:
    """The number of nodes of a simulated federation (``num-supernodes``). Flower's
    simulation engine registers its nodes while the ServerApp starts: the count is read
    until it has not changed for ``settle`` seconds (at most ``timeout`` seconds); any other
    grid's count is read once."""
    from flwr.superlink.grid import InMemoryGrid

    count = len(list(grid.get_node_ids()))  # type: ignore[attr-defined]
    if not isinstance(grid, InMemoryGrid):
        return count
    deadline = time.monotonic() + timeout
    since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = len(list(grid.get_node_ids()))
        if now != count or now == 0:
            count, since = now, time.monotonic()
        elif time.monotonic() - since >= settle:
            break
    return count


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

    ``num-rounds`` may differ, and so may every key :func:`run_settings` leaves out (the
    :data:`OUTPUT_KEYS`, the :data:`SCHEDULE_KEYS`, the options of methods other than the run's, ``device`` when both
    runs compute in float32). A key the checkpoint lacks (added to the project after it was
    written) counts as its default.
    """
    before = {**default_config(), **saved}
    now = cfg.as_dict()
    requested = run_settings(now)
    counted = set(requested) | (set(run_settings(before)) & set(now))  # a key either run counts
    return [
        f"{key}: {before.get(key)!r} in the checkpoint, {now[key]!r} now"
        for key in sorted(counted - {"num-rounds"})
        if before.get(key) != now[key]
    ]


def run_finished(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` ended whole: its ``summary.txt`` says ``status=ok``
    (written last, after ``model.pt`` and the plot). Reads only."""
    try:
        return (Path(run_dir) / "summary.txt").read_text(errors="replace").rstrip().endswith(" status=ok")
    except OSError:
        return False


def check_resume(cfg: RunConfig, run_dir: Path) -> Checkpoint:
    """The checkpoint ``resume=true`` continues from, once it is certain the run can go on:
    it exists, its round is below ``num-rounds`` (or at ``num-rounds`` in a run that did not
    end whole, :func:`run_finished`: e.g. a full device after its last checkpoint; the run
    then trains no round and writes its outputs from the checkpoint) and it was written with
    the same settings (:func:`resume_conflicts`). Reads only; nothing is written.

    Raises
    ------
    CheckpointError
        If ``run_dir`` holds no readable checkpoint.
    ConfigError
        If the run is already at ``num-rounds`` and ended whole, or naming every differing
        key with both values.
    """
    ckpt = load_checkpoint(run_dir)
    _check(
        ckpt.round < cfg.num_rounds or (ckpt.round == cfg.num_rounds and not run_finished(run_dir)),
        f"resume=true: {run_dir} has finished round {ckpt.round} and num-rounds={cfg.num_rounds}; nothing to resume "
        "(set num-rounds higher to continue it)",
    )
    conflicts = resume_conflicts(ckpt.config, cfg)
    _check(
        not conflicts,
        f"resume=true: {run_dir} was run with other settings; only {RESUME_FREE_KEYS + SCHEDULE_KEYS} (and device, "
        f"with precision={DEVICE_FREE_PRECISION!r}) may change on resume: "
        + "; ".join(conflicts),
    )
    return ckpt


def check_resumed_federation(cfg: RunConfig, ckpt: Checkpoint, simulated: bool, num_nodes: int) -> None:
    """What a resume must share with the run it continues beyond the settings, once the
    federation's nodes are known. With ``local-optimizer-state = "kept"`` in simulation the
    clients' states are keyed by partition id, and another ``num-supernodes`` partitions the
    data otherwise: the states would go to clients holding other images, so the resume is
    refused (a deployment's node keys come from its nodes' folders and stay theirs). A
    schedule over ``num-rounds`` (``lr-schedule`` other than ``exponential``) that the resume
    stretches to more rounds is logged: rounds after the checkpoint follow the new length.

    Raises
    ------
    CheckpointError
        Naming both node counts.
    """
    if cfg.local_optimizer_state == "kept" and simulated and ckpt.num_nodes not in (None, num_nodes):
        raise CheckpointError(
            f"resume=true with local-optimizer-state='kept': the run had {ckpt.num_nodes} simulated nodes, this "
            f"federation has {num_nodes}; another num-supernodes partitions the data otherwise and the clients' "
            "optimizer states would go to clients holding other images"
        )
    before = int(ckpt.config.get("num-rounds", cfg.num_rounds))
    if cfg.lr_schedule != "exponential" and before != cfg.num_rounds:
        from fedul_flwr import get_logger

        get_logger(__name__).warning(
            "resume=true: lr-schedule=%r ran rounds 1-%d as a schedule over num-rounds=%d; rounds %d-%d follow it over "
            "num-rounds=%d", cfg.lr_schedule, ckpt.round, before, ckpt.round + 1, cfg.num_rounds, cfg.num_rounds,
        )  # fmt: skip


def check_before_round_one(cfg: RunConfig, grid: object) -> None:
    """The checks of the settings that need no node's data, run by the ServerApp before
    anything is written: :func:`validate_config`, :func:`check_dataset` (every image of the
    run's dataset, which the server evaluates on), and when ``grid`` simulates its clients
    :func:`check_clients` (every client built as its node will build it),
    (:func:`is_simulation`) :func:`check_simulation`, :func:`check_node_counts` and, for settings that lay out their
    clients one by one, :func:`check_federation_size` against the grid's nodes. (With
    ``resume=true`` the ServerApp then runs :func:`check_resume` on the run folder.)

    Raises
    ------
    ConfigError
        Naming the key(s) and value(s).
    """
    validate_config(cfg)
    if is_simulation(grid):
        check_simulation(cfg)
        num_nodes = federation_nodes(grid)
        check_node_counts(cfg, num_nodes)
        if laid_out_clients(cfg) is not None or cfg.client_setting == "pu":
            check_federation_size(cfg, num_nodes)
    check_dataset(cfg)
    if is_simulation(grid):
        check_clients(cfg, num_nodes)


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
    parser.add_argument(
        "--federation-config", default="", metavar="'num-supernodes=N'",
        help="the simulation's --federation-config as `flwr run` takes it: its num-supernodes is checked "
             "against a layout of the clients (label-layout, positive-classes per client)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Resolve and check the settings; print the resolved run in one line (exit 0) or the
    first problem in one line (exit 1)."""
    from flwr.common.config import parse_config_args

    try:
        values = parse_config_args(args.run_config) if args.run_config else {}
        composed, sources = compose_config(values)
        cfg = validate_config(config_from_values(composed))
        note, num_nodes = "", None
        if args.simulation:
            check_simulation(cfg)
            num_nodes = _num_supernodes(args.federation_config)
            if num_nodes is not None:
                check_node_counts(cfg, num_nodes)
                check_federation_size(cfg, num_nodes)
            elif (laid_out := laid_out_clients(cfg)) is not None:
                if cfg.client_setting == "annotation-heterogeneity":
                    check_label_layout(cfg, laid_out[1])
                note += f" (needs a federation of {laid_out[1]} nodes: {laid_out[0]}={cfg.as_dict()[laid_out[0]]!r})"
        started = time.monotonic()
        images = check_dataset(cfg)
        read = f"; read {images} images of dataset={cfg.dataset!r} in {time.monotonic() - started:.1f}s"
        if args.simulation:
            laid_out = laid_out_clients(cfg)
            clients = num_nodes if num_nodes is not None else None if laid_out is None else laid_out[1]
            if clients is not None:
                check_clients(cfg, clients)
                read += f", built its {clients} simulated clients"
        note = read + note
        from fedul_flwr.outputs import check_unused, run_folder

        if cfg.resume:
            check_resume(cfg, run_folder(cfg))
        else:
            check_unused(cfg)
    except (ConfigError, CheckpointError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"ok: {describe_sources(composed, sources)}{note}")
    return 0


def _num_supernodes(federation_config: str) -> int | None:
    """``num-supernodes`` of a ``--federation-config`` string (``None`` if not given).

    Raises
    ------
    ConfigError
        If it is not an integer >= 1.
    """
    from flwr.common.config import parse_config_args

    if not federation_config.strip():
        return None
    try:
        value = parse_config_args([federation_config]).get("num-supernodes")
    except ValueError as exc:
        raise ConfigError(f"--federation-config {federation_config!r}: {exc}") from None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"--federation-config: num-supernodes={value!r} must be an integer >= 1")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m fedul_flwr.preflight``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="fedul check", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
