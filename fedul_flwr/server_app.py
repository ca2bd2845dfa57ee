"""The ServerApp: resolve the run's settings once, run the strategy over the method's exchanged
models, evaluate the method's predictors centrally every round, write the outputs.

The method decides the models, the predictors and, optionally, an aggregation mixin; the
strategy comes from ``strategy``; nothing here depends on which method runs.
"""

from __future__ import annotations

import random
import time
from logging import ERROR, INFO

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from torch import nn

from fedul_flwr import wire
from fedul_flwr.checkpoint import CheckpointError, restore_strategy_state, save_checkpoint
from fedul_flwr.checks import check_before_round_one, check_resume
from fedul_flwr.config import ConfigError, RunConfig, compose_config, config_from_values, describe_sources
from fedul_flwr.console import PROGRESS, RoundClock, set_verbose
from fedul_flwr.data.datasets import normalize
from fedul_flwr.data.simulated import load_run_dataset, validation_indices
from fedul_flwr.methods import Method, get_method
from fedul_flwr.models import build_model
from fedul_flwr.outputs import RunOutputs, read_metrics, run_folder, running_time
from fedul_flwr.privacy import privacy_spent
from fedul_flwr.runtime import configure_threads, loop_acceleration, model_seed, pick_device
from fedul_flwr.strategies import build_strategy, inner_strategy
from fedul_flwr.training import EvaluationCache, evaluate_predictors

app = ServerApp()


def global_models(cfg: RunConfig, method: Method, channels: int, classes: int, size: int) -> nn.ModuleDict:
    """The method's exchanged models with their initial weights (model i seeded by
    :func:`~fedul_flwr.runtime.model_seed` of (seed, i): the same seed, the same weights; a
    model with ``ModelSpec.initial`` starts as a copy of that model).

    Raises
    ------
    ValueError
        If a model's ``initial`` names no exchanged model, or one of another shape.
    """
    specs = [s for s in method.model_specs() if s.exchanged]
    models = nn.ModuleDict(
        {s.name: build_model(s.arch or cfg.model, channels, classes, size, seed=model_seed(cfg.seed, i), width=s.width)
         for i, s in enumerate(specs)}  # fmt: skip
    )
    for s in specs:
        if s.initial is not None:
            if s.initial not in models:
                raise ValueError(f"model {s.name!r} starts from {s.initial!r}, which is not an exchanged model of {cfg.method!r}")
            try:
                models[s.name].load_state_dict(models[s.initial].state_dict())
            except RuntimeError as err:
                raise ValueError(f"model {s.name!r} cannot start from {s.initial!r}: {err}") from err
    return models


def run_federation(grid: Grid, cfg: RunConfig) -> RunOutputs:
    """Train the method's models for ``num-rounds`` rounds over the nodes of ``grid``; returns
    the run's outputs.

    Central evaluation of every predictor of the method on the dataset's test split runs at
    round 0 and after every round (Flower's ``evaluate_fn``): the first predictor is recorded
    as ``test-accuracy`` etc., the others as ``test-accuracy-<name>``. The final models, the
    metric table, the plot and a summary line are written to the run folder, and after every
    round ``checkpoint.pt`` (the global arrays, the round and the strategy's state,
    :mod:`fedul_flwr.checkpoint`); with ``resume=true`` the run continues from the
    checkpoint of ``<output-dir>/<run-name>`` up to ``num-rounds``. Every round's failed
    training replies go on record (``failed-replies``, and the failed nodes in the summary).

    Every check that needs no node's data runs first
    (:func:`fedul_flwr.checks.check_before_round_one`, and with ``resume=true``
    :func:`fedul_flwr.checks.check_resume`): a refused run writes nothing.

    Raises
    ------
    ConfigError
        From the checks before round 1 (names the key and value).
    NoSuccessfulReplyError
        If a round gets too few successful client replies (``min-train-nodes``) or too many
        failed ones (``max-failure-fraction``).
    CheckpointError
        With ``resume=true``, if the run folder has no readable checkpoint.
    """
    check_before_round_one(cfg, grid)
    ckpt = check_resume(cfg, run_folder(cfg)) if cfg.resume else None
    configure_threads(cfg.client_threads)
    device = pick_device(cfg.device)
    acceleration = loop_acceleration(cfg, device)
    method = get_method(cfg.method)(cfg)
    data = load_run_dataset(cfg)

    def to_input(x: torch.Tensor) -> torch.Tensor:
        return normalize(x, data.mean, data.std)

    # labeled validation hold-out (val-fraction of the training set): model selection on it
    # uses labels -- the runner reports it separately from the last-round test error
    val_idx = torch.from_numpy(validation_indices(cfg)) if cfg.val_fraction > 0 else None
    # Flower's node sampling (strategy_utils.sample_nodes) draws from Python's global
    # `random`: seed it so a run picks (and orders) its clients the same way every time
    random.seed(cfg.seed)
    models = global_models(cfg, method, data.in_channels, data.num_classes, data.image_size).to(device)
    predictors = method.predictors()
    outputs = RunOutputs.create(cfg, primary=next(iter(models.keys())))
    PROGRESS.info("fedul-flwr: run folder %s", outputs.path)
    log(INFO, "fedul-flwr: the loop runs %s on %s (server side; each client resolves 'auto' on its own hardware)",
        acceleration.describe(), device)  # fmt: skip
    num_nodes = len(list(grid.get_node_ids()))  # the nodes each round samples from (DP accounting)
    start_round = 0  # rounds already done by the run being resumed (resume=true)
    strategy = build_strategy(cfg, method.aggregation())
    initial_arrays = ArrayRecord(models.state_dict())
    if ckpt is not None:
        start_round = ckpt.round
        models.load_state_dict(ckpt.state_dict)
        initial_arrays = ArrayRecord(ckpt.state_dict)  # as the strategy held them (FedOpt: float64)
        restore_strategy_state(inner_strategy(strategy), ckpt.strategy_state)
        if ckpt.random_state is not None:  # Flower's node sampling continues where it stopped
            random.setstate(ckpt.random_state)
        inner_strategy(strategy).round_offset = start_round  # rounds r + 1, ... are configured and aggregated as such
        if (outputs.path / "metrics.json").is_file():
            outputs.rows.update({int(r["round"]): r for r in read_metrics(outputs.path) if int(r["round"]) <= start_round})
            # wall-time goes on from the stopped run's (time spent running, not the pause between)
            outputs.started -= running_time(outputs.rows.values())
        log(INFO, "fedul-flwr: resuming after round %d from %s", start_round, outputs.path / "checkpoint.pt")
    clock = RoundClock(cfg.num_rounds, start_round)

    caches = {"test": EvaluationCache(), "val": EvaluationCache()}  # a model unchanged since the last round runs no forward

    def test(x: torch.Tensor, y: torch.Tensor, prefix: str) -> dict[str, float]:
        out = {}
        results = evaluate_predictors(
            models, predictors, x, y, to_input=to_input, batch_size=cfg.eval_batch_size, device=device,
            acceleration=acceleration, cache=caches[prefix],
        )  # fmt: skip
        for i, (name, result) in enumerate(results.items()):
            suffix = "" if i == 0 else f"-{name}"
            out.update({f"{prefix}-{k}{suffix}": result[f"test-{k}"] for k in ("loss", "accuracy", "error")})
        return out

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        server_round += start_round  # Flower counts the rounds of this start() from 1
        global_arrays = arrays.to_torch_state_dict()
        models.load_state_dict(global_arrays)
        metrics = test(data.test_x, data.test_y, "test")
        if val_idx is not None:
            val = test(data.train_x[val_idx], data.train_y[val_idx], "val")
            metrics.update({k: v for k, v in val.items() if not k.startswith("val-loss")})
        train = inner_strategy(strategy).last_train_metrics  # this round's aggregate (evaluation comes last)
        if train is not None:  # recorded as the run goes (not at the end), so a stopped run keeps them
            keys = (wire.TRAIN_LOSS, *method.recorded_metrics)
            outputs.record(server_round, **{k: train[k] for k in keys if k in train})
            inner_strategy(strategy).last_train_metrics = None
        failures = inner_strategy(strategy).last_failures  # this round's failed training replies
        if failures is not None:
            outputs.record_failures(server_round, failures)
            inner_strategy(strategy).last_failures = None
        spent = privacy_spent(cfg, server_round, num_nodes)
        outputs.record(server_round, **metrics, **spent)
        progress = clock.line(server_round, metrics["test-accuracy"])
        if spent:
            progress += f", epsilon {spent[wire.PRIVACY_EPSILON]:.4g} (delta {spent[wire.PRIVACY_DELTA]:g})"
        PROGRESS.info(progress)
        if server_round > start_round:  # every finished round, once its row is written: the models, their
            # round, the strategy state -- the global arrays as the strategy holds them, not the models'
            # float32 copy: FedOpt strategies compute in float64, and an exact resume must continue from those
            save_checkpoint(outputs.path, server_round, global_arrays, cfg.as_dict(), inner_strategy(strategy))
        return MetricRecord(metrics)

    settings = ConfigRecord({wire.RUN_CONFIG: cfg.to_json()})  # the clients use the server's resolution
    result = strategy.start(
        grid=grid,
        initial_arrays=initial_arrays,
        num_rounds=cfg.num_rounds - start_round,
        train_config=settings,
        evaluate_config=settings,
        evaluate_fn=central_evaluate,
    )
    models.load_state_dict(result.arrays.to_torch_state_dict())
    outputs.save_models({name: {k: v.cpu() for k, v in m.state_dict().items()} for name, m in models.items()})
    outputs.plot()
    outputs.close()
    return outputs


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Flower entry point: resolve the settings (what the user typed wins over the preset),
    run the federation, print the summary. A run refused by a check before round 1 logs one
    line naming the key and value, then fails."""
    start = time.time()
    typed = grid.run.override_config.keys()  # the --run-config values, as the SuperLink keeps them
    try:
        values, sources = compose_config(context.run_config, given=typed)
        cfg = config_from_values(values)
        set_verbose(cfg.verbose)
        log(INFO, "fedul-flwr: %s", describe_sources(values, sources))
        outputs = run_federation(grid, cfg)
    except (ConfigError, CheckpointError) as exc:
        log(ERROR, "fedul-flwr: run refused before round 1, nothing written: %s", exc)
        raise
    line = outputs.summary(num_clients=len(list(grid.get_node_ids())))
    print(line, flush=True)  # the run's one-line summary, shown by `flwr run --stream` / `flwr log`
    log(INFO, "fedul-flwr: finished in %.1fs", time.time() - start)
