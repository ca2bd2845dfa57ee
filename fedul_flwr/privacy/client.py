"""Client-side DP (``client-local``): the Gaussian mechanism of Flower's ``LocalDpMod`` as a
ClientApp mod (:func:`local_dp_mod`), with this project's clip and noise
(:mod:`fedul_flwr.privacy.mechanism`). The overview is :mod:`fedul_flwr.privacy`.
"""

from __future__ import annotations

import math

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MessageType
from flwr.clientapp.typing import ClientAppCallable

from fedul_flwr import wire
from fedul_flwr.config import RunConfig, config_from_json
from fedul_flwr.privacy.mechanism import NonFiniteUpdateError, add_noise, clip_update, release_generator

__all__ = ["local_dp_mod"]


def _run_config(msg: Message) -> RunConfig | None:
    config = msg.content.config_records.get(wire.CONFIG)
    text = None if config is None else config.get(wire.RUN_CONFIG)
    return config_from_json(text) if isinstance(text, str) else None


def local_dp_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Client-side mod for ``differential-privacy=client-local`` (a pass-through otherwise): the
    Gaussian mechanism of Flower's ``LocalDpMod`` on the train reply, with its clipping and its
    sigma = ``dp-sensitivity`` sqrt(2 ln(1.25 / dp-delta)) / ``dp-epsilon``, the noise drawn from
    :func:`release_generator`.

    The update (reply minus the received copy of exactly the models the client sends, HASSLE's
    partial replies included) is clipped to ``dp-clipping-norm`` (:func:`clip_update`: a zero
    update stays zero), added back to the received arrays and noised; a client that sat the
    round out and failed replies pass unchanged.

    Raises
    ------
    NonFiniteUpdateError
        If the update holds NaN or an infinity (the ClientApp replies with the error, so the
        server records a failed reply of this node).
    """
    cfg = _run_config(msg) if msg.metadata.message_type == MessageType.TRAIN else None
    if cfg is None or cfg.differential_privacy != "client-local":
        return call_next(msg, context)
    reply = call_next(msg, context)
    if reply.has_error() or not len(reply.content[wire.ARRAYS]):
        return reply
    sent = reply.content[wire.ARRAYS]
    received = msg.content[wire.ARRAYS]
    keys = list(sent.keys())
    with wire.decoding():
        base = [received[k].numpy() for k in keys]
        updated = [sent[k].numpy() for k in keys]
    try:
        clipped, _ = clip_update([np.subtract(u, b) for u, b in zip(updated, base, strict=True)],
                                 cfg.dp_clipping_norm)  # fmt: skip
    except NonFiniteUpdateError as exc:
        raise NonFiniteUpdateError(f"node {context.node_id}: {exc}") from None
    sigma = cfg.dp_sensitivity * math.sqrt(2 * math.log(1.25 / cfg.dp_delta)) / cfg.dp_epsilon
    noisy = add_noise([b + c for b, c in zip(base, clipped, strict=True)], sigma, release_generator())
    reply.content[wire.ARRAYS] = ArrayRecord({k: Array(np.asarray(v)) for k, v in zip(keys, noisy, strict=True)})
    return reply
