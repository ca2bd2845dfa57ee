"""The ``--run-config`` text of the command line (``fedul check``, ``fedul node-data``), parsed
as ``flwr run`` parses it, with one-line errors that name the key or pair."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import click
import tomli  # Flower's TOML parser (tomllib may be an older TOML version)
from flwr.common.config import parse_config_args

from fedul_flwr.config.record import ConfigError

__all__ = ["parse_run_config"]

_PAIR = re.compile(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)")
"""One ``key=value`` pair of a ``--run-config`` string, as Flower's parser finds them."""


def parse_run_config(lines: Sequence[str] | None) -> dict[str, Any]:
    """The settings of ``--run-config`` (each occurrence one string of pairs, or one ``.toml``
    file), by Flower's own parser, after naming what Flower's one generic message would not (a
    key given twice, the pair whose value is not a TOML bool, int, float or quoted string) and
    what Flower drops without a word (text that is no ``key=value`` pair, such as ``lr = 0.1``).

    Raises
    ------
    ConfigError
        Naming the key (and both values), the pair, or the text that is no pair.
    """
    lines = list(lines or [])
    if not lines:
        return {}
    files = [line for line in lines if line.endswith(".toml")]
    if files and len(lines) > 1:
        raise ConfigError(f"--run-config {files[0]!r}: a .toml file cannot come with other --run-config values "
                          "(as in flwr run); put them in the file")  # fmt: skip
    for line in [] if len(lines) == 1 and lines[0].endswith(".toml") else lines:
        seen: dict[str, str] = {}  # a later --run-config overrides an earlier one, as in flwr run
        for key, value in _PAIR.findall(line):
            if key in seen:
                raise ConfigError(f"--run-config: {key} is given twice ({key}={seen[key]} and {key}={value}); give it once")
            seen[key] = value
            try:
                tomli.loads(f"{key} = {value}")
            except tomli.TOMLDecodeError:
                raise ConfigError(f"--run-config: {key}={value}: {_why(key, value)}") from None
        left = _PAIR.sub(" ", line).split()
        if left:
            raise ConfigError(f"--run-config: {' '.join(left)!r} is no key=value pair (no spaces around '='; "
                              "a value with spaces needs quotes), so flwr run would drop it")  # fmt: skip
    try:
        return parse_config_args(lines)
    except click.ClickException as exc:  # what the pairs above did not explain
        raise ConfigError(f"--run-config {' '.join(lines)!r}: {exc.format_message()}") from None


def _why(key: str, value: str) -> str:
    """What is wrong with a pair whose value TOML refuses, with the fix where it is clear."""
    if value in ("True", "False", "TRUE", "FALSE"):
        return f"a bool is lower case ({key}={value.lower()})"
    if re.fullmatch(r"[A-Za-z_][\w.-]*", value):
        return f"a string value needs quotes ({key}=\"{value}\")"
    return "the value must be a bool, int, float or quoted string"
