"""The compute profiles of ``fedul reproduce`` (``--profile cpu`` / ``paper``), read from
``conf/grids/profiles/<name>.yaml``, and the complete run config of a grid's run under one
(:func:`run_config_of`).

- ``cpu``: LeNet (``small-cnn``), 8 rounds, Adam lr 1e-3, B = 128, E = 1, one seed,
  ``precision=fp32`` (``auto`` would pick bfloat16 on CPUs with AVX512-BF16 or AMX and float32
  elsewhere, so the same run would give other numbers on another machine).
- ``paper``: the FedUL paper's CNN (``paper-cnn``, Table D.2; ResNet-18 on CIFAR-10, Table
  D.3), 100 rounds, Adam lr 1e-4, B = 128, E = 1, L1 weight by M from Table D.4, seeds 0, 1, 2;
  for a GPU (``device=auto``).

Presets of another method's protocol (FedPU, FedDB, HASSLE, FixMatch) get their own values
(``by-preset``, ``preset-first``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fedul_flwr import get_logger
from fedul_flwr.config import CONF_DIR, default_config, load_preset, server_dp_weights
from fedul_flwr.experiments.grids import GridError
from fedul_flwr.experiments.records import RunSpec

__all__ = ["PROFILES", "PROFILES_DIR", "Profile", "read_profile", "run_config_of"]


@dataclass(frozen=True)
class Profile:
    """Compute settings shared by every run of a grid (see the module doc).

    Attributes
    ----------
    overrides : dict
        Run-config values of every run.
    seeds : tuple of int
        The seeds of a grid that names none.
    l1_by_sets : dict
        Dataset (``"*"``: any other) -> number of sets -> L1 weight (FedUL, App. D, Table D.4).
    by_dataset : dict
        Dataset -> extra overrides (e.g. the CIFAR-10 model).
    by_preset : dict
        Preset -> extra overrides, applied after the others (another method's protocol).
    preset_first : tuple of str
        Presets whose own values beat this profile's overrides (a protocol of another method,
        complete in its preset).
    """

    overrides: dict[str, Any]
    seeds: tuple[int, ...]
    l1_by_sets: dict[str, dict[str, float]] = field(default_factory=dict)
    by_dataset: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_preset: dict[str, dict[str, Any]] = field(default_factory=dict)
    preset_first: tuple[str, ...] = ()


PROFILES_DIR = CONF_DIR / "grids" / "profiles"
"""Where the profiles' files are (``<name>.yaml``)."""


def read_profile(path: Path) -> Profile:
    """The profile of file ``path`` (keys ``overrides``, ``seeds``, ``l1-by-sets``,
    ``by-dataset``, ``by-preset``, ``preset-first``: the attributes of :class:`Profile`).

    Raises
    ------
    GridError
        If it is not YAML or holds another key.
    """
    try:
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except (OSError, OmegaConfBaseException, ValueError, yaml.YAMLError) as exc:
        raise GridError(f"{path}: cannot read it as YAML: {' '.join(str(exc).split())[:200]}") from exc
    keys = {"overrides", "seeds", "l1-by-sets", "by-dataset", "by-preset", "preset-first"}
    if not isinstance(raw, dict) or set(raw) - keys:
        raise GridError(f"{path}: a profile is a mapping of {sorted(keys)}")
    nested = {k: {str(a): dict(b) for a, b in raw.get(k, {}).items()} for k in ("l1-by-sets", "by-dataset", "by-preset")}
    nested["l1-by-sets"] = {d: {str(m): float(w) for m, w in t.items()} for d, t in nested["l1-by-sets"].items()}
    return Profile(dict(raw.get("overrides", {})), tuple(raw.get("seeds", (0,))), nested["l1-by-sets"],
                   nested["by-dataset"], nested["by-preset"], tuple(raw.get("preset-first", ())))  # fmt: skip


PROFILES = {path.stem: read_profile(path) for path in sorted(PROFILES_DIR.glob("*.yaml"))}
"""The profiles by name (``--profile``)."""


def run_config_of(spec: RunSpec, profile: Profile, data_dir: str, out_dir: Path, user: Mapping[str, Any]) -> dict[str, Any]:
    """The complete dashed-key run config of ``spec``: defaults < preset < profile < spec <
    ``--set`` values (``user``). The preset is expanded here (and ``preset`` left empty) so
    that a value equal to its default still beats the preset (see
    :func:`fedul_flwr.config.compose_config`); the run writes under ``<out_dir>/runs/<run id>``."""
    values: dict[str, Any] = {**default_config(), **load_preset(spec.preset), **profile.overrides}
    dataset = str(spec.overrides.get("dataset", values["dataset"]))
    values.update(profile.by_dataset.get(dataset, {}))
    l1 = profile.l1_by_sets.get(dataset, profile.l1_by_sets.get("*", {}))
    if l1:  # Table D.4 has 10 / 20 / 30 sets; 40 takes the 30 column
        values["l1-weight"] = l1.get(str(spec.overrides.get("num-sets", values["num-sets"])).split(",")[0], 0.0)
    if spec.preset in profile.preset_first:
        values.update(load_preset(spec.preset))
    values.update(profile.by_preset.get(spec.preset, {}))
    values.update(spec.overrides)
    values.update({"seed": spec.seed, "preset": "", "output-dir": str(out_dir / "runs"), "run-name": spec.run_id})
    if data_dir:
        values["data-dir"] = data_dir
    values.update(user)
    # --set differential-privacy=server-* on a grid that pins num-examples weights: what flwr run does
    if server_dp_weights(values, {k: "user" if k in user else "grid" for k in values}):
        get_logger(__name__).warning("run %s: set for server-side DP (its noise assumes equal client weights): "
                                     "aggregation-weights='uniform' (the grid's value was not typed)", spec.run_id)  # fmt: skip
    return values
