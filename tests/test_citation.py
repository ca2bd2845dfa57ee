"""CITATION.cff is valid CFF 1.2 (the keys GitHub's "Cite this repository" needs) and cites the
software and the paper of every method; the README's method table links the same papers."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
CFF = yaml.safe_load((REPO / "CITATION.cff").read_text())
METHOD_DOCS = ("fedul", "fedpu", "feddb", "hassle")


def _names(person: dict) -> str:
    return person.get("name") or f"{person['given-names']} {person['family-names']}"


def test_citation_file_has_the_required_cff_keys() -> None:
    assert CFF["cff-version"] == "1.2.0"
    assert CFF["type"] == "software"
    for key in ("message", "title", "version", "license"):
        assert isinstance(CFF[key], str) and CFF[key].strip(), key
    assert CFF["authors"] and all(_names(a) for a in CFF["authors"])
    project = (REPO / "pyproject.toml").read_text()
    assert re.search(rf'^version = "{re.escape(CFF["version"])}"$', project, re.M), "CITATION.cff version != pyproject"


def test_citation_file_lists_each_methods_paper_in_full() -> None:
    papers = CFF["references"]
    assert len(papers) == len(METHOD_DOCS)
    for paper in papers:
        assert paper["type"] in {"conference-paper", "article"}, paper["title"]
        assert len(paper["authors"]) >= 2 and all(_names(a) for a in paper["authors"]), paper["title"]
        assert isinstance(paper["year"], int) and 2020 <= paper["year"] <= 2030
        assert paper.get("collection-title") or paper.get("journal"), f"{paper['title']}: no venue"
        assert paper["url"].startswith("https://")


def test_readme_and_method_pages_link_the_cited_papers() -> None:
    """Every paper of CITATION.cff is linked, with its title, from the README's method table and
    from its method's docs page, and the README names its first author."""
    readme = (REPO / "README.md").read_text()
    pages = {name: (REPO / "docs" / f"{name}.md").read_text() for name in METHOD_DOCS}
    for paper in CFF["references"]:
        link = f"({paper['url']})"
        row = next((line for line in readme.splitlines() if line.startswith("|") and link in line), None)
        assert row is not None, f"README table does not link {paper['url']}"
        assert paper["title"] in row and paper["authors"][0]["family-names"] in row
        flat = {name: " ".join(text.split()) for name, text in pages.items()}
        assert any(link in text and paper["title"] in text for text in flat.values()), paper["title"]
