"""Every check of a run's settings that needs no node's data, run before round 1 and before any
run folder exists (``fedul check``: :mod:`fedul_flwr.check_cli`).

:mod:`fedul_flwr.config` checks what the settings alone can tell and knows no registry (the
modules that implement methods, strategies and client settings import it). This module sits
above both and adds what needs the registries:

- every key chosen by name is one of its registry's names (the closest one is suggested);
- the method's own options (``Method.options``);
- ``resume=true`` only with a strategy whose whole state a server checkpoint holds, and
  (:func:`fedul_flwr.resume.check_resume`) only from a checkpoint of the same settings:
  ``num-rounds``, the :data:`~fedul_flwr.resume.OUTPUT_KEYS` and, in float32, ``device`` may
  differ, nothing else (:func:`fedul_flwr.resume.run_settings`, the same rule the grid runner's
  records follow);
- in simulation (:func:`check_simulation`), where ``client-setting`` builds the clients'
  data: the method is defined for that setting (:func:`method_settings`), every client gets
  ``num-sets`` >= K U sets (Lu et al., ICLR 2022, Theorem 1), a given ``class-prior`` is
  finite and not all zero, and a client layout that names one entry per client (HASSLE's
  ``label-layout``, FedPU's ``positive-classes`` per client) has one per node of the
  federation (:func:`check_federation_size`).

The ServerApp runs :func:`check_before_round_one` first thing, so a refused run ends
``failed`` with one line naming the key and value, and leaves no run folder behind (a rerun
under the same name is not blocked). A deployment's nodes check their own folders
(:mod:`fedul_flwr.data.node_folder.layout`). ``fedul check --run-config "..."`` (:mod:`fedul_flwr.check_cli`) runs the same checks
on the command line, before ``flwr run``: Flower's own error for an unknown key does not name
it, this one names it and the closest valid key; given ``--federation-config
"num-supernodes=N"`` (as ``flwr run`` takes it) it also checks the layouts against N.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from flwr.superlink.grid import InMemoryGrid

from fedul_flwr import get_logger
from fedul_flwr.augment import AUGMENTATIONS
from fedul_flwr.checkpoint import RESUMABLE_STRATEGIES
from fedul_flwr.config import (
    ConfigError,
    RunConfig,
    check_robust_replies,
    compose_config,
    config_from_values,
    default_config,
    describe_sources,
    load_preset,
)
from fedul_flwr.data.annotation import parse_layout
from fedul_flwr.data.client_data import ClientData, MissingPartError
from fedul_flwr.data.node_folder.layout import NodeDataError
from fedul_flwr.data.datasets import DATASETS, run_dataset, run_dataset_info
from fedul_flwr.data.image_dataset import DatasetError
from fedul_flwr.data.partition import PARTITIONS
from fedul_flwr.data.pu import class_prior, parse_positive_classes
from fedul_flwr.data.simulated import (
    SETTINGS,
    SETTING_PARTS,
    client_label_fractions,
    client_rows,
    load_client,
)
from fedul_flwr.data.sources import server_data
from fedul_flwr.data.usets import PRIOR_SCHEMES
from fedul_flwr.methods import METHODS, get_method
from fedul_flwr.models import MODELS, check_input_size
from fedul_flwr.privacy.accounting import check_numbers
from fedul_flwr.registry import closest
from fedul_flwr.strategies import STRATEGIES
from fedul_flwr.strategies.contract import MISSING_CONTRACT, dp_refusal, strategy_refusal

__all__ = [
    "aggregation_contract",
    "check_aggregation_contract",
    "check_before_round_one",
    "check_clients",
    "check_dataset",
    "check_label_layout",
    "check_labels_at_server",
    "check_federation_size",
    "check_setting",
    "check_node_counts",
    "check_simulation",
    "federation_nodes",
    "is_simulation",
    "laid_out_clients",
    "method_settings",
    "registry_choices",
    "resolve_config",
    "unread_options",
    "validate_config",
]


def registry_choices() -> dict[str, tuple[str, ...]]:
    """Valid values of the keys chosen by name, from the registries of the modules that
    implement them."""
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

    try:
        method = get_method(cfg.method)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    method.check_options(cfg)
    plugin = {o.key for o in method.options}
    takers = sorted(n for n in METHODS.names() if "dpl" in {o.key for o in METHODS.get(n).options})
    _check("dpl" in plugin or not dict(cfg.extra).get("dpl"),
           f"dpl=true: method={cfg.method!r} takes no debiased pseudo-labels plug-in; the methods that do: {takers} "
           "(FixMatch with them is method='fixmatch-dpl')")  # fmt: skip
    if cfg.test_prior:  # () is uniform
        classes = len(_dataset_facts(cfg).class_names)
        _check(
            len(cfg.test_prior) == classes,
            f"test-prior={','.join(f'{v:g}' for v in cfg.test_prior)!r}: expected {classes} values (the classes of "
            f"dataset={cfg.dataset!r}), got {len(cfg.test_prior)}",
        )
    check_aggregation_contract(cfg)
    check_robust_replies(cfg)

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


def unread_options(values: Mapping[str, Any], sources: Mapping[str, str]) -> list[str]:
    """The method options the user typed that the run's method does not read (e.g.
    ``hassle-gamma`` with ``method=fedul``), one line each: they change nothing. An option is a
    method's when the method declares it (``Method.options``; FixMatch's options are also
    FedRGD's, SemiFL's and FedDB's). A typed value equal to the preset's (else the default) is
    left out: it changes nothing either way, and a grid hands its runs' whole settings over as
    typed. These are warnings, not refusals: a grid's row may set an option for all its columns,
    of which only some read it. An unknown ``method`` or preset gives none (the checks refuse
    it).

    Parameters
    ----------
    values : Mapping[str, Any]
        The composed settings by dashed key (:func:`fedul_flwr.config.compose_config`).
    sources : Mapping[str, str]
        Where each key's value came from; ``"user"``: typed.

    Returns
    -------
    list[str]
        ``"<key>=<value>: an option of method(s) [...]; method='<m>' does not read it"`` per
        key, sorted by key.
    """
    try:
        read = {o.key for o in get_method(str(values["method"])).options}
        baseline = {**default_config(), **load_preset(str(values.get("preset", "none")))}
    except (ValueError, ConfigError):
        return []
    owners: dict[str, list[str]] = {}
    for name in METHODS.names():
        for option in METHODS.get(name).options:
            owners.setdefault(option.key, []).append(name)
    typed = (k for k, source in sources.items() if source == "user" and k in owners and k not in read)
    return [f"{key}={values.get(key)!r}: an option of method(s) {sorted(owners[key])}; method={values['method']!r} "
            "does not read it" for key in sorted(k for k in typed if values.get(k) != baseline.get(k))]  # fmt: skip


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
    mixin = get_method(cfg.method)(cfg).aggregation()
    return None if mixin is None else getattr(mixin, "contract", MISSING_CONTRACT)


def check_aggregation_contract(cfg: RunConfig) -> None:
    """The run's strategy against the method's aggregation (a strategy the method's contract
    refuses, :func:`fedul_flwr.strategies.contract.strategy_refusal`), then
    ``differential-privacy``, ``dp-noise-multiplier`` and ``aggregation-weights`` against how
    the run's strategy and method combine the replies and what they send
    (:func:`fedul_flwr.strategies.contract.dp_refusal`).

    Raises
    ------
    ConfigError
        In one line naming the keys, their values and why the combination is refused.
    """
    contract = aggregation_contract(cfg)
    why = strategy_refusal(cfg.strategy, cfg.method, contract) or dp_refusal(
        cfg.differential_privacy, cfg.aggregation_weights, cfg.strategy, cfg.method, contract,
        cfg.dp_noise_multiplier, cfg.as_dict())  # fmt: skip
    _check(why is None, str(why))


# --------------------------------------------------------------------------- simulation


def method_settings(method: type) -> tuple[str, ...]:
    """The simulated ``client-setting`` values a method class is defined for: its own
    ``settings`` when it names them, else every setting whose clients hold all the parts in
    its ``requires`` (:data:`fedul_flwr.data.simulated.SETTING_PARTS`)."""
    declared = tuple(getattr(method, "settings", ()) or ())
    if declared:
        return declared
    needed = set(method.requires)
    return tuple(name for name, parts in SETTING_PARTS.items() if needed <= set(parts))


def check_labels_at_server(cfg: RunConfig, simulation: bool) -> ClientData | None:
    """The server's labeled images (:func:`~fedul_flwr.data.sources.server_data`), checked
    against the method before anything is written: a server that holds labels needs a method
    that trains on them, and a deployment of ``client-setting=labels-at-server`` needs
    ``server-data-dir``. Reads the folder (or the dataset); writes nothing.

    Raises
    ------
    ConfigError
        In one line naming the key, the value, the folder or the method.
    """
    if not simulation and cfg.client_setting == "labels-at-server" and not cfg.server_data_dir:
        raise ConfigError("client-setting='labels-at-server' in a deployment: the server reads its labeled images from "
                          "server-data-dir (a node folder with labeled images; docs/deployment.md)")  # fmt: skip
    try:
        server = server_data(cfg, simulation)
    except (NodeDataError, MissingPartError) as exc:
        raise ConfigError(f"server-data-dir={cfg.server_data_dir!r}: {exc}") from None
    _check(server is not None or cfg.server_epochs == 1,
           f"server-epochs={cfg.server_epochs}: the server holds no labeled images to train on (client-setting="
           f"{cfg.client_setting!r}, no server-data-dir); it applies to client-setting='labels-at-server'")  # fmt: skip
    if server is not None and not get_method(cfg.method).trains_on_server:
        trainers = sorted(n for n in METHODS.names() if METHODS.get(n).trains_on_server)
        source = f"server-data-dir={cfg.server_data_dir!r}" if cfg.server_data_dir else "client-setting='labels-at-server'"
        raise ConfigError(f"method={cfg.method!r} with {source}: the method does not train on the server's labeled "
                          f"images; methods that do: {trainers}")  # fmt: skip
    return server


def check_simulation(cfg: RunConfig) -> None:
    """The checks of a simulation, where ``client-setting`` builds every client's data from the
    run's dataset: the method is defined for that setting (:func:`method_settings`), and what
    the setting builds can be built (:func:`check_setting`).

    Raises
    ------
    ConfigError
        Naming the key(s) and value(s).
    """
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
    full column rank); with ``pu`` ``positive-classes`` has one of its forms with classes of the
    dataset (its count per client is checked against the federation by
    :func:`check_federation_size`), and a ``class-prior`` given as numbers is finite and not all
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
    if cfg.client_setting == "pu":  # its form; against the federation's size: check_federation_size
        try:
            parse_positive_classes(cfg.positive_classes, None, num_classes, class_names=_dataset_facts(cfg).class_names)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if cfg.client_setting == "pu" and cfg.class_prior not in ("global", "client"):
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
    method = get_method(cfg.method)
    wanted = frozenset(method.requires) | frozenset(getattr(method, "uses", ()))
    for i in range(num_nodes):
        try:
            load_client(cfg, i, num_nodes, wanted)
        except ValueError as exc:
            raise ConfigError(f"client {i} of {num_nodes} (client-setting={cfg.client_setting!r}): {exc}") from None


def _dataset_facts(cfg: RunConfig) -> Any:
    """The run's :class:`~fedul_flwr.data.image_dataset.DatasetInfo` (a refusal as a ConfigError)."""
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
    return isinstance(grid, InMemoryGrid) or bool(getattr(grid, "simulated", False))


# --------------------------------------------------------------------------- before round 1


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
