"""The flags every grid command (``fedul reproduce``, ``fedul compare``) shares, and ``--clean``.

``--seeds 0,1``, ``--data-dir``, ``--out``, ``--set [COLUMN:]KEY=VALUE`` (repeatable),
``--jobs``, ``--threads``, ``--clean [--yes]`` and ``--stop-after MINUTES``
(:func:`add_common_arguments`), with their parsers (:func:`parse_seeds`,
:func:`parse_overrides`); a bad value is refused in one line naming the flag and the value.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedul_flwr.config import ConfigError, check_keys, coerce_value, default_config
from fedul_flwr.store import remove_tree, set_aside_folders

__all__ = ["add_common_arguments", "clean", "parse_overrides", "parse_seeds"]


def add_common_arguments(p: argparse.ArgumentParser, out: str, seeds_help: str = "comma list of seeds",
                         column_set: bool = False) -> None:  # fmt: skip
    """The flags every grid command shares: ``--seeds 0,1``, ``--data-dir``, ``--out``,
    ``--set KEY=VALUE`` (repeatable; ``COLUMN:KEY=VALUE`` too where ``column_set``, the
    commands that accept it), ``--jobs``, ``--threads`` (0: cores // jobs),
    ``--clean [--yes]`` (:func:`clean`), ``--stop-after MINUTES`` (:func:`~fedul_flwr.experiments.runner.run_cells`' ``stop_after``)."""
    p.add_argument("--seeds", default="", help=seeds_help)
    p.add_argument("--data-dir", default="", type=_data_dir,
                   help="torchvision root of the non-embedded datasets (made absolute)")  # fmt: skip
    p.add_argument("--out", default=out, help="results folder: records/, runs/ (each with its flower.log), tables")
    scoped = ("[COLUMN:]KEY=VALUE", ", or with COLUMN: for that column's runs only") if column_set else ("KEY=VALUE", "")
    p.add_argument("--set", action="append", default=[], metavar=scoped[0], help="run-config value for every run" + scoped[1])
    p.add_argument("--jobs", type=int, default=1, help="runs at once (worker processes)")
    p.add_argument("--threads", type=int, default=0, help="torch threads per run; 0: the machine's cores // jobs")
    p.add_argument("--clean", action="store_true",
                   help="list the set-aside run folders (earlier attempts that could not be continued) and exit")
    p.add_argument("--yes", action="store_true", help="with --clean: remove them")
    p.add_argument("--stop-after", type=_minutes, default=None, metavar="MINUTES",
                   help="end within MINUTES: runs stop between rounds (checkpointed, no record) and continue when the "
                   "same command runs again; exit status 75 while runs are left")  # fmt: skip


def _data_dir(text: str) -> str:
    return str(Path(text).expanduser().resolve()) if text else ""


def clean(runs_dir: Path, remove: bool) -> int:
    """``--clean``: print the set-aside run folders under ``runs_dir`` (:func:`fedul_flwr.store.set_aside`)
    with their sizes, and with ``remove`` (``--yes``) delete them: the only way this project
    deletes a run folder. Returns the exit status (0)."""

    folders = set_aside_folders(runs_dir)
    total = 0
    for folder in folders:
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        total += size
        print(f"{folder}  {size / 2**20:.1f} MiB")
    if not folders:
        print(f"no set-aside run folders in {runs_dir}")
    elif remove:
        for folder in folders:
            remove_tree(folder)
        print(f"removed {len(folders)} set-aside run folder(s), {total / 2**20:.1f} MiB")
    else:
        print(f"{len(folders)} set-aside run folder(s), {total / 2**20:.1f} MiB: add --yes to remove them")
    return 0


def _minutes(text: str) -> float:
    """``--stop-after`` value: a positive number of minutes."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number of minutes")
    return value


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"0,1,2"`` -> ``(0, 1, 2)``; ``""`` -> ``()``.

    Raises
    ------
    SystemExit
        On a value that is not an integer (the message names it).
    """
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise SystemExit(f"--seeds {text!r}: expected a comma list of integers, e.g. 0,1,2") from None


def parse_overrides(items: Sequence[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``--set`` values: ``key=value`` (every run) and ``column:key=value`` (one column's
    runs), typed like the key's default.

    Raises
    ------
    SystemExit
        On a malformed item or a key that ``[tool.flwr.app.config]`` lacks.
    """

    defaults = default_config()
    common: dict[str, Any] = {}
    targeted: dict[str, dict[str, Any]] = {}
    for item in items:
        target, _, assignment = item.rpartition(":") if ":" in item.split("=", 1)[0] else ("", "", item)
        key, sep, text = assignment.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected [column:]key=value with a key of [tool.flwr.app.config]")
        try:
            check_keys([key])  # an unknown key: named with the closest valid one
            value = coerce_value(key, text, type(defaults[key]))
        except ConfigError as exc:
            raise SystemExit(f"--set {item!r}: {exc}") from None
        (targeted.setdefault(target, {}) if target else common)[key] = value
    return common, targeted
