"""The ServerApp: run the strategy, evaluate f centrally every round, write the outputs."""

from __future__ import annotations

import time
from logging import INFO

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedul_flwr.config import RunConfig, resolve_config
from fedul_flwr.data.client_data import load_run_dataset
from fedul_flwr.data.datasets import normalize
from fedul_flwr.models import build_model
from fedul_flwr.outputs import RunOutputs
from fedul_flwr.runtime import configure_threads, pick_device
from fedul_flwr.strategies import build_strategy
from fedul_flwr.training import evaluate

app = ServerApp()


def run_federation(grid: Grid, cfg: RunConfig) -> RunOutputs:
    """Train f for ``num-rounds`` rounds over the nodes of ``grid``; returns the run's outputs.

    Centralized evaluation of f on the dataset's test split runs at round 0 and after every
    round (Flower's ``evaluate_fn``). The final f, the metric table, the plot and a summary
    line are written to the run folder.

    Raises
    ------
    NoSuccessfulReplyError
        If a round gets no successful client reply.
    """
    configure_threads()
    device = pick_device(cfg.device)
    data = load_run_dataset(cfg)
    test_x = normalize(data.test_x, data.mean, data.std)
    test_y = data.test_y
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, data.in_channels, data.num_classes, data.image_size).to(device)
    outputs = RunOutputs.create(cfg)
    log(INFO, "fedul-flwr: run folder %s", outputs.path)

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        metrics = evaluate(model, test_x, test_y, batch_size=cfg.eval_batch_size, device=device)
        outputs.record(server_round, **{k: metrics[k] for k in ("test-loss", "test-accuracy", "test-error")})
        return MetricRecord(metrics)

    strategy = build_strategy(cfg)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=cfg.num_rounds,
        train_config=ConfigRecord({}),
        evaluate_fn=central_evaluate,
    )
    for server_round, metrics in result.train_metrics_clientapp.items():
        outputs.record(server_round, **{"train-loss": metrics["train-loss"]})
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
    log(INFO, "%s", line)
    print(line, flush=True)
    log(INFO, "fedul-flwr: finished in %.1fs", time.time() - start)
