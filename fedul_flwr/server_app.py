"""The ServerApp: resolve the run's settings once, run the strategy over the method's exchanged
models, evaluate the method's predictors centrally every round, write the outputs.

The method decides the models, the predictors and, optionally, an aggregation mixin and (in the
labels-at-server setting) its training on the server's labeled images after every round
(:func:`server_step`); the strategy comes from ``strategy``; nothing here depends on which method
runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from logging import ERROR, INFO, WARNING

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy
from torch import nn

from fedul_flwr import wire
from fedul_flwr.checkpoint import Checkpoint, CheckpointError, restore_strategy_state, save_checkpoint
from fedul_flwr.preflight import check_before_round_one, check_labels_at_server, is_simulation, unread_options
from fedul_flwr.resume import check_resume, check_resumed_federation, server_data_digest
from fedul_flwr.config import ConfigError, RunConfig, compose_config, config_from_values, describe_sources
from fedul_flwr.console import PROGRESS, RoundClock, mark_reported, print_in_one_line, reported, set_verbose
from fedul_flwr.acceleration import Acceleration
from fedul_flwr.augment import build_augmentation
from fedul_flwr.data.client_data import ClientData
from fedul_flwr.data.datasets import run_dataset_info
from fedul_flwr.data.image_dataset import ImageDataset, normalize
from fedul_flwr.data.simulated import load_run_dataset, validation_indices
from fedul_flwr.ema import WeightEMA
from fedul_flwr.methods import Method, get_method
from fedul_flwr.methods.base import ServerRoundContext
from fedul_flwr.models import build_model
from fedul_flwr.outputs import RunFolderInUse, RunOutputs, run_folder
from fedul_flwr.store import FolderLock, NoSpace
from fedul_flwr.privacy.accounting import privacy_spent
from fedul_flwr.execution import configure_threads, loop_acceleration, model_seed, pick_device
from fedul_flwr.strategies import build_strategy, inner_strategy
from fedul_flwr.strategies.server_training import SERVER_LABELED_IMAGES, SERVER_TRAIN_LOSS, ServerStep
from fedul_flwr.training import LocalLoop
from fedul_flwr.evaluation import EvaluationCache, evaluate_predictors

app = ServerApp()


def global_models(cfg: RunConfig, method: Method, channels: int, classes: int, size: int) -> nn.ModuleDict:
    """The method's exchanged models with their initial weights (model i seeded by
    :func:`~fedul_flwr.execution.model_seed` of (seed, i): the same seed, the same weights; a
    model with ``ModelSpec.initial`` starts as a copy of that model, its parameters then
    multiplied by ``ModelSpec.initial_scale``).

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
        if s.initial_scale != 1.0:
            with torch.no_grad():
                for p in models[s.name].parameters():
                    p.mul_(s.initial_scale)
    return models


def resume_from(ckpt: Checkpoint | None, models: nn.ModuleDict, strategy: Strategy) -> tuple[ArrayRecord, int]:
    """The arrays the run starts from and the rounds already done: the models' initial
    weights and 0, or with a checkpoint (``resume=true``) its arrays -- as the strategy held
    them (FedOpt: float64) -- and round r, the strategy's state put back, and the strategy
    numbering rounds from r + 1 (so its node draws, seeded by (seed, round), continue as in an
    uninterrupted run). Writes nothing."""
    if ckpt is None:
        return ArrayRecord(models.state_dict()), 0
    models.load_state_dict(ckpt.state_dict)
    restore_strategy_state(inner_strategy(strategy), ckpt.strategy_state)
    inner_strategy(strategy).round_offset = ckpt.round  # rounds r + 1, ... are configured and aggregated as such
    return ArrayRecord(ckpt.state_dict), ckpt.round


def server_step(cfg: RunConfig, method: Method, models: nn.ModuleDict, server: ClientData, device: torch.device,
                acceleration: Acceleration) -> ServerStep:  # fmt: skip
    """The server's training between rounds in the labels-at-server setting
    (:class:`~fedul_flwr.strategies.server_training.ServerTraining`): the method's
    :meth:`~fedul_flwr.methods.base.Method.server_update` on the server's labeled images, for
    ``server-epochs`` epochs of the shared loop with the run's optimiser settings and the step
    size of the round (of round 1 before round 1), batches and draws from the ``server-*``
    streams of (seed, round). The arrays come back with the dtypes they came in (FedOpt's
    float64)."""
    augment = build_augmentation(cfg.augment, server.image_shape[1], server.flip)

    def step(arrays: ArrayRecord, server_round: int) -> tuple[ArrayRecord, dict[str, float]]:
        models.load_state_dict(arrays.to_torch_state_dict())
        ctx = ServerRoundContext(cfg.seed, server_round, 0, device)
        loop = LocalLoop(
            epochs=cfg.server_epochs, lr=cfg.lr_of(max(server_round, 1)), l1_weight=cfg.l1_weight,
            optimizer=cfg.local_optimizer, momentum=cfg.local_momentum, seed=ctx.batch_seed, device=device,
            to_input=server.to_input, acceleration=acceleration, augment=augment, batchable=False,
            weight_decay=cfg.weight_decay, nesterov=cfg.nesterov, grad_clip_norm=cfg.grad_clip_norm,
        )  # fmt: skip
        result = method.server_update(server, models, ctx, loop)
        if result is None:
            return arrays, {}
        trained = {k: v.detach().cpu().numpy() for k, v in models.state_dict().items()}
        out = ArrayRecord({k: Array(trained[k].astype(arrays[k].numpy().dtype, copy=False)) for k in arrays.keys()})
        return out, {SERVER_TRAIN_LOSS: result.loss, SERVER_LABELED_IMAGES: float(len(server.labeled))}

    return step


@dataclass
class RoundEnd:
    """What the server does after every round (Flower's ``evaluate_fn``, called at round 0
    and after each round): evaluate every predictor of the method on the test split (and the
    validation hold-out) at round 0, every ``evaluate-every``-th round and the last round, record the round's aggregated train metrics and training replies
    (:meth:`record_replies`) and the test metrics, print the progress line, and write the
    checkpoint of a trained round."""

    cfg: RunConfig
    method: Method
    data: ImageDataset
    models: nn.ModuleDict
    device: torch.device
    acceleration: Acceleration
    val_idx: torch.Tensor | None  # the labeled validation hold-out (val-fraction > 0)
    strategy: Strategy
    outputs: RunOutputs
    num_nodes: int
    start_round: int
    ema_state: dict[str, torch.Tensor] | None = None  # a resumed run's EMA (the checkpoint's)
    server_data: str | None = None  # the server's labeled images' digest (resume.server_data_digest), in each checkpoint

    def __post_init__(self) -> None:
        self.predictors = self.method.predictors()
        self.clock = RoundClock(self.cfg.num_rounds, self.start_round)
        # per test set: a model unchanged since the last round runs no forward
        self.caches = {name: EvaluationCache() for name in ("test", "val", "test-without-ema")}
        self.ema = WeightEMA(self.models, self.cfg.ema_decay) if self.cfg.ema_decay > 0 else None
        if self.ema is not None and self.ema_state is not None:
            self.ema.load_state_dict(self.ema_state)

    @property
    def evaluated(self) -> nn.ModuleDict:
        """The models the central evaluation tests: the EMA of the global weights
        (``ema-decay > 0``), else the global models."""
        return self.ema.models if self.ema is not None else self.models

    def evaluates(self, server_round: int) -> bool:
        """Whether round ``server_round`` is evaluated centrally: the initial model, every
        ``evaluate-every``-th round and the last round."""
        return (server_round <= self.start_round or server_round >= self.cfg.num_rounds
                or server_round % self.cfg.evaluate_every == 0)  # fmt: skip

    def test(self, x: torch.Tensor, y: torch.Tensor, prefix: str, models: nn.ModuleDict | None = None) -> dict[str, float]:
        """``<prefix>-loss``/``-accuracy``/``-error`` of the headline predictor, with
        ``-<name>`` for the others, of ``models`` (default: :attr:`evaluated`)."""
        out = {}
        results = evaluate_predictors(
            self.evaluated if models is None else models, self.predictors, x, y,
            to_input=lambda v: normalize(v, self.data.mean, self.data.std), batch_size=self.cfg.eval_batch_size,
            device=self.device, acceleration=self.acceleration, cache=self.caches[prefix],
        )  # fmt: skip
        for i, (name, result) in enumerate(results.items()):
            suffix = "" if i == 0 else f"-{name}"
            out.update({f"{prefix}-{k}{suffix}": result[f"test-{k}"] for k in ("loss", "accuracy", "error")})
        return out

    def record_replies(self) -> None:
        """Record the latest training round's replies (trained, idle, failed nodes) and print
        one warning line naming the failed nodes and their error types, if any."""
        inner = inner_strategy(self.strategy)
        replies = inner.last_replies
        if replies is None:
            return
        inner.last_replies = None
        self.outputs.record_replies(replies)
        if replies.failed:
            total = len(replies.failed) + len(replies.idle) + len(replies.trained)
            log(WARNING, "fedul-flwr: round %d: %d of %d training replies failed: %s", replies.server_round,
                len(replies.failed), total, ", ".join(f"node {n} ({kind})" for n, kind in replies.failed))  # fmt: skip

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        server_round += self.start_round  # Flower counts the rounds of this start() from 1
        global_arrays = arrays.to_torch_state_dict()
        metrics: dict[str, float] = {}
        evaluated = self.evaluates(server_round)
        if self.ema is not None or evaluated:
            self.models.load_state_dict(global_arrays)
        if self.ema is not None and (server_round > self.start_round or self.ema.rounds == 0):
            self.ema.update(self.models)  # every round's weights go in (a resumed run's are in already)
        if evaluated:
            metrics = self.test(self.data.test_x, self.data.test_y, "test")
            if self.ema is not None:  # the global weights' own accuracy beside the EMA's
                plain = self.test(self.data.test_x, self.data.test_y, "test-without-ema", self.models)
                metrics.update({f"test-{k}-without-ema": plain[f"test-without-ema-{k}"] for k in ("accuracy", "loss")})
            if self.val_idx is not None:
                val = self.test(self.data.train_x[self.val_idx], self.data.train_y[self.val_idx], "val")
                metrics.update({k: v for k, v in val.items() if not k.startswith("val-loss")})
        inner = inner_strategy(self.strategy)
        train = inner.last_train_metrics  # this round's aggregate (evaluation comes last)
        if train is not None:  # recorded as the run goes (not at the end), so a stopped run keeps them
            keys = (wire.TRAIN_LOSS, SERVER_TRAIN_LOSS, SERVER_LABELED_IMAGES, *self.method.recorded_metrics)
            self.outputs.record(server_round, **{k: train[k] for k in keys if k in train})
            inner.last_train_metrics = None
        self.record_replies()
        spent = privacy_spent(self.cfg, server_round, self.num_nodes)
        clipped_to = getattr(self.strategy, "last_clipping_norm", None)  # server-adaptive: set by noised counts
        if self.cfg.differential_privacy == "server-adaptive" and clipped_to is not None:
            spent[wire.PRIVACY_CLIPPING_NORM] = clipped_to
        self.outputs.record(server_round, **metrics, **spent)
        progress = self.clock.line(server_round, metrics.get("test-accuracy"))
        if spent:
            progress += f", epsilon {spent[wire.PRIVACY_EPSILON]:.4g} (delta {spent[wire.PRIVACY_DELTA]:g})"
        PROGRESS.info(progress)
        if server_round > self.start_round:  # every finished round, once its row is written: the models, their
            # round, the strategy state -- the global arrays as the strategy holds them, not the models'
            # float32 copy: FedOpt strategies compute in float64, and an exact resume must continue from those
            save_checkpoint(self.outputs.path, server_round, global_arrays, self.cfg.as_dict(), inner,
                            self.ema.state_dict() if self.ema is not None else None, self.num_nodes,
                            self.server_data)  # fmt: skip
        return MetricRecord(metrics)


def run_federation(grid: Grid, cfg: RunConfig, lock: FolderLock | None = None) -> RunOutputs:
    """Train the method's models for ``num-rounds`` rounds over the nodes of ``grid``; returns
    the run's outputs (finished: ``summary.txt`` written, the folder released unless ``lock``,
    the run folder's lock its caller holds, was given: :meth:`RunOutputs.create`).

    Central evaluation of every predictor of the method on the dataset's test split runs at
    round 0 and after every round (:class:`RoundEnd`): the first predictor is recorded
    as ``test-accuracy`` etc., the others as ``test-accuracy-<name>``. The final models, the
    metric table, the plot and a summary line are written to the run folder, and after every
    round ``checkpoint.pt`` (the global arrays, the round and the strategy's state,
    :mod:`fedul_flwr.checkpoint`); with ``resume=true`` the run continues from the
    checkpoint of ``<output-dir>/<run-name>`` up to ``num-rounds``. Every round's training
    replies go on record (``failed-replies``, ``idle-replies``, the nodes); a run that stops
    writes its last round's replies and a ``status=failed`` summary with the reason, then
    raises.

    Every check runs before anything is written (:func:`fedul_flwr.preflight.check_before_round_one`,
    with ``resume=true`` :func:`fedul_flwr.resume.check_resume`, and the run folder's own
    checks in :meth:`RunOutputs.create`): a refused run changes nothing.

    Raises
    ------
    ConfigError
        From the checks before round 1 (names the key and value).
    NoSuccessfulReplyError
        If a round gets too few successful client replies (``min-train-nodes``) or too many
        failed ones (``max-failure-fraction``).
    CheckpointError
        With ``resume=true``, if the run folder has no readable checkpoint or metric table.
    RunFolderInUse
        If a live run holds the run folder.
    """
    check_before_round_one(cfg, grid)
    ckpt = check_resume(cfg, run_folder(cfg)) if cfg.resume else None
    configure_threads(cfg.client_threads)
    device = pick_device(cfg.device)
    method = get_method(cfg.method)(cfg)
    data = load_run_dataset(cfg)
    server = check_labels_at_server(cfg, is_simulation(grid))  # the server's labeled images, or None
    # who trains and who evaluates each round: seeded streams of (seed, round) in the strategy
    # (strategies/participation.py), never Flower's sample_nodes draw from the global `random`
    models = global_models(cfg, method, data.in_channels, data.num_classes, data.image_size).to(device)
    acceleration = loop_acceleration(cfg, device)
    # labeled validation hold-out (val-fraction of the training set): model selection on it
    # uses labels -- the runner reports it separately from the last-round test error
    val_idx = torch.from_numpy(validation_indices(cfg)) if cfg.val_fraction > 0 else None
    num_nodes = len(list(grid.get_node_ids()))  # the nodes each round samples from (DP noise and accounting)
    server_digest = server_data_digest(server)
    if ckpt is not None:
        check_resumed_federation(cfg, ckpt, is_simulation(grid), num_nodes, server_digest)
    strategy = build_strategy(cfg, method.aggregation(), num_nodes)
    initial_arrays, start_round = resume_from(ckpt, models, strategy)
    if server is not None:  # labels at the server: it trains after every aggregation, and once before round 1
        inner_strategy(strategy).server_step = step = server_step(cfg, method, models, server, device, acceleration)
        if start_round == 0:
            initial_arrays, _ = step(initial_arrays, 0)
    # the clients use the server's resolution, and a deployed node reads its folder against the dataset's facts
    settings = ConfigRecord({wire.RUN_CONFIG: cfg.to_json(), wire.DATASET_FACTS: run_dataset_info(cfg.as_dict()).to_json()})
    outputs = RunOutputs.create(cfg, primary=next(iter(models.keys())), resume_round=start_round, lock=lock)
    outputs.num_nodes = num_nodes  # the federation the epsilon's neighbours= is for
    round_end: RoundEnd | None = None
    try:
        PROGRESS.info("fedul-flwr: run folder %s", outputs.path)
        log(INFO, "fedul-flwr: the loop runs %s on %s (server side; each client resolves 'auto' on its own hardware)",
            acceleration.describe(), device)  # fmt: skip
        if ckpt is not None:
            log(INFO, "fedul-flwr: resuming after round %d from %s", start_round, outputs.path / "checkpoint.pt")
        round_end = RoundEnd(cfg, method, data, models, device, acceleration, val_idx, strategy, outputs, num_nodes,
                             start_round, ckpt.ema_state if ckpt is not None else None, server_digest)  # fmt: skip
        strategy.start(
            grid=grid, initial_arrays=initial_arrays, num_rounds=cfg.num_rounds - start_round, train_config=settings,
            evaluate_config=settings, evaluate_fn=round_end,
        )  # fmt: skip
        # the models of the last round's evaluation: the global arrays, or their EMA (ema-decay > 0)
        outputs.save_models({name: {k: v.cpu() for k, v in m.state_dict().items()} for name, m in round_end.evaluated.items()})
        outputs.plot()
    except BaseException as exc:
        try:
            if round_end is not None:
                round_end.record_replies()  # the replies of the round that stopped the run
        finally:
            log(ERROR, "%s", outputs.finish(failure=exc))  # summary.txt, status=failed|stopped; the folder released
            mark_reported(exc)  # that summary is the one line: Flower's console shows no traceback (unless verbose)
        raise
    outputs.finish()
    return outputs


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Flower entry point: resolve the settings (what the user typed wins over the preset),
    run the federation, print the summary. A run refused by a check before round 1 logs one
    line naming the key and value, then fails (Flower's console shows no traceback of it)."""
    start = time.time()
    typed = grid.run.override_config.keys()  # the --run-config values, as the SuperLink keeps them
    print_in_one_line(ConfigError, CheckpointError, RunFolderInUse)
    set_verbose(context.run_config.get("verbose") is True)  # quiet also when the settings are refused
    try:
        values, sources = compose_config(context.run_config, given=typed)
        cfg = config_from_values(values)
        set_verbose(cfg.verbose)
        log(INFO, "fedul-flwr: %s", describe_sources(values, sources))
        for line in unread_options(values, sources):
            log(WARNING, "fedul-flwr: %s", line)
        outputs = run_federation(grid, cfg)
    except (ConfigError, CheckpointError, RunFolderInUse) as exc:
        log(ERROR, "fedul-flwr: run refused before round 1, nothing written: %s", exc)
        raise
    except NoSpace as exc:
        if not reported(exc):  # a full device before the run folder was made (the lock, config.json)
            log(ERROR, "fedul-flwr: run refused before round 1, nothing written: %s", exc)
            mark_reported(exc)
        raise
    line = outputs.summary()
    print(line, flush=True)  # the run's one-line summary, shown by `flwr run --stream` / `flwr log`
    log(INFO, "fedul-flwr: finished in %.1fs", time.time() - start)
