"""Settings that lay out the simulated clients one by one (HASSLE's ``label-layout``, FedPU's
``positive-classes`` per client) are checked against the federation's number of nodes before
round 1 and by ``fedul check --federation-config``, in one line that names the count needed;
a refused run leaves no run folder. In-process federations (the real ServerApp logic and
ClientApp, no Ray); ``tests/test_flower_env.py`` does the same through ``flwr run``."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedul_flwr.preflight import check_before_round_one, check_federation_size, laid_out_clients, resolve_config
from fedul_flwr.cli import main as fedul
from fedul_flwr.client_app import app as client_app
from fedul_flwr.config import ConfigError, compose_config, config_from_values
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.server_app import run_federation

HASSLE = {"preset": "hassle", "dataset": "mnist-sample", "num-rounds": 1, "device": "cpu"}


def test_preset_hassle_on_five_nodes_is_refused_before_round_1_naming_twenty(tmp_path: Path) -> None:
    """``preset='hassle'`` (the ALL layout of 20 clients) on a federation of 5 nodes: one line
    naming the key, its value, 20 and 5; no client trains, no run folder."""
    typed = {**HASSLE, "output-dir": str(tmp_path / "runs"), "run-name": "h"}
    grid = InProcessGrid(client_app, 5, typed)
    pushed: list = []
    grid.push_messages = lambda messages: pushed.extend(messages) or []  # type: ignore[method-assign]
    with pytest.raises(ConfigError) as refused:
        run_federation(grid, config_from_values(compose_config(typed)[0]))
    message = str(refused.value)
    assert message.startswith("label-layout='ALL' (preset='hassle') lays out 20 clients, the federation has 5 nodes")
    assert 'num-supernodes=20"' in message and "\n" not in message
    assert pushed == [] and not (tmp_path / "runs").exists()


def test_a_layout_of_the_federations_size_passes() -> None:
    cfg = resolve_config({**HASSLE, "label-layout": "L,P,P,U,U", "labeled-share": 0.3})
    assert laid_out_clients(cfg) == ("label-layout", 5)
    check_before_round_one(cfg, InProcessGrid(client_app, 5, {}))
    # at a labeled share below the fully labeled client's own, the partially labeled ones would
    # label a negative fraction: refused before round 1, naming the layout and the counts
    few = resolve_config({**HASSLE, "label-layout": "L,P,P,U,U", "labeled-share": 0.1})
    with pytest.raises(ConfigError, match=r"label-layout='L,P,P,U,U'.*labeled-share=0.1.*fraction -0.250"):
        check_before_round_one(few, InProcessGrid(client_app, 5, {}))
    with pytest.raises(ConfigError, match=r"lays out 5 clients, the federation has 4 nodes"):
        check_before_round_one(cfg, InProcessGrid(client_app, 4, {}))
    assert laid_out_clients(resolve_config({"num-sets": 10})) is None  # FedUL's U sets fit any number of clients


def test_positive_classes_per_client_against_the_federation() -> None:
    cfg = resolve_config({"method": "fedpu", "client-setting": "pu", "positive-classes": "2,2,2,2,2,2"})
    with pytest.raises(ConfigError, match=r"positive-classes='2,2,2,2,2,2': a division of 6 numbers for 5 clients"):
        check_federation_size(cfg, 5)
    check_federation_size(cfg, 6)


def test_deployment_nodes_bring_their_own_layout(tmp_path: Path) -> None:
    """In a deployment every node's folder says what it holds: no layout check."""
    cfg = resolve_config(HASSLE)
    check_before_round_one(cfg, InProcessGrid(client_app, 1, {}, node_configs=[{"data-dir": str(tmp_path)}]))


def test_fedul_check_takes_the_federation_config(capsys: pytest.CaptureFixture[str]) -> None:
    settings = ["--run-config", "preset='hassle' dataset='mnist-sample'"]  # fedul check reads the dataset
    assert fedul(["check", *settings, "--federation-config", "num-supernodes=5"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: label-layout='ALL' (preset='hassle') lays out 20 clients, the federation has 5 nodes")
    assert "\n" not in err
    assert fedul(["check", *settings, "--federation-config", "num-supernodes=20 client-resources-num-cpus=1"]) == 0
    capsys.readouterr()
    assert fedul(["check", *settings]) == 0  # without it: said, not refused
    assert capsys.readouterr().out.rstrip().endswith("(needs a federation of 20 nodes: label-layout='ALL')")
    assert fedul(["check", *settings, "--federation-config", "num-supernodes=0"]) == 1
    assert "num-supernodes=0 must be an integer >= 1" in capsys.readouterr().err
