"""How wrong is the prior matrix the method is told under Table E.9's noise?

Lu et al. (ICLR 2022), App. E.1 / Table E.9 perturb each client's class priors. For every
client of a preset (default: ``table-e9``, MNIST non-IID, 5 clients, 10 sets) and every
noise level eps, this prints, averaged over the clients:

- ``zeroed``: share of the nonzero entries of Pi_c that the clip sets to 0 in Pi~_c;
- ``flipped``: U sets whose largest-prior class changes (the class a set "stands for");
- ``max |d|``: the largest absolute change of an entry, Pi~ - Pi;
- ``cond``: the median condition number of Pi~_c (Pi_c at eps = 0).

for two readings of the paper's formula: ``relative`` (what ``prior-noise`` implements,
Pi (1 + eps (2 gamma - 1)), :mod:`fedul_flwr.data.prior_noise`) and ``printed`` (the
formula as printed, Pi ((2 eps - 1) gamma + 1), clipped and renormalised the same way).
Both draw gamma from `prior_noise_rng`, as `load_client` does, so the `relative` rows describe exactly
the matrices the Table E.9 runs were told. No training; it only builds the U sets.

Usage::

    PYTHONPATH=. python scripts/prior_noise_stats.py --data-dir /path/to/torchvision-root
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

from fedul_flwr.preflight import resolve_config
from fedul_flwr.data.simulated import client_usets, prior_noise_rng
from fedul_flwr.data.prior_noise import noisy_priors


def printed_noise(priors: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray:
    """The formula as printed in App. E.1: clip(Pi ((2 eps - 1) gamma + 1), 0, 1), rows renormalised."""
    noisy = np.clip(priors * ((2.0 * eps - 1.0) * rng.uniform(0.0, 1.0, size=priors.shape) + 1.0), 0.0, 1.0)
    return noisy / noisy.sum(axis=1, keepdims=True)


def describe(true: list[np.ndarray], told: list[np.ndarray]) -> str:
    """One table row: the four measures of the module docstring, over the clients."""
    zeroed = np.mean([((t == 0) & (p > 0)).sum() / (p > 0).sum() for p, t in zip(true, told)])
    flipped = np.mean([(t.argmax(1) != p.argmax(1)).sum() for p, t in zip(true, told)])
    max_d = np.max([np.abs(t - p).max() for p, t in zip(true, told)])
    cond = np.median([np.linalg.cond(t) for t in told])
    return f"{100 * zeroed:.1f}% | {flipped:.1f} of {true[0].shape[0]} | {max_d:.2f} | {cond:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="absolute torchvision root")
    parser.add_argument("--preset", default="table-e9")
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eps", type=float, nargs="+", default=[0.0, 0.2, 0.4, 0.8, 1.6])
    args = parser.parse_args()
    cfg = resolve_config({"preset": args.preset, "data-dir": args.data_dir, "seed": args.seed})
    true = [client_usets(cfg, pid, args.clients)[0].priors for pid in range(args.clients)]
    forms: dict[str, Callable[[np.ndarray, float, np.random.Generator], np.ndarray]] = {
        "relative": noisy_priors,
        "printed": printed_noise,
    }
    print(f"{args.preset}: {args.clients} clients, seed {args.seed}; means over clients")
    print("| formula | eps | zeroed entries | sets with another largest class | max abs change | median cond |")
    print("|---|---|---|---|---|---|")
    for name, form in forms.items():
        for eps in args.eps:
            told = [form(p, eps, prior_noise_rng(args.seed, pid)) for pid, p in enumerate(true)]
            print(f"| {name} | {eps:g} | {describe(true, told)} |")


if __name__ == "__main__":
    main()
