"""``fedul check`` (``python -m fedul_flwr.check_cli``): the checks of :mod:`fedul_flwr.preflight`
on the command line, before ``flwr run``. Flower's own error for an unknown key does not name
it, this one names it and the closest valid key; given ``--federation-config
"num-supernodes=N"`` (as ``flwr run`` takes it) it also checks the layouts against N. It reads
the run's dataset, builds the simulated clients, and checks the run folder (free, or resumable
with ``resume=true``); it writes nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import click
from flwr.common.config import parse_config_args

from fedul_flwr.checkpoint import CheckpointError
from fedul_flwr.config import ConfigError, compose_config, config_from_values, describe_sources
from fedul_flwr.config.command_line import parse_run_config
from fedul_flwr.outputs import check_unused, run_folder
from fedul_flwr.preflight import (
    check_clients,
    check_dataset,
    check_labels_at_server,
    check_federation_size,
    check_label_layout,
    check_node_counts,
    check_simulation,
    laid_out_clients,
    unread_options,
    validate_config,
)
from fedul_flwr.resume import check_resume

__all__ = ["add_arguments", "main", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``fedul check`` arguments."""
    parser.add_argument(
        "--run-config", action="append", default=[],
        help="the settings you will give `flwr run --run-config`, e.g. 'num-sets=10 seed=1' (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--simulation", action=argparse.BooleanOptionalAction, default=True,
        help="also check what a simulation's client-setting builds (--no-simulation for a deployment)",
    )  # fmt: skip
    parser.add_argument(
        "--federation-config", default="", metavar="'num-supernodes=N'",
        help="the simulation's --federation-config as `flwr run` takes it: its num-supernodes is checked "
             "against a layout of the clients (label-layout, positive-classes per client)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Resolve and check the settings; print the resolved run in one line (exit 0) or the
    first problem in one line (exit 1)."""
    try:
        values = parse_run_config(args.run_config)
        composed, sources = compose_config(values)
        cfg = validate_config(config_from_values(composed))
        note, num_nodes = "", None
        if args.simulation:
            check_simulation(cfg)
            num_nodes = _num_supernodes(args.federation_config)
            if num_nodes is not None:
                check_node_counts(cfg, num_nodes)
                check_federation_size(cfg, num_nodes)
            elif (laid_out := laid_out_clients(cfg)) is not None:
                if cfg.client_setting == "annotation-heterogeneity":
                    check_label_layout(cfg, laid_out[1])
                note += f" (needs a federation of {laid_out[1]} nodes: {laid_out[0]}={cfg.as_dict()[laid_out[0]]!r})"
        started = time.monotonic()
        images = check_dataset(cfg)
        read = f"; read {images} images of dataset={cfg.dataset!r} in {time.monotonic() - started:.1f}s"
        server = check_labels_at_server(cfg, args.simulation)
        if server is not None:
            read += f", the server's {len(server.labeled or ())} labeled images"
        if args.simulation:
            laid_out = laid_out_clients(cfg)
            clients = num_nodes if num_nodes is not None else None if laid_out is None else laid_out[1]
            if clients is not None:
                check_clients(cfg, clients)
                read += f", built its {clients} simulated clients"
        note = read + note
        if cfg.resume:
            check_resume(cfg, run_folder(cfg))
        else:
            check_unused(cfg)
    except (ConfigError, CheckpointError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"ok: {describe_sources(composed, sources)}{note}")
    for line in unread_options(composed, sources):
        print(f"warning: {line}", file=sys.stderr)
    return 0


def _num_supernodes(federation_config: str) -> int | None:
    """``num-supernodes`` of a ``--federation-config`` string (``None`` if not given).

    Raises
    ------
    ConfigError
        If it is not an integer >= 1.
    """
    if not federation_config.strip():
        return None
    try:
        value = parse_config_args([federation_config]).get("num-supernodes")
    except (ValueError, click.ClickException) as exc:  # Flower's parser raises the latter
        why = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
        raise ConfigError(f"--federation-config {federation_config!r}: {why}") from None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"--federation-config: num-supernodes={value!r} must be an integer >= 1")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m fedul_flwr.check_cli``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="fedul check", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
