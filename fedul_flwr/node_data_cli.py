"""Command line for deployed nodes' data folders (``fedul node-data``; ``python -m fedul_flwr.node_data_cli``).

``write``
    Simulate N organisations: split the run's dataset exactly as a simulation would
    (``dataset``, ``partition``, ``num-sets``, ``prior-scheme``, ``seed``,
    ``client-test-fraction`` ... of ``--run-config``) and write one node folder per
    partition, ``<out>/node-<i>`` (layout: :mod:`fedul_flwr.data.node_folder.layout`). Start
    SuperNode i with ``--node-config "data-dir=<out>/node-<i>"``. With ``--labeled`` each
    node also gets a labeled part ``labeled/``: the node's whole U-set pool with its true
    labels (not cut by ``--max-set-size``), so a deployment can run the supervised reference.
    With ``client-setting=pu`` in ``--run-config`` the nodes are positive-unlabeled nodes
    (FedPU): ``labeled/`` (the labeled images of the node's positive classes), ``unlabeled/``
    and ``class_prior.csv``, as the simulated PU client would hold them; with
    ``client-setting=labels-at-clients`` (FixMatch, FedDB) ``labeled/`` and ``unlabeled/``;
    with ``client-setting=annotation-heterogeneity`` (HASSLE) the parts each client holds;
    with ``client-setting=labels-at-server`` (SemiFL, FedRGD, FedMatch) ``unlabeled/`` per node
    and the server's folder ``<out>/server`` (``labeled/``: the ``num-labeled`` labeled
    images; start the run with ``server-data-dir=<out>/server``);
    ``--max-set-size`` then caps the labeled and the unlabeled part.
``validate``
    Check node folders against the run's dataset facts (class names, image shape) and print
    a summary: parts, sets, sizes, condition number of the prior matrix. Exit code 1 and the error
    (naming the file, CSV line or value) on the first problem; nothing is modified.

Examples::

    fedul node-data write --out /tmp/nodes --num-nodes 3 --max-set-size 20 \\
        --run-config 'num-sets=10 seed=1'
    fedul node-data write --out /tmp/nodes-sup --num-nodes 3 --labeled
    fedul node-data write --out /tmp/nodes-pu --num-nodes 5 --run-config 'client-setting="pu" positive-classes="2"'
    fedul node-data write --out /tmp/nodes-ssl --num-nodes 3 --run-config 'client-setting="labels-at-clients"'
    fedul node-data write --out /tmp/nodes-las --num-nodes 3 --run-config 'client-setting="labels-at-server"'
    fedul node-data validate /tmp/nodes/node-0 /tmp/nodes/node-1 --dataset mnist-sample
    fedul node-data write --out /tmp/pets-nodes --num-nodes 5 --dataset "hf:/data/pets" --run-config 'image-size=32'
    fedul node-data validate /data/my-images --dataset "hf:/data/pets" --run-config 'image-size=32'

``--dataset`` takes any dataset of the run, the user's own ``hf:<Hub name or /path>`` included
(:mod:`fedul_flwr.data.user_datasets`); a node folder may be an image folder of its own
(:mod:`fedul_flwr.data.node_folder.layout`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedul_flwr.config import ConfigError, RunConfig, check_keys, default_config
from fedul_flwr.config.command_line import parse_run_config
from fedul_flwr.data.datasets import run_dataset_info
from fedul_flwr.data.node_folder.layout import NodeDataError
from fedul_flwr.data.node_folder.reader import validate_node_dir
from fedul_flwr.data.node_folder.writer import write_node_dir
from fedul_flwr.data.simulated import SETTING_PARTS, client_usets, load_client, load_run_dataset
from fedul_flwr.data.sources import server_data
from fedul_flwr.preflight import check_setting, resolve_config
from fedul_flwr.rng import numpy_generator

__all__ = ["main", "write_nodes"]


def write_nodes(
    cfg: RunConfig,
    out: str | Path,
    num_nodes: int,
    *,
    image_format: str = "npy",
    max_set_size: int | None = None,
    labeled: bool = False,
) -> list[Path]:
    """Write ``num_nodes`` node folders ``<out>/node-<i>`` from the run's simulated partitions.

    Node i holds exactly the U sets (and local test split, when ``client-test-fraction``
    > 0) that simulated client ``partition-id=i`` of ``num-partitions=num_nodes`` would
    build (:func:`fedul_flwr.data.simulated.client_usets`), optionally cut to
    ``max_set_size`` images per set.

    Parameters
    ----------
    cfg : RunConfig
        The run configuration (dataset, partition, U-set settings, seed).
    out : str or Path
        Parent folder.
    num_nodes : int
        Number of nodes (= ``num-partitions`` of the simulation).
    image_format : str
        ``"npy"`` or ``"png"`` (see :func:`~fedul_flwr.data.node_folder.writer.write_node_dir`).
    max_set_size : int or None
        Keep at most this many random images per set.
    labeled : bool
        Also write each node's labeled part ``labeled/``: the images of all its U sets, in
        set order, with their true labels. It holds the whole pool: ``max_set_size`` does
        not apply to it.

    Returns
    -------
    list[Path]
        The folders written.

    Raises
    ------
    NodeDataError
        If a target folder exists and is not empty.
    ValueError
        From partitioning / U-set construction.
    """
    if cfg.client_setting != "usets":
        return _write_labeled_unlabeled_nodes(cfg, Path(out), num_nodes, max_set_size, image_format)
    data = load_run_dataset(cfg)
    info = run_dataset_info(cfg.as_dict())
    paths = []
    for i in range(num_nodes):
        usets, local_test = client_usets(cfg, i, num_nodes)
        test = (data.train_x[local_test], data.train_y[local_test]) if len(local_test) else None
        pair = None
        if labeled:
            rows = torch.from_numpy(np.concatenate(usets.indices).astype(np.int64))
            pair = (data.train_x[rows], data.train_y[rows])
        paths.append(
            write_node_dir(
                Path(out) / f"node-{i}",
                data.train_x,
                usets,
                info.class_names,
                image_format=image_format,
                max_set_size=max_set_size,
                labeled=pair,
                test=test,
                meta={"dataset": cfg.dataset, "simulated-from": {"partition-id": i, "num-partitions": num_nodes}},
                rng=numpy_generator("node-folder", cfg.seed, i),
            )
        )
    return paths


def _write_labeled_unlabeled_nodes(cfg: RunConfig, out: Path, num_nodes: int, max_size: int | None,
                                   image_format: str = "npy") -> list[Path]:  # fmt: skip
    """Node folders with a labeled and an unlabeled part (either may be absent: a fully labeled
    or an unlabeled client of the annotation-heterogeneity setting): node i holds what
    simulated client i of the run's ``client-setting`` holds (positive-unlabeled: plus
    ``class_prior.csv``), each part cut to ``max_size`` random images when given. With
    ``labels-at-server`` the server's labeled images go to ``<out>/server`` (last in the
    returned list), cut likewise."""
    info = run_dataset_info(cfg.as_dict())
    parts = frozenset(SETTING_PARTS[cfg.client_setting])
    server = server_data(cfg, simulation=True) if cfg.client_setting == "labels-at-server" else None
    clients = [load_client(cfg, i, num_nodes, parts) for i in range(num_nodes)] + ([server] if server else [])
    nodes = []
    for i, client in enumerate(clients):  # every folder is built and checked before the first is written
        rng = numpy_generator("node-folder", cfg.seed, i)

        def cut(n: int) -> torch.Tensor:
            keep = np.arange(n) if max_size is None or n <= max_size else np.sort(rng.choice(n, max_size, replace=False))
            return torch.from_numpy(keep)

        labeled = None if client.labeled is None else client.labeled
        if labeled is not None:
            lab = cut(len(labeled))
            labeled = (labeled.x[lab], labeled.y[lab])
        if client.positive_classes is not None:  # a PU node's positive classes are the classes of its labels
            kept = set() if labeled is None else {int(c) for c in labeled[1].unique()}
            lost = [info.class_names[c] for c in client.positive_classes if c not in kept]
            if lost:
                raise NodeDataError(
                    f"node-{i}: positive class(es) {lost} would get no labeled image (--max-set-size {max_size} keeps "
                    f"{0 if labeled is None else len(labeled[1])} of its {len(client.labeled or ())} labeled images); "
                    "raise --max-set-size"
                )
        unlabeled = None if client.unlabeled is None else client.unlabeled[cut(len(client.unlabeled))]
        test = None if client.test is None else (client.test.x, client.test.y)
        nodes.append((client, labeled, unlabeled, test))
    paths = []
    for i, (client, labeled, unlabeled, test) in enumerate(nodes):
        images = client.unlabeled if client.unlabeled is not None else labeled[0]  # type: ignore[index]
        origin = {"partition-id": i, "num-partitions": num_nodes} if i < num_nodes else "the server's labeled images"
        paths.append(
            write_node_dir(
                out / (f"node-{i}" if i < num_nodes else "server"), images, None, info.class_names, unlabeled=unlabeled,
                labeled=labeled, class_prior=client.class_prior, test=test, image_format=image_format,
                meta={"dataset": cfg.dataset, "simulated-from": origin},
            )
        )  # fmt: skip
    return paths


def _run_config(text: list[str] | None, dataset: str | None) -> RunConfig:
    values = parse_run_config(text)
    if dataset:
        values["dataset"] = dataset
    cfg = resolve_config(values)
    check_setting(cfg)  # what the simulated split needs (num-sets >= K, a usable class prior)
    return cfg


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedul node-data", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``write`` and ``validate`` subcommands (with ``parser``'s help formatter)."""
    sub = parser.add_subparsers(dest="node_command", required=True, metavar="{write,validate}")
    parser_kwargs = {"formatter_class": parser.formatter_class}
    run_config_help = "run settings as for `flwr run --run-config`, e.g. 'num-sets=10 seed=1 partition=\"noniid\"'"

    w = sub.add_parser("write", help="write simulated node folders from the run's dataset", **parser_kwargs)
    w.add_argument("--out", required=True, help="parent folder; node i goes to <out>/node-<i>")
    w.add_argument("--num-nodes", type=int, required=True, help="number of nodes (= num-partitions)")
    w.add_argument("--dataset", help="shortcut for --run-config dataset=...")
    w.add_argument("--run-config", action="append", help=run_config_help)
    w.add_argument("--format", choices=("npy", "png"), default="npy",
                   help="images.npy per set and part, or PNG files (labeled/ as one folder per class)")
    w.add_argument("--max-set-size", type=int, default=None, help="keep at most this many random images per set")
    w.add_argument(
        "--labeled",
        action="store_true",
        help="also write each node's labeled part labeled/: its whole U-set pool with true labels "
        "(not cut by --max-set-size), for the supervised reference",
    )

    v = sub.add_parser("validate", help="check node folders and print a summary", **parser_kwargs)
    v.add_argument("dirs", nargs="+", help="node folder(s)")
    v.add_argument("--dataset", help="the run's dataset (class names, image shape); shortcut for dataset=...")
    v.add_argument("--run-config", action="append", help=run_config_help + " (class-names=... for custom names)")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (0 ok, 1 invalid data or settings, 2 usage)."""
    return run(_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the parsed ``write`` / ``validate`` command; returns the exit code."""
    try:
        if args.node_command == "validate":  # needs the dataset's facts only, no dataset files
            for path in args.dirs:
                print(validate_node_dir(path, *_facts(_validate_settings(args.run_config, args.dataset))).summary())
            return 0
        cfg = _run_config(args.run_config, args.dataset)
        if args.node_command == "write":
            if args.num_nodes < 1:
                raise ValueError(f"--num-nodes must be >= 1, got {args.num_nodes}")
            paths = write_nodes(
                cfg,
                args.out,
                args.num_nodes,
                image_format=args.format,
                max_set_size=args.max_set_size,
                labeled=args.labeled,
            )
            for path in paths:
                print(validate_node_dir(path, *_facts(cfg.as_dict())).summary())
        return 0
    except (NodeDataError, ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _validate_settings(text: list[str] | None, dataset: str | None) -> dict[str, Any]:
    """The dataset facts ``validate`` checks against: ``dataset`` and ``class-names`` from the
    arguments (the project's default dataset otherwise); other known keys do not change them.

    Raises
    ------
    ConfigError
        On a key that is not a run-config key (naming the closest valid one), or bad
        ``class-names``.
    ValueError
        On an unknown dataset.
    """
    values = parse_run_config(text)
    check_keys(values)  # a typo such as 'datset' must not pass as a check against the default dataset
    return {**values, "dataset": dataset or str(values.get("dataset", default_config()["dataset"]))}


def _facts(values: dict[str, Any]) -> tuple[tuple[str, ...], int, int, bool]:
    """What a node folder is checked against: the run's dataset facts
    (:func:`~fedul_flwr.data.datasets.run_dataset_info`) and whether ``image-size`` resizes."""
    info = run_dataset_info(values)
    return info.class_names, info.image_size, info.channels, int(values.get("image-size", 0)) > 0


if __name__ == "__main__":
    sys.exit(main())
