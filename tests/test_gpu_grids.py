"""The grids of the papers' SVHN and CIFAR-100 columns (FedDB's Tables 1-3, HASSLE's Tables 1
and 7): every run is the paper's protocol and passes the checks a run makes before round 1,
and their committed results pages are what ``fedul reproduce --render-only`` renders."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fedul_flwr.preflight import check_simulation, resolve_config
from fedul_flwr.config import load_preset
from fedul_flwr.experiments import grids, reproduce

REPO = Path(__file__).resolve().parent.parent
GRIDS = tuple(name for name in grids.named_grids() if grids.load_grid(name).gpu)


def _parsed(grid: str, profile: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    reproduce.add_arguments(parser)
    return parser.parse_args(["--grid", grid, "--profile", profile])


def _specs(grid: str) -> list[reproduce.RunSpec]:
    return reproduce.grid_runs(grids.load_grid(grid), _parsed(grid, "paper"), reproduce.PROFILES["paper"].seeds)


@pytest.mark.parametrize("grid", GRIDS)
def test_every_run_is_the_papers_protocol_and_passes_the_checks(grid, tmp_path):
    specs = _specs(grid)
    g = grids.load_grid(grid)
    preset_name, clients = g.for_profile("paper")
    assert GRIDS == ("feddb-baselines-cifar10", "feddb-cifar100", "feddb-svhn", "fedpu-table5-cifar10",
                     "hassle-baselines-cifar10", "hassle-cifar100")  # fmt: skip
    assert len(specs) == len(g.rows) * len(g.columns) * 3
    labels = {"feddb-svhn": {"IID": 1000, "Dir(0.3)": 4000, "Dir(0.1)": 4000},
              "feddb-cifar100": {"IID": 10_000, "Dir(0.3)": 10_000, "Dir(0.1)": 10_000},
              "feddb-baselines-cifar10": {"IID": 4000, "Dir(0.3)": 4000, "Dir(0.1)": 4000},
              "fedpu-table5-cifar10": {"IID": 5000, "non-IID": 5000}}.get(grid)  # fmt: skip
    for spec in specs:
        rc = reproduce.run_config_of(spec, reproduce.PROFILES["paper"], str(tmp_path), tmp_path / "out", {})
        cfg = resolve_config(rc)
        check_simulation(cfg)
        preset = load_preset(preset_name)
        assert spec.clients == clients and cfg.l1_weight == 0.0
        assert (cfg.dataset, cfg.model, cfg.num_rounds, cfg.lr) == (preset["dataset"], preset["model"], preset["num-rounds"], preset["lr"])
        if labels:
            assert cfg.num_labeled == labels[spec.row]
            assert (cfg.partition, cfg.dirichlet_alpha if cfg.partition == "dirichlet" else None) == {
                "IID": ("iid", None), "Dir(0.3)": ("dirichlet", 0.3), "Dir(0.1)": ("dirichlet", 0.1),
                "non-IID": ("noniid", None)}[spec.row]  # fmt: skip
        else:
            assert cfg.client_setting == "annotation-heterogeneity" and cfg.dataset == preset["dataset"]


@pytest.mark.parametrize("grid", GRIDS)
def test_a_gpu_grid_refuses_the_cpu_profile(grid):
    with pytest.raises(grids.GridError, match="--profile paper"):
        reproduce.grid_runs(grids.load_grid(grid), _parsed(grid, "cpu"), (0,))


@pytest.mark.parametrize("grid", GRIDS)
def test_the_committed_page_is_the_rendered_one(grid, tmp_path):
    """The page shows the paper's numbers beside the (missing) runs, the command and the GPU
    time: rendered by the runner, never typed by hand."""
    committed = (REPO / "docs" / "reproduce" / "paper" / f"results-{grid}.md").read_text()
    rendered = reproduce.render(grid, "paper", _specs(grid), [], tmp_path).read_text()
    assert committed == rendered, f"re-render: fedul reproduce --grid {grid} --profile paper --render-only --out docs/reproduce"
    assert f"fedul reproduce --grid {grid} --profile paper" in rendered and "h per run" in rendered
    paper = grids.load_grid(grid).paper
    assert all(f"[{v:.2f}]" in rendered for (row, col, _), v in paper.items() if " " not in col or not col.startswith("HASSLE "))
