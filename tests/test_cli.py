"""The ``fedul`` command ends every error a user can cause with one line naming the setting and
its value, a non-zero exit code and nothing written; ``--debug`` shows the traceback; its
``--help`` texts are plain text (no Sphinx markup from the docstrings they come from)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedul_flwr import cli
from fedul_flwr.config import ConfigError


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


def test_compare_without_data_dir_is_one_line_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert cli.main(["compare", "--rounds", "1", "--strategies", "fedavg", "--out", str(out)]) == 1
    line = _one_error_line(capsys)
    assert line.startswith("fedul: error: ") and "dataset='mnist'" in line and "--data-dir" in line
    assert not out.exists()  # refused before anything was written


def test_too_few_nodes_for_krum_is_refused_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    args = ["compare", "--dataset", "mnist-sample", "--strategies", "krum", "--clients", "2", "--rounds", "1", "--out", str(out)]
    assert cli.main(args) == 1
    line = _one_error_line(capsys)
    assert "strategy='krum'" in line and "min-train-nodes=2" in line
    assert not out.exists()


def test_node_data_write_with_an_unquoted_string_names_the_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nodes"
    assert cli.main(["node-data", "write", "--out", str(out), "--num-nodes", "3", "--run-config", "num-sets=10 partition=noniid"]) == 1
    line = _one_error_line(capsys)
    assert '--run-config: partition=noniid: a string value needs quotes (partition="noniid")' in line, line
    assert not out.exists()


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data-dir"):
        cli.main(["--debug", "compare", "--rounds", "1", "--strategies", "fedavg", "--out", str(tmp_path / "out")])


def test_error_line_is_one_line_for_multi_line_messages() -> None:
    assert cli.error_line(ValueError("first\n  second")) == "fedul: error: first second"
    assert cli.error_line(KeyError("missing")) == "fedul: error: missing"
    assert cli.error_line(RuntimeError()) == "fedul: error: RuntimeError"


@pytest.mark.parametrize("command", [[], ["reproduce"], ["compare"], ["benchmark"], ["node-data"]])
def test_help_texts_are_plain(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.strip()
    for role in (":class:`", ":func:`", ":mod:`", ":data:`", ":meth:`", ":attr:`", "``"):
        assert role not in text, (command, role)


@pytest.mark.parametrize(("command", "metavar"), [("reproduce", "--set KEY=VALUE"), ("compare", "--set [COLUMN:]KEY=VALUE")])
def test_help_offers_a_column_scoped_set_only_where_the_command_accepts_it(
    command: str, metavar: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``reproduce`` refuses ``--set COLUMN:KEY=VALUE``; its help must not offer it."""
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = capsys.readouterr().out
    assert metavar in text
    assert ("COLUMN" in text) is (command == "compare")


@pytest.mark.parametrize(("command", "item", "says"), [
    ("reproduce", "fedavg-10:lr=0.1", "this command takes key=value, without a column"),
    ("reproduce", "lr", "expected key=value with a key of"),
    ("compare", "fedprox:lr", "expected [column:]key=value with a key of"),
    ("compare", "=1", "the key before '=' is empty"),
    ("reproduce", "lrr=1", "unknown run-config key(s) 'lrr' (did you mean 'lr'?)"),
    ("compare", ":lr=0.1", "the column before ':' is empty"),
    ("reproduce", "lr=true", "lr='true' is not a valid float"),
])
def test_a_bad_set_is_refused_by_the_parser_in_the_form_its_help_offers(
    command: str, item: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One flag (``column_set``) decides both what ``--help`` offers and what ``--set`` takes;
    a refusal is argparse's own line (``PROG: error: argument --set: 'ITEM': ...``, status 2)
    and writes nothing."""
    out = tmp_path / "out"
    grid = ["--grid", "smoke"] if command == "reproduce" else ["--strategies", "fedavg"]
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, *grid, "--out", str(out), "--set", item])
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"fedul {command}: error: argument --set: {item!r}: " + last.split(f"{item!r}: ", 1)[1]
    assert says in last and not out.exists()


def test_roles_become_plain_text_or_optional_crossrefs() -> None:
    from fedul_flwr.markup import ROLE, crossrefs, plain

    text = "see :class:`RunConfig`, :func:`~fedul_flwr.execution.model_seed` and ``flwr run``"
    assert plain(text) == "see RunConfig, model_seed() and flwr run"
    names = {"RunConfig": "fedul_flwr.config.RunConfig"}
    linked = crossrefs(text, lambda name: names.get(name, name))
    assert '<autoref identifier="fedul_flwr.config.RunConfig" optional><code>RunConfig</code></autoref>' in linked
    assert "<code>model_seed()</code>" in linked and not ROLE.search(linked)


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_stop_after_takes_a_positive_number_of_minutes(value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["reproduce", "--grid", "smoke", "--out", str(out), "--stop-after", value])
    assert exit_info.value.code == 2
    assert f"--stop-after: {value!r}: expected a positive number of minutes" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(("command", "flag", "value"), [
    ("reproduce", "--jobs", "0"), ("reproduce", "--jobs", "-1"), ("reproduce", "--threads", "-1"),
    ("reproduce", "--jobs", "two"), ("compare", "--rounds", "0"), ("compare", "--clients", "0"),
])
def test_counts_below_their_least_are_flag_errors(command: str, flag: str, value: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """``--jobs`` >= 1 and ``--threads`` >= 0 (0: the machine's cores // jobs), ``fedul compare``'s
    ``--rounds`` and ``--clients`` >= 1: refused by the parser, naming the flag (not a run-config
    key the user never typed), before any run folder or failure record exists."""
    out = tmp_path / "out"
    grid = ["--grid", "smoke"] if command == "reproduce" else ["--strategies", "fedavg"]
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, *grid, "--out", str(out), flag, value])
    assert exit_info.value.code == 2
    assert f"argument {flag}: {value!r}: expected a whole number >= " in capsys.readouterr().err
    assert not out.exists()


def test_a_refused_set_value_is_blamed_on_the_set_and_listed_with_the_runs(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """``--set num-rounds=0`` is the user's value, not the grid file's: the refusal begins with
    it; ``--list`` shows each run's settings with the ``--set`` values applied."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=r"^--set num-rounds=0: row 'MNIST-sample IID', .*num-rounds=0 must be >= 1$"):
        cli.main(["reproduce", "--grid", "smoke", "--out", str(out), "--set", "num-rounds=0"])
    assert not out.exists()
    assert cli.main(["reproduce", "--grid", "smoke", "--list", "--set", "num-rounds=1"]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if "clients {" in line]
    assert listed and all('"num-rounds": 1' in line for line in listed)
