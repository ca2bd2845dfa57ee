"""The checks before round 1 (:mod:`fedul_flwr.preflight`): a resume that cannot damage a run,
run folders inside ``output-dir``, settings that cannot work refused before any run folder
exists, failed replies on record, and ``fedul check`` naming a mistyped key.

Each run here is an in-process federation (the real ServerApp logic and ClientApp, no Ray) on
the embedded MNIST sample."""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import pytest

from fedul_flwr.checkpoint import CheckpointError
from fedul_flwr.preflight import resolve_config, unread_options
from fedul_flwr.resume import RESUME_FREE_KEYS, resume_conflicts
from fedul_flwr.cli import main as fedul
from fedul_flwr.client_app import app as client_app
from fedul_flwr.config import ConfigError, compose_config, config_from_values
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.server_app import run_federation
from fedul_flwr.strategies import NoSuccessfulReplyError

pytestmark = pytest.mark.usefixtures("small_test_set")  # central evaluation on 500 test images (tests/conftest.py)

CHEAP = {"num-sets": 10, "samples-per-client": 150, "batch-size": 32, "device": "cpu", "seed": 4,
         "min-available-nodes": 2, "min-train-nodes": 2}  # fmt: skip


def _settings(tmp_path: Path, **overrides: object) -> dict:
    return {**CHEAP, "output-dir": str(tmp_path / "runs"), **overrides}


def _run(tmp_path: Path, clients: int = 2, node_configs: list[dict] | None = None, **overrides: object):
    """A federation through ``run_federation`` with only the parsing checks done beforehand
    (as ``main`` does): every other check is the ServerApp's own."""
    run_config = _settings(tmp_path, **overrides)
    grid = InProcessGrid(client_app, clients, run_config, node_configs=node_configs)
    return run_federation(grid, config_from_values(compose_config(run_config)[0]))


def _snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with a hash of its bytes (and every folder)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
        if ".locks" not in p.relative_to(root).parts  # who last held a folder's lock, not a run's content
    }


# --------------------------------------------------------------------------- resume


def test_resume_with_other_training_settings_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """A run stopped after round 1, resumed with another lr and seed: refused with both keys and
    both values, and the run folder (config.json included) keeps every byte."""
    _run(tmp_path, **{"num-rounds": 1, "run-name": "r"})
    before = _snapshot(tmp_path)
    with pytest.raises(ConfigError) as refused:
        _run(tmp_path, **{"num-rounds": 2, "run-name": "r", "resume": True, "lr": 0.01, "seed": 5})
    message = str(refused.value)
    assert "lr: 0.001 in the checkpoint, 0.01 now" in message and "seed: 4 in the checkpoint, 5 now" in message
    assert "\n" not in message
    assert _snapshot(tmp_path) == before


def test_resume_may_change_only_rounds_outputs_and_logging(tmp_path: Path) -> None:
    """num-rounds and the keys of RESUME_FREE_KEYS may differ; a resumed run that changes only
    them goes on, and its config.json then says the new num-rounds."""
    first = _run(tmp_path, **{"num-rounds": 1, "run-name": "r"})
    saved = resolve_config(_settings(tmp_path, **{"num-rounds": 1, "run-name": "r"})).as_dict()
    free = resolve_config(_settings(tmp_path, **{"num-rounds": 3, "run-name": "r", "resume": True,
                                                 "eval-batch-size": 256, "max-failure-fraction": 1.0}))  # fmt: skip
    assert resume_conflicts(saved, free) == [] and "num-rounds" in RESUME_FREE_KEYS
    assert resume_conflicts({k: v for k, v in saved.items() if k != "max-failure-fraction"}, free) == []  # added later
    resumed = _run(tmp_path, **{"num-rounds": 2, "run-name": "r", "resume": True, "eval-batch-size": 256})
    assert resumed.path == first.path
    assert '"num-rounds": 2' in (resumed.path / "config.json").read_text()


def test_resume_of_a_finished_run_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    _run(tmp_path, **{"num-rounds": 1, "run-name": "done"})
    before = _snapshot(tmp_path)
    with pytest.raises(ConfigError, match=r"finished round 1 and num-rounds=1; nothing to resume"):
        _run(tmp_path, **{"num-rounds": 1, "run-name": "done", "resume": True, "lr": 0.01})
    assert _snapshot(tmp_path) == before


def test_resume_of_a_folder_without_checkpoint_changes_nothing(tmp_path: Path) -> None:
    """``run-name='.'`` (the output folder itself) is not a run name; a folder that holds other
    files but no checkpoint is refused with the file named, and nothing in either is written."""
    out = tmp_path / "runs"
    (out / "notes").mkdir(parents=True)
    (out / "notes" / "config.json").write_text("my own file\n")
    (out / "keep.txt").write_text("keep\n")
    before = _snapshot(tmp_path)
    with pytest.raises(ConfigError, match=r"run-name='\.' is '\.' or '\.\.'"):
        _run(tmp_path, **{"num-rounds": 2, "run-name": ".", "resume": True})
    with pytest.raises(CheckpointError, match=r"notes/checkpoint\.pt does not exist"):
        _run(tmp_path, **{"num-rounds": 2, "run-name": "notes", "resume": True})
    with pytest.raises(CheckpointError, match="does not exist"):
        _run(tmp_path, **{"num-rounds": 2, "run-name": "missing", "resume": True})
    assert _snapshot(tmp_path) == before


# --------------------------------------------------------------------------- run folders


@pytest.mark.parametrize("name", ["../escaped-run", "a/b", "..", "/tmp/abs", "~x", "tab\there"])
def test_run_name_is_one_folder_inside_output_dir(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="run-name=.*one folder name inside output-dir"):
        resolve_config({"run-name": name})
    (tmp_path / "runs").mkdir()
    with pytest.raises(ConfigError, match="run-name"):
        _run(tmp_path, **{"num-rounds": 1, "run-name": name})
    assert _snapshot(tmp_path) == {"runs": "dir"}  # nothing inside output-dir, nothing beside it


# --------------------------------------------------------------------------- before round 1


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"method": "hassle", "client-setting": "pu"}, r"method='hassle' with client-setting='pu'"),
        ({"method": "fedpu", "client-setting": "usets"}, r"method='fedpu' with client-setting='usets'"),
        ({"num-sets": 5}, r"num-sets=5: every simulated client needs M_c >= K=10"),
        ({"num-sets": "10,5"}, r"num-sets=10,5: .* got \[5\]"),
        ({"client-setting": "pu", "method": "fedpu", "class-prior": "0"}, r"class-prior='0'.*not all zero"),
        ({"strategy": "krum", "num-malicious-nodes": 1}, r"strategy='krum' .* min-train-nodes=2 must be >= 5"),
        ({"min-available-nodes": 3, "min-train-nodes": 3, "differential-privacy": "server-fixed"},
         r"^min-available-nodes=3 with a simulated federation of 2 nodes .*wait forever"),  # else: waits forever
    ],
    ids=["hassle-pu", "fedpu-usets", "num-sets", "num-sets-list", "zero-prior", "krum", "more-nodes-than-simulated"],
)
def test_settings_that_cannot_work_stop_before_round_1_and_leave_no_folder(
    tmp_path: Path, settings: dict, message: str
) -> None:
    """Refused by the ServerApp in one line naming the key and value, before any client trains
    and before the run folder exists: a rerun under the same name with working settings runs."""
    with pytest.raises(ConfigError, match=message) as refused:
        _run(tmp_path, **{"num-rounds": 1, "run-name": "same-name", **settings})
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "runs" / "same-name").exists()
    rerun = _run(tmp_path, **{"num-rounds": 1, "run-name": "same-name"})
    assert (rerun.path / "model.pt").is_file()


def test_deployment_nodes_bring_their_own_data_so_the_setting_is_not_checked(tmp_path: Path) -> None:
    """The method-against-setting and num-sets checks concern simulated clients: with node
    folders (a deployment) the run is not refused for them."""
    from fedul_flwr.preflight import check_before_round_one

    cfg = resolve_config({"method": "hassle", "num-sets": 5})
    deployed = InProcessGrid(client_app, 1, {}, node_configs=[{"data-dir": str(tmp_path)}])
    check_before_round_one(cfg, deployed)
    with pytest.raises(ConfigError):
        check_before_round_one(cfg, InProcessGrid(client_app, 1, {}))


# --------------------------------------------------------------------------- failures


def test_failed_replies_go_on_record(tmp_path: Path) -> None:
    """Two of three nodes fail every round (their data cannot be built). With
    ``max-failure-fraction=1`` the run goes on with the third: metrics.csv counts the failed
    replies of every round, the summary names the failed nodes and their error type. With the
    default (0.5) the run stops in round 1 with the nodes' errors."""
    nodes = [{"partition-id": 0, "num-partitions": 3}] + [{"partition-id": 9, "num-partitions": 3}] * 2
    with pytest.raises(NoSuccessfulReplyError, match=r"(?s)round 1: 2 of 3 training replies failed, more than "
                                                      r"max-failure-fraction=0.5 allows; node 2: .*; node 3: "):
        _run(tmp_path, 3, nodes, **{"num-rounds": 2, "run-name": "stops", "min-train-nodes": 1})  # fmt: skip
    outputs = _run(tmp_path, 3, nodes, **{"num-rounds": 2, "run-name": "goes-on", "min-train-nodes": 1,
                                          "max-failure-fraction": 1.0})  # fmt: skip
    with (outputs.path / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["round"], r["failed-replies"]) for r in rows] == [("0", ""), ("1", "2"), ("2", "2")]
    line = outputs.summary()
    assert "failed-replies=4 failed-nodes=2(ValueError),3(ValueError)" in line
    assert (outputs.path / "summary.txt").read_text().strip() == line


def test_a_run_without_failures_records_zero(tmp_path: Path) -> None:
    outputs = _run(tmp_path, **{"num-rounds": 1, "run-name": "clean"})
    with (outputs.path / "metrics.csv").open() as fh:
        assert [r["failed-replies"] for r in csv.DictReader(fh)] == ["", "0"]
    assert "failed-replies=0 " in outputs.summary() and "failed-nodes" not in outputs.summary()


def test_max_failure_fraction_is_a_fraction() -> None:
    with pytest.raises(ConfigError, match=r"max-failure-fraction=1.5 must be in \[0, 1\]"):
        resolve_config({"max-failure-fraction": 1.5})


# --------------------------------------------------------------------------- fedul check


def test_fedul_check_names_a_mistyped_key_and_the_closest_valid_one(capsys: pytest.CaptureFixture[str]) -> None:
    """Flower refuses an unknown ``--run-config`` key with "[code: 15] Invalid run
    configuration" and names it only in the SuperLink's log; ``fedul check`` names it."""
    assert fedul(["check", "--run-config", 'datset="cifar10" num-rounds=3']) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown run-config key(s) 'datset' (did you mean 'dataset'?)") and "\n" not in err
    assert fedul(["check", "--run-config", 'method="fedull"']) == 1
    assert "(did you mean 'fedul'?)" in capsys.readouterr().err
    assert fedul(["check", "--run-config", "num-sets=5"]) == 1
    assert "num-sets=5" in capsys.readouterr().err
    assert fedul(["check", "--no-simulation", "--run-config", "num-sets=5"]) == 0  # a deployment's nodes have their sets
    assert fedul(["check", "--run-config", "num-rounds=3"]) == 0
    assert capsys.readouterr().out.startswith("ok: run configuration:")


def test_fedul_check_names_a_key_given_twice_and_an_unquoted_string(capsys: pytest.CaptureFixture[str]) -> None:
    """Flower's parser refuses both with one generic message ("invalid format"); ``fedul
    check`` names the key and values, in one line. Two ``--run-config`` occurrences override as
    in ``flwr run`` (the later wins)."""
    assert fedul(["check", "--run-config", "lr=0.1 num-rounds=2 lr=0.2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "error: --run-config: lr is given twice (lr=0.1 and lr=0.2); give it once", err
    assert fedul(["check", "--run-config", "num-rounds=2 method=fedul"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == 'error: --run-config: method=fedul: a string value needs quotes (method="fedul")', err
    assert fedul(["check", "--run-config", "resume=True"]) == 1
    assert "a bool is lower case (resume=true)" in capsys.readouterr().err
    # what Flower's parser drops without a word: no pair, or text after a quoted value
    for text, left in (("lr = 0.1", "lr = 0.1"), ("num-rounds=5 seed 3", "seed 3"), ('run-name="a"b', "b")):
        assert fedul(["check", "--run-config", text]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: --run-config: {left!r} is no key=value pair"), err
    assert fedul(["check", "--run-config", "lr=0.1", "--run-config", "lr=0.3"]) == 0
    assert "typed by the user: lr=0.3" in capsys.readouterr().out
    assert fedul(["node-data", "write", "--out", "/nonexistent-never-written", "--num-nodes", "2",
                  "--run-config", "partition=noniid"]) == 1  # fmt: skip
    assert 'partition=noniid: a string value needs quotes (partition="noniid")' in capsys.readouterr().err
    assert fedul(["check", "--run-config", "/tmp/settings.toml", "--run-config", "seed=2"]) == 1
    assert "a .toml file cannot come with other --run-config values" in capsys.readouterr().err
    assert fedul(["check", "--federation-config", "num-supernodes=abc"]) == 1
    assert capsys.readouterr().err.startswith("error: --federation-config 'num-supernodes=abc': ")


@pytest.mark.parametrize("participation", ["fixed-size", "poisson"])
def test_fedul_check_refuses_more_available_nodes_than_simulated_in_one_line(
    participation: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A simulation never gets more nodes than num-supernodes: Flower would wait forever."""
    values = f"min-train-nodes=6 min-available-nodes=6 participation='{participation}'"
    assert fedul(["check", "--run-config", values, "--federation-config", "num-supernodes=5"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: min-available-nodes=6 with a simulated federation of 5 nodes")
    assert fedul(["check", "--run-config", values, "--federation-config", "num-supernodes=6"]) == 0


def test_a_typed_option_the_method_does_not_read_is_named_in_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    """``hassle-gamma`` changes nothing under FedUL: ``fedul check`` says so (and the ServerApp
    logs the same line); the method's own options, and a foreign one at the preset's value (a
    grid hands its runs' whole settings over as typed), give no warning."""
    assert fedul(["check", "--run-config", 'method="fedul" hassle-gamma=0.5']) == 0
    err = capsys.readouterr().err
    assert "warning: hassle-gamma=0.5: an option of method(s) ['hassle']; method='fedul' does not read it" in err, err
    assert fedul(["check", "--run-config", 'method="fedrgd" client-setting="labels-at-clients" num-labeled=200 fixmatch-threshold=0.9 fedrgd-groups=2']) == 0
    assert "warning" not in capsys.readouterr().err
    values, sources = compose_config({"method": "fedul", "preset": "hassle", "hassle-gamma": 100.0, "lr": 0.1})
    assert unread_options(values, sources) == []  # the hassle preset's own value
    assert unread_options(*compose_config({"method": "fedul", "dpl": True})) == [
        "dpl=True: an option of method(s) ['fedmatch', 'fedrgd', 'semifl']; method='fedul' does not read it"]
