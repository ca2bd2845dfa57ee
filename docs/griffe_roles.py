"""Griffe extension of the documentation site (``mkdocs.yml``): the Sphinx roles of the
package's docstrings become cross-references when mkdocstrings loads them
(:func:`fedul_flwr.markup.crossrefs`; a short name is resolved where the docstring stands:
the object's members, its parents', then the module's imports)."""

from __future__ import annotations

from typing import Any

import griffe

from fedul_flwr.markup import crossrefs


def _resolver(obj: griffe.Object) -> Any:
    def canonical(path: str) -> str:
        try:  # an import: link to where the object is defined
            member = obj.modules_collection.get_member(path)
            return member.final_target.path if member.is_alias else member.path
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError, ValueError):
            return path

    def resolve(name: str) -> str:
        first, dot, rest = name.partition(".")
        scope: griffe.Object | griffe.Alias | None = obj
        while scope is not None:
            try:
                path = scope.resolve(first)
            except (griffe.NameResolutionError, AttributeError, KeyError):
                scope = scope.parent
                continue
            path = canonical(path)
            return canonical(f"{path}.{rest}") if dot else path
        return canonical(name)

    return resolve


def _objects(obj: griffe.Object) -> Any:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring of a loaded package."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = crossrefs(obj.docstring.value, _resolver(obj))
