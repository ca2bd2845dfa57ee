"""Where a ClientApp's data comes from: a simulated partition or a deployed node's folder (and
where the server's own labeled images come from in the labels-at-server setting:
:func:`server_data`).

The one place that decides it, from ``context.node_config``:

- ``data-dir`` set (deployment: ``flower-supernode --node-config "data-dir=/path"``): the node
  folder of :mod:`fedul_flwr.data.node_folder.layout`, checked against the run's dataset facts, which
  the ServerApp sends with every message (:data:`fedul_flwr.wire.DATASET_FACTS`): a node
  never opens the server's dataset, only its own folder;
- else ``partition-id`` / ``num-partitions`` (simulation): :mod:`fedul_flwr.data.simulated`.

Both build the same :class:`~fedul_flwr.data.client_data.ClientData`; the method's required
parts are checked here, at the boundary, in both cases.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from fedul_flwr import get_logger
from fedul_flwr.config import RunConfig, resolve_path
from fedul_flwr.data.client_data import ClientData, LabeledImages, MissingPartError
from fedul_flwr.data.datasets import run_dataset_info
from fedul_flwr.data.image_dataset import DatasetInfo
from fedul_flwr.data.node_folder.layout import NodeDataError
from fedul_flwr.data.node_folder.reader import load_node_dir
from fedul_flwr.data.simulated import SETTING_PARTS, load_client, load_run_dataset, server_labeled_rows

__all__ = ["client_from_node_config", "node_key", "server_data"]

log = get_logger(__name__)


def _dir_fingerprint(path: str) -> tuple[tuple[str, int], ...]:
    """(name, mtime_ns) of a node folder's files and folders, so edits invalidate the cache."""
    root = Path(path).expanduser()
    if not root.is_dir():
        return ()
    return tuple(sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*")))


@functools.lru_cache(maxsize=16)
def _load_node(facts: DatasetInfo, resize: bool, path: str, fingerprint: tuple[tuple[str, int], ...]) -> ClientData:
    client = load_node_dir(path, class_names=facts.class_names, image_size=facts.image_size, channels=facts.channels,
                           mean=facts.mean, std=facts.std, resize=resize, flip=facts.flip)  # fmt: skip
    log.info("node data %s: parts %s", path, list(client.parts()))
    return client


def client_from_node_config(
    cfg: RunConfig, node_config: Mapping[str, Any], *, method: str, parts: Iterable[str], uses: Iterable[str] = (),
    facts: DatasetInfo | None = None,
) -> ClientData:
    """The client's data, from a deployed node's folder or a simulated partition.

    Parameters
    ----------
    cfg : RunConfig
        The run configuration.
    node_config : Mapping[str, Any]
        ``context.node_config``.
    method : str
        The run's method (named in errors).
    parts : Iterable[str]
        The parts the method needs (``Method.requires``): a client without one is an error.
    uses : Iterable[str]
        The parts the method uses where a client has them (``Method.uses``); a simulated
        client builds them too.
    facts : DatasetInfo, optional
        The run's dataset facts as the server sent them; a node folder is read against them
        (its images decoded to their channels and size, resized where ``image-size`` > 0).

    Returns
    -------
    ClientData
        Cached per process (a node folder is re-read when its files change).

    Raises
    ------
    NodeDataError
        If the node folder is missing or invalid (the message names file, row or value).
    MissingPartError
        If the client lacks a part the method needs (names method, part and node).
    ValueError
        If ``node_config`` has neither ``data-dir`` nor ``partition-id``/``num-partitions``,
        or names a ``data-dir`` and no ``facts`` came with the message.
    """
    needed = frozenset(parts)
    wanted = needed | frozenset(uses)
    data_dir = str(node_config.get("data-dir", "")).strip()
    if data_dir:
        if facts is None:
            raise ValueError("a node folder is read against the run's dataset facts, and the message carries none: "
                             "the fedul-flwr ServerApp sends them with every message")  # fmt: skip
        try:  # a symlink loop, named with the node's key
            path = str(resolve_path(data_dir))
        except ValueError as exc:
            raise NodeDataError(f"data-dir={data_dir!r}: {exc}") from None
        client = _load_node(facts, cfg.image_size > 0, path, _dir_fingerprint(path))
    elif "partition-id" in node_config and "num-partitions" in node_config:
        client = load_client(cfg, int(node_config["partition-id"]), int(node_config["num-partitions"]), wanted)
    else:
        raise ValueError(
            f"node_config {dict(node_config)} names no data: give 'data-dir=/path' (deployment) or "
            "'partition-id' and 'num-partitions' (simulation)"
        )
    try:
        client.require(method, sorted(needed))
    except MissingPartError as exc:
        if data_dir:
            raise
        holds = [name for name, held in SETTING_PARTS.items() if needed <= set(held)]
        raise MissingPartError(f"{exc}; in simulation client-setting={cfg.client_setting!r} chooses the parts: "
                               f"set client-setting to one of {holds}") from None  # fmt: skip
    return client


def node_key(node_config: Mapping[str, Any], node_id: int) -> int:
    """A stable per-node integer for seeds, per-client settings and the aggregation order.

    The partition id in simulation (or where a deployed node is given one with
    ``--node-config "partition-id=..."``), else a hash of the node's data folder (stable
    across SuperNode restarts, unlike the node id), else the node id.
    """
    if "partition-id" in node_config:
        return int(node_config["partition-id"])
    data_dir = str(node_config.get("data-dir", "")).strip()
    if data_dir:
        return int.from_bytes(hashlib.sha256(data_dir.encode()).digest()[:4], "little")
    return int(node_id)


def server_data(cfg: RunConfig, simulation: bool) -> ClientData | None:
    """The server's own labeled images, in the labels-at-server setting; ``None`` elsewhere.

    - ``server-data-dir`` set: that folder, in the node folder layout
      (:mod:`fedul_flwr.data.node_folder.layout`), read against the run's dataset facts; its
      labeled part is the server's labeled set (any unlabeled part is ignored).
    - else, in a simulation with ``client-setting=labels-at-server``: the class-balanced pool of
      ``num-labeled`` training images (:func:`~fedul_flwr.data.simulated.server_labeled_rows`).
    - else ``None``: the server holds no labels (a deployment needs ``server-data-dir`` for them).

    Returns
    -------
    ClientData | None
        With the ``labeled`` part only (``node`` names the folder or ``"the server"``).

    Raises
    ------
    NodeDataError
        If ``server-data-dir`` is not a valid node folder (names the file, row or value).
    MissingPartError
        If that folder holds no labeled images.
    """
    if cfg.server_data_dir:
        facts = run_dataset_info(cfg.as_dict())
        path = str(Path(cfg.server_data_dir).expanduser().resolve())
        folder = _load_node(facts, cfg.image_size > 0, path, _dir_fingerprint(path))
        if folder.labeled is None or not len(folder.labeled):
            raise MissingPartError(f"the server's folder {path} holds no labeled images (a labeled/ part), only "
                                   f"{list(folder.parts()) or 'nothing'}")  # fmt: skip
        return ClientData(node=f"the server's folder {path}", class_names=folder.class_names, mean=folder.mean,
                          std=folder.std, labeled=folder.labeled, flip=folder.flip)  # fmt: skip
    if not simulation or cfg.client_setting != "labels-at-server":
        return None
    data = load_run_dataset(cfg)
    rows = torch.from_numpy(server_labeled_rows(cfg))
    return ClientData(node="the server", class_names=data.class_names, mean=data.mean, std=data.std,
                      labeled=LabeledImages(data.train_x[rows], data.train_y[rows].clone()),
                      flip=run_dataset_info(cfg.as_dict()).flip)  # fmt: skip
