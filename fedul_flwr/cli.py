"""The ``fedul`` command: one entry point for the project's tools, one set of flag conventions.

Subcommands:

``fedul reproduce``
    The papers' tables as resumable grids of in-process federations, rendered beside the
    papers' numbers (:mod:`fedul_flwr.experiments.reproduce`).
``fedul compare``
    One method under several server strategies, same data and seeds
    (:mod:`fedul_flwr.experiments.compare`).
``fedul benchmark``
    Speed and memory of the training loop, the ClientApp, Flower's simulation and scale
    (:mod:`fedul_flwr.experiments.benchmark`).
``fedul node-data``
    Write and validate the data folders of deployed nodes (:mod:`fedul_flwr.node_data_cli`).
``fedul check``
    Resolve and check run settings as the ServerApp will before round 1, e.g. before
    ``flwr run`` (:mod:`fedul_flwr.check_cli`).

The grid commands share one runner (:mod:`fedul_flwr.experiments.runner`) and its flags:
``--seeds 0,1`` (comma list), ``--data-dir``, ``--out``, ``--set KEY=VALUE`` (``compare``: also
``COLUMN:KEY=VALUE``), ``--jobs``, ``--threads`` (0: cores // jobs), ``--stop-after MINUTES``; a
run with a record is never run again (delete the record to redo it); each run's Flower log goes to ``flower.log``
in its run folder and the terminal shows a progress bar and one line per finished run. A run
that fails is one failed cell: the others finish, the tables are rendered, the last lines
name each failed run and the exit code is 1; ``--stop-after`` stops in time with every
unfinished run checkpointed (exit code 75 while runs are left, the same command continues). ``fedul <command> --help`` shows
every option with its default.

An error ends the command with one line, ``fedul: error: ...`` naming the setting and the
value, and exit code 1 (2 for a usage error, 130 on Ctrl-C); ``fedul --debug <command>`` shows
the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Sequence

from fedul_flwr.markup import plain

__all__ = ["build_parser", "error_line", "main"]

COMMANDS: dict[str, tuple[str, str]] = {
    "reproduce": ("fedul_flwr.experiments.reproduce", "reproduce the papers' tables (resumable grids)"),
    "compare": ("fedul_flwr.experiments.compare", "compare server strategies on the same runs"),
    "benchmark": ("fedul_flwr.experiments.benchmark", "measure the loop, the ClientApp, Flower and scale"),
    "node-data": ("fedul_flwr.node_data_cli", "write and validate deployed nodes' data folders"),
    "check": ("fedul_flwr.check_cli", "check run settings before `flwr run` (names a mistyped key)"),
}
"""Subcommand -> (module with ``add_arguments(parser)`` and ``run(args) -> int``, summary)."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in ``--help``; descriptions (the modules' docstrings, in plain text:
    :func:`fedul_flwr.markup.plain`) as written."""


def build_parser() -> argparse.ArgumentParser:
    """The ``fedul`` parser with its subcommands (each imported when the parser is built)."""
    parser = argparse.ArgumentParser(prog="fedul", description=plain(__doc__.split("\n\n")[0]), formatter_class=HelpFormatter)
    parser.add_argument("--debug", action="store_true", help="on an error, show the traceback instead of one line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, summary) in COMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=summary, description=plain(module.__doc__ or ""), formatter_class=HelpFormatter)
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def error_line(exc: BaseException) -> str:
    """``fedul: error: <the exception's message on one line>`` (its type where it has none)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, KeyError) and text.startswith("'"):  # KeyError quotes its message
        text = text.strip("'")
    return f"fedul: error: {text}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``fedul``; returns the subcommand's exit code.

    Any exception of the subcommand ends it with :func:`error_line` on stderr and exit code 1
    (``--debug``: raised, with its traceback); Ctrl-C with exit code 130. The subcommand gets
    ``args.started``, the ``time.time()`` this call began (a grid's ``--stop-after`` counts
    from it).
    """
    started = time.time()  # before the subcommands' imports: --stop-after counts from here
    args = build_parser().parse_args(argv)
    args.started = started
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        print("fedul: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        print(error_line(exc), file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
