"""Each method page (and the datasets page) starts with a ready `flwr run .` command, and every
`flwr run .` command on them runs as printed: Flower parses its settings, they pass the checks
the ServerApp makes before round 1 (in a simulation of that many SuperNodes), the SuperNodes
are those the preset names, and the first command of a method page, on the embedded sample,
trains a round in an in-process federation."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from flwr.common.config import parse_config_args

from fedul_flwr.preflight import check_simulation, laid_out_clients, resolve_config
from fedul_flwr.config import preset_files

REPO = Path(__file__).resolve().parent.parent
METHOD_PAGES = ("fedul.md", "fedpu.md", "feddb.md", "hassle.md", *(f"baselines/{m}.md" for m in ("mixmatch", "uda", "rscfed", "semifl", "fedrgd", "fedmatch")))
PLACEHOLDER = "/path/to/torchvision-root"


def flwr_commands(page: str) -> list[list[str]]:
    """The `flwr run` commands of a page's bash blocks, continuation lines joined, as argv."""
    text = (REPO / "docs" / page).read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("flwr run"):
                commands.append(shlex.split(line))
    return commands


def settings(argv: list[str], data_dir: Path) -> tuple[int, dict[str, object]]:
    """(SuperNodes, run config) of a `flwr run . --federation-config ... --run-config ...` command."""
    assert argv[:3] == ["flwr", "run", "."], argv
    rest = [a for a in argv[3:] if a != "--stream"]
    options = dict(zip(rest[::2], rest[1::2]))
    assert set(options) <= {"--federation-config", "--run-config"}, options
    nodes = parse_config_args([options["--federation-config"]])["num-supernodes"]
    run_config = parse_config_args([options["--run-config"]]) if "--run-config" in options else {}
    if run_config.get("data-dir") == PLACEHOLDER:
        run_config["data-dir"] = str(data_dir)
    return int(nodes), run_config


def preset_supernodes(preset: str) -> int | None:
    """The SuperNodes a preset's own comment asks for (``num-supernodes=N``), if any."""
    found = re.findall(r"num-supernodes=(\d+)", preset_files()[preset].read_text())
    return int(found[0]) if found else None


@pytest.mark.parametrize("page", METHOD_PAGES)
def test_each_method_page_starts_with_a_flwr_run_command_on_the_embedded_sample(page):
    text = (REPO / "docs" / page).read_text()
    first_block = re.search(r"```(\w*)\n(.*?)```", text, flags=re.S)
    assert first_block and first_block.group(1) == "bash" and "flwr run ." in first_block.group(2)
    assert first_block.start() < text.index("\n## "), f"{page}: the command comes before the first section"
    nodes, run_config = settings(flwr_commands(page)[0], REPO)
    assert run_config.get("dataset") == "mnist-sample" and "data-dir" not in run_config


# the "Your own images" command (dataset="hf:/data/pets") needs an image folder: test_user_datasets runs it on one
@pytest.mark.parametrize("page,argv", [(p, c) for p in (*METHOD_PAGES, "datasets.md") for c in flwr_commands(p)
                                       if "hf:" not in " ".join(c)],
                         ids=lambda x: x if isinstance(x, str) else " ".join(x[-1:]))  # fmt: skip
def test_every_command_passes_the_checks_before_round_one(page, argv, tmp_path):
    nodes, run_config = settings(argv, tmp_path)
    cfg = resolve_config(run_config, given=run_config)
    check_simulation(cfg)
    preset = str(run_config.get("preset", ""))
    if preset and preset_supernodes(preset) is not None:
        assert nodes == preset_supernodes(preset), f"{page}: preset {preset!r} asks for {preset_supernodes(preset)} SuperNodes"
    laid_out = laid_out_clients(cfg)  # a label layout lays out its clients one by one (the named ones: 20)
    if laid_out is not None:
        assert nodes == laid_out[1], f"{page}: {laid_out[0]} lays out {laid_out[1]} clients"


@pytest.mark.slow
@pytest.mark.parametrize("page", METHOD_PAGES)
def test_the_first_command_trains_a_round(page, tmp_path):
    """The page's first command, for one round, in an in-process federation of its SuperNodes."""
    from fedul_flwr.client_app import app as client_app
    from fedul_flwr.inprocess import InProcessGrid
    from fedul_flwr.server_app import run_federation

    nodes, run_config = settings(flwr_commands(page)[0], tmp_path)
    rc = {**run_config, "num-rounds": 1, "output-dir": str(tmp_path), "run-name": "page"}
    outputs = run_federation(InProcessGrid(client_app, nodes, rc), resolve_config(rc, given=rc))
    rows = [outputs.rows[r] for r in sorted(outputs.rows)]
    assert [r["round"] for r in rows] == [0, 1] and rows[1]["test-loss"] != rows[0]["test-loss"]
