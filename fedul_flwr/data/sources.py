"""Where a ClientApp's data comes from: a simulated partition or a deployed node's folder.

The one place that decides it, from ``context.node_config``:

- ``data-dir`` set (deployment: ``flower-supernode --node-config "data-dir=/path"``): the node
  folder of :mod:`fedul_flwr.data.node_dir`, checked against the run's dataset facts;
- else ``partition-id`` / ``num-partitions`` (simulation): :mod:`fedul_flwr.data.simulated`.

Both build the same :class:`~fedul_flwr.data.client_data.ClientData`; the method's required
parts are checked here, at the boundary, in both cases.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedul_flwr import get_logger
from fedul_flwr.config import ConfigError, RunConfig
from fedul_flwr.data.client_data import ClientData, MissingPartError
from fedul_flwr.data.datasets import DatasetInfo
from fedul_flwr.data.node_dir import load_node_dir
from fedul_flwr.data.simulated import SETTING_PARTS, load_client
from fedul_flwr.data.user_datasets import UserDatasetOptions, any_dataset_info

__all__ = ["client_from_node_config", "node_key", "run_dataset_info"]

log = get_logger(__name__)


def run_dataset_info(cfg: RunConfig) -> DatasetInfo:
    """The run's dataset facts a node must match: ``dataset`` with ``class-names`` applied
    (:func:`dataset_facts`)."""
    return dataset_facts(cfg.dataset, cfg.class_names, UserDatasetOptions.from_values(cfg.as_dict()))


def dataset_facts(dataset: str, class_names: str = "", options: UserDatasetOptions | None = None) -> DatasetInfo:
    """Class names, image size and channels of ``dataset``, with the comma-separated
    ``class_names`` (the ``class-names`` key) replacing its own names when given. Needs no
    dataset files (a user dataset ``hf:...`` is read with ``options``).

    Raises
    ------
    ConfigError
        If ``class_names`` does not list K distinct names (K of the dataset).
    ValueError
        On an unknown dataset name.
    """
    info = any_dataset_info(dataset, options or UserDatasetOptions())
    if not class_names.strip():
        return info
    names = tuple(n.strip() for n in class_names.split(","))
    if len(names) != len(info.class_names) or len(set(names)) != len(names) or not all(names):
        raise ConfigError(
            f"class-names={class_names!r}: expected {len(info.class_names)} distinct non-empty comma-separated "
            f"names (K of dataset {dataset!r}), got {len(names)}"
        )
    return dataclasses.replace(info, class_names=names)


def _dir_fingerprint(path: str) -> tuple[tuple[str, int], ...]:
    """(name, mtime_ns) of a node folder's files and folders, so edits invalidate the cache."""
    root = Path(path).expanduser()
    if not root.is_dir():
        return ()
    return tuple(sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*")))


@functools.lru_cache(maxsize=16)
def _load_node(cfg: RunConfig, path: str, fingerprint: tuple[tuple[str, int], ...]) -> ClientData:
    info = run_dataset_info(cfg)
    client = load_node_dir(
        path, class_names=info.class_names, image_size=info.image_size, channels=info.channels, mean=info.mean, std=info.std
    )
    log.info("node data %s: parts %s", path, list(client.parts()))
    return client


def client_from_node_config(
    cfg: RunConfig, node_config: Mapping[str, Any], *, method: str, parts: Iterable[str], uses: Iterable[str] = ()
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
        If ``node_config`` has neither ``data-dir`` nor ``partition-id``/``num-partitions``.
    """
    needed = frozenset(parts)
    wanted = needed | frozenset(uses)
    data_dir = str(node_config.get("data-dir", "")).strip()
    if data_dir:
        path = str(Path(data_dir).expanduser().resolve())
        client = _load_node(cfg, path, _dir_fingerprint(path))
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
