"""The ServerApp: run the strategy, evaluate f centrally every round, write the outputs."""

from __future__ import annotations

import random
import time
from logging import INFO

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedul_flwr.config import RunConfig, resolve_config
from fedul_flwr.data.client_data import load_run_dataset, validation_indices
from fedul_flwr.data.datasets import normalize
from fedul_flwr.models import build_model
from fedul_flwr.checkpoint import load_checkpoint, restore_strategy_state, save_checkpoint
from fedul_flwr.outputs import RunOutputs, read_metrics
from fedul_flwr.runtime import configure_threads, pick_device
from fedul_flwr.strategies import build_strategy
from fedul_flwr.training import evaluate

app = ServerApp()


def run_federation(grid: Grid, cfg: RunConfig) -> RunOutputs:
    """Train f for ``num-rounds`` rounds over the nodes of ``grid``; returns the run's outputs.

    Centralized evaluation of f on the dataset's test split runs at round 0 and after every
    round (Flower's ``evaluate_fn``). The final f, the metric table, the plot and a summary
    line are written to the run folder, and after every round ``checkpoint.pt`` (f, the
    round and the strategy's state, :mod:`fedul_flwr.checkpoint`); with ``resume=true`` the run continues from the
    checkpoint of ``<output-dir>/<run-name>`` up to ``num-rounds``.

    Raises
    ------
    NoSuccessfulReplyError
        If a round gets no successful client reply.
    CheckpointError
        With ``resume=true``, if the run folder has no readable checkpoint.
    """
    configure_threads()
    device = pick_device(cfg.device)
    data = load_run_dataset(cfg)
    test_x = normalize(data.test_x, data.mean, data.std)
    test_y = data.test_y
    # labeled validation hold-out (val-fraction of the training set): model selection on it
    # uses labels -- the runner reports it separately from the last-round test error
    val_idx = torch.from_numpy(validation_indices(cfg)) if cfg.val_fraction > 0 else None
    val_x = normalize(data.train_x[val_idx], data.mean, data.std) if val_idx is not None else None
    val_y = data.train_y[val_idx] if val_idx is not None else None
    torch.manual_seed(cfg.seed)
    # Flower's node sampling (strategy_utils.sample_nodes) draws from Python's global
    # `random`: seed it so a run picks (and orders) its clients the same way every time
    random.seed(cfg.seed)
    model = build_model(cfg.model, data.in_channels, data.num_classes, data.image_size).to(device)
    outputs = RunOutputs.create(cfg)
    log(INFO, "fedul-flwr: run folder %s", outputs.path)
    start_round = 0  # rounds already done by the run being resumed (resume=true)
    strategy = build_strategy(cfg)
    initial_arrays = ArrayRecord(model.state_dict())
    if cfg.resume:
        ckpt = load_checkpoint(outputs.path)
        if ckpt.round >= cfg.num_rounds:
            raise ValueError(f"{outputs.path}: checkpoint of round {ckpt.round} >= num-rounds={cfg.num_rounds}; nothing to resume")
        start_round = ckpt.round
        model.load_state_dict(ckpt.state_dict)
        initial_arrays = ArrayRecord(ckpt.state_dict)  # as the strategy held them (FedOpt: float64)
        restore_strategy_state(strategy, ckpt.strategy_state)
        strategy.round_offset = start_round  # rounds r + 1, ... are configured and aggregated as such
        if (outputs.path / "metrics.json").is_file():
            outputs.rows.update({int(r["round"]): r for r in read_metrics(outputs.path) if int(r["round"]) <= start_round})
        log(INFO, "fedul-flwr: resuming after round %d from %s", start_round, outputs.path / "checkpoint.pt")

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        server_round += start_round  # Flower counts the rounds of this start() from 1
        global_arrays = arrays.to_torch_state_dict()
        model.load_state_dict(global_arrays)
        if server_round > start_round:  # every finished round: f, its round, the strategy state
            # the global arrays as the strategy holds them, not f's float32 copy: FedOpt
            # strategies compute in float64, and an exact resume must continue from those
            save_checkpoint(outputs.path, server_round, global_arrays, cfg.as_dict(), strategy)
        metrics = evaluate(model, test_x, test_y, batch_size=cfg.eval_batch_size, device=device)
        outputs.record(server_round, **{k: metrics[k] for k in ("test-loss", "test-accuracy", "test-error")})
        if val_x is not None and val_y is not None:
            val = evaluate(model, val_x, val_y, batch_size=cfg.eval_batch_size, device=device)
            val_metrics = {"val-accuracy": val["test-accuracy"], "val-error": val["test-error"]}
            outputs.record(server_round, **val_metrics)
            metrics = {**metrics, **val_metrics}
        return MetricRecord(metrics)

    result = strategy.start(
        grid=grid,
        initial_arrays=initial_arrays,
        num_rounds=cfg.num_rounds - start_round,
        evaluate_fn=central_evaluate,
    )
    for server_round, metrics in result.train_metrics_clientapp.items():
        outputs.record(server_round + start_round, **{"train-loss": metrics["train-loss"]})
    model.load_state_dict(result.arrays.to_torch_state_dict())
    outputs.save_model({k: v.cpu() for k, v in model.state_dict().items()})
    outputs.plot()
    return outputs


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Flower entry point: resolve the config, run the federation, print the summary."""
    start = time.time()
    cfg = resolve_config(context.run_config)
    outputs = run_federation(grid, cfg)
    line = outputs.summary(num_clients=len(list(grid.get_node_ids())))
    print(line, flush=True)  # the run's one-line summary, shown by `flwr run --stream` / `flwr log`
    log(INFO, "fedul-flwr: finished in %.1fs", time.time() - start)
