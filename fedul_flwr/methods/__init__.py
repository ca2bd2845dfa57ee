"""Learning methods behind one interface (:class:`fedul_flwr.methods.base.Method`).

Every module (or sub-package) of this package that defines a method registers it in
:data:`METHODS` with :func:`~fedul_flwr.methods.base.register_method`; all of them are
imported here, so adding a method means adding its module, nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil

from fedul_flwr.methods.base import (
    METHODS,
    LocalTask,
    Method,
    ModelSpec,
    NothingToTrain,
    RoundContext,
    Stream,
    method_class,
    register_method,
)

for _module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")


def get_method(name: str) -> type[Method]:
    """The method class of ``name``: a registered name or ``"module:Class"``
    (:func:`~fedul_flwr.methods.base.method_class`).

    Raises
    ------
    UnknownChoiceError
        If no method has that name (lists the registered ones).
    """
    return method_class(name)


__all__ = ["METHODS", "LocalTask", "Method", "ModelSpec", "NothingToTrain", "RoundContext", "Stream", "get_method", "register_method"]
