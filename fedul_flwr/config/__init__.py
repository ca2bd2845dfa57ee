"""One composed, validated run configuration.

Every key is declared once, with its default and meaning: the general keys in
:mod:`fedul_flwr.config.keys`, a method's own keys in its folder
(``fedul_flwr/methods/<name>/settings.py``). ``scripts/config_reference.py`` generates
``[tool.flwr.app.config]`` of ``pyproject.toml`` and ``docs/configuration.md`` from them.

Sources of a run's values, lowest precedence first (:mod:`fedul_flwr.config.presets`): the
defaults of ``[tool.flwr.app.config]``, the preset (a method's
``fedul_flwr/methods/<name>/presets/<preset>.yaml`` or ``conf/experiment/<preset>.yaml``,
composed with Hydra), and the values the user typed (``flwr run . --run-config "key=value
..."``).

A value the user typed always wins, also when it equals the default: Flower hands the app
the defaults already merged with the user's values (``context.run_config``), so the
ServerApp tells them apart with the run's ``override_config`` (what was typed, kept by the
SuperLink) and passes those keys as ``given``. The server resolves the configuration once,
at the start, logs which keys came from the preset and which from the user, and sends the
resolved settings to the clients in every message (:data:`fedul_flwr.wire.RUN_CONFIG`), so
every node runs with exactly the server's values.

Keys are of two kinds. *General* keys (data path, federation, strategy, outputs) are fields of
:class:`RunConfig`. A *method's own options* (FedPL's threshold, FedUL's loss, ...) are
declared and validated by the method (``Method.options``); :class:`RunConfig` carries their
values in :attr:`RunConfig.extra`.

This package checks what the settings alone can tell (types, ranges, rules between keys, the
run folder's name) and knows none of the registries: the modules that implement methods,
strategies and client settings import it. The checks that need them (choice lists, a method's
options, a method against the client setting, ...) are in :mod:`fedul_flwr.preflight`, above
both; :func:`fedul_flwr.preflight.resolve_config` composes and checks a configuration fully.

Modules: :mod:`~fedul_flwr.config.record` (the record and the value parsers),
:mod:`~fedul_flwr.config.keys` (the declarations), :mod:`~fedul_flwr.config.presets`
(defaults, presets, composition), :mod:`~fedul_flwr.config.validate` (parse and check),
:mod:`~fedul_flwr.config.command_line` (the ``--run-config`` text of the command line).
"""

from __future__ import annotations

from fedul_flwr.config.record import (
    CORE_KEYS,
    ConfigError,
    RunConfig,
    coerce_value,
    parse_positive_ints,
    parse_test_prior,
    test_prior_values,
)
from fedul_flwr.config.keys import CHOICES, CORE_OPTIONS, Option
from fedul_flwr.config.presets import (
    CONF_DIR,
    METHODS_DIR,
    PROJECT_DIR,
    PYPROJECT,
    SERVER_DP,
    check_keys,
    compose_config,
    default_config,
    describe_sources,
    load_preset,
    preset_files,
    server_dp_weights,
)
from fedul_flwr.config.validate import (
    check_robust_replies,
    check_run_name,
    check_values,
    config_from_json,
    config_from_values,
    resolve_path,
)

__all__ = [
    "CHOICES", "CONF_DIR", "CORE_KEYS", "CORE_OPTIONS", "METHODS_DIR", "PROJECT_DIR", "PYPROJECT", "SERVER_DP",
    "ConfigError", "Option", "RunConfig", "check_keys", "check_robust_replies", "check_run_name", "check_values", "coerce_value", "resolve_path",
    "compose_config", "config_from_json", "config_from_values", "default_config", "describe_sources", "load_preset",
    "parse_positive_ints", "parse_test_prior", "preset_files", "server_dp_weights", "test_prior_values",
]  # fmt: skip
