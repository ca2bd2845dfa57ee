"""The peer benchmark: pfl-research, this project's in-process engine and Flower's Ray simulation
on one workload, on the same machine and threads (``fedul benchmark --only peers``).

The default workload is pfl-research's CIFAR-10 benchmark (``benchmarks/image_classification/
configs/baseline.yaml`` of its repository; Granqvist et al., *pfl-research: simulation framework
for accelerating research in private federated learning*, NeurIPS 2024 datasets track):
``simple-cnn`` (:func:`fedul_flwr.models.simple_cnn`), 1000 users x 50 images, a cohort of 50
users per central iteration, local SGD (lr 0.1, batch 10, 1 local epoch, no momentum), FedAvg
with uniform weights and central lr 1.0, float32. The images are ``synthetic-cifar``
(:mod:`fedul_flwr.data.synthetic`, offline) unless ``--peers-dataset cifar10 --data-dir``. The
model, users, cohort, images per user, batch, epochs and learning rate are options
(:mod:`fedul_flwr.experiments.peers_workload`: ``--peers-<key>`` flags or a YAML file). Every
system starts from the same initial weights (this project's seed) and trains the same users'
images (this project's IID partition, handed to pfl as its users).

The systems:

- **pfl**: pfl-research 0.6.0's ``SimulatedBackend`` with its ``PyTorchModel`` and
  ``FederatedAveraging`` (:mod:`fedul_flwr.experiments.pfl_driver`), in its own Python
  (``--pfl-python``): pfl pins ``dp-accounting<0.6``, this project needs 0.6. Set up beside the
  checkout (:data:`PFL_SETUP`; inside it, its 5.6 GB would slow every ``flwr run .``, whose
  ``flwr build`` walks every file of the app folder). ``simple-cnn`` is built by the driver
  and loaded with the engine's weights; another model goes to the driver as TorchScript.
  Its torch threads: ``torch.set_num_threads(T)`` (pfl's multi-worker mode needs Horovod,
  which does not install here; on one machine without it pfl trains one user after another).
- **engine**: this project's ServerApp and ClientApp through the in-process grid
  (:class:`~fedul_flwr.inprocess.InProcessGrid`; ``method = "supervised"``,
  ``aggregation-weights = "uniform"``, ``evaluate-every`` past the timed rounds), on the
  cohort path ``cohort = "auto"`` picks (:func:`fedul_flwr.execution.cohort_path`: with T >= 2
  threads on a CPU, T clients at once, one thread each; on a GPU the batched cohort). Also
  with ``precision = "auto"`` (bf16 autocast where the CPU has it), with ``method = "fedul"``
  (the same images as 10 U sets of 5 per user), at T >= 2 one client after another on all T
  threads, and at T = 1 on the batched path (``--peers-batched``: the GPU's path, timed on the
  CPU too).
- **ray**: ``flwr run .`` of this app on a fresh local SuperLink (Flower's Ray backend, the
  test suite's harness), the engine's settings; at T = 1 one actor with one torch thread
  (``client-resources-num-cpus`` = the machine's cores, ``client-threads = 1``), at T >= 2
  T actors of one thread.

Timing. pfl and the engine alternate iteration by iteration in one process pair: the engine's
grid runs one pfl iteration (the driver blocks on its input between iterations) right before
each of its own rounds, so both see the same machine state, load drift included. An engine
round is timed from the end of that pfl iteration to the start of the next (training,
aggregation, the run's records and checkpoint); a pfl iteration from its ``go`` to pfl's
``after_central_iteration``. The first ``--peers-warmup`` iterations of each are left out
(start-up, first visits). Ray runs on its own afterwards (a separate process tree); its
per-round times are the differences of its ``metrics.json`` wall times, round 1 (actor start)
and its last round (the final central evaluation, which no timed engine round holds) left
out (:func:`~fedul_flwr.experiments.peers_stats.rounds_without_evaluation`). pfl / engine is
the median of the per-pair ratios of interleaved pfl iterations and engine rounds, one pair per
timed engine round (:mod:`fedul_flwr.experiments.peers_stats`); the other columns are medians.

Accuracy. After the same iterations pfl and the engine report their central model's test
accuracy (different random streams for sampling, data order and dropout, so a few points
apart at most), and Ray the last round's: the check that the comparison is of equal work.

Breakdown. During the sequential engine phase (T = 1) the grid also times every ClientApp call
and, inside it, ``train_local`` (the forward/backward/optimizer loop): the rest of a call is the
ClientApp's overhead (message decoding, the client's data and models, the reply's arrays), and
the rest of a round the server's (sampling, aggregation, records, checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Message, MessageType

from fedul_flwr.client_app import app
from fedul_flwr.data.simulated import client_rows, load_run_dataset
from fedul_flwr.execution import cohort_path
from fedul_flwr.experiments.bench_core import say
from fedul_flwr.experiments.flwr_timing import PROJECT, flwr_run
from fedul_flwr.experiments.peers_stats import median, paired_ratio, rounds_without_evaluation, summarize, timed_pairs
from fedul_flwr.experiments.peers_workload import PeersWorkload, add_workload_arguments, engine_settings, resolve_workload
from fedul_flwr.experiments.tables import markdown_table
from fedul_flwr.experiments.timing import timed_train_local
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import get_method
from fedul_flwr.preflight import resolve_config
from fedul_flwr.server_app import global_models, run_federation
from fedul_flwr.store import write_atomic

DRIVER = Path(__file__).with_name("pfl_driver.py")
PFL_VENV = PROJECT.parent / "pfl-venv"
"""pfl-research's environment: beside the checkout, never inside it (``flwr build`` would walk its
5.6 GB on every ``flwr run .``); ``--pfl-python``'s default is its ``bin/python``."""
PFL_SETUP = 'python3.11 -m venv ../pfl-venv && ../pfl-venv/bin/pip install "pfl[pytorch]==0.6.0"'
"""The one command, run in the checkout, that sets up pfl-research's environment at :data:`PFL_VENV`."""


class PacedGrid(InProcessGrid):
    """The in-process grid that runs another system's iteration (``pacer``) before each of its
    rounds and times its own rounds and ClientApp calls around it (module docstring).

    Attributes
    ----------
    round_s : list[float]
        Seconds of each finished round (train, aggregation, records), the pacer left out.
    call_s, train_s : list[list[float]]
        Per round: seconds of every ClientApp call and of every ``train_local`` in them.
    """

    def __init__(self, *args: Any, pacer: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pacer = pacer
        self.round_s: list[float] = []
        self.call_s: list[list[float]] = []
        self.train_s: list[list[float]] = []
        self._resumed: float | None = None

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """A round's training messages: close the previous round's clock, run the pacer, go."""
        messages = list(messages)
        if messages and messages[0].metadata.message_type == MessageType.TRAIN:
            if self._resumed is not None:
                self.round_s.append(time.perf_counter() - self._resumed)
            self.pacer()
            self.call_s.append([])
            self.train_s.append([])
            self._resumed = time.perf_counter()
        return super().send_and_receive(messages, timeout=timeout)

    def _call(self, msg: Message) -> Message:
        start = time.perf_counter()
        try:
            return super()._call(msg)
        finally:
            if self.call_s:
                self.call_s[-1].append(time.perf_counter() - start)


class PflProcess:
    """pfl-research's driver (:mod:`fedul_flwr.experiments.pfl_driver`) as a subprocess.

    Raises
    ------
    RuntimeError
        If the driver exits or answers something else than expected (its error output quoted).
    """

    def __init__(self, python: str, spec: Path) -> None:
        self.process = subprocess.Popen([python, str(DRIVER), str(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, bufsize=1)  # fmt: skip
        self._errors: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        self.ready = self._answer("ready")
        self.seconds: list[float] = []

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._errors.append(line)
            del self._errors[:-40]

    def _answer(self, key: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                reply = json.loads(line)
                if key in reply:
                    return reply
        self.process.wait()
        raise RuntimeError(f"pfl driver exited ({self.process.returncode}) before {key!r}: {''.join(self._errors)[-2000:]}")

    def _send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def iterate(self) -> float:
        """Run one central iteration; return its seconds."""
        self._send("go")
        seconds = float(self._answer("iteration")["seconds"])
        self.seconds.append(seconds)
        return seconds

    def accuracy(self) -> float:
        """The central model's test accuracy now (in [0, 1])."""
        self._send("eval")
        return float(self._answer("test-accuracy")["test-accuracy"])

    def close(self) -> None:
        """Stop the driver."""
        if self.process.poll() is None:
            self._send("stop")
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()


def pfl_spec(cfg_values: Mapping[str, Any], workdir: Path, threads: int, w: PeersWorkload) -> tuple[Path, np.ndarray]:
    """Write what pfl's driver needs (the images as uint8, the users' rows, the engine's initial
    model, a probe batch); return the spec's path and the engine's probe logits.

    ``simple-cnn`` goes as its weights (the driver builds pfl's ``simple_cnn`` and loads them
    strictly); another model as TorchScript (``torch.jit.script``), which the driver loads
    without this project.

    Raises
    ------
    SystemExit
        If users of the partition hold different numbers of images, or the model cannot be
        scripted.
    """
    cfg = resolve_config(dict(cfg_values))
    data = load_run_dataset(cfg)
    rows = [client_rows(cfg, k, w.users)[0].tolist() for k in range(w.users)]
    sizes = sorted({len(r) for r in rows})
    if len(sizes) != 1:
        raise SystemExit(f"peers: the partition gives users {sizes[0]}..{sizes[-1]} images; set --peers-images-per-user "
                         f"<= {sizes[0]} so that every user holds as many")  # fmt: skip
    workdir.mkdir(parents=True, exist_ok=True)
    data_path, initial = workdir / "pfl-data.npz", workdir / "pfl-initial.pt"
    if not data_path.exists():
        write_atomic(data_path, lambda fh: np.savez(fh, train_x=data.train_x.numpy(), train_y=data.train_y.numpy(), test_x=data.test_x.numpy(),
                 test_y=data.test_y.numpy(), probe_x=data.test_x[:8].numpy()))  # fmt: skip
    model = global_models(cfg, get_method(cfg.method)(cfg), data.in_channels, data.num_classes, data.image_size)["f"]
    if w.model == "simple-cnn":
        write_atomic(initial, lambda fh: torch.save(model.state_dict(), fh))
    else:
        try:
            scripted = torch.jit.script(model)
        except Exception as exc:  # noqa: BLE001 -- TorchScript's errors are many kinds
            raise SystemExit(f"--peers-model {w.model}: cannot go to pfl's driver as TorchScript "
                             f"({' '.join(str(exc).split())[:200]})") from None  # fmt: skip
        initial = workdir / f"pfl-model-{w.model}.pt"
        write_atomic(initial, lambda fh: torch.jit.save(scripted, fh))
    model.eval()
    with torch.no_grad():
        probe = model((data.test_x[:8].float() / 255 - torch.tensor(data.mean).view(1, -1, 1, 1)) / torch.tensor(data.std).view(1, -1, 1, 1))
    spec = {
        "data": str(data_path), "initial": str(initial), "users": rows, "num_classes": data.num_classes,
        "mean": list(data.mean), "std": list(data.std), "threads": threads, "seed": cfg.seed, "cohort": w.cohort,
        "batch_size": cfg.batch_size, "lr": cfg.lr, "local_epochs": cfg.local_epochs, "central_lr": 1.0,
        "model": "simple-cnn" if w.model == "simple-cnn" else "torchscript",
    }  # fmt: skip
    path = workdir / f"pfl-spec-{threads}.json"
    write_atomic(path, json.dumps(spec))
    return path, probe.numpy()


def engine_phase(values: Mapping[str, Any], users: int, threads: int, rounds: int, pacer: Callable[[], None],
                 workdir: Path, name: str) -> dict[str, Any]:  # fmt: skip
    """One engine run of ``rounds`` rounds on the paced grid; its times, path and accuracy.

    The run evaluates centrally at round 0 and its last round only, whose time is not taken
    (:class:`PacedGrid` closes a round's clock when the next starts): ``round-s`` holds
    ``rounds - 1`` times and ``pfl-round-s`` (the caller's) ``rounds`` iterations.
    """
    run = {**values, "num-rounds": rounds, "evaluate-every": rounds, "output-dir": str(workdir / "runs"),
           "run-name": f"{name}-{time.time_ns()}"}  # fmt: skip
    torch.set_num_threads(threads)
    cfg = resolve_config(run)
    path, workers = cohort_path(cfg.cohort, torch.device("cpu"), threads, cfg.client_threads)
    grid = PacedGrid(app, users, run, path=path, workers=workers, pacer=pacer)
    try:
        with timed_train_local(lambda seconds: grid.train_s[-1].append(seconds) if grid.train_s else None):
            outputs = run_federation(grid, cfg)
    finally:
        grid.close()
    last = outputs.rows[max(outputs.rows)]
    return {"round-s": grid.round_s, "call-s": grid.call_s, "train-s": grid.train_s, "cohort": grid.cohort_path,
            "clients-at-once": grid.workers, "test-accuracy": last.get("test-accuracy"), "run-dir": str(outputs.path)}  # fmt: skip


def ray_phase(values: Mapping[str, Any], users: int, threads: int, rounds: int, workdir: Path) -> dict[str, Any]:
    """``flwr run .`` of the workload (module docstring): ``rounds + 1`` rounds, the last one
    holding the final central evaluation, so that ``rounds`` of them are like the engine's
    timed rounds (``median-s``: rounds 2..``rounds``)."""
    cores = os.cpu_count() or 1
    total = rounds + 1
    run = {**values, "num-rounds": total, "evaluate-every": total}
    if threads == 1:
        run["client-threads"] = 1
        federation = f"num-supernodes={users} client-resources-num-cpus={cores} client-resources-num-gpus=0"
    else:
        federation = f"num-supernodes={users} client-resources-num-cpus={max(1, cores // threads)} client-resources-num-gpus=0"
    result = flwr_run(run, federation, workdir / f"ray-{threads}", timeout=3600, memory_every_s=5.0)
    result.pop("rounds", None)
    result.update({"federation-config": federation, "num-rounds": total, "evaluate-every": total})
    result["median-s"] = median(rounds_without_evaluation(result.get("round-s", []), total))
    return result


def check_peers_arguments(args: argparse.Namespace) -> None:
    """The peers options a run cannot take, refused before anything runs.

    Raises
    ------
    SystemExit
        Naming the option and the value (one line).
    """
    try:
        threads = [int(t) for t in args.peers_threads.split(",")]
    except ValueError:
        raise SystemExit(f"--peers-threads {args.peers_threads!r}: a comma list of thread counts (e.g. 1,2)") from None
    if not threads or min(threads) < 1:
        raise SystemExit(f"--peers-threads {args.peers_threads!r}: every thread count must be >= 1")
    resolve_workload(args)
    if args.peers_iterations < 1 or args.peers_warmup < 0 or args.peers_ray_rounds < 0:
        raise SystemExit("--peers-iterations must be >= 1, --peers-warmup and --peers-ray-rounds >= 0")
    if args.pfl_python and not Path(args.pfl_python).is_file():
        raise SystemExit(f"--pfl-python {args.pfl_python}: no such file (set up pfl-research's Python with: {PFL_SETUP})")


def add_peers_arguments(p: argparse.ArgumentParser) -> None:
    """The options of the ``peers`` section (the workload's: :mod:`~fedul_flwr.experiments.peers_workload`)."""
    p.add_argument("--pfl-python", default="", help=f"peers: pfl-research's Python (default: {PFL_VENV}/bin/python)")
    p.add_argument("--peers-threads", default="1,2", help="peers: torch thread counts measured (comma list)")
    p.add_argument("--peers-iterations", type=int, default=10, help="peers: timed iterations of each system per phase")
    p.add_argument("--peers-warmup", type=int, default=2, help="peers: iterations left out first")
    add_workload_arguments(p)
    p.add_argument("--peers-ray-rounds", type=int, default=6,
                   help="peers: timed rounds of the Ray run (0: none; it runs one more, with the final evaluation)")
    p.add_argument("--peers-precision", action=argparse.BooleanOptionalAction, default=True,
                   help="peers: also time the engine at precision=auto")
    p.add_argument("--peers-batched", action=argparse.BooleanOptionalAction, default=True,
                   help="peers: also time the engine's batched path (at one thread on a CPU)")


def section_peers(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The peer benchmark (module docstring): per thread count of ``--peers-threads``."""
    w = resolve_workload(args)
    timed, warm = args.peers_iterations, args.peers_warmup
    values = engine_settings(w, args.data_dir)
    python = args.pfl_python or str(PFL_VENV / "bin" / "python")
    has_pfl = Path(python).is_file()
    if not has_pfl:
        say(f"peers: no pfl-research Python at {python}: the pfl columns stay empty (set it up: {PFL_SETUP})")
    out: dict[str, Any] = {"setting": {**values, "workload": w.as_dict(), "users": w.users, "cohort": w.cohort,
                                       "central-lr": 1.0, "timed-iterations": timed, "warmup": warm,
                                       "pfl-python": python if has_pfl else None},
                           "threads": {}}  # fmt: skip
    rounds = timed + warm
    for threads in [int(t) for t in args.peers_threads.split(",")]:
        entry: dict[str, Any] = {}
        out["threads"][str(threads)] = entry
        pfl = None
        if has_pfl:
            spec, probe = pfl_spec(values, workdir, threads, w)
            pfl = PflProcess(python, spec)
            entry["probe-max-abs-diff"] = float(np.abs(np.asarray(pfl.ready["probe-logits"]) - probe).max())
            entry["pfl-torch"] = pfl.ready.get("torch")
            say(f"peers T={threads}: pfl ready (torch {pfl.ready.get('torch')}, {pfl.ready.get('threads')} threads), "
                f"same model: max |logit difference| {entry['probe-max-abs-diff']:.2e}")  # fmt: skip
        variants = [("engine", {}), ("engine-fedul", {"method": "fedul"})]
        if args.peers_precision:
            variants.insert(1, ("engine-auto-precision", {"precision": "auto"}))
        if threads > 1:
            variants.insert(1, ("engine-sequential", {"cohort": "sequential"}))
        elif args.peers_batched:
            variants.append(("engine-batched", {"cohort": "batched"}))
        for name, change in variants:
            pfl_before = len(pfl.seconds) if pfl else 0
            pacer = pfl.iterate if pfl else (lambda: None)
            # rounds + 1: the last round holds the final evaluation and is not timed
            result = engine_phase({**values, **change}, w.users, threads, rounds + 1, pacer, workdir, f"{name}-{threads}")
            result["pfl-round-s"] = pfl.seconds[pfl_before:] if pfl else []
            if pfl and name == "engine":
                result["pfl-test-accuracy"] = pfl.accuracy()
            entry[name] = result
            pairs = timed_pairs(result["pfl-round-s"], result["round-s"], warm) if pfl else []
            engine_s = median([e for _, e in pairs]) if pairs else median(result["round-s"][warm:])
            pfl_s = median([p for p, _ in pairs])
            result["median-s"], result["pfl-median-s"] = engine_s, pfl_s
            say(f"peers T={threads} {name} ({result['cohort']} x{result['clients-at-once']}): {engine_s:.2f} s/round, "
                f"pfl {pfl_s:.2f} s/iteration: pfl/engine {paired_ratio(pairs):.2f} (median of {len(pairs)} paired "
                f"ratios); accuracy engine {result['test-accuracy']}, pfl {result.get('pfl-test-accuracy')}")  # fmt: skip
        if pfl:
            pfl.close()
        if args.peers_ray_rounds:
            ray = ray_phase(values, w.users, threads, args.peers_ray_rounds, workdir)
            entry["ray"] = ray
            say(f"peers T={threads} ray: {ray['median-s']:.2f} s/round over rounds 2..{args.peers_ray_rounds} "
                f"(status {ray.get('status')}, accuracy {ray.get('final-test-accuracy')})")  # fmt: skip
        entry["summary"] = summarize(entry, warm)
    return out


def _ray_steady(ray: Mapping[str, Any]) -> float:
    """A Ray phase's median over its rounds without actor start and central evaluation; a
    record written before ``evaluate-every`` was kept evaluated only at its last round."""
    round_s = ray.get("round-s", [])
    return median(rounds_without_evaluation(round_s, int(ray.get("evaluate-every", len(round_s) or 1))))


def peers_markdown(result: Mapping[str, Any], ray_rounds: int | None = None) -> str:
    """The table of docs/performance.md from a peers result (the machine is the caller's line;
    ``ray_rounds``: ``--peers-ray-rounds``). Medians and ratios are computed from the raw
    timings (:func:`~fedul_flwr.experiments.peers_stats.summarize`), so a record written before
    the paired ratio renders with it."""
    fmt = lambda v: f"{v:.2f}" if isinstance(v, float) and v == v else "-"  # noqa: E731
    pct = lambda v: f"{100 * v:.1f}" if isinstance(v, float) else "-"  # noqa: E731
    st = result["setting"]
    warm = st["warmup"]
    w = st.get("workload") or {"model": st["model"], "users": st["users"], "cohort": st["cohort"],
                               "images-per-user": st.get("images-per-user", 50), "batch-size": st["batch-size"],
                               "local-epochs": st["local-epochs"], "lr": st["lr"]}  # fmt: skip
    rows = []
    for threads, entry in result["threads"].items():
        entry = {**entry, **({"ray": {**entry["ray"], "median-s": _ray_steady(entry["ray"])}} if "ray" in entry else {})}
        s = summarize(entry, warm)
        eng = entry["engine"]
        rows.append([threads, fmt(s.get("pfl-s")), f"{fmt(s['engine-s'])} ({eng['cohort']} x{eng['clients-at-once']})",
                     fmt(s["pfl-over-engine"]), fmt(s.get("engine-sequential-s")), fmt(s.get("ray-s")), fmt(s.get("ray-over-engine")),
                     fmt(s.get("engine-auto-precision-s")), fmt(s.get("engine-fedul-s")), fmt(s.get("engine-batched-s")),
                     f"{pct(eng.get('pfl-test-accuracy'))} / {pct(eng['test-accuracy'])}",
                     pct(entry.get("ray", {}).get("final-test-accuracy"))])  # fmt: skip
    rounds = st["timed-iterations"] + st["warmup"] + 1
    head = ["threads", "pfl s/iter", "engine s/round (path)", "pfl / engine (paired)", "engine one after another",
            "Ray s/round", "Ray / engine", "engine precision=auto", "engine FedUL", "engine batched",
            f"test acc. % after {rounds} iterations: pfl / engine",
            f"Ray test acc. % after {ray_rounds + 1 if ray_rounds and 'workload' in st else ray_rounds or 'its'} rounds "
            "(other users sampled)"]  # fmt: skip
    images = w["images-per-user"] or st.get("images-per-user") or "its share of"
    return (f"`{st['dataset']}`, `{w['model']}`, {w['users']} users x {images} images, cohort {w['cohort']}, batch "
            f"{w['batch-size']}, {w['local-epochs']} local epoch(s), lr {w['lr']:g}; medians of {st['timed-iterations']} "
            f"interleaved iterations after {warm} left out; pfl / engine is the median of the per-pair ratios.\n\n"
            + markdown_table(head, rows))  # fmt: skip
