"""Every page under ``docs/`` is in the site's ``nav`` (``mkdocs build --strict`` refuses one
that is not), checked without building the site: a page added without its nav entry fails here
in a second instead of at the end of CI's docs build."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _nav_pages(node) -> set[str]:
    """The ``.md`` paths named anywhere in a nav tree (lists of one-key dicts or strings)."""
    if isinstance(node, str):
        return {node} if node.endswith(".md") else set()
    if isinstance(node, dict):
        return set().union(*(_nav_pages(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_nav_pages(v) for v in node)) if node else set()
    return set()


def _excluded(rel: str, patterns: list[str]) -> bool:
    for pattern in patterns:
        if pattern.endswith("/"):
            prefix = pattern.rstrip("/")
            parts = rel.split("/")
            if any(fnmatch.fnmatch("/".join(parts[: i + 1]), prefix) for i in range(len(parts))):
                return True
        elif fnmatch.fnmatch(rel, pattern):
            return True
    return False


def test_every_docs_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    patterns = [line.strip() for line in config.get("exclude_docs", "").splitlines() if line.strip()]
    nav = _nav_pages(config["nav"])
    pages = {
        p.relative_to(ROOT / "docs").as_posix()
        for p in (ROOT / "docs").rglob("*.md")
    }
    pages = {p for p in pages if not _excluded(p, patterns)}
    missing = sorted(pages - nav)
    assert not missing, f"pages under docs/ not in mkdocs.yml's nav: {missing}"
    dangling = sorted(p for p in nav if not (ROOT / "docs" / p).is_file())
    assert not dangling, f"mkdocs.yml's nav names pages that do not exist: {dangling}"
