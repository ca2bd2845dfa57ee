"""Named registries: the one list of each configurable choice.

Every choice a run makes by name -- dataset, model, partition, prior scheme, method, strategy,
surrogate loss -- has one :class:`Registry`, defined in the module that implements the
choice. The run configuration takes its list of valid values from the registry
(:mod:`fedul_flwr.config`), so adding a choice means registering it where it is implemented,
nothing else.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["Registry", "UnknownChoiceError", "closest"]


def closest(name: str, valid: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the valid name nearest to a mistyped ``name``
    (:func:`difflib.get_close_matches`, similarity >= 0.6, compared without case: ``'POISSON'``
    finds ``'poisson'``), else ``""``; for error messages."""
    names = {str(v).lower(): str(v) for v in reversed(list(valid))}  # the first spelling wins on a tie of cases
    match = difflib.get_close_matches(str(name).lower(), list(names), n=1)
    return f" (did you mean {names[match[0]]!r}?)" if match else ""


class UnknownChoiceError(ValueError):
    """A name that is not registered; the message names the setting, the value and the valid names."""


class Registry(Generic[T]):
    """An ordered mapping of names to objects (classes, factories, functions).

    Parameters
    ----------
    key : str
        The run-config key whose values this registry lists (``"method"``, ``"model"``, ...);
        used in error messages.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering its argument under ``name``.

        Raises
        ------
        ValueError
            If ``name`` is already registered (two implementations of one choice).
        """

        def add(obj: T) -> T:
            self.add(name, obj)
            return obj

        return add

    def add(self, name: str, obj: T) -> None:
        """Register ``obj`` under ``name``.

        Raises
        ------
        ValueError
            If ``name`` is already registered.
        """
        if name in self._items:
            raise ValueError(f"{self.key}={name!r} is registered twice ({self._items[name]!r} and {obj!r})")
        self._items[name] = obj

    def get(self, name: str) -> T:
        """The object registered as ``name``.

        Raises
        ------
        UnknownChoiceError
            Naming the key, the value and the registered names.
        """
        try:
            return self._items[name]
        except KeyError:
            raise UnknownChoiceError(f"{self.key}={name!r} is not one of {self.names()}{closest(name, self._items)}") from None

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[tuple[str, T]]:
        """(name, object) pairs in registration order."""
        return list(self._items.items())
