"""Every ``flwr run`` and ``fedul`` command of the README and docs/*.md runs as printed.

The commands are read from the pages' shell code blocks (continuation lines as bash joins
them, a setup prefix ``python3.11 -m venv .venv && . .venv/bin/activate && pip install -e .
&&`` dropped: the tests run in that venv) and each is one test, named by its page and line
(``docs/fedul.md:9``). bash runs the command's text with only these changes:

- **one round** where it trains: ``flwr run`` gets ``num-rounds=1`` in its ``--run-config``
  (added or replacing the printed value); ``fedul reproduce`` gets ``--runs <the first run
  it lists> --set num-rounds=1``, ``fedul compare`` ``--rounds 1 --seeds 0``, ``fedul
  benchmark`` its own smoke switch ``--quick`` (not with ``--render``, which runs nothing);
- **placeholders** filled by fixtures: ``/path/to/torchvision-root`` (and ``/data/torchvision``)
  is a torchvision root of tiny generated files in each dataset's real layout (MNIST and
  Fashion-MNIST extracted as torchvision leaves them; for FedDB's grid a Fashion-MNIST large
  enough for its 1000 images per client), ``/data/pets`` an image folder of PNGs,
  ``/data/fedul-node`` a node folder written by ``fedul node-data write`` (of CIFAR-10's shape
  where the command names it: written from generated CIFAR-10 files whose md5s are
  registered in process, as tests/test_datasets.py does), ``/data/xrays`` an organisation's
  image folder of some classes of the dataset ``/data/xrays-test``, ``$FEDUL_NODES`` a
  temporary folder, ``server.example.org`` (the ``fedul-prod`` connection of
  docs/deployment.md) a loopback deployment of a SuperLink and three SuperNodes, and output
  paths under ``/tmp``, ``/srv`` or relative ones land in the test's own folders (each
  command runs in a fresh copy of the project; ``HOME`` is a temporary folder, so default run
  folders ``~/fedul-flwr-runs/...`` are too).

A command the tests cannot run (a GPU, a cluster of machines, Docker, the internet, hours)
is in :data:`ALLOWED` with the reason; a command of the docs that is neither runnable nor
there fails its test, so the docs cannot drift from what runs. The same command printed on
several pages runs once (the other places name it).

``flwr run`` in simulation: one SuperLink for the module (started here as Flower's CLI starts
its local one, with its own ``FLWR_HOME`` and ports, which ``. scripts/flower-env.sh`` keeps
because they were exported first; its simulations join one Ray node started for the module,
``RAY_ADDRESS`` in its environment, instead of starting Ray for each run), every run checked ``finished:completed`` with ``flwr ls
--format json`` (``flwr run --stream`` exits 0 even when a run failed), its printed lines
(Flower's few, the run folder, one line per round, the summary line, no traceback or warning
of the project's: at most 20 lines plus one per round) and its run folder (the settings of the
command are in its config.json, the metric table has rounds 0 and 1, and round 1 changed the
test loss).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.flower_harness import BIN, SuperLink, app_dir, flower_env, free_port, printed_lines, ray_cluster, serving

REPO = Path(__file__).resolve().parent.parent
PAGES = ("README.md", *(f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md"))))
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")

SETUP_PREFIX = re.compile(r'^python3(?:\.\d+)? -m venv (?:\.venv|"\.\./\$\(basename "\$PWD"\)\.venv" && ln -sfn "\.\./\$\(basename "\$PWD"\)\.venv" \.venv) && \. \.venv/bin/activate && pip install -e \. && ')
"""The README's installation in front of its first command: the tests run in that venv."""
ENV_PREFIX = ". scripts/flower-env.sh && "
"""Sourcing Flower's settings in front of a command: the same as on a line of its own before it."""

ALLOWED: dict[str, str] = {
    r"client-resources-num-gpus=0\.\d": "gives each simulated client a share of a GPU (Ray does not schedule it without one)",
    r"--augment-device cuda|--loop-device cuda|--set device=cuda": "runs on a CUDA GPU",
    r"--profile paper": "the papers' protocols: hours on a GPU (tests/test_gpu_grids.py checks every run's settings)",
    r"^fedul compare --dataset cifar10 ": "ResNet-18 on CIFAR-10 under five strategies and three seeds: a GPU's work",
    r"^flwr run \. <connection> ": "a Ray cluster of several machines (tests/test_ray_cluster.py runs one of two nodes on one machine)",
    r"^flwr run \. docker-local ": "needs a Docker daemon and Flower's images (tests/test_docker_files.py validates the files)",
    r"^flwr run \. fedul-one-host ": "a step of the one-host block, which "
    "tests/test_deployment.py::test_three_supernodes_on_one_host_as_documented runs as printed, the processes it starts included",
    r"--run-config \"key=value key2='text'\"": "shows the syntax of --run-config with placeholder keys",
    r"--py-spy ": "profiles with py-spy, which the project does not install",
    r"preset='(feddb|feddb-authors|feddb-svhn|feddb-cifar100|hassle-cifar10|hassle-cifar100)'": "a paper's protocol on a GPU "
    "(FedDB: WRN-28-2 on 100 SuperNodes; HASSLE: ResNet-8): one round of feddb-svhn on generated data took 124 s on 2 CPU "
    "cores; tests/test_method_pages.py::test_every_command_passes_the_checks_before_round_one checks their settings",
    r"^fedul benchmark (?!.*--render)(?!--only (augment|qc|gpu|hassle) )": "a measurement of minutes even with --quick "
    "(--only loop: 317 s; every section: 341 s on 2 CPU cores). NOTE: as printed, `fedul benchmark --quick` and the "
    "every-section command then fail in their scale section, which needs full MNIST (--data-dir)",
}
"""Regular expression (searched in the command, continuation lines joined) -> why it does not run here."""


@dataclass(frozen=True)
class Command:
    """A command as printed: its page, line and text (continuation lines as printed)."""

    page: str
    line: int
    text: str
    sources_env: bool = False  # the block sources scripts/flower-env.sh on a line before it

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def flat(self) -> str:
        """The text on one line, as bash joins it, whitespace collapsed (for matching and names)."""
        flat = " ".join(SETUP_PREFIX.sub("", self.text.replace("\\\n", "")).split())
        return flat.removeprefix(ENV_PREFIX)

    @property
    def tool(self) -> str:
        """``flwr run``, ``fedul <subcommand>``."""
        found = re.search(r"\b(flwr run|fedul [a-z-]+)", self.flat)
        assert found, self.text
        return found.group(1)


_COMMAND = re.compile(r"(?:^|&&|;)\s*(?:flwr run|fedul [a-z])")


def documented_commands() -> list[Command]:
    """Every ``flwr run`` / ``fedul`` command in the shell code blocks of the README and docs/*.md."""
    found = []
    for page in PAGES:
        lines = (REPO / page).read_text().splitlines()
        language = None  # inside a code block: its language ("" for none)
        sourced = False  # this block ran `. scripts/flower-env.sh` on a line of its own
        i = 0
        while i < len(lines):
            fence = re.match(r"\s*```(\w*)", lines[i])
            if fence:
                language = fence.group(1) if language is None else None
                sourced = False
                i += 1
                continue
            start, text = i, lines[i]
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text += "\n" + lines[i]
            if language in SHELL_LANGUAGES and _COMMAND.search(" ".join(text.replace("\\\n", "").split())):
                found.append(Command(page, start + 1, text.strip(), sourced))
            sourced = sourced or text.strip() == ". scripts/flower-env.sh"
            i += 1
    return found


def allowed_reason(command: Command) -> str | None:
    for pattern, reason in ALLOWED.items():
        if re.search(pattern, command.flat):
            return reason
    return None


COMMANDS = documented_commands()


def _first_places() -> dict[str, Command]:
    first: dict[str, Command] = {}
    for command in COMMANDS:
        first.setdefault(command.flat, command)
    return first


def _uses_ray(command: Command) -> bool:
    """Whether the command starts Ray: ``flwr run`` in simulation, ``fedul benchmark`` with its
    ``flower`` or ``scale`` section (``--only`` absent: every default section)."""
    if command.tool == "flwr run":
        return not re.search(r"^flwr run \. fedul-prod ", command.flat)
    if command.tool == "fedul benchmark" and "--render" not in command.flat:
        only = re.search(r"--only (\S+)", command.flat)
        return not only or bool({"flower", "scale"} & set(only.group(1).split(",")))
    return False


EVERY_COMMAND = os.environ.get("FEDUL_DOCS_COMMANDS", "") == "1"
"""Run every documented command (``FEDUL_DOCS_COMMANDS=1 pytest tests/test_docs_commands.py``:
95 commands, 61 run, 29 min on 2 busy CPU cores: a separate check, like the benchmarks, outside
CI's 20-minute budget). Without it, CI runs the commands of :data:`ALWAYS_RUN` pages and the
checks that every command of the docs is found, runnable or allow-listed."""
ALWAYS_RUN = ("docs/datasets.md",)
"""Pages whose commands run in every ``pytest`` (the user's own images: seconds each)."""


def _params() -> list:
    first = _first_places()
    params = []
    for command in COMMANDS:
        marks = []
        reason = allowed_reason(command)
        if reason:
            marks.append(pytest.mark.skip(reason=f"allow-listed: {reason}"))
        elif not EVERY_COMMAND and command.page not in ALWAYS_RUN:
            marks.append(pytest.mark.skip(reason="runs with FEDUL_DOCS_COMMANDS=1 (every documented command: ~29 min)"))
        elif first[command.flat] is not command:
            marks.append(pytest.mark.skip(reason=f"the same command as {first[command.flat].id}, which runs it"))
        elif _uses_ray(command):
            marks.append(pytest.mark.xdist_group("ray"))  # see tests/conftest.py
        elif command.tool == "flwr run":
            marks.append(pytest.mark.xdist_group("docs-deployment"))  # one loopback deployment for these
        params.append(pytest.param(command, id=command.id, marks=marks))
    return params


# --------------------------------------------------------------------------- the docs' commands


def test_the_commands_are_found_on_the_pages_that_must_have_them() -> None:
    """The extraction sees the commands these tests exist for (a changed fence or prefix would
    otherwise silently drop them): the datasets page's ready command and node-folder command,
    and the ready command of each method page."""
    ids = {c.id.split(":")[0]: [] for c in COMMANDS}
    for c in COMMANDS:
        ids[c.page].append(c.flat)
    datasets = ids["docs/datasets.md"]
    assert any("dataset=\"hf:/data/pets\"" in c and c.startswith("flwr run . --stream") for c in datasets), datasets
    assert any(c.startswith("fedul node-data write ") and "hf:/data/pets" in c for c in datasets), datasets
    for page in ("fedul", "fedpu", "feddb", "hassle"):
        first = ids[f"docs/{page}.md"][0]
        assert first.startswith("flwr run . --stream") and "dataset='mnist-sample'" in first, (page, first)
        assert allowed_reason(next(c for c in COMMANDS if c.flat == first)) is None
    assert any(c.startswith("flwr run . --stream") for c in ids["README.md"])


def test_every_allow_list_entry_matches_a_documented_command() -> None:
    """No stale entry: each pattern still matches a command of the docs, and each test a
    reason names (``tests/<module>.py::<function>``) exists."""
    unused = [p for p in ALLOWED if not any(re.search(p, c.flat) for c in COMMANDS)]
    assert not unused, f"ALLOWED entries that match no documented command: {unused}"
    for module, function in re.findall(r"(tests/\w+\.py)::(\w+)", " ".join(ALLOWED.values())):
        assert f"def {function}(" in (REPO / module).read_text(), f"{module}::{function} (named in ALLOWED) is gone"


@pytest.mark.slow
@pytest.mark.parametrize("command", _params())
def test_documented_command_runs(command: Command, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    world: World = request.getfixturevalue("docs_world")
    text = world.fill(command, request, tmp_path)
    workdir = world.project(tmp_path)
    if command.tool == "flwr run":
        if command.flat.startswith("flwr run . fedul-prod "):
            _run_in_deployment(command, text, world, request.getfixturevalue("docs_deployment"), workdir)
        else:
            _run_in_simulation(command, text, world, request.getfixturevalue("docs_superlink"), workdir)
        return
    if command.tool == "fedul reproduce":
        run_id = _first_run(command, text, workdir)
        text = _append(text, f"--runs {shlex.quote(run_id)} --set num-rounds=1")
    elif command.tool == "fedul compare":
        text = _append(text, "--rounds 1 --seeds 0")
    elif command.tool == "fedul benchmark" and "--render" not in command.flat and "--quick" not in command.flat:
        text = _append(text, "--quick")
    done = world.bash(text, workdir, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{command.id}: exit code {done.returncode} of\n{text}\n{out[-6000:]}"
    if command.tool == "fedul reproduce":  # --out is relative (the project copy) or under /tmp (tmp_path/tmp)
        assert list(tmp_path.rglob(f"records/{run_id}.json")), f"{command.id}: no record of {run_id}\n{out[-4000:]}"


# --------------------------------------------------------------------------- filling and running


def _append(text: str, extra: str) -> str:
    """``text`` with ``extra`` arguments at the end of the command (before a trailing ``# comment``)."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and i and text[i - 1] in " \t":
            return f"{text[:i].rstrip()} {extra}  {text[i:]}"
    return f"{text.rstrip()} {extra}"


def _with_rounds(text: str, rounds: int) -> str:
    """``flwr run`` text whose ``--run-config`` sets ``num-rounds=<rounds>`` (replaced or added;
    ``--run-config "num-rounds=<rounds>"`` added where there is none)."""
    found = re.search(r"--run-config\s+(['\"])(.*?)\1", text, flags=re.S)
    if not found:
        return _append(text, f'--run-config "num-rounds={rounds}"')
    inner = found.group(2)
    inner = re.sub(r"\bnum-rounds=\d+", f"num-rounds={rounds}", inner) if "num-rounds=" in inner else f"{inner} num-rounds={rounds}"
    return text[: found.start(2)] + inner + text[found.end(2) :]


def _first_run(command: Command, text: str, workdir: Path) -> str:
    """The first run ``fedul reproduce`` would start for ``text`` (its own ``--list``, in process)."""
    from fedul_flwr.cli import build_parser

    argv = shlex.split(text.replace("\\\n", " "), comments=True)
    assert argv[:2] == ["fedul", "reproduce"], argv
    cwd = Path.cwd()
    listed = io.StringIO()
    try:
        os.chdir(workdir)  # relative --out folders are the command's
        args = build_parser().parse_args(argv[1:])
        args.list = True
        with contextlib.redirect_stdout(listed):
            assert args.run(args) == 0
    finally:
        os.chdir(cwd)
    runs = [line.split()[0] for line in listed.getvalue().splitlines() if " clients " in line]
    assert runs, f"{command.id}: lists no run\n{listed.getvalue()}"
    return runs[0]


def _stream_checks(command: Command, out: str, rounds: int) -> Path:
    """What a ``flwr run --stream`` of ``rounds`` rounds prints (simulation.md, "What a run
    prints"); returns the run folder its summary line names."""
    lines = printed_lines(out)
    assert len(lines) <= 20 + rounds, f"{command.id}: {len(lines)} lines\n{out}"
    assert [int(r) for r in re.findall(rf"round (\d+)/{rounds}: test-accuracy \d+\.\d\d%", out)] == list(range(rounds + 1)), out
    summary = re.search(rf"^fedul-flwr: method=\S+ .* rounds={rounds} failed-replies=0 .* run-dir=(\S+) status=ok$", out, re.M)
    assert summary, f"{command.id}: no summary line\n{out[-4000:]}"
    for noise in ("Traceback", "FutureWarning", "DeprecationWarning"):
        assert noise not in out, f"{command.id}: {noise}\n{out[-4000:]}"
    return Path(summary.group(1))


def _check_run_folder(command: Command, run_dir: Path, rounds: list[int], text: str) -> None:
    """The run folder of a documented run: the command's ``--run-config`` values in its
    config.json, the metric table of ``rounds``, a trained model."""
    from flwr.common.config import parse_config_args

    given = re.search(r"--run-config\s+(['\"])(.*?)\1", text, flags=re.S)
    config = json.loads((run_dir / "config.json").read_text())
    for key, value in (parse_config_args([given.group(2)]) if given else {}).items():
        assert key == "resume" or str(config.get(key)) == str(value), (command.id, key, value, config.get(key))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [row["round"] for row in metrics] == rounds, (command.id, metrics)
    assert metrics[1]["test-loss"] != metrics[0]["test-loss"], f"{command.id}: round 1 did not change the model"
    assert (run_dir / "model.pt").is_file(), command.id


def _status(link: SuperLink, run_id: str) -> str:
    listed = link.flwr("ls", link.connection, "--run-id", run_id, "--format", "json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    return str(json.loads(listed.stdout)["runs"][0]["status"])


def _run_in_simulation(command: Command, text: str, world: World, link: SuperLink, workdir: Path) -> None:
    text = _with_rounds(text, 1)
    done = world.bash(text, workdir, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{command.id}: exit code {done.returncode}\n{out[-4000:]}"
    started = re.search(r"Successfully started run (\d+)", out)
    assert started, f"{command.id}: no run started\n{out[-4000:]}"
    status = _status(link, started.group(1))
    assert status == "finished:completed", f"{command.id}: {status}\n{text}\n{out[-6000:]}"
    run_dir = _stream_checks(command, out, 1)
    _check_run_folder(command, run_dir, [0, 1], text)


def _run_in_deployment(command: Command, text: str, world: World, dep: Deployment, workdir: Path) -> None:
    """A ``flwr run . fedul-prod`` command against the loopback deployment. The resume command
    (``resume=true``, its other settings printed as ``...``: those of the page's first
    fedul-prod run) continues a one-round run of its ``run-name``, submitted first, for one
    more round."""
    name = re.search(r'run-name="([^"]+)"', command.flat)
    if "resume=true" in command.flat:
        assert name, command.flat
        text = text.replace(" ...'", f" {dep.settings}'")
        first = world.bash(f"flwr run . fedul-prod --format json --run-config 'run-name=\"{name.group(1)}\" num-rounds=1 "
                           f"{dep.settings}'", workdir)  # fmt: skip
        record, log = dep.link.wait(str(json.loads(first.stdout)["run-id"]), timeout=300)
        assert record.get("status") == "finished:completed", (record, log[-4000:])
        text, rounds = _with_rounds(text, 2), [0, 1, 2]
    else:
        text, rounds = _with_rounds(text, 1), [0, 1]
    before = set(dep.runs.glob("*")) if dep.runs.exists() else set()
    done = world.bash(text, workdir)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{command.id}: exit code {done.returncode}\n{out[-4000:]}"
    if "--format json" in command.flat:
        run_id = str(json.loads(done.stdout)["run-id"])
    else:
        started = re.search(r"Successfully started run (\d+)", out)
        assert started, f"{command.id}: no run started\n{out[-4000:]}"
        run_id = started.group(1)
    record, log = dep.link.wait(run_id, timeout=300)
    assert record.get("status") == "finished:completed", f"{command.id}: {record}\n{text}\n{log[-6000:]}"
    if name:
        run_dir = dep.runs / name.group(1)
    else:
        (run_dir,) = set(dep.runs.glob("*")) - before
    _check_run_folder(command, run_dir, rounds, text)


# --------------------------------------------------------------------------- fixtures


@dataclass
class World:
    """What the commands run in: the environment (``HOME``, ``FLWR_HOME``, the local
    SuperLink's ports), the generated data and the placeholders' values."""

    root: Path
    env: dict[str, str]
    torchvision_root: Path
    feddb_root: Path  # Fashion-MNIST of 22,000 images: FedDB's CPU protocol takes 1000 per client of 20
    pets: Path
    xrays: Path  # an organisation's own image folder (two of the dataset's three classes)
    xrays_test: Path  # the run's image-folder dataset of those classes

    def project(self, tmp_path: Path) -> Path:
        """A fresh copy of the project for one command: the app's files (what ``flwr run .``
        bundles), ``scripts/`` and ``docs/benchmarks`` (what ``fedul benchmark --render`` reads)."""
        project = tmp_path / "project"
        shutil.copytree(app_dir(), project)
        shutil.copytree(REPO / "scripts", project / "scripts")
        shutil.copytree(REPO / "docs" / "benchmarks", project / "docs" / "benchmarks")
        return project

    def fill(self, command: Command, request: pytest.FixtureRequest, tmp_path: Path) -> str:
        """The command's text (as printed, setup prefix dropped) with its placeholders filled."""
        text = SETUP_PREFIX.sub("", command.text)
        if command.sources_env:
            text = f". scripts/flower-env.sh\n{text}"
        root = self.feddb_root if re.search(r"--grid feddb-|preset='feddb-cpu'", command.flat) else self.torchvision_root
        values = {"/path/to/torchvision-root": root, "/data/torchvision": root,
                  "/data/pets": self.pets, "/data/xrays": self.xrays, "/data/xrays-test": self.xrays_test,
                  "/srv/": f"{self.root}/srv/", "/tmp/": f"{tmp_path}/tmp/",
                  '"$FEDUL_NODES"': f'"{tmp_path}/fedul-nodes"'}  # fmt: skip
        if "/data/fedul-node" in text:
            values["/data/fedul-node"] = request.getfixturevalue("cifar10_node" if "cifar10" in text else "mnist_node")
        pattern = "|".join(rf"(?<![\w/.-]){re.escape(p)}" for p in sorted(values, key=len, reverse=True))
        text = re.sub(pattern, lambda m: str(values[m.group(0)]), text)  # one pass: no value is filled again
        return text

    def bash(self, text: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", text], cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout)


def _write_torchvision_root(root: Path, mnist: int = 3000, fashion: int = 3000) -> Path:
    """Tiny MNIST and Fashion-MNIST files as torchvision leaves them (extracted ``raw/*-ubyte``,
    which torchvision reads without a checksum): ``mnist`` / ``fashion`` training images, 500 test."""
    from tests.test_datasets import _write_fake_mnist

    _write_fake_mnist(root, "MNIST", n_train=mnist, n_test=500, gz=False)
    _write_fake_mnist(root, "FashionMNIST", n_train=fashion, n_test=500, gz=False)
    return root


@pytest.fixture(scope="module")
def docs_world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """The environment of the commands and the data their placeholders stand for."""
    from tests.test_user_datasets import PETS, _image_folder

    root = tmp_path_factory.mktemp("docs-commands")
    torchvision_root = _write_torchvision_root(root / "torchvision-root")
    feddb_root = _write_torchvision_root(root / "torchvision-root-feddb", mnist=100, fashion=22000)
    pets = _image_folder(root / "pets", per_class=100)  # 5 nodes x 10 non-empty U sets
    xrays, xrays_test = _image_folder(root / "xrays", PETS[:2], per_class=4), _image_folder(root / "xrays-test", per_class=10)
    home = root / "home"
    (home / ".flwr").mkdir(parents=True)
    env = {k: v for k, v in flower_env(home / ".flwr").items() if k != "FEDUL_FLWR_ENV"}
    port = free_port()
    env.update(
        HOME=str(home),
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(port),
        FLWR_LOCAL_CONTROL_API_PORT=str(free_port()),
        COLUMNS="250",
    )
    env.pop("RAY_ADDRESS", None)
    # Flower's default configuration ("local": the local SuperLink), as the first command would write it
    subprocess.run([str(BIN / "flwr"), "config", "ls"], env=env, cwd=root, capture_output=True, check=True, timeout=120)
    return World(root=root, env=env, torchvision_root=torchvision_root, feddb_root=feddb_root, pets=pets, xrays=xrays,
                 xrays_test=xrays_test)


@pytest.fixture(scope="module")
def docs_superlink(docs_world: World) -> Iterator[SuperLink]:
    """The local SuperLink of the module's ``FLWR_HOME``, started as ``flwr run .`` starts it
    (flwr/cli/local_superlink.py) on the module's ports, so every ``flwr run .`` of the docs
    finds it answering there and submits to it; its simulations join one Ray node of this
    machine's cores (``RAY_ADDRESS``: Ray's start, ~5 s a run, is paid once). Both are
    stopped (their process groups) at the end."""
    env = docs_world.env
    home = Path(env["FLWR_HOME"]) / "local-superlink"
    home.mkdir(parents=True, exist_ok=True)
    port = env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"]
    cmd = [str(BIN / "flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
           "--control-api-address", f"127.0.0.1:{env['FLWR_LOCAL_CONTROL_API_PORT']}",
           "--host", "127.0.0.1", "--port", port, "--log-file", str(home / "superlink.log"),
           "--database", str(home / "state.db")]  # fmt: skip
    with ray_cluster(nodes=1, cpus_per_node=len(os.sched_getaffinity(0))) as ray:
        with serving(cmd, {**env, "RAY_ADDRESS": ray.address}, docs_world.root, int(port), home / "superlink.log",
                     connection="local") as link:  # fmt: skip
            yield replace(link, env=env)  # the commands' environment has no RAY_ADDRESS


def _write_nodes(out: Path, run_config: str, nodes: int = 1, max_set_size: int = 5) -> Path:
    from fedul_flwr.node_data_cli import main

    assert main(["write", "--out", str(out), "--num-nodes", str(nodes), "--max-set-size", str(max_set_size),
                 "--run-config", run_config]) == 0  # fmt: skip
    return out


@pytest.fixture(scope="module")
def mnist_node(docs_world: World) -> Path:
    """A node folder of MNIST's shape and classes (``fedul node-data write`` from the embedded sample)."""
    return _write_nodes(docs_world.root / "mnist-nodes", "num-sets=10") / "node-0"


@pytest.fixture(scope="module")
def cifar10_node(docs_world: World) -> Iterator[Path]:
    """A CIFAR-10 node folder with the classes docs/deployment.md's validate command names
    (``fedul node-data write`` from generated CIFAR-10 files, their md5s registered in
    torchvision's checksum attributes for the write, as tests/test_datasets.py does)."""
    from fedul_flwr.data import datasets as D
    from tests.test_datasets import _register_checksums, _write_fake_cifar_tar

    root = docs_world.root / "cifar10-root"
    root.mkdir()
    _write_fake_cifar_tar(root, n_per_batch=50)
    with pytest.MonkeyPatch.context() as mp:
        _register_checksums(mp, "CIFAR10", root, root / "staging" / "cifar-10-batches-py")
        mp.setenv("FEDUL_CACHE_DIR", str(docs_world.root / "cache"))
        try:
            folder = _write_nodes(docs_world.root / "cifar-nodes", f'dataset="cifar10" data-dir="{root}" '
                                  'class-names="a,b,c,d,e,f,g,h,i,j" num-sets=10')  # fmt: skip
        finally:
            D._load_cached.cache_clear()  # nothing of the patched load stays in the worker
    yield folder / "node-0"


@dataclass
class Deployment:
    """The loopback deployment behind the ``fedul-prod`` connection."""

    link: SuperLink
    runs: Path
    settings: str  # the settings of docs/deployment.md's first fedul-prod run, for the resume command's "..."


@pytest.fixture(scope="module")
def docs_deployment(docs_world: World) -> Iterator[Deployment]:
    """docs/deployment.md's setup on loopback: ``server.example.org:9092`` is a SuperLink on a
    free port of 127.0.0.1 with three SuperNodes on folders of ``fedul node-data write``, and
    the ``[superlink.fedul-prod]`` connection of the page (its address filled in) is in the
    commands' ``$FLWR_HOME/config.toml``."""
    from tests.test_deployment import _Federation

    root = docs_world.root / "deployment"
    nodes = _write_nodes(root / "nodes", "num-sets=10", nodes=3, max_set_size=20)
    fed = _Federation(root, [nodes / f"node-{i}" for i in range(3)])
    try:
        config = Path(docs_world.env["FLWR_HOME"]) / "config.toml"
        config.write_text(config.read_text() + f'\n[superlink.fedul-prod]\naddress = "127.0.0.1:{fed.port}"\ninsecure = true\n')
        runs = docs_world.root / "srv" / "fedul-runs"
        link = SuperLink(process=fed.procs["superlink"], connection="fedul-prod", env=docs_world.env, log_file=root / "superlink.log")
        yield Deployment(link=link, runs=runs, settings=f'num-sets=10 min-available-nodes=3 min-train-nodes=3 output-dir="{runs}"')
    finally:
        fed.close()
