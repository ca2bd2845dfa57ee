"""The declaration of a run-config key (:class:`Option`) and the general keys' declarations.

Every key of ``[tool.flwr.app.config]`` is declared once, with its default and a one-line
meaning: the general keys (data, federation, strategy, privacy, outputs) here in
:data:`CORE_OPTIONS`, by topic; a method's own keys in its folder,
``fedul_flwr/methods/<name>/settings.py`` (its ``OPTIONS``, which the method class lists in
``Method.options``). ``scripts/config_reference.py`` generates both the
``[tool.flwr.app.config]`` table of ``pyproject.toml`` (which Flower reads, and
:func:`fedul_flwr.config.default_config` with it) and ``docs/configuration.md`` from these
declarations; ``--check`` finds either stale.

A general key's fixed choice list is declared here (:data:`CHOICES`); its other rules (ranges,
rules between keys) are :func:`fedul_flwr.config.validate.check_values`; the keys chosen from
a registry (datasets, methods, strategies, ...) are checked by :mod:`fedul_flwr.preflight`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedul_flwr.config.record import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from fedul_flwr.config.record import RunConfig

__all__ = ["CHOICES", "CORE_OPTIONS", "Option"]


def _any_value(value: Any) -> bool:
    return True


@dataclass(frozen=True)
class Option:
    """The declaration of one run-config key.

    Attributes
    ----------
    key : str
        The dashed run-config key, e.g. ``"fedpl-threshold"``.
    default : bool | int | float | str
        Its default (Flower's run-config values are of these types only); its type is the
        key's type (a typed value is coerced to it).
    doc : str
        What the key means, one line of Markdown (a row of docs/configuration.md).
    check : Callable[[Any], bool]
        True for a valid value (of the default's type); default: every value.
    rule : str
        What a valid value is, for the error message and the docs (e.g. ``"in [0, 1]"``).
    choices : tuple[str, ...]
        The allowed values of a key with a fixed choice list (sets ``check`` and ``rule``).

    Raises
    ------
    ValueError
        If ``default`` is not a bool, int, float or str, or breaks its own rule.
    """

    key: str
    default: bool | int | float | str
    doc: str
    check: Callable[[Any], bool] = _any_value
    rule: str = ""
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.choices:
            object.__setattr__(self, "check", self.choices.__contains__)
            object.__setattr__(self, "rule", self.rule or f"one of {self.choices}")
        if not isinstance(self.default, (bool, int, float, str)):
            raise ValueError(f"option {self.key!r}: default {self.default!r} is not a bool, int, float or str")
        if not self.check(self.default):
            raise ValueError(f"option {self.key!r}: default {self.default!r} must be {self.rule}")

    def validate(self, cfg: RunConfig, method: str) -> Any:
        """The option's value in ``cfg``, checked as an option of method ``method``.

        Raises
        ------
        ConfigError
            If ``cfg`` lacks the key (``[tool.flwr.app.config]`` was not regenerated after
            the method declared it) or the value breaks the rule.
        """
        try:
            value = cfg.option(self.key)
        except KeyError:
            raise ConfigError(
                f"method {method!r} declares option {self.key!r}, which [tool.flwr.app.config] lacks "
                "(regenerate it: python scripts/config_reference.py)"
            ) from None
        if not self.check(value):
            raise ConfigError(f"{self.key}={value!r} must be {self.rule} (an option of method {method!r})")
        return value


CORE_OPTIONS: dict[str, tuple[Option, ...]] = {
    "Run and preset": (
        Option("preset", "", "a preset by name: `fedul_flwr/methods/<method>/presets/<name>.yaml` (e.g. "
               "`paper-mnist`, `authors-code`, `fedpu`, `feddb-cpu`, `feddb-authors`, `fixmatch`, `hassle`) or "
               "`conf/experiment/<name>.yaml` (presets that belong to no one method, e.g. `mnist-iid-small`); it "
               "holds only the values it changes (a preset may start from another: `feddb-authors` is `feddb` and "
               "the recipe of FedDB's code)"),
        Option("seed", 0, "seed of partitions, U sets, priors, model init and batch order"),
    ),
    "Data": (
        Option("dataset", "mnist-sample", "`mnist-sample` (embedded: 12k training + the 10k test images of MNIST, "
               "shipped in the package), `mnist`, `fashion-mnist`, `cifar10`, `cifar100`, `svhn` (read through "
               "torchvision from `data-dir`; [datasets](datasets.md)), or the user's own `hf:<Hugging Face Hub name"
               " or /absolute/path>` (an image folder, a `save_to_disk` folder, Parquet/Arrow files; [your own "
               "images](datasets.md#your-own-images))"),
        Option("image-column", "", "`hf:` datasets: the column of the images; `\"\"` = the one `Image` column"),
        Option("label-column", "", "`hf:` datasets: the column of the class labels; `\"\"` = the one `ClassLabel` "
               "column, else `label`"),
        Option("image-size", 0, "`hf:` datasets: resize every image to S x S pixels; 0 = keep (every image must then "
               "be square and of one size)"),
        Option("horizontal-flip", "auto", "whether augmentation (`augment`, FixMatch's weak and strong views) may "
               "mirror images horizontally: `auto` = the dataset's own fact (`true` for `fashion-mnist`, `cifar10`,"
               " `cifar100`; `false` for digits and `hf:` datasets), `true` or `false` (for any dataset: set `true`"
               " for your own images whose classes a mirror does not change)"),
        Option("data-dir", "", "absolute torchvision root for the non-embedded datasets (Flower runs the app from its"
               " own copy, so relative paths are refused); `hf:` Hub datasets: the cache folder of Hugging Face "
               "`datasets`"),
        Option("download", False, "let torchvision download missing files (online machines); offline, the error lists"
               " the missing files and where to put them"),
        Option("val-fraction", 0.0, "class-stratified labeled hold-out of the training set (paper: 0.2); > 0 adds "
               "`val-accuracy` / `val-error` to the metrics of every round"),
        Option("client-test-fraction", 0.0, "share of each client's data kept as a *labeled* local test split; > 0 "
               "turns on client-side evaluation"),
        Option("partition", "iid", "`iid`, `noniid` (FedUL paper, App. D: 2 majority classes per client), `dirichlet`"
               " (per-class proportions over clients; client sizes vary), `inner-dirichlet` (per-client class "
               "proportions; equal clients), `shards`"),
        Option("dirichlet-alpha", 0.5, "concentration of the `dirichlet` and `inner-dirichlet` splits"),
        Option("noniid-majority-classes", 2, "majority classes per client in `noniid`"),
        Option("noniid-minority-fraction", 0.012, "share of each minority class given to each client in `noniid` "
               "(Table D.5: ~57 of ~4.8k)"),
        Option("shards-per-client", 2, "shards per client in the `shards` partition (FedAvg/FedProx shards via Flower"
               " Datasets' `ShardPartitioner`; FedPU's 5-class and 2-class non-IID)"),
        Option("samples-per-client", 0, "training images per client (a fixed random subset of its partition; 0 = "
               "all), Table E.10; `labels-at-clients`: caps each client's share of the unlabeled pool"),
    ),
    "The clients' setting": (
        Option("client-setting", "usets", "the simulated clients' setting: `usets` (U sets with class priors, FedUL),"
               " `pu` (positive-unlabeled: each client labels part of its positive classes; FedPU), "
               "`labels-at-clients` (a few labeled and many unlabeled images per client; FixMatch, FedDB), "
               "`labels-at-server` (the server holds the labeled images and trains on them between rounds, the "
               "clients hold only unlabeled images; SemiFL, FedRGD, FedMatch) or `annotation-heterogeneity` (fully,"
               " partially and un-labeled clients; HASSLE)"),
        Option("num-sets", 10, "`usets`: M_c, U sets per client; a comma list (`'10,20,30,40,50'`) cycles over "
               "clients"),
        Option("prior-scheme", "dominant", "`usets`: class priors of the sets: `dominant` (authors' code: each set "
               "dominated by one class, well conditioned; behind the paper's Table 1) or `uniform` (paper text: "
               "entries ~ U[0.1, 0.9], rows normalised)"),
        Option("dominant-factor", 10.0, "weight of the dominant class in `dominant`"),
        Option("test-prior", "uniform", "class prior pi of the test distribution: `uniform` or a comma list of K "
               "values"),
        Option("class-names", "", "the K class names (comma-separated) that deployed nodes' `priors.csv` headers must"
               " list, in order; `\"\"` = the dataset's names"),
        Option("prior-noise", 0.0, "eps of Table E.9: the method is told Pi~ = clip(Pi (1 + eps (2 gamma - 1)), 0, "
               "1), rows renormalised; the U sets are unchanged. Each client logs cond(Pi~_c), with a warning if "
               "Pi~_c lost full column rank (f is then not identifiable)"),
        Option("positive-classes", "2", "`pu`: positive classes per client: one count for all (`2`), one count per "
               "client (`2,3,4,6,7,8`) or the classes of each client, clients separated by a vertical bar "
               "(0,1&#124;2,3&#124;...); the sets must cover every class"),
        Option("pu-labeled-fraction", 0.5, "`pu`: share of each positive class that is labeled"),
        Option("class-prior", "global", "`pu`: class prior pi a client is told: `global` (training pool), `client` "
               "(its unlabeled set's class mix, the authors' code), a number or K numbers (misspecified)"),
        Option("num-labeled", 1000, "`labels-at-clients`: labeled images over all clients, class-balanced; the "
               "labeled and the unlabeled pool are partitioned separately, and a client's unlabeled part holds its "
               "labeled images too; `labels-at-server`: the server's labeled images, class-balanced (the clients "
               "share the rest, without labels)"),
        Option("server-data-dir", "", "`labels-at-server`: the server's own folder of labeled images (the node folder"
               " layout, [deployment](deployment.md#labels-at-the-server)); required in deployment, optional in "
               "simulation (where `\"\"` draws the `num-labeled` images from the dataset)"),
        Option("server-epochs", 1, "`labels-at-server`: epochs over the server's labeled images after every "
               "round's aggregation (and once before round 1)"),
        Option("label-layout", "ALL", "`annotation-heterogeneity`: fully (`L`), partially (`P`) or un- (`U`) labeled "
               "clients: a named layout of 20 clients (`ALL`: Table 4's 1 or 2 L, the rest of 10 P, 10 U; `PL`, "
               "`LPL`, `UPL`, `LU`: Fig. 6), kinds per client (`\"L,P*9,U*10\"`) or label fractions (`\"1,0.3,0\"`)"),
        Option("labeled-share", 0.1, "`annotation-heterogeneity`: share of all training images that are labeled; the "
               "P clients' fraction is solved to meet it"),
    ),
    "Method, model and augmentation": (
        Option("method", "fedul", "learning method: `fedul`, `fedpu` (with `client-setting=pu`), `fixmatch`, "
               "`fixmatch-dpl`, `feddb` (with `client-setting=labels-at-clients`), `hassle` (with "
               "`client-setting=annotation-heterogeneity`), the compared methods `mixmatch`, `uda`, `rscfed`, "
               "`semifl`, `fedrgd`, `fedmatch` ([their settings](methods.md#the-methods-of-the-package)), or the "
               "baselines `fedpl`, `fedllp`, `fedllp-vat`, "
               "`supervised`; or `module:Class`, a method class of your own ([the method interface](methods.md))"),
        Option("model", "small-cnn", "`small-cnn` (LeNet, the FedUL paper's Sec. 4.1 MNIST backbone; ~0.43M "
               "parameters, CPU-friendly), `paper-cnn` (Table D.2, ~14M), `resnet18` (Table D.3, from scratch), "
               "`resnet8` (CIFAR ResNet-8, ~78k, HASSLE's CIFAR model), `wrn-28-2` (Wide ResNet 28-2, FixMatch's "
               "and FedDB's CIFAR model, ~1.47M), `simple-cnn` (pfl-research's CIFAR-10 benchmark model, ~1.6M, "
               "dropout from the client's generator); `small-cnn` and `resnet8` take a width factor (a method's "
               "`ModelSpec.width`)"),
        Option("augment", "none", "augmentation of every method's training images, per image from the client's "
               "generator: `none`, `weak` (pad-and-crop; a horizontal flip where `horizontal-flip` allows it), "
               "`strong` (weak + RandAugment(2, 10) + Cutout), `strong-random` (weak + RandAugment(2) at magnitudes"
               " drawn over the full range + Cutout up to half the side), `rotate` (up to 20 degrees, the FedUL "
               "authors' MNIST transform)"),
    ),
    "Local training": (
        Option("num-rounds", 20, "federated rounds"),
        Option("local-epochs", 1, "local epochs per round"),
        Option("local-epochs-per-client", "", "unequal local work: comma list cycled over partition ids, e.g. "
               "`\"1,2,5\"`; empty = `local-epochs` for all"),
        Option("batch-size", 128, "local batch size"),
        Option("lr", 0.001, "step size of the local optimiser (Adam, FedUL paper: 1e-4 over 100 rounds; 1e-3 reaches "
               "the same accuracy in 20)"),
        Option("l1-weight", 0.0, "L1 penalty weight on all parameters (FedUL paper, Table D.4)"),
        Option("local-optimizer", "adam", "`adam` (the FedUL paper) or `sgd` (the form SCAFFOLD's and FedNova's rules"
               " are derived in)", choices=("adam", "sgd")),
        Option("local-momentum", 0.0, "heavy-ball momentum of `local-optimizer=sgd` (FedPU's protocol: 0.5); the "
               "optimiser starts afresh every round"),
        Option("lr-decay", 1.0, "step size of round r = `lr * lr-decay ** (r - 1)` (FedPU's protocol: 0.995)"),
        Option("lr-schedule", "exponential", "`exponential` (`lr-decay` alone), `cosine`: FixMatch's cosine decay "
               "with the round as the step, `lr * cos(7 pi (r - 1) / (16 num-rounds))`, or `cosine-annealing`: "
               "PyTorch's `CosineAnnealingLR` to 0 over the rounds, as FedDB's code (either times `lr-decay ** (r -"
               " 1)`); a function of the round, so a resumed run continues it exactly unless the resume raises "
               "`num-rounds` (then the rest follows the longer schedule, with a warning)",
               choices=("exponential", "cosine", "cosine-annealing")),
        Option("weight-decay", 0.0, "L2 weight decay of the local optimiser (FixMatch's and FedDB's code: 5e-4)"),
        Option("nesterov", False, "Nesterov momentum for `local-optimizer=sgd` with `local-momentum > 0` (FixMatch, "
               "FedDB's code)"),
        Option("grad-clip-norm", 0.0, "clip each local step's gradient to this 2-norm (FedDB's code: 1); 0 = no "
               "clipping"),
        Option("local-optimizer-state", "fresh", "`fresh` (a new optimiser every round, the FedUL and FedPU papers' "
               "code) or `kept`: a client's optimiser state (momentum, Adam's moments) carries over to its next "
               "round, held by the server between rounds and in its checkpoint (FedDB's code; [the "
               "recipe](recipe.md)); refused with differential privacy", choices=("fresh", "kept")),
        Option("ema-decay", 0.0, "exponential moving average of the global weights per round, which the central "
               "evaluation tests and the run saves (`test-accuracy-without-ema` beside it); 0 = none. FixMatch's "
               "0.999 per step is 0.999 ** S per round of S steps"),
    ),
    "Server strategy": (
        Option("strategy", "fedavg", "the server algorithm ([server strategies](server-strategies.md))"),
        Option("aggregation-weights", "num-examples", "client weights, for every strategy: `num-examples` (n_c) or "
               "`uniform` (1/C, the FedUL authors' code); `uniform` under server-side DP, whose noise assumes equal"
               " weights (set when not typed; a typed `num-examples` is refused)", choices=("num-examples", "uniform")),
        Option("fraction-train", 1.0, "share of connected nodes sampled per round (`participation=poisson`: each "
               "node's probability q of training in a round)"),
        Option("participation", "fixed-size", "which nodes train in a round: `fixed-size` (max(int(N * "
               "`fraction-train`), `min-train-nodes`) of the N connected nodes, drawn without replacement) or "
               "`poisson` (each node on its own with probability q = `fraction-train`; a round may train none; "
               "under server DP the noised sum is divided by the expected cohort qN). Under server DP the draw "
               "comes from the OS CSPRNG, else from the run's `seed`; what each gives in epsilon: "
               "[privacy](privacy.md#participation-and-the-privacy-spent)", choices=("fixed-size", "poisson")),
        Option("min-train-nodes", 2, "at least this many nodes per round (must be <= `min-available-nodes`)"),
        Option("max-failure-fraction", 0.5, "stop the run (with the nodes' errors) when more than this share of a "
               "round's training replies are errors; default 0.5: a minority of failing nodes is survived, a "
               "failing majority (almost always a shared cause) stops the run; 1: only `min-train-nodes` counts. "
               "Failed replies are recorded either way (`failed-replies` per round, failed nodes in the summary)"),
        Option("min-available-nodes", 2, "nodes that must be connected before a round starts"),
        Option("proximal-mu", 0.0, "FedProx mu (0 = FedAvg)"),
        Option("server-lr", 0.0, "server step size; `0` = the strategy's default: FedAvgM 1.0, SCAFFOLD eta_g 1.0, "
               "FedAdam 0.1, FedYogi 0.01, FedAdagrad 0.1"),
        Option("server-momentum", 0.0, "FedAvgM momentum"),
        Option("beta-1", 0.9, "FedAdam / FedYogi first-moment parameter"),
        Option("beta-2", 0.99, "FedAdam / FedYogi second-moment parameter"),
        Option("tau", 0.001, "FedAdam / FedYogi / FedAdagrad adaptivity"),
        Option("scaffold-option", "II", "SCAFFOLD's client control-variate update, `I` or `II` ([update "
               "rules](server-strategies.md#update-rules))", choices=("I", "II")),
    ),
    "Privacy and robustness": (
        Option("num-malicious-nodes", 0, "f, the Byzantine nodes Krum / MultiKrum (need 2f + 3 replies) and Bulyan "
               "(4f + 3) tolerate ([privacy and robustness](privacy.md))"),
        Option("num-nodes-to-select", 1, "how many of the best-scored replies MultiKrum averages"),
        Option("differential-privacy", "none", "`none`; `server-fixed` / `server-adaptive` (Flower's server-side DP "
               "wrappers); `client-local` (Flower's `LocalDpMod` on every node) ([privacy and "
               "robustness](privacy.md))", choices=("none", "server-fixed", "server-adaptive", "client-local")),
        Option("dp-noise-multiplier", 1.0, "z: the server adds N(0, (z C / n)^2) per coordinate to the mean of n "
               "clipped updates"),
        Option("dp-clipping-norm", 1.0, "C, the L2 norm a whole-model update is clipped to (server-fixed, "
               "client-local); the initial C of server-adaptive"),
        Option("dp-target-clipped-quantile", 0.5, "server-adaptive: the share of updates that should be clipped"),
        Option("dp-clip-norm-lr", 0.2, "server-adaptive: the geometric step of C per round"),
        Option("dp-clipped-count-stddev", 0.0, "server-adaptive: sigma_b, the noise (in updates) on the count of "
               "clipped updates; it must exceed z / 2, and the update then carries z_Delta = (z^-2 - (2 "
               "sigma_b)^-2)^-1/2; `0`: max(m / 20, z) for the m nodes a round samples "
               "([privacy](privacy.md#the-privacy-spent))"),
        Option("dp-sensitivity", 1.0, "client-local: the sensitivity in `LocalDpMod`'s noise formula (two updates "
               "clipped to C differ by at most 2C: 2 x dp-clipping-norm is the true one)"),
        Option("dp-epsilon", 1.0, "client-local: the epsilon in `LocalDpMod`'s noise formula sigma = dp-sensitivity "
               "sqrt(2 ln(1.25 / dp-delta)) / dp-epsilon, a per-round guarantee only below 1; the run records the "
               "exact epsilon of one reply (`privacy-epsilon-round`)"),
        Option("dp-delta", 1e-05, "client-local: the delta in `LocalDpMod`'s noise formula; every DP mode: the delta "
               "at which the run records the epsilon it has spent (`privacy-epsilon`, an upper bound, and "
               "`privacy-epsilon-round` in metrics.csv; the summary line)"),
        Option("dp-publish-unnoised-train-metrics", False, "server-fixed / server-adaptive: `true` records the "
               "clients' aggregated train metrics (the train loss, ...) every round; no DP noise covers them, so "
               "they are outside the recorded epsilon, and the summary line says so"),
        Option("dp-publish-unnoised-client-evaluation", False, "every DP mode: `true` runs the clients' evaluation on"
               " their labeled local test splits (`client-test-fraction` > 0) and prints its aggregate each round, "
               "marked `unnoised-`; no DP noise covers it, so it is outside the recorded epsilon. `false` (the "
               "default): no client-side evaluation under DP"),
    ),
    "Outputs and runtime": (
        Option("verbose", False, "`false`: the run prints one line per round (test accuracy, seconds, ETA) and the "
               "summary line; `true`: Flower's full logs as well (the resolved configuration, each round's sampling"
               " and aggregation)"),
        Option("tensorboard", False, "also write the metrics of every round as TensorBoard event files to `<run "
               "folder>/tensorboard` (`pip install \"fedul-flwr[tensorboard]\"` on the server; `tensorboard --logdir "
               "<output-dir>`)"),
        Option("output-dir", "~/fedul-flwr-runs", "where run folders go (on the SuperLink's machine in a deployment; "
               "use absolute paths)"),
        Option("run-name", "", "run folder name, one folder inside `output-dir` (no `/`, not `.` or `..`; default: "
               "time, method, dataset, partition, sets, seed)"),
        Option("resume", False, "continue the run `<output-dir>/<run-name>` from its `checkpoint.pt` up to "
               "`num-rounds` (needs `run-name`; strategies <resumable-strategies>, not with "
               "`differential-privacy=server-adaptive`, whose adapted clipping norm is not checkpointed); refused, "
               "with nothing written, unless the checkpoint was written with the same settings (only "
               "<resume-free-keys>, `cohort`, and `device` in fp32 may differ)"),
        Option("eval-batch-size", 2048, "batch size of evaluation (under `torch.inference_mode`)"),
        Option("evaluate-every", 1, "central evaluation (test set, validation hold-out) every N rounds, and always at"
               " round 0 and the last round, as pfl-research's `evaluation_frequency`; the other rounds' rows hold "
               "their training replies and privacy figures, and their progress line no accuracy"),
        Option("device", "auto", "`auto` (CUDA when present), `cpu`, `cuda`", choices=("auto", "cpu", "cuda")),
        Option("client-threads", 0, "torch threads per client: `0` = the client's CPU share (`OMP_NUM_THREADS`, set "
               "by Ray from `client-resources-num-cpus`), n = exactly n. The thread count changes float reduction "
               "order, so bit-identical repeats need the same count"),
        Option("cohort", "auto", "how the in-process engine (`fedul reproduce`) trains a round's clients: "
               "`sequential` (one after another, all threads), `parallel` (CPU: as many at once as threads, one "
               "thread each; the same replies as sequential at one thread), `batched` (one batched model with "
               "stacked weights; a client it cannot take trains alone) or `auto` (batched on a GPU, parallel on a "
               "CPU with 2+ threads, else sequential); the record names the path ([the cohort "
               "paths](performance.md#the-cohort-paths)); `flwr run .`'s Ray actors ignore it",
               choices=("auto", "sequential", "parallel", "batched")),
        Option("precision", "auto", "`fp32`, `bf16` (autocast of the model forwards; losses, weights and optimiser "
               "stay float32) or `auto`: bf16 only where the CPU (AVX512-BF16/AMX) or GPU computes bfloat16 "
               "natively ([performance](performance.md))", choices=("auto", "fp32", "bf16")),
        Option("memory-format", "auto", "`channels-last` (NHWC), `contiguous` (NCHW) or `auto`: channels-last for "
               "convolutional models; weights leave the client as NCHW either way",
               choices=("auto", "channels-last", "contiguous")),
        Option("fused-optimizer", True, "Adam's/SGD's fused kernels (else PyTorch's per-parameter loop)"),
        Option("compile", False, "`torch.compile` each model (opt-in: compiles for tens of seconds per process; "
               "slower than eager for the paper CNN on 2 CPU cores)"),
    ),
}
"""The general keys' declarations by topic (the sections of docs/configuration.md, in order).
In ``doc``, ``<resumable-strategies>`` and ``<resume-free-keys>`` stand for lists the
renderer takes from the code above this module (:mod:`fedul_flwr.checkpoint`,
:mod:`fedul_flwr.preflight`)."""

CHOICES: dict[str, tuple[str, ...]] = {o.key: o.choices for opts in CORE_OPTIONS.values() for o in opts if o.choices}
"""Fixed choice lists of general keys that have no registry of their own (the keys chosen from
a registry are checked by :mod:`fedul_flwr.preflight`, which knows the registries)."""
