"""Where the defaults and the presets are, and how they compose with what the user typed.

Sources, lowest precedence first:

1. ``[tool.flwr.app.config]`` in ``pyproject.toml`` -- the defaults of every key, generated
   from the keys' declarations (:mod:`fedul_flwr.config.keys`, the methods' ``settings.py``)
   by ``scripts/config_reference.py``; Flower reads the same table (and rejects a
   ``--run-config`` key it lacks);
2. the preset: ``fedul_flwr/methods/<method>/presets/<preset>.yaml`` (a method's own presets)
   or ``conf/experiment/<preset>.yaml`` (presets of no one method), composed with Hydra (a
   preset may start from another through its defaults list) -- holds only the values it
   changes;
3. the values the user typed (``flwr run . --run-config "key=value ..."``).
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedul_flwr.config.record import ConfigError, coerce_value
from fedul_flwr.registry import closest

__all__ = ["CONF_DIR", "METHODS_DIR", "PROJECT_DIR", "PYPROJECT", "SERVER_DP", "check_keys", "compose_config",
           "default_config", "describe_sources", "load_preset", "preset_files", "server_dp_weights"]  # fmt: skip

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
PROJECT_DIR = (
    _PACKAGE_DIR.parent if (_PACKAGE_DIR.parent / "pyproject.toml").is_file() else _PACKAGE_DIR / "_project"
)
"""Where ``pyproject.toml`` (the defaults) and ``conf/`` (the presets of no one method) are: the
source tree (a checkout, an editable install, a Flower app bundle), else the copy an installed
wheel carries inside the package."""
CONF_DIR = PROJECT_DIR / "conf"
PYPROJECT = PROJECT_DIR / "pyproject.toml"
METHODS_DIR = _PACKAGE_DIR / "methods"
"""The method folders; a method's presets are ``<its folder>/presets/*.yaml``."""

SERVER_DP = "server-side DP"
"""The source :func:`compose_config` names for ``aggregation-weights='uniform'`` when it sets it
because of ``differential-privacy=server-*`` (not typed by the user)."""


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


def preset_files() -> dict[str, Path]:
    """Every preset by name: ``conf/experiment/*.yaml`` and ``fedul_flwr/methods/*/presets/*.yaml``.

    Raises
    ------
    ConfigError
        If two files define the same name (naming both: ``preset=`` could not tell them apart).
    """
    found: dict[str, Path] = {}
    for path in [*sorted((CONF_DIR / "experiment").glob("*.yaml")), *sorted(METHODS_DIR.glob("*/presets/*.yaml"))]:
        if path.stem in found:
            raise ConfigError(f"preset {path.stem!r} is defined twice: {found[path.stem]} and {path}; rename one")
        found[path.stem] = path
    return found


def _quoted(text: str) -> str:
    """``text`` as a quoted string of Hydra's override grammar."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def load_preset(name: str) -> dict[str, Any]:
    """Compose preset ``name`` (:func:`preset_files`) with Hydra and return its flat values.

    The preset is the primary config; every other preset folder is on Hydra's search path,
    so a preset's defaults list may name a preset of any folder.

    Raises
    ------
    ConfigError
        If no preset has that name (lists the available ones), a name is defined twice, or
        the preset sets an unknown key.
    """
    if not name:
        return {}
    # deferred: import cost (Hydra and OmegaConf, 0.2-1 s); every ClientApp start imports this
    # package, only composing a preset needs them
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    files = preset_files()
    if name not in files:
        raise ConfigError(f"preset={name!r}: no such preset{closest(name, files)}; available: {sorted(files)}")
    path = files[name]
    others = sorted({str(p.parent) for p in files.values()} - {str(path.parent)})
    search = "hydra.searchpath=[" + ",".join(_quoted(f"file://{folder}") for folder in others) + "]"
    try:
        with initialize_config_dir(version_base=None, config_dir=str(path.parent), job_name="fedul"):
            composed = compose(config_name=name, overrides=[search])
    except HydraException as exc:
        raise ConfigError(f"preset={name!r} ({path}): {exc}") from exc
    values = OmegaConf.to_container(composed, resolve=True)
    assert isinstance(values, dict)
    unknown = sorted(set(values) - set(default_config()))
    if unknown:
        raise ConfigError(
            f"{path} sets unknown key(s) {unknown}; known keys are those of [tool.flwr.app.config] in {PYPROJECT}"
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
    values = {k: _typed(k, v, defaults[k]) for k, v in {**defaults, **preset, **user}.items()}
    sources = {k: "user" if k in user else "preset" if k in preset else "default" for k in values}
    server_dp_weights(values, sources)
    return values, sources


def _typed(key: str, value: Any, default: Any) -> Any:
    """``value`` typed like the key's default (:func:`~fedul_flwr.config.record.coerce_value`),
    so every check, warning and echo sees what the run will read: ``positive-classes=3`` is
    ``'3'``, ``mixmatch-unlabeled-clients=true`` is ``'true'``, ``lr=1`` is ``1.0``, and
    ``lr=true`` is refused. A list for a text key (``test-prior=[...]``) and ``num-sets`` (a
    number or a comma list) are left to their own parsers.

    Raises
    ------
    ConfigError
        Naming the key and the value, as :func:`~fedul_flwr.config.record.coerce_value`.
    """
    if key == "num-sets" or (isinstance(default, str) and not isinstance(value, (bool, int, float))):
        return value
    return coerce_value(key, value, type(default))


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
        Naming each unknown key with the closest valid key, and where every valid key is listed.
    """
    defaults = default_config()
    unknown = sorted(set(keys) - set(defaults))
    if unknown:
        named = ", ".join(f"{k!r}{closest(k, defaults)}" for k in unknown)
        raise ConfigError(f"unknown run-config key(s) {named}; the {len(defaults)} valid keys are the table "
                          "[tool.flwr.app.config] of pyproject.toml, each explained in docs/configuration.md")


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
