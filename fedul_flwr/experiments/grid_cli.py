"""The flags every grid command (``fedul reproduce``, ``fedul compare``) shares, and ``--clean``.

``--seeds 0,1``, ``--data-dir``, ``--out``, ``--set [COLUMN:]KEY=VALUE`` (repeatable),
``--jobs``, ``--threads``, ``--clean [--yes]`` and ``--stop-after MINUTES``
(:func:`add_common_arguments`), with their parsers (:func:`parse_seeds`,
:func:`parse_set_item`, :func:`parse_overrides`); a bad value is refused in one line naming the
flag and the value (argparse's ``PROG: error: argument --set: ...``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from fedul_flwr.config import ConfigError, check_keys, coerce_value, default_config
from fedul_flwr.store import remove_tree, set_aside_folders

__all__ = ["SetItem", "add_common_arguments", "clean", "parse_overrides", "parse_seeds", "parse_set_item", "whole_number"]


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
    p.add_argument("--set", action="append", default=[], metavar=scoped[0], type=_SetParser(column_set),
                   help="run-config value for every run" + scoped[1])  # fmt: skip
    p.add_argument("--jobs", type=whole_number(1), default=1, help="runs at once (worker processes)")
    p.add_argument("--threads", type=whole_number(0), default=0, help="torch threads per run; 0: the machine's cores // jobs")
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


def whole_number(least: int) -> Callable[[str], int]:
    """The ``type=`` of a whole-number flag of at least ``least`` (``--jobs`` 1, ``--threads`` 0,
    ``fedul compare``'s ``--rounds`` and ``--clients`` 1): a smaller value is a flag error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number >= {least}")
        return value

    return parse


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


class SetItem(NamedTuple):
    """One ``--set`` value: ``column`` ("" for every run), the run-config ``key``, and its
    ``value`` typed like the key's default."""

    column: str
    key: str
    value: Any


class _SetParser:
    """The ``type=`` of ``--set``: :func:`parse_set_item` with the command's ``column_set``,
    its refusal raised as argparse's (``PROG: error: argument --set: ...``, exit status 2)."""

    def __init__(self, column_set: bool) -> None:
        self.column_set = column_set
        self.__name__ = "--set"  # argparse names a failing type by it

    def __call__(self, text: str) -> SetItem:
        try:
            return parse_set_item(text, self.column_set)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None


def parse_set_item(item: str, column_set: bool = True) -> SetItem:
    """One ``--set`` value: ``key=value`` (every run) or, where ``column_set``,
    ``column:key=value`` (one column's runs), typed like the key's default.

    Raises
    ------
    ConfigError
        Naming ``item``: no ``=``, an empty key or column, a column where the command takes none, a key
        that ``[tool.flwr.app.config]`` lacks (with the closest one) or a value the key refuses.
    """
    form = "[column:]key=value" if column_set else "key=value"
    head, sep, text = item.partition("=")
    column, _, key = head.rpartition(":")
    if not sep:
        raise ConfigError(f"{item!r}: expected {form} with a key of [tool.flwr.app.config]")
    if not key.strip():
        raise ConfigError(f"{item!r}: the key before '=' is empty; expected {form}")
    if ":" in head and not column.strip():
        raise ConfigError(f"{item!r}: the column before ':' is empty; expected {form}")
    if column and not column_set:
        raise ConfigError(f"{item!r}: this command takes key=value, without a column")
    try:
        check_keys([key])  # an unknown key: named with the closest valid one
        return SetItem(column, key, coerce_value(key, text, type(default_config()[key])))
    except ConfigError as exc:
        raise ConfigError(f"{item!r}: {exc}") from None


def parse_overrides(items: Sequence[str | SetItem]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``--set`` values as ``(every run's, {column: that column's})``; text items are parsed by
    :func:`parse_set_item` (the parsed ones come from ``--set``'s own ``type=``).

    Raises
    ------
    SystemExit
        On a malformed text item (the message begins ``--set 'ITEM':``).
    """

    common: dict[str, Any] = {}
    targeted: dict[str, dict[str, Any]] = {}
    for item in items:
        if isinstance(item, str):
            try:
                item = parse_set_item(item)
            except ConfigError as exc:
                raise SystemExit(f"--set {exc}") from None
        (targeted.setdefault(item.column, {}) if item.column else common)[item.key] = item.value
    return common, targeted
