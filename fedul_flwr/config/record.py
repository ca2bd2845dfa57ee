"""The run configuration as a record: :class:`RunConfig` (one field per general key, the
method's own keys in ``extra``), the error every configuration check raises
(:class:`ConfigError`), and the parsers of single values (booleans and numbers typed as text,
comma lists, the test prior)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CORE_KEYS", "ConfigError", "RunConfig", "coerce_value", "parse_positive_ints", "parse_test_prior",
           "test_prior_values"]


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
    server_data_dir: str
    server_epochs: int
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
        epochs = parse_positive_ints("local-epochs-per-client", self.local_epochs_per_client, allow_empty=True)
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


CORE_KEYS: tuple[str, ...] = tuple(f.name.replace("_", "-") for f in dataclasses.fields(RunConfig) if f.name != "extra")
"""The general keys: the fields of :class:`RunConfig` (the keys a method owns are in ``extra``)."""


def parse_positive_ints(key: str, value: Any, allow_empty: bool = False) -> tuple[int, ...]:
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
    """``value`` as ``kind`` (bool / int / float / str; ``"true"`` / ``"false"`` for bool, and a
    bool given to a str key becomes that text: ``--run-config`` parses ``key=true`` as TOML; a
    bool is never an int or a float).

    Raises
    ------
    ConfigError
        Naming ``key`` and ``value`` (a bool as ``true`` / ``false``) when it is not a valid
        ``kind`` (a bool for an int or float key among them), or is a float that is not finite (NaN or infinite: no key means anything by them).
    """
    shown = ("true" if value else "false") if isinstance(value, bool) else repr(value)  # as TOML wrote it
    try:
        if kind in (int, float) and isinstance(value, bool):  # float(True) is 1.0: never a number the user meant
            raise ValueError
        if kind is bool:
            if isinstance(value, str):
                if value.lower() not in ("true", "false"):
                    raise ValueError
                return value.lower() == "true"
            return bool(value)
        if kind is int:
            if float(value) != int(value):
                raise ValueError
            return int(value)
        if kind is float:
            number = float(value)
        elif isinstance(value, bool):  # TOML's true / false, as the user typed it (not 'True')
            return "true" if value else "false"
        else:
            return str(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConfigError(f"{key}={shown} is not a valid {kind.__name__}") from exc
    if not math.isfinite(number):
        raise ConfigError(f"{key}={value!r} is not a finite number")
    return number


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
                    f"test-prior={spec!r}: {tok!r} is not a number; "
                    "use 'uniform' or one probability per class, comma-separated"
                ) from None
    elif isinstance(spec, (int, float, np.floating, np.integer)):
        values = [float(spec)]
    else:
        values = [float(v) for v in spec]
    arr = np.asarray(values, dtype=np.float64)
    if arr.size != num_classes:
        raise ValueError(
            f"test-prior={spec!r}: expected {num_classes} values (one per class), got {arr.size}"
        )
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"test-prior={spec!r}: entries must be finite")
    if np.any(arr <= 0):
        k = int(np.flatnonzero(arr <= 0)[0])
        raise ValueError(f"test-prior={spec!r}: entry {k} = {arr[k]:g} must be > 0")
    if abs(arr.sum() - 1.0) > 1e-6:
        raise ValueError(f"test-prior={spec!r}: entries sum to {arr.sum():.8g}, not 1")
    return arr / arr.sum()


def test_prior_values(value: Any) -> tuple[float, ...]:
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
        raise ConfigError(str(exc)) from exc  # the message names test-prior and its value
