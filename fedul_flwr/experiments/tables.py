"""The one Markdown table renderer of the ``fedul`` commands: every results, benchmark and
comparison table is laid out by tabulate's GitHub format (pipe tables, columns padded to
their widest cell), from cells that the caller has already formatted as text."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tabulate import tabulate

__all__ = ["markdown_table", "table_rows"]


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown pipe table, without a trailing newline.

    Parameters
    ----------
    headers : sequence of str
        Column titles.
    rows : iterable of sequences
        One sequence of cells per row, as many as ``headers``; cells are shown as ``str()``
        gives them (no number parsing or reformatting: the caller chose the digits).

    Returns
    -------
    str
        The header line, the separator line and one line per row.

    Raises
    ------
    ValueError
        If a row has another number of cells than ``headers``.
    """
    rows = [[str(cell) for cell in row] for row in rows]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"a table row has {len(row)} cells for {len(headers)} columns: {row}")
    return tabulate(rows, headers=list(headers), tablefmt="github", disable_numparse=True)


def table_rows(text: str) -> list[list[str]]:
    """The cells of every pipe-table line of ``text`` (header lines included, separator lines
    left out), stripped: the inverse of :func:`markdown_table` whatever the column widths."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if all(c and set(c) <= set(":-") for c in cells):
            continue
        rows.append(cells)
    return rows
