"""Learning methods behind one interface (:class:`fedul_flwr.methods.base.Method`)."""

from __future__ import annotations

from fedul_flwr.methods.base import LocalTask, Method
from fedul_flwr.methods.fedllp import FedLLP
from fedul_flwr.methods.fedllp_vat import FedLLPVAT
from fedul_flwr.methods.fedpl import FedPL
from fedul_flwr.methods.fedul import FedUL
from fedul_flwr.methods.supervised import Supervised

METHODS: dict[str, type[Method]] = {cls.name: cls for cls in (FedUL, FedPL, FedLLP, FedLLPVAT, Supervised)}


def get_method(name: str) -> type[Method]:
    """The method class registered as ``name``.

    Raises
    ------
    ValueError
        If no method has that name (lists the registered ones).
    """
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"method={name!r} is not one of {sorted(METHODS)}") from None


__all__ = ["METHODS", "FedLLP", "FedLLPVAT", "FedPL", "FedUL", "Supervised", "LocalTask", "Method", "get_method"]
