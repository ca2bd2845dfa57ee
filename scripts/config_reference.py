"""Render docs/configuration.md, the reference of every run-config key.

What comes from the code (never typed here):

- the keys and their defaults: ``[tool.flwr.app.config]`` of ``pyproject.toml``, read by
  :func:`fedul_flwr.config.default_config` (the single source of defaults);
- the allowed values of the keys chosen by name: the registries (datasets, partitions, prior
  schemes, client settings, methods, models, strategies, augmentations) and the fixed choice
  lists of :data:`fedul_flwr.config.CHOICES`;
- the rule of every key a method owns, and which methods own it: the methods' ``Option``s.

What a key means is written below (:data:`DESCRIPTIONS`), grouped by topic. A key of the
defaults table without a description is listed under "Not yet described" with an empty
meaning, which ``tests/test_readme.py`` rejects.

Usage (from the repository root)::

    python scripts/config_reference.py           # (re)write docs/configuration.md
    python scripts/config_reference.py --check   # exit 1 if docs/configuration.md is stale
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from fedul_flwr.checkpoint import RESUMABLE_STRATEGIES
from fedul_flwr.preflight import RESUME_FREE_KEYS

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

OUTPUT = REPO / "docs" / "configuration.md"

DESCRIPTIONS: dict[str, dict[str, str]] = {
    "Run and preset": {
        "preset": "a preset of `conf/experiment/` (e.g. `paper-mnist`, `mnist-iid-small`, `authors-code`, `fedpu`, "
        "`feddb-cpu`, `feddb-authors`, `fixmatch`, `hassle`); it holds only the values it changes (a preset may "
        "start from another: `feddb-authors` is `feddb` and the recipe of FedDB's code)",
        "seed": "seed of partitions, U sets, priors, model init and batch order",
    },
    "Data": {
        "dataset": "`mnist-sample` (embedded: 12k training + the 10k test images of MNIST, shipped in the package), "
        "`mnist`, `fashion-mnist`, `cifar10`, `cifar100`, `svhn` (read through torchvision from `data-dir`; "
        "[datasets](datasets.md)), or the user's own `hf:<Hugging Face Hub name or /absolute/path>` (an image folder, "
        "a `save_to_disk` folder, Parquet/Arrow files; [your own images](datasets.md#your-own-images))",
        "image-column": "`hf:` datasets: the column of the images; `\"\"` = the one `Image` column",
        "label-column": "`hf:` datasets: the column of the class labels; `\"\"` = the one `ClassLabel` column, "
        "else `label`",
        "image-size": "`hf:` datasets: resize every image to S x S pixels; 0 = keep (every image must then be square "
        "and of one size)",
        "horizontal-flip": "whether augmentation (`augment`, FixMatch's weak and strong views) may mirror images "
        "horizontally: `auto` = the dataset's own fact (`true` for `fashion-mnist`, `cifar10`, `cifar100`; `false` "
        "for digits and `hf:` datasets), `true` or `false` (for any dataset: set `true` for your own images whose "
        "classes a mirror does not change)",
        "data-dir": "absolute torchvision root for the non-embedded datasets (Flower runs the app from its own copy, "
        "so relative paths are refused); `hf:` Hub datasets: the cache folder of Hugging Face `datasets`",
        "download": "let torchvision download missing files (online machines); offline, the error lists the "
        "missing files and where to put them",
        "val-fraction": "class-stratified labeled hold-out of the training set (paper: 0.2); > 0 adds "
        "`val-accuracy` / `val-error` to the metrics of every round",
        "client-test-fraction": "share of each client's data kept as a *labeled* local test split; > 0 turns on "
        "client-side evaluation",
        "partition": "`iid`, `noniid` (FedUL paper, App. D: 2 majority classes per client), `dirichlet` (per-class "
        "proportions over clients; client sizes vary), `inner-dirichlet` (per-client class proportions; equal "
        "clients), `shards`",
        "dirichlet-alpha": "concentration of the `dirichlet` and `inner-dirichlet` splits",
        "noniid-majority-classes": "majority classes per client in `noniid`",
        "noniid-minority-fraction": "share of each minority class given to each client in `noniid` "
        "(Table D.5: ~57 of ~4.8k)",
        "shards-per-client": "shards per client in the `shards` partition (FedAvg/FedProx shards via Flower "
        "Datasets' `ShardPartitioner`; FedPU's 5-class and 2-class non-IID)",
        "samples-per-client": "training images per client (a fixed random subset of its partition; 0 = all), "
        "Table E.10; `labels-at-clients`: caps each client's share of the unlabeled pool",
    },
    "The clients' setting": {
        "client-setting": "the simulated clients' setting: `usets` (U sets with class priors, FedUL), `pu` "
        "(positive-unlabeled: each client labels part of its positive classes; FedPU), `labels-at-clients` "
        "(a few labeled and many unlabeled images per client; FixMatch, FedDB) or `annotation-heterogeneity` "
        "(fully, partially and un-labeled clients; HASSLE)",
        "num-sets": "`usets`: M_c, U sets per client; a comma list (`'10,20,30,40,50'`) cycles over clients",
        "prior-scheme": "`usets`: class priors of the sets: `dominant` (authors' code: each set dominated by one "
        "class, well conditioned; behind the paper's Table 1) or `uniform` (paper text: entries ~ U[0.1, 0.9], "
        "rows normalised)",
        "dominant-factor": "weight of the dominant class in `dominant`",
        "test-prior": "class prior pi of the test distribution: `uniform` or a comma list of K values",
        "class-names": "the K class names (comma-separated) that deployed nodes' `priors.csv` headers must list, "
        "in order; `\"\"` = the dataset's names",
        "prior-noise": "eps of Table E.9: the method is told Pi~ = clip(Pi (1 + eps (2 gamma - 1)), 0, 1), rows "
        "renormalised; the U sets are unchanged. Each client logs cond(Pi~_c), with a warning if Pi~_c lost "
        "full column rank (f is then not identifiable)",
        "positive-classes": "`pu`: positive classes per client: one count for all (`2`), one count per client "
        "(`2,3,4,6,7,8`) or the classes of each client, clients separated by a vertical bar "
        "(0,1&#124;2,3&#124;...); the sets must cover every class",
        "pu-labeled-fraction": "`pu`: share of each positive class that is labeled",
        "class-prior": "`pu`: class prior pi a client is told: `global` (training pool), `client` (its unlabeled "
        "set's class mix, the authors' code), a number or K numbers (misspecified)",
        "num-labeled": "`labels-at-clients`: labeled images over all clients, class-balanced; the labeled and the "
        "unlabeled pool are partitioned separately, and a client's unlabeled part holds its labeled images too",
        "label-layout": "`annotation-heterogeneity`: fully (`L`), partially (`P`) or un- (`U`) labeled clients: "
        "a named layout of 20 clients (`ALL`: Table 4's 1 or 2 L, the rest of 10 P, 10 U; `PL`, `LPL`, `UPL`, "
        "`LU`: Fig. 6), kinds per client (`\"L,P*9,U*10\"`) or label fractions (`\"1,0.3,0\"`)",
        "labeled-share": "`annotation-heterogeneity`: share of all training images that are labeled; the P "
        "clients' fraction is solved to meet it",
    },
    "Method, model and augmentation": {
        "method": "learning method: `fedul`, `fedpu` (with `client-setting=pu`), `fixmatch`, `fixmatch-dpl`, "
        "`feddb` (with `client-setting=labels-at-clients`), `hassle` (with "
        "`client-setting=annotation-heterogeneity`), or the baselines `fedpl`, `fedllp`, `fedllp-vat`, "
        "`supervised`; or `module:Class`, a method class of your own ([the method interface](methods.md))",
        "model": "`small-cnn` (LeNet, the FedUL paper's Sec. 4.1 MNIST backbone; ~0.43M parameters, "
        "CPU-friendly), `paper-cnn` (Table D.2, ~14M), `resnet18` (Table D.3, from scratch), `resnet8` "
        "(CIFAR ResNet-8, ~78k, HASSLE's CIFAR model), `wrn-28-2` (Wide ResNet 28-2, FixMatch's and FedDB's "
        "CIFAR model, ~1.47M), `simple-cnn` (pfl-research's CIFAR-10 benchmark model, ~1.6M, dropout from the "
        "client's generator); `small-cnn` and `resnet8` take a width factor (a method's `ModelSpec.width`)",
        "augment": "augmentation of every method's training images, per image from the client's generator: "
        "`none`, `weak` (pad-and-crop; a horizontal flip where `horizontal-flip` allows it), `strong` (weak + "
        "RandAugment(2, 10) + Cutout), `strong-random` (weak + RandAugment(2) at magnitudes drawn over the full "
        "range + Cutout up to half the side), `rotate` (up to 20 degrees, the FedUL authors' MNIST transform)",
    },
    "Options of the methods": {
        "loss": "FedUL's loss: `nll` (paper: -log Q_c[ybar]) or `ce-prob` (authors' code: cross-entropy applied "
        "to the probabilities Q_c)",
        "label-fraction": "fraction of each client's images used with their true labels (0.1 = \"FedAvg 10%\", "
        "1.0 = the supervised reference of Theorem 4)",
        "fedpl-threshold": "FedPL confidence threshold tau on softmax(f(x))[pseudo label]",
        "fedpl-mixup-alpha": "FedPL mixup lam_mix ~ Beta(a, a)",
        "fedpl-mix-weight": "FedPL weight lambda of the mixup loss",
        "llp-batches": "FedLLP(-VAT) batches: `stratified` (each batch holds a proportional share of every U "
        "set), `single-set` (each batch = a chunk of one U set) or `whole-set` (one batch per U set)",
        "vat-weight": "FedLLP-VAT consistency weight alpha (App. D: 5e-4 MNIST, 0.05 CIFAR-10)",
        "vat-epsilon": "FedLLP-VAT perturbation radius mu (App. D: 1e-2 MNIST, 6.0 CIFAR-10)",
        "vat-xi": "FedLLP-VAT finite-difference step of the power iteration",
        "fedpu-loss": "the PU risk: `nnpu` (a sum of one-vs-rest non-negative binary PU risks, bounded below; "
        "not Eq. 10: it also penalises confusing two positive classes), `eq10-nn` (Eq. 10 itself with "
        "cross-entropy, each negative class's corrected risk clamped at 0), `upu` (`nnpu` unclamped: "
        "conventional PU), `eq10` (Eq. 10 with the bounded surrogate 1 - s), `authors` (the authors' code) "
        "([FedPU](fedpu.md))",
        "fedpu-cross-client": "add Eq. 10's cross-client term; the server queries every node's positive classes "
        "and broadcasts them to all clients ([what this reveals](fedpu.md))",
        "fixmatch-threshold": "confidence threshold tau of the pseudo-labels",
        "fixmatch-lambda": "weight lambda of the unlabeled loss",
        "fixmatch-mu": "unlabeled images per labeled one in a step",
        "fixmatch-strong-augment": "the strong view: `strong` (RandAugment at the fixed magnitude 10 of 30, "
        "torchvision's) or `strong-random` (a magnitude per image and operation drawn over the full range, and "
        "Cutout up to half the side: FixMatch's paper and USB's code)",
        "fixmatch-weight": "a reply's aggregation weight: `epoch` (the images one local epoch passes over: n_L "
        "where the client has labels, else n_U), `all` (n_L + n_U) or `used` (labeled rows plus pseudo-labels "
        "kept over the round's steps; a client with none sends no model)",
        "dpl-ema": "gamma of APP-U's moving average (the authors' code's value; the paper gives none)",
        "dpl-app-u-update": "APP-U update: `epoch` (paper, Alg. 3: over all unlabeled images before each local "
        "epoch's update) or "
        "`step` (authors' code: per step, confident images of the batch)",
        "dma-loss": "DMA's loss, `l2` (paper, Eq. 16) or `mse` (authors' code)",
        "dma-steps": "DMA's gradient steps E_aggr",
        "dma-lr": "DMA's step size eta_aggr",
        "hassle-residual-width": "width of the residual models r_{U-S}, r_{S-U} as a share of the model's "
        "channels (1/16 ... 1); 0 removes them (the GRA ablation)",
        "hassle-lambda": "weight lambda of the residual alignment (KL to the tempered logit difference)",
        "hassle-gamma": "gamma of the cross-model proximity term, gamma / 2 times the squared distance of w_S "
        "and w_U beside the batch-mean loss (`hassle-gamma-form`); 0 turns it off (the MPA ablation)",
        "hassle-temperature": "temperature T of the residual target (T^2-scaled KL)",
        "hassle-threshold": "confidence threshold of the pseudo-labels (0: none, the paper's default; 0.95 in "
        "its Table 6)",
        "hassle-pairing": "which dual model a residual model is added to in SM, UM and the pseudo-labels: "
        "`previous`, the one it was trained against (the paper, after its Eq. 10; the previous round's w_S / "
        "w_U travel too), or `current`, the same round's",
        "hassle-phase-order": "`residual-first` (Eqs. 7-8 and Fig. 3: each residual fits the received dual "
        "models) or `dual-first` (Alg. 1's order: the dual model trains first, its residual then fits the "
        "updated one)",
        "hassle-gamma-form": "`mean` (gamma / 2 times the squared distance beside the batch-mean loss) or `sum` "
        "(Eq. 12 as written: gamma times it beside the sum over the client's n examples, i.e. 2 gamma / n per "
        "batch-mean step)",
        "hassle-shared-init": "start w_U from w_S's initial weights",
        "hassle-warmup-rounds": "rounds before w_U and r_{S-U} train on pseudo-labels (0: none)",
    },
    "Local training": {
        "num-rounds": "federated rounds",
        "local-epochs": "local epochs per round",
        "local-epochs-per-client": "unequal local work: comma list cycled over partition ids, e.g. `\"1,2,5\"`; "
        "empty = `local-epochs` for all",
        "batch-size": "local batch size",
        "lr": "step size of the local optimiser (Adam, FedUL paper: 1e-4 over 100 rounds; 1e-3 reaches the same "
        "accuracy in 20)",
        "l1-weight": "L1 penalty weight on all parameters (FedUL paper, Table D.4)",
        "local-optimizer": "`adam` (the FedUL paper) or `sgd` (the form SCAFFOLD's and FedNova's rules are "
        "derived in)",
        "local-momentum": "heavy-ball momentum of `local-optimizer=sgd` (FedPU's protocol: 0.5); the optimiser "
        "starts afresh every round",
        "lr-decay": "step size of round r = `lr * lr-decay ** (r - 1)` (FedPU's protocol: 0.995)",
        "lr-schedule": "`exponential` (`lr-decay` alone), `cosine`: FixMatch's cosine decay with the round as "
        "the step, `lr * cos(7 pi (r - 1) / (16 num-rounds))`, or `cosine-annealing`: PyTorch's "
        "`CosineAnnealingLR` to 0 over the rounds, as FedDB's code (either times `lr-decay ** (r - 1)`); a "
        "function of the round, so a resumed run continues it exactly unless the resume raises `num-rounds` "
        "(then the rest follows the longer schedule, with a warning)",
        "weight-decay": "L2 weight decay of the local optimiser (FixMatch's and FedDB's code: 5e-4)",
        "nesterov": "Nesterov momentum for `local-optimizer=sgd` with `local-momentum > 0` (FixMatch, FedDB's code)",
        "grad-clip-norm": "clip each local step's gradient to this 2-norm (FedDB's code: 1); 0 = no clipping",
        "local-optimizer-state": "`fresh` (a new optimiser every round, the FedUL and FedPU papers' code) or "
        "`kept`: a client's optimiser state (momentum, Adam's moments) carries over to its next round, held by "
        "the server between rounds and in its checkpoint (FedDB's code; [the recipe](recipe.md)); refused "
        "with differential privacy",
        "ema-decay": "exponential moving average of the global weights per round, which the central evaluation "
        "tests and the run saves (`test-accuracy-without-ema` beside it); 0 = none. FixMatch's 0.999 per step is "
        "0.999 ** S per round of S steps",
    },
    "Server strategy": {
        "strategy": "the server algorithm ([server strategies](server-strategies.md))",
        "aggregation-weights": "client weights, for every strategy: `num-examples` (n_c) or `uniform` (1/C, the "
        "FedUL authors' code); `uniform` under server-side DP, whose noise assumes equal weights (set when not "
        "typed; a typed `num-examples` is refused)",
        "fraction-train": "share of connected nodes sampled per round (`participation=poisson`: each node's "
        "probability q of training in a round)",
        "participation": "which nodes train in a round: `fixed-size` (max(int(N * `fraction-train`), "
        "`min-train-nodes`) of the N connected nodes, drawn without replacement) or `poisson` (each node on its own "
        "with probability q = `fraction-train`; a round may train none; under server DP the noised sum is divided "
        "by the expected cohort qN). Under server DP the draw comes from the OS CSPRNG, else from the run's `seed`; "
        "what each gives in epsilon: [privacy](privacy.md#participation-and-the-privacy-spent)",
        "min-train-nodes": "at least this many nodes per round (must be <= `min-available-nodes`)",
        "max-failure-fraction": "stop the run (with the nodes' errors) when more than this share of a round's "
        "training replies are errors; default 0.5: a minority of failing nodes is survived, a failing majority "
        "(almost always a shared cause) stops the run; 1: only `min-train-nodes` counts. Failed replies are "
        "recorded either way (`failed-replies` per round, failed nodes in the summary)",
        "min-available-nodes": "nodes that must be connected before a round starts",
        "proximal-mu": "FedProx mu (0 = FedAvg)",
        "server-lr": "server step size; `0` = the strategy's default: FedAvgM 1.0, SCAFFOLD eta_g 1.0, FedAdam "
        "0.1, FedYogi 0.01, FedAdagrad 0.1",
        "server-momentum": "FedAvgM momentum",
        "beta-1": "FedAdam / FedYogi first-moment parameter",
        "beta-2": "FedAdam / FedYogi second-moment parameter",
        "tau": "FedAdam / FedYogi / FedAdagrad adaptivity",
        "scaffold-option": "SCAFFOLD's client control-variate update, `I` or `II` "
        "([update rules](server-strategies.md#update-rules))",
    },
    "Privacy and robustness": {
        "num-malicious-nodes": "f, the Byzantine nodes Krum / MultiKrum (need 2f + 3 replies) and Bulyan "
        "(4f + 3) tolerate ([privacy and robustness](privacy.md))",
        "num-nodes-to-select": "how many of the best-scored replies MultiKrum averages",
        "differential-privacy": "`none`; `server-fixed` / `server-adaptive` (Flower's server-side DP wrappers); "
        "`client-local` (Flower's `LocalDpMod` on every node) ([privacy and robustness](privacy.md))",
        "dp-noise-multiplier": "z: the server adds N(0, (z C / n)^2) per coordinate to the mean of n clipped updates",
        "dp-clipping-norm": "C, the L2 norm a whole-model update is clipped to (server-fixed, client-local); the "
        "initial C of server-adaptive",
        "dp-target-clipped-quantile": "server-adaptive: the share of updates that should be clipped",
        "dp-clip-norm-lr": "server-adaptive: the geometric step of C per round",
        "dp-clipped-count-stddev": "server-adaptive: sigma_b, the noise (in updates) on the count of clipped "
        "updates; it must exceed z / 2, and the update then carries z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2; `0`: "
        "max(m / 20, z) for the m nodes a round samples ([privacy](privacy.md#the-privacy-spent))",
        "dp-sensitivity": "client-local: the sensitivity in `LocalDpMod`'s noise formula (two updates clipped to C "
        "differ by at most 2C: 2 x dp-clipping-norm is the true one)",
        "dp-epsilon": "client-local: the epsilon in `LocalDpMod`'s noise formula sigma = dp-sensitivity "
        "sqrt(2 ln(1.25 / dp-delta)) / dp-epsilon, a per-round guarantee only below 1; the run records the exact "
        "epsilon of one reply (`privacy-epsilon-round`)",
        "dp-delta": "client-local: the delta in `LocalDpMod`'s noise formula; every DP mode: the delta "
        "at which the run records the epsilon it has spent (`privacy-epsilon`, an upper bound, and "
        "`privacy-epsilon-round` in metrics.csv; the summary line)",
        "dp-publish-unnoised-train-metrics": "server-fixed / server-adaptive: `true` records the clients' aggregated "
        "train metrics (the train loss, ...) every round; no DP noise covers them, so they are outside the recorded "
        "epsilon, and the summary line says so",
        "dp-publish-unnoised-client-evaluation": "every DP mode: `true` runs the clients' evaluation on their "
        "labeled local test splits (`client-test-fraction` > 0) and prints its aggregate each round, marked "
        "`unnoised-`; no DP noise covers it, so it is outside the recorded epsilon. `false` (the default): no "
        "client-side evaluation under DP",
    },
    "Outputs and runtime": {
        "verbose": "`false`: the run prints one line per round (test accuracy, seconds, ETA) and the summary line; "
        "`true`: Flower's full logs as well (the resolved configuration, each round's sampling and aggregation)",
        "tensorboard": "also write the metrics of every round as TensorBoard event files to `<run folder>/tensorboard` "
        "(`pip install \"fedul-flwr[tensorboard]\"` on the server; `tensorboard --logdir <output-dir>`)",
        "output-dir": "where run folders go (on the SuperLink's machine in a deployment; use absolute paths)",
        "run-name": "run folder name, one folder inside `output-dir` (no `/`, not `.` or `..`; default: time, "
        "method, dataset, partition, sets, seed)",
        "resume": "continue the run `<output-dir>/<run-name>` from its `checkpoint.pt` up to `num-rounds` "
        "(needs `run-name`; strategies " + ", ".join(f"`{k}`" for k in RESUMABLE_STRATEGIES) + ", not with "
        "`differential-privacy=server-adaptive`, whose adapted clipping norm is not checkpointed); refused, with "
        "nothing written, unless the checkpoint was written with the same settings (only "
        + ", ".join(f"`{k}`" for k in RESUME_FREE_KEYS) + ", `cohort`, and `device` in fp32 may differ)",
        "eval-batch-size": "batch size of evaluation (under `torch.inference_mode`)",
        "evaluate-every": "central evaluation (test set, validation hold-out) every N rounds, and always at round 0 "
        "and the last round, as pfl-research's `evaluation_frequency`; the other rounds' rows hold their training "
        "replies and privacy figures, and their progress line no accuracy",
        "device": "`auto` (CUDA when present), `cpu`, `cuda`",
        "client-threads": "torch threads per client: `0` = the client's CPU share (`OMP_NUM_THREADS`, set by Ray "
        "from `client-resources-num-cpus`), n = exactly n. The thread count changes float reduction order, so "
        "bit-identical repeats need the same count",
        "cohort": "how the in-process engine (`fedul reproduce`) trains a round's clients: `sequential` (one after "
        "another, all threads), `parallel` (CPU: as many at once as threads, one thread each; the same replies as "
        "sequential at one thread), `batched` (one batched model with stacked weights; a client it cannot take "
        "trains alone) or `auto` (batched on a GPU, parallel on a CPU with 2+ threads, else sequential); the "
        "record names the path ([the cohort paths](performance.md#the-cohort-paths)); `flwr run .`'s Ray actors "
        "ignore it",
        "precision": "`fp32`, `bf16` (autocast of the model forwards; losses, weights and optimiser stay "
        "float32) or `auto`: bf16 only where the CPU (AVX512-BF16/AMX) or GPU computes bfloat16 natively "
        "([performance](performance.md))",
        "memory-format": "`channels-last` (NHWC), `contiguous` (NCHW) or `auto`: channels-last for "
        "convolutional models; weights leave the client as NCHW either way",
        "fused-optimizer": "Adam's/SGD's fused kernels (else PyTorch's per-parameter loop)",
        "compile": "`torch.compile` each model (opt-in: compiles for tens of seconds per process; slower than "
        "eager for the paper CNN on 2 CPU cores)",
    },
}
"""What each key means, by topic; the sections and their rows appear in this order."""

UNDESCRIBED = "Not yet described"

HEADER = """\
# Configuration reference

<!-- Generated by scripts/config_reference.py from [tool.flwr.app.config] in pyproject.toml,
the registries and the methods' options. Do not edit: run `python scripts/config_reference.py`. -->

Every setting is a key of `[tool.flwr.app.config]` in `pyproject.toml`, the one place that
holds the defaults. Override any of them with

```bash
flwr run . --stream --federation-config "num-supernodes=5" --run-config "key=value key2='text'"
```

(strings in single quotes). Presets in `conf/experiment/<name>.yaml` are composed with Hydra
and hold only the values they change; `preset='<name>'` selects one. Precedence: defaults <
preset < what you typed, also where a typed value equals the default. The server logs which
keys came from the preset and which from you, resolves the settings once and sends them to
the clients ([the method interface](methods.md#configuration-what-you-type-wins)). Bad values
fail before round 1 and before the run folder exists, naming the key
([checks before round 1](deployment.md#3-run-and-monitor)); `fedul check --run-config '...'`
runs the same checks before `flwr run` and names a mistyped key with the closest valid one,
which Flower's own refusal (`Invalid run configuration`) does not.

*Allowed* comes from the code: the registries for the keys chosen by name, and each method's
declared options (a method validates its own options, only when it runs). The number of
clients is not a key: it is the number of SuperNodes (`--federation-config
"num-supernodes=N"` in simulation).
"""


def _fmt_default(value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = f'"{value}"'
    else:
        text = repr(value)
    return f"`{text}`".replace("|", "&#124;")


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "`true` / `false`"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "text"


def _choices() -> dict[str, tuple[str, ...]]:
    from fedul_flwr.preflight import registry_choices
    from fedul_flwr.config import CHOICES

    return {**CHOICES, **registry_choices()}


def _method_options() -> dict[str, tuple[str, list[str]]]:
    """key -> (rule, names of the methods that own it), from the methods' ``Option``s."""
    from fedul_flwr.methods import METHODS

    owned: dict[str, tuple[str, list[str]]] = {}
    for name in METHODS.names():
        for option in METHODS.get(name).options:
            _, owners = owned.setdefault(option.key, (option.rule, []))
            owners.append(name)
    return owned


def _allowed(key: str, default: Any, choices: dict[str, tuple[str, ...]],
             options: dict[str, tuple[str, list[str]]]) -> str:
    if key in choices:
        text = "one of " + ", ".join(f"`{c}`" for c in choices[key])
        if key == "method":
            text += "; or `module:Class`"
        return text
    if key in options:
        rule, owners = options[key]
        owner_text = ", ".join(f"`{m}`" for m in owners)
        return f"{_pretty_rule(rule) if rule else _type_name(default)}; option of {owner_text}"
    return _type_name(default)


def _pretty_rule(rule: str) -> str:
    """An ``Option.rule`` for Markdown: a Python tuple of names, and quoted names, as code spans."""

    def names(match: re.Match[str]) -> str:
        return ", ".join(f"`{name}`" for name in re.findall(r"'([^']*)'", match.group(1)))

    rule = re.sub(r"\(((?:'[^']*'(?:, )?)+),?\)", names, rule)
    return re.sub(r"'([^']*)'", r"`\1`", rule)


def render() -> str:
    """The text of docs/configuration.md for the current defaults, registries and options."""
    from fedul_flwr.config import default_config

    defaults = default_config()
    choices = _choices()
    options = _method_options()
    described = {key for section in DESCRIPTIONS.values() for key in section}
    sections = {title: dict(rows) for title, rows in DESCRIPTIONS.items()}
    missing = {key: "" for key in defaults if key not in described}
    if missing:
        sections[UNDESCRIBED] = missing

    out = [HEADER]
    out.append("Sections: " + " · ".join(f"[{title}](#{_anchor(title)})" for title in sections) + ".\n")
    for title, rows in sections.items():
        keys = [key for key in rows if key in defaults]
        if not keys:
            continue
        out.append(f"## {title}\n")
        out.append("| key | default | allowed | meaning |")
        out.append("|---|---|---|---|")
        for key in keys:
            out.append(
                f"| `{key}` | {_fmt_default(defaults[key])} | {_allowed(key, defaults[key], choices, options)} "
                f"| {rows[key]} |"
            )
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _anchor(title: str) -> str:
    """The heading id Python-Markdown's toc extension gives ``## title``."""
    slug = re.sub(r"[^\w\s-]", "", title.lower()).strip()
    return re.sub(r"[-\s]+", "-", slug)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from what would be written")
    parser.add_argument("--out", type=Path, default=OUTPUT, help=f"output file (default {OUTPUT.relative_to(REPO)})")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text() if args.out.is_file() else ""
        if current != text:
            print(f"{args.out} is stale: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    from fedul_flwr.store import write_atomic

    write_atomic(args.out, text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
