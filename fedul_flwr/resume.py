"""What a run may change when it continues, and the checks of ``resume=true``: the settings
that identify a run (:func:`run_settings`: all but the :data:`OUTPUT_KEYS`, the
:data:`SCHEDULE_KEYS`, other methods' options and, in float32, ``device``), which the grid
runner's records follow too; the conflicts between a checkpoint's settings and the run's
(:func:`resume_conflicts`); whether a run folder's run ended whole (:func:`run_finished`); the
checkpoint a resume continues from (:func:`check_resume`) and what it must share with the
federation (:func:`check_resumed_federation`). Every function reads only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedul_flwr import get_logger
from fedul_flwr.checkpoint import Checkpoint, CheckpointError, load_checkpoint
from fedul_flwr.config import ConfigError, RunConfig, default_config
from fedul_flwr.data.client_data import ClientData
from fedul_flwr.methods import METHODS

__all__ = [
    "DEVICE_FREE_PRECISION",
    "OUTPUT_KEYS",
    "RESUME_FREE_KEYS",
    "SCHEDULE_KEYS",
    "check_resume",
    "check_resumed_federation",
    "resume_conflicts",
    "run_finished",
    "run_settings",
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
    method = str(config.get("method", default_config()["method"]))
    own = {o.key for o in METHODS.get(method).options} if method in METHODS else set()
    foreign = {o.key for name in METHODS.names() for o in METHODS.get(name).options} - own
    free = {*OUTPUT_KEYS, *SCHEDULE_KEYS, *foreign, *(("device",) if config.get("precision") == DEVICE_FREE_PRECISION else ())}
    return {k: v for k, v in config.items() if k not in free}



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
    if not (ckpt.round < cfg.num_rounds or (ckpt.round == cfg.num_rounds and not run_finished(run_dir))):
        raise ConfigError(
            f"resume=true: {run_dir} has finished round {ckpt.round} and num-rounds={cfg.num_rounds}; nothing to resume "
            "(set num-rounds higher to continue it)"
        )
    conflicts = resume_conflicts(ckpt.config, cfg)
    if conflicts:
        raise ConfigError(
            f"resume=true: {run_dir} was run with other settings; only {RESUME_FREE_KEYS + SCHEDULE_KEYS} (and device, "
            f"with precision={DEVICE_FREE_PRECISION!r}) may change on resume: "
            + "; ".join(conflicts)
        )
    return ckpt


def server_data_digest(server: ClientData | None) -> str | None:
    """The SHA-256 (hex) of the server's labeled images and labels (``None`` without them): what
    a resume checks the server still holds (:func:`check_resumed_federation`)."""
    if server is None or server.labeled is None:
        return None
    digest = hashlib.sha256()
    for tensor in (server.labeled.x, server.labeled.y):
        array = tensor.detach().cpu().contiguous().numpy()
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def check_resumed_federation(cfg: RunConfig, ckpt: Checkpoint, simulated: bool, num_nodes: int,
                             server_data: str | None = None) -> None:  # fmt: skip
    """What a resume must share with the run it continues beyond the settings, once the
    federation's nodes are known. With ``local-optimizer-state = "kept"`` in simulation the
    clients' states are keyed by partition id, and another ``num-supernodes`` partitions the
    data otherwise: the states would go to clients holding other images, so the resume is
    refused (a deployment's node keys come from its nodes' folders and stay theirs). A
    schedule over ``num-rounds`` (``lr-schedule`` other than ``exponential``) that the resume
    stretches to more rounds is logged: rounds after the checkpoint follow the new length.
    The server's labeled images (``server_data``, :func:`server_data_digest`) must be those
    the run trained on, where its checkpoint names them: a folder whose images or labels
    changed between a stop and a resume would go on training another run.

    Raises
    ------
    CheckpointError
        Naming both node counts, or the server's folder whose images changed.
    """
    if ckpt.server_data is not None and server_data != ckpt.server_data:
        where = f"server-data-dir={cfg.server_data_dir!r}" if cfg.server_data_dir else "the server's labeled pool"
        raise CheckpointError(
            f"resume=true: {where} holds other labeled images than the run trained on (SHA-256 "
            f"{(server_data or 'none')[:12]}... against the checkpoint's {ckpt.server_data[:12]}...); resume with the "
            "images it started with, or start a new run"
        )
    if cfg.local_optimizer_state == "kept" and simulated and ckpt.num_nodes not in (None, num_nodes):
        raise CheckpointError(
            f"resume=true with local-optimizer-state='kept': the run had {ckpt.num_nodes} simulated nodes, this "
            f"federation has {num_nodes}; another num-supernodes partitions the data otherwise and the clients' "
            "optimizer states would go to clients holding other images"
        )
    before = int(ckpt.config.get("num-rounds", cfg.num_rounds))
    if cfg.lr_schedule != "exponential" and before != cfg.num_rounds:
        get_logger(__name__).warning(
            "resume=true: lr-schedule=%r ran rounds 1-%d as a schedule over num-rounds=%d; rounds %d-%d follow it over "
            "num-rounds=%d", cfg.lr_schedule, ckpt.round, before, ckpt.round + 1, cfg.num_rounds, cfg.num_rounds,
        )  # fmt: skip
