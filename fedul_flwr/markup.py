"""The Sphinx cross-reference roles of the package's docstrings (``:class:`RunConfig```,
``:func:`~fedul_flwr.execution.model_seed```, ...) turned into what each reader understands:
plain text for the terminal (``fedul --help``), and mkdocstrings cross-references (links) for
the documentation site, applied when the site's API pages load the docstrings
(``docs/griffe_roles.py``, a Griffe extension named in ``mkdocs.yml``). The source keeps the
roles, so the docstrings read the same in an editor and in ``help()``."""

from __future__ import annotations

import html
import re
from collections.abc import Callable

__all__ = ["ROLE", "crossrefs", "plain"]

ROLE = re.compile(r":(?:py:)?(?P<role>class|func|data|mod|meth|attr|exc|obj|const):`(?P<tilde>~)?(?P<target>[^`]+)`")
"""A Sphinx role: ``:role:`target``` or ``:role:`~target``` (``~``: show the last name only)."""
_LITERAL = re.compile(r"``(?P<text>[^`]+)``")


def _shown(match: re.Match[str]) -> str:
    target = match["target"].strip()
    text = target.rsplit(".", 1)[-1] if match["tilde"] else target
    return f"{text}()" if match["role"] in ("func", "meth") and not text.endswith(")") else text


def plain(text: str) -> str:
    """``text`` with every role replaced by the name it shows and ``\\`\\`literals\\`\\``` by
    their text: for a terminal."""
    return _LITERAL.sub(lambda m: m["text"], ROLE.sub(_shown, text))


def crossrefs(text: str, resolve: Callable[[str], str]) -> str:
    """``text`` with every role replaced by an optional mkdocs-autorefs cross-reference to the
    object ``resolve(target)`` names (its full dotted path): a link where the site renders that
    object, the name in code font where it does not (e.g. an object of another package).
    Roles inside code spans or blocks are left alone: the docstrings quote roles nowhere."""

    def link(match: re.Match[str]) -> str:
        identifier = resolve(match["target"].strip())
        return f'<autoref identifier="{html.escape(identifier)}" optional><code>{html.escape(_shown(match))}</code></autoref>'

    return ROLE.sub(link, text)
