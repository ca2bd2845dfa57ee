"""The ``client`` benchmark: the ClientApp's per-message cost around the training loop."""

from __future__ import annotations

import argparse
import time
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, RecordDict

import fedul_flwr.client_app as client_module
from fedul_flwr import wire
from fedul_flwr.data.simulated import load_run_dataset
from fedul_flwr.experiments.bench_core import median, say
from fedul_flwr.experiments.timing import timed_train_local
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import get_method
from fedul_flwr.preflight import resolve_config
from fedul_flwr.server_app import global_models

__all__ = ["section_client"]


def _clear_client_caches(client_module: Any) -> None:
    """Empty the ClientApp's per-process caches of the model modules and the parsed run
    configuration (if this version of the ClientApp has them): the cost of a message
    without them."""
    for name in ("_module", "_config"):
        cache = getattr(client_module, name, None)
        if cache is not None and hasattr(cache, "cache_clear"):
            cache.cache_clear()


def section_client(args: argparse.Namespace) -> dict[str, Any]:
    """Per-message cost of the ClientApp around the training loop, per model.

    Calls the real ClientApp's ``train`` through :class:`~fedul_flwr.inprocess.InProcessGrid`
    (no Ray) on a client of ``--client-images`` images (one or two batches), with the
    message the ServerApp sends (the exchanged models' arrays, the round and the resolved
    run configuration as JSON), timing the whole call and, inside it, ``train_local``
    (which the ClientApp reaches through ``LocalLoop.run``, so it is timed where that looks
    it up: :mod:`fedul_flwr.training`); overhead = call - train_local (parsing the run
    configuration, data look-up, model construction / weight loading, Q_c, reply arrays).
    With and without a preset (the server composes it once; the client only parses the
    resolved settings, so a preset should cost nothing per message). Calls alternate
    between the ClientApp as it runs (per-process caches warm) and with its caches emptied
    before the call (= building the models and parsing the configuration for every
    message). The ClientApp runs with ``client-threads = --threads``, the thread count of
    the other sections.
    """
    inner: list[float] = []
    out: dict[str, Any] = {"setting": {"images": args.client_images, "calls": args.client_calls}, "runs": []}
    with timed_train_local(inner.append):
        for model_name in args.client_models.split(","):
            for preset in ("", "authors-code"):
                cfg = resolve_config(
                    {
                        "dataset": args.dataset,
                        "data-dir": args.data_dir,
                        "model": model_name,
                        "num-sets": args.num_sets,
                        "samples-per-client": args.client_images,
                        "preset": preset,
                        "client-threads": args.threads,
                    }
                )
                data = load_run_dataset(cfg)
                method = get_method(cfg.method)(cfg)
                state = global_models(cfg, method, data.in_channels, data.num_classes, data.image_size).state_dict()
                settings = cfg.to_json()
                grid = InProcessGrid(client_module.app, 2, cfg.as_dict())
                calls: dict[bool, list[float]] = {True: [], False: []}
                overhead: dict[bool, list[float]] = {True: [], False: []}
                for call in range(2 * args.client_calls + 1):  # the first call builds the client: dropped
                    cached = call % 2 == 1  # interleaved: per-process caches kept / emptied before the call
                    if not cached:
                        _clear_client_caches(client_module)
                    config = ConfigRecord({wire.SERVER_ROUND: call + 1, wire.RUN_CONFIG: settings})
                    content = RecordDict({wire.ARRAYS: ArrayRecord(state), wire.CONFIG: config})
                    msg = grid.create_message(content, "train", 1, "bench")
                    inner.clear()
                    start = time.perf_counter()
                    (reply,) = grid.send_and_receive([msg])
                    elapsed = time.perf_counter() - start
                    if reply.has_error():
                        raise RuntimeError(reply.error.reason)
                    if call:
                        calls[cached].append(elapsed)
                        overhead[cached].append(elapsed - sum(inner))
                entry = {
                    "model": model_name,
                    "preset": preset,
                    "call-ms": 1000 * median(calls[True]),
                    "overhead-ms": 1000 * median(overhead[True]),
                    "uncached-call-ms": 1000 * median(calls[False]),
                    "uncached-overhead-ms": 1000 * median(overhead[False]),
                }
                out["runs"].append(entry)
                say(
                    f"client {model_name} preset={preset or '-'}: per-message overhead {entry['overhead-ms']:.1f}ms "
                    f"(rebuilding model + config every message: {entry['uncached-overhead-ms']:.1f}ms); "
                    f"call {entry['call-ms']:.1f}ms"
                )
    return out
