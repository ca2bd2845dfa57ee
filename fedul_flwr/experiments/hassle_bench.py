"""The ``hassle`` section of ``fedul benchmark``: a HASSLE round of this checkout against the
same round of a git revision, measured in one run, with the numbers of both compared.

Two worker processes run the same federation in process (the real ServerApp and ClientApp
through :class:`~fedul_flwr.inprocess.InProcessGrid`, no Ray): one imports this checkout's
``fedul_flwr``, the other the package as it was at git revision ``--hassle-baseline`` (its
``fedul_flwr``, ``pyproject.toml`` and ``conf`` exported by ``git archive``). Each worker stops
before every round's training and waits; the benchmark lets one worker run one round (its
clients' local updates, the aggregation and the central evaluation), then the other, the
order alternating round by round (old, new; new, old; ...), so that the machine's load drifts
over both alike. A round's time is from its release to the worker's next stop; round 1 (which
builds the clients' data) and the last round (which also writes the run's outputs) are
reported but left out of the medians.

Both runs use the same run configuration (default: the ``hassle`` preset on Fashion-MNIST
from ``--data-dir``, 8 of 20 clients per round, one torch thread, ``client-threads = 1``), so
they draw the same random numbers in the same order; the section reports the largest
difference between their per-round metrics and between their final models' weights.

Run::

    fedul benchmark --only hassle --data-dir /path/to/torchvision-root --hassle-rounds 6 \\
        --markdown docs/benchmarks/hassle.md --out docs/benchmarks/hassle.json

:func:`run_pair` is also what the test of equal numbers runs (on ``mnist-sample``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping
from io import BytesIO
from pathlib import Path
from statistics import median
from typing import IO, Any

import torch
from flwr.app import MessageType

PROJECT = Path(__file__).resolve().parents[2]
"""The source checkout (its git history holds the baseline)."""

BASELINE_REVISION = "c3b3bd1bf2a160f61ca07b2d09efb49f5c50728a"
"""The last commit before HASSLE's round was made faster (the teachers' logits once per
round, in the loop's memory format; the evaluation's logits reused across rounds)."""

LAST_OLD_STREAMS_REVISION = "a043696decad9e0199dbe3e1c073b4b15c41b956"
"""The last commit whose seed streams are the baseline's: the next one keyed the streams that
could meet another (:mod:`fedul_flwr.rng`), which moves the client data, the labeled pools and
the models after the first, so numbers are compared with the baseline at this commit (it holds
the faster round)."""

PREFIX = "hassle-bench:"
"""Lines of the workers' protocol on their standard output start with this."""

SIDES = ("baseline", "current")


def export_revision(revision: str, root: Path = PROJECT) -> Path:
    """``fedul_flwr``, ``pyproject.toml`` and ``conf`` of git ``revision`` of the checkout
    ``root``, extracted to a new temporary folder (which becomes the worker's PYTHONPATH).

    Raises
    ------
    SystemExit
        If git cannot export that revision (no git, not a checkout, an unknown revision).
    """
    try:
        tar = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", revision, "fedul_flwr", "pyproject.toml", "conf"],
                             capture_output=True, check=False)  # fmt: skip
    except FileNotFoundError as exc:
        raise SystemExit(f"--hassle-baseline {revision}: git is not installed ({exc})") from exc
    if tar.returncode:
        raise SystemExit(f"--hassle-baseline {revision}: {tar.stderr.decode().strip()}")
    out = Path(tempfile.mkdtemp(prefix=f"fedul-baseline-{revision[:8]}-"))
    with tarfile.open(fileobj=BytesIO(tar.stdout)) as archive:
        archive.extractall(out, filter="data")
    return out


class _Worker:
    """One worker process (this module run as a script) and its protocol lines."""

    def __init__(
        self, side: str, tree: Path, run_config: Mapping[str, Any], nodes: int, threads: int, gate: bool, log: Path
    ) -> None:  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
        self.side = side
        self._log = log.open("w")
        argv = [str(Path(__file__).resolve()), "--worker", json.dumps(dict(run_config)), "--nodes", str(nodes), "--threads", str(threads),
                *(["--gate"] if gate else [])]  # fmt: skip
        # this file as a script, from the tree: ``fedul_flwr`` is the tree's (the baseline's or this checkout's)
        start = f"import runpy, sys; sys.argv = {argv!r}; runpy.run_path(sys.argv[0], run_name='__main__')"
        self.proc = subprocess.Popen([sys.executable, "-c", start], cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True)  # fmt: skip

    def read(self) -> tuple[str, str]:
        """The next protocol line as (word, rest).

        Raises
        ------
        RuntimeError
            If the worker exits first (names its log).
        """
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                word, _, rest = line[len(PREFIX) :].strip().partition(" ")
                return word, rest
        self.proc.wait()
        raise RuntimeError(f"the {self.side} worker exited with {self.proc.returncode}; its log: {self._log.name}")

    def release(self) -> None:
        """Let the worker run its next round."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        """Wait for the worker; close its log."""
        self.proc.wait(timeout=60)
        self._log.close()


def run_pair(
    run_config: Mapping[str, Any], revision: str, *, num_nodes: int, threads: int = 1, gate: bool = True,
    workdir: Path | None = None, current: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run the federation of ``run_config`` with this checkout and with git ``revision``.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        The run configuration both run (dashed keys; ``output-dir`` and ``run-name`` are set
        here).
    revision : str
        The git revision of the baseline.
    num_nodes : int
        Nodes of the in-process federation.
    threads : int
        torch threads of each worker.
    gate : bool
        Run the two one round at a time, alternating, and time the rounds; ``False``: both at
        once, untimed (the comparison of numbers only).
    workdir : Path | None
        Where the runs and the workers' logs go (default: a temporary folder).
    current : str | None
        A git revision to run as the current side instead of this checkout (the comparison of
        numbers across a change of the seed streams, :data:`LAST_OLD_STREAMS_REVISION`).

    Returns
    -------
    dict
        ``round-s`` (per side: seconds of rounds 1, 2, ...; with ``gate``), ``metrics`` (per
        side: the per-round metric rows), ``models`` (per side: the final weights, name ->
        tensor), the ``baseline`` revision and ``threads``.

    Raises
    ------
    SystemExit
        If the revision cannot be exported.
    RuntimeError
        If a worker fails (names its log).
    """
    workdir = workdir or Path(tempfile.mkdtemp(prefix="fedul-hassle-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    trees = {"baseline": export_revision(revision), "current": export_revision(current) if current else PROJECT}
    workers = {
        side: _Worker(side, trees[side], {**run_config, "output-dir": str(workdir), "run-name": side}, num_nodes, threads,
                      gate, workdir / f"{side}.log")
        for side in SIDES
    }  # fmt: skip
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    done: dict[str, dict[str, Any]] = {}
    try:
        if gate:
            state = {side: workers[side].read() for side in SIDES}  # both wait before round 1
            rnd = 0
            while len(done) < len(SIDES):
                rnd += 1
                for side in SIDES if rnd % 2 else SIDES[::-1]:
                    if side in done:
                        continue
                    start = time.perf_counter()
                    workers[side].release()
                    state[side] = workers[side].read()
                    times[side].append(time.perf_counter() - start)
                    if state[side][0] == "done":
                        done[side] = json.loads(state[side][1])
        else:
            for side in SIDES:
                word, rest = workers[side].read()
                done[side] = json.loads(rest)
    finally:
        for worker in workers.values():
            if worker.proc.poll() is None and len(done) < len(SIDES):
                worker.proc.kill()
            worker.close()
        with contextlib.suppress(OSError):
            # deferred: the workers run this file against the baseline revision's package (_worker), which lacks it
            from fedul_flwr.store import remove_tree

            remove_tree(trees["baseline"])  # the exported revision, a temporary tree
    models = {
        side: {f"{name}.{k}": v for name, path in done[side]["models"].items() for k, v in torch.load(path).items()}
        for side in SIDES
    }
    return {"baseline": revision, "threads": threads, "round-s": times, "metrics": {s: done[s]["rows"] for s in SIDES},
            "models": models, "workdir": str(workdir)}  # fmt: skip


def differences(pair: Mapping[str, Any]) -> dict[str, float]:
    """The largest absolute differences between the two sides of :func:`run_pair`: of the
    accuracies (``accuracy``, over every predictor and round), of the losses (``loss``,
    test losses of every predictor and the train loss) and of the final weights
    (``weights``, over every model).

    Raises
    ------
    ValueError
        If the sides recorded different rounds, metrics or models.
    """
    rows = {s: {int(r["round"]): r for r in pair["metrics"][s]} for s in SIDES}
    if rows["baseline"].keys() != rows["current"].keys():
        raise ValueError(f"the runs recorded different rounds: {sorted(rows['baseline'])} vs {sorted(rows['current'])}")
    out = {"accuracy": 0.0, "loss": 0.0, "weights": 0.0}
    for rnd, old in rows["baseline"].items():
        new = rows["current"][rnd]
        keys = {k for k in (*old, *new) if "accuracy" in k or "loss" in k}
        if any(k not in old or k not in new for k in keys):
            raise ValueError(f"round {rnd}: the runs recorded different metrics: {sorted(keys - (old.keys() & new.keys()))}")
        for k in keys:
            kind = "accuracy" if "accuracy" in k else "loss"
            out[kind] = max(out[kind], abs(float(old[k]) - float(new[k])))
    old_models, new_models = pair["models"]["baseline"], pair["models"]["current"]
    if old_models.keys() != new_models.keys():
        raise ValueError(f"the runs saved different weights: {sorted(old_models.keys() ^ new_models.keys())}")
    for k, v in old_models.items():
        out["weights"] = max(out["weights"], float((v.float() - new_models[k].float()).abs().max()))
    return out


def section_hassle(args: argparse.Namespace) -> dict[str, Any]:
    """The section (module docstring).

    Raises
    ------
    SystemExit
        Without ``--data-dir`` for a dataset that needs one, or if the baseline cannot be
        exported.
    """
    run_config: dict[str, Any] = {"preset": "hassle", "num-rounds": args.hassle_rounds, "client-threads": args.hassle_threads}
    if args.hassle_dataset:
        run_config["dataset"] = args.hassle_dataset
    if args.data_dir:
        run_config["data-dir"] = args.data_dir
    # deferred: the workers run this file against the baseline revision's package (_worker), whose modules differ
    from fedul_flwr.preflight import resolve_config

    cfg = resolve_config(run_config)  # refuses a bad setting before any worker starts
    if cfg.dataset != "mnist-sample" and not cfg.data_dir:
        raise SystemExit(f"--only hassle: dataset {cfg.dataset!r} needs --data-dir (a torchvision root)")
    if args.hassle_rounds < 3:
        raise SystemExit(f"--hassle-rounds={args.hassle_rounds}: needs >= 3 (round 1 and the last round are not counted)")
    pair = run_pair(run_config, args.hassle_baseline, num_nodes=args.hassle_nodes, threads=args.hassle_threads)
    steady = {s: pair["round-s"][s][1:-1] for s in SIDES}
    medians = {s: median(v) for s, v in steady.items()}
    paired = [b / c for b, c in zip(steady["baseline"], steady["current"], strict=True)]
    out = {
        "setting": {"preset": "hassle", "dataset": cfg.dataset, "nodes": args.hassle_nodes,
                    "fraction-train": cfg.fraction_train, "rounds": cfg.num_rounds, "threads": args.hassle_threads,
                    "baseline": args.hassle_baseline, "precision": cfg.precision, "memory-format": cfg.memory_format},
        "round-s": pair["round-s"], "median-s": medians, "speedup": medians["baseline"] / medians["current"],
        "median-paired-speedup": median(paired), "differences": differences(pair),
    }  # fmt: skip
    print(f"hassle: round {medians['baseline']:.2f} s at {args.hassle_baseline[:8]}, {medians['current']:.2f} s now: "
          f"x{out['speedup']:.2f}; largest differences {out['differences']}", flush=True)  # fmt: skip
    return out


def hassle_markdown(section: Mapping[str, Any]) -> str:
    """The section's results as a short markdown paragraph and table."""
    # deferred: the workers run this file against the baseline revision's package (_worker), whose modules differ
    from fedul_flwr.experiments.tables import markdown_table

    s, d = section["setting"], section["differences"]
    rounds = len(section["round-s"]["current"])
    rows = [[side, *(f"{t:.2f}" for t in section["round-s"][side]), f"**{section['median-s'][side]:.2f}**"] for side in SIDES]
    rows[0][0] = f"`{s['baseline'][:8]}` (before)"
    rows[1][0] = "this checkout"
    head = ["code", *(f"round {r}" for r in range(1, rounds + 1)), f"median, rounds 2-{rounds - 1}"]
    return "\n".join([
        f"HASSLE, the `hassle` preset on `{s['dataset']}` ({s['nodes']} clients, {s['fraction-train']:g} of them per round), "
        f"{s['threads']} torch thread(s) per run, the two runs one round at a time, alternating; seconds per round "
        "(local updates, aggregation and central evaluation):", "",
        markdown_table(head, rows), "",
        f"Speed-up: **{section['speedup']:.2f}x** (ratio of the medians; median of the per-round ratios "
        f"{section['median-paired-speedup']:.2f}x). Largest differences between the two runs: test accuracy "
        f"{d['accuracy']:.2g}, losses {d['loss']:.2g}, final weights {d['weights']:.2g}.",
    ])  # fmt: skip


# --------------------------------------------------------------------------- the worker


def _worker(run_config: dict[str, Any], num_nodes: int, threads: int, gate: bool, out: IO[str]) -> None:
    """Run the federation in this process (whichever ``fedul_flwr`` PYTHONPATH gives); with
    ``gate``, stop before every round's training until a line arrives on stdin. Prints
    ``ready`` at every stop and, at the end, ``done`` with the metric rows and the paths of the
    final models."""
    # deferred: this runs in a worker against either package (this checkout's or the baseline revision's)
    from fedul_flwr.client_app import app
    from fedul_flwr.inprocess import InProcessGrid
    from fedul_flwr.server_app import run_federation

    try:
        from fedul_flwr.preflight import resolve_config  # deferred: as above
    except ModuleNotFoundError:  # the baseline revision names the module fedul_flwr.checks
        from fedul_flwr.checks import resolve_config  # type: ignore[no-redef]  # deferred: as above

    torch.set_num_threads(threads)

    class GatedGrid(InProcessGrid):
        def push_messages(self, messages: Any) -> Any:
            messages = list(messages)
            if gate and any(m.metadata.message_type == MessageType.TRAIN for m in messages):
                out.write(f"{PREFIX}ready\n")
                out.flush()
                sys.stdin.readline()
            return super().push_messages(messages)

    cfg = resolve_config(run_config)
    outputs = run_federation(GatedGrid(app, num_nodes, run_config), cfg)
    rows = [outputs.rows[r] for r in sorted(outputs.rows)]
    models = {p.stem: str(p) for p in sorted(outputs.path.glob("model*.pt"))}
    out.write(f"{PREFIX}done {json.dumps({'rows': rows, 'models': models}, default=float)}\n")
    out.flush()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="a worker of the hassle benchmark section")
    parser.add_argument("--worker", required=True, help="the run configuration (JSON)")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gate", action="store_true")
    ns = parser.parse_args()
    _worker(json.loads(ns.worker), ns.nodes, ns.threads, ns.gate, sys.stdout)
