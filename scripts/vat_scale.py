"""How large is FedLLP-VAT's VAT term, and from which (alpha, mu) on does it change the result?

FedLLP-VAT (:mod:`fedul_flwr.methods.fedllp_vat`; Lu et al., ICLR 2022, App. D, Eq. 19-20)
minimises the proportion loss of FedLLP plus alpha * KL(p || p_adv), the VAT consistency at
an adversarial perturbation of L2 norm mu per image (``vat-weight`` alpha, ``vat-epsilon``
mu; App. D: alpha = 5e-4, mu = 1e-2 on MNIST, alpha = 0.05, mu = 6.0 on CIFAR-10). On the
embedded MNIST sample (``dataset=mnist-sample``: 2 clients, 10 U sets each, LeNet, Adam
lr 1e-3, B = 128: the cpu profile's model and optimiser) this script measures:

(a) **the term's size**, with the method's own functions
    (:func:`~fedul_flwr.methods.fedllp.proportion_loss`,
    :func:`~fedul_flwr.methods.fedllp_vat.vat_loss`, ``vat-xi`` = 1e-6, the direction drawn
    from the client's round generator) on real set-stratified batches of both clients, with f
    at its initial weights and after the FedLLP federation of (b): the proportion loss, the
    VAT KL at each mu (and, for comparison, the KL along a random direction of the same
    norm), ||grad_theta KL|| / ||grad_theta loss||, and over the (alpha, mu) grid the share of
    the loss alpha * KL / loss and of the gradient alpha * ||grad KL|| / ||grad loss||;
(b) **its effect**: short federations (in-process engine, ``num-rounds`` rounds, central
    evaluation on the 10,000 test images) of FedLLP and of FedLLP-VAT at several (alpha, mu),
    with the final test accuracy, its change against FedLLP, and whether every recorded metric
    of every round (wall time aside) equals FedLLP's bit for bit, else the first round that
    differs.

It prints the tables and writes them, with the command in the first line, to ``--out``
(default ``docs/reproduce/vat-scale.md``). Offline; about 6 minutes on 2 busy CPU cores with
the defaults (``--pairs`` and ``--rounds`` trade coverage for time).

Usage::

    PYTHONPATH=. python scripts/vat_scale.py
    PYTHONPATH=. python scripts/vat_scale.py --pairs 0.0005:0.01 0.05:6 --rounds 2 --out /tmp/vat.md
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedul_flwr import server_app
from fedul_flwr.client_app import app as client_app
from fedul_flwr.data.simulated import load_client, load_run_dataset
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import get_method
from fedul_flwr.methods.base import RoundContext
from fedul_flwr.methods.fedllp import proportion_loss, set_stratified_batches
from fedul_flwr.methods.fedllp_vat import vat_loss
from fedul_flwr.preflight import resolve_config
from fedul_flwr.store import write_atomic

__all__ = ["BatchScale", "batch_scale", "client_batches", "main", "run_config"]

ALPHAS = (5e-4, 5e-3, 0.05, 0.5, 1.0)
"""``vat-weight`` values of part (a); App. D: 5e-4 (MNIST), 0.05 (CIFAR-10)."""
MUS = (0.01, 0.1, 0.3, 1.0, 3.0, 6.0)
"""``vat-epsilon`` values of part (a); App. D: 1e-2 (MNIST), 6.0 (CIFAR-10)."""
PAIRS = ("0.0005:0.01", "0.05:1", "0.05:6", "0.5:1", "0.5:6")
"""(alpha, mu) of the FedLLP-VAT federations of part (b): App. D's MNIST and CIFAR-10 values and neighbours."""
APP_D_MNIST = (5e-4, 0.01)
APP_D_CIFAR = (0.05, 6.0)
NUM_CLIENTS = 2


def run_config(method: str, samples: int, rounds: int, seed: int, threads: int, **extra: Any) -> dict[str, Any]:
    """The run config of every measurement: the cpu profile's LeNet, Adam lr 1e-3, B = 128, one
    local epoch, float32 on the CPU, on ``samples`` images of each of 2 clients of the embedded
    MNIST sample with 10 U sets, no validation hold-out; ``extra`` adds keys (``vat-weight``, ...)."""
    return {"dataset": "mnist-sample", "method": method, "model": "small-cnn", "lr": 1e-3, "batch-size": 128,
            "local-epochs": 1, "device": "cpu", "precision": "fp32", "num-sets": "10", "val-fraction": 0.0,
            "samples-per-client": samples, "num-rounds": rounds, "seed": seed, "client-threads": threads,
            **extra}  # fmt: skip


def client_batches(cfg: Any, per_client: int) -> list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The first ``per_client`` set-stratified batches of each client, as FedLLP draws them.

    Returns
    -------
    list of (node, x, set_index, priors)
        ``x`` float ``[B, 1, 28, 28]`` normalised images, ``set_index`` int64 ``[B]``, ``priors``
        float ``[M_c, K]``; the batch order is drawn from the round-1 batch seed of the node.
    """
    requires = frozenset(get_method("fedllp-vat").requires)
    out = []
    for node in range(NUM_CLIENTS):
        client = load_client(cfg, node, NUM_CLIENTS, requires)
        assert client.usets is not None and client.unlabeled is not None  # the method's ``requires``
        priors = torch.as_tensor(client.usets.priors, dtype=torch.float32)
        order = set_stratified_batches(client.usets.set_index, cfg.batch_size, cfg.option("llp-batches"))
        generator = torch.Generator().manual_seed(RoundContext(seed=cfg.seed, server_round=1, node_key=node).batch_seed)
        for _, rows in zip(range(per_client), order(generator)):
            out.append((node, client.to_input(client.unlabeled[rows]), client.usets.set_index[rows], priors))
    return out


@dataclass(frozen=True)
class BatchScale:
    """The VAT term against the proportion loss on one batch at one radius mu (alpha = 1).

    Attributes
    ----------
    loss : float
        Proportion loss (Eq. 18) of the batch.
    kl : float
        VAT KL(p || p_adv) at radius mu (float32: about +-1e-8 of rounding noise).
    kl_random : float
        KL(p || p_r) along a random direction r of the same norm mu.
    grad_ratio : float
        ||grad_theta KL|| / ||grad_theta loss|| over all parameters of f.
    """

    loss: float
    kl: float
    kl_random: float
    grad_ratio: float


def _grad_norm(value: torch.Tensor, params: Sequence[nn.Parameter]) -> float:
    grads = torch.autograd.grad(value, params, retain_graph=True, allow_unused=True)
    return math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads if g is not None))


def batch_scale(model: nn.Module, x: torch.Tensor, set_index: torch.Tensor, priors: torch.Tensor, mu: float,
                xi: float, ctx: RoundContext) -> BatchScale:  # fmt: skip
    """Measure :class:`BatchScale` of one batch: ``x`` float ``[B, C, H, W]``, ``set_index``
    int64 ``[B]``, ``priors`` float ``[M, K]``; the VAT direction from ``ctx.generator`` (as
    :class:`~fedul_flwr.methods.fedllp_vat.FedLLPVAT` draws it), the random one from a
    generator of the same seed."""
    params = [p for p in model.parameters() if p.requires_grad]
    logits = model(x)
    loss = proportion_loss(logits, set_index, priors)
    kl = vat_loss(model, x, logits, mu, xi, ctx.generator)
    random = torch.randn(x.shape, generator=torch.Generator().manual_seed(ctx.generator.initial_seed()))
    random = mu * random / random.flatten(1).norm(dim=1).view(-1, *([1] * (x.ndim - 1)))
    with torch.no_grad():
        p, log_p = F.softmax(logits, dim=1), F.log_softmax(logits, dim=1)
        kl_random = (p * (log_p - F.log_softmax(model(x + random), dim=1))).sum(dim=1).mean()
    ratio = _grad_norm(kl, params) / _grad_norm(loss, params)
    return BatchScale(loss.item(), kl.item(), kl_random.item(), ratio)


def _sci(v: float) -> str:
    return f"{v:.1e}"


def scale_tables(states: dict[str, nn.Module], cfg: Any, per_client: int) -> tuple[str, dict[tuple[str, float], dict[str, float]]]:
    """Part (a): the markdown tables and the means per (state, mu)."""
    batches = client_batches(cfg, per_client)
    xi = cfg.option("vat-xi")
    means: dict[tuple[str, float], dict[str, float]] = {}
    for state, model in states.items():
        model.train()  # as in local training (LeNet has no batch norm)
        for mu in MUS:
            rows = [batch_scale(model, x, s, pri, mu, xi, RoundContext(seed=cfg.seed, server_round=1, node_key=node))
                    for node, x, s, pri in batches]  # fmt: skip
            means[state, mu] = {
                "loss": sum(r.loss for r in rows) / len(rows),
                "kl": sum(r.kl for r in rows) / len(rows),
                "kl_random": sum(r.kl_random for r in rows) / len(rows),
                "kl_over_loss": sum(r.kl / r.loss for r in rows) / len(rows),
                "grad_ratio": sum(r.grad_ratio for r in rows) / len(rows),
            }
    lines = [f"Means over {len(batches)} batches ({per_client} per client, B = {cfg.batch_size}), "
             f"vat-xi = {xi:g}. KL values below ~1e-8 are float32 rounding noise.", "",
             "| f | mu | proportion loss | VAT KL | KL, random direction | grad ratio / alpha |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for (state, mu), m in means.items():
        lines.append(f"| {state} | {mu:g} | {m['loss']:.4f} | {_sci(m['kl'])} | {_sci(m['kl_random'])} | {_sci(m['grad_ratio'])} |")
    for title, key in (("alpha * KL / proportion loss", "kl_over_loss"),
                       ("alpha * ||grad KL|| / ||grad proportion loss||", "grad_ratio")):  # fmt: skip
        lines += ["", f"{title}:", "", "| f | mu | " + " | ".join(f"alpha {a:g}" for a in ALPHAS) + " |",
                  "|---|---|" + "---|" * len(ALPHAS)]  # fmt: skip
        for (state, mu), m in means.items():
            lines.append(f"| {state} | {mu:g} | " + " | ".join(_sci(a * m[key]) for a in ALPHAS) + " |")
    return "\n".join(lines), means


def _metrics(outputs: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in outputs.rows[r].items() if k != "wall-time"} for r in sorted(outputs.rows)]


def federate(rc: dict[str, Any]) -> tuple[list[dict[str, Any]], Path, float]:
    """One in-process federation of ``rc``: its metric rows (wall time left out), run folder, seconds."""
    start = time.time()
    outputs = server_app.run_federation(InProcessGrid(client_app, NUM_CLIENTS, rc), resolve_config(rc))
    return _metrics(outputs), outputs.path, time.time() - start


def first_difference(rows: list[dict[str, Any]], reference: list[dict[str, Any]]) -> str:
    """``"none (bit-identical)"``, or the first round whose metrics differ and the largest
    relative difference of its numbers."""
    for row, ref in zip(rows, reference):
        if row != ref:
            rel = max((abs(row[k] - ref[k]) / max(abs(ref[k]), 1e-30) for k in ref
                       if isinstance(ref[k], float) and row.get(k) != ref[k]), default=float("nan"))  # fmt: skip
            return f"round {row['round']} (max rel. diff. {rel:.0e})"
    return "none (bit-identical)"


def parse_pair(text: str) -> tuple[float, float]:
    """``"alpha:mu"`` -> (alpha, mu); argparse type."""
    try:
        alpha, mu = (float(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--pairs: expected alpha:mu, e.g. 0.05:6, got {text!r}") from None
    if alpha < 0 or mu < 0:
        raise argparse.ArgumentTypeError(f"--pairs: alpha and mu must be >= 0, got {text!r}")
    return alpha, mu


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1000, help="training images per client (2 clients)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every federation")
    parser.add_argument("--batches", type=int, default=2, help="batches per client in part (a)")
    parser.add_argument("--pairs", type=parse_pair, nargs="+", default=[parse_pair(p) for p in PAIRS],
                        help="alpha:mu of the FedLLP-VAT federations")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path, default=Path("docs/reproduce/vat-scale.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    command = " ".join(["PYTHONPATH=. python scripts/vat_scale.py", shlex.join(sys.argv[1:] if argv is None else argv)]).strip()
    common = dict(samples=args.samples, rounds=args.rounds, seed=args.seed, threads=args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        fed: list[tuple[str, list[dict[str, Any]], float]] = []
        base_rc = run_config("fedllp", **common, **{"output-dir": tmp, "run-name": "fedllp"})
        base, base_dir, secs = federate(base_rc)
        fed.append(("FedLLP", base, secs))
        cfg = resolve_config(run_config("fedllp-vat", **common))
        method = get_method("fedllp-vat")(cfg)
        data = load_run_dataset(cfg)
        initial = server_app.global_models(cfg, method, data.in_channels, data.num_classes, data.image_size)["f"]
        trained = server_app.global_models(cfg, method, data.in_channels, data.num_classes, data.image_size)["f"]
        trained.load_state_dict(torch.load(base_dir / "model.pt"))
        states = {"initial": initial, f"FedLLP, {args.rounds} rounds": trained}
        part_a, means = scale_tables(states, cfg, args.batches)
        for alpha, mu in args.pairs:
            rc = run_config("fedllp-vat", **common, **{"output-dir": tmp, "run-name": f"vat-{alpha:g}-{mu:g}",
                                                       "vat-weight": alpha, "vat-epsilon": mu})  # fmt: skip
            rows, _, secs = federate(rc)
            fed.append((f"FedLLP-VAT alpha {alpha:g}, mu {mu:g}", rows, secs))

    acc0 = base[-1]["test-accuracy"]
    part_b = ["| run | test accuracy | change vs FedLLP (points) | final test loss | first round that differs from FedLLP | s |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for name, rows, secs in fed:
        last = rows[-1]
        diff = "-" if rows is base else first_difference(rows, base)
        change = "-" if rows is base else f"{100 * (last['test-accuracy'] - acc0):+.2f}"
        part_b.append(f"| {name} | {100 * last['test-accuracy']:.2f}% | {change} | {last['test-loss']:.6f} | {diff} | {secs:.0f} |")
    trained_key = f"FedLLP, {args.rounds} rounds"
    app_d = means[trained_key, APP_D_MNIST[1]]
    report = "\n".join([
        f"`{command}`",
        "",
        "# The size of FedLLP-VAT's VAT term (generated by scripts/vat_scale.py)",
        "",
        f"Embedded MNIST sample, {NUM_CLIENTS} clients x {args.samples} images, 10 U sets each, LeNet, Adam lr 1e-3, "
        f"B = 128, 1 local epoch, seed {args.seed}, float32 on the CPU.",
        "",
        f"At App. D's MNIST values (alpha {APP_D_MNIST[0]:g}, mu {APP_D_MNIST[1]:g}), after {args.rounds} rounds of "
        f"FedLLP: VAT KL {_sci(app_d['kl'])}, alpha * KL / loss {_sci(APP_D_MNIST[0] * app_d['kl_over_loss'])}, "
        f"alpha * ||grad KL|| / ||grad loss|| {_sci(APP_D_MNIST[0] * app_d['grad_ratio'])}.",
        "",
        "## (a) The VAT term against the proportion loss",
        "",
        part_a,
        "",
        f"## (b) {args.rounds}-round federations",
        "",
        "Test accuracy on the 10,000 test images after the last round; \"first round that differs\": the first "
        "round whose recorded metrics (train and test loss, accuracy; wall time aside) are not FedLLP's bit for bit.",
        "",
        "\n".join(part_b),
        "",
    ])  # fmt: skip
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out, report)
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
