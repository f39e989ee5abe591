"""The pipe tables of a Markdown text (a model card, results.md), read into rows keyed by their header, so a test
checks a cell by its column and row rather than a line's exact spelling."""

from __future__ import annotations


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def tables(text: str) -> list[list[dict[str, str]]]:
    """Each table of ``text`` (a header line, a ``---`` line, rows), as a list of ``{header: cell}`` rows."""
    found, lines = [], text.splitlines()
    for i in range(len(lines) - 1):
        header, rule = lines[i].strip(), lines[i + 1].strip()
        if header.startswith("|") and rule.startswith("|") and set(rule) <= set("|-: "):
            names, rows = _cells(header), []
            for line in lines[i + 2:]:
                if not line.strip().startswith("|"):
                    break
                rows.append(dict(zip(names, _cells(line))))
            found.append(rows)
    return found


def cell_rows(text: str) -> list[list[str]]:
    """Every pipe-table line of ``text`` as its cells, the ``---`` lines left out: for a table whose column names are
    not its first line (the paper's layouts: a line naming the models, then the names of the columns as a row)."""
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    return [_cells(line) for line in lines if not set(line) <= set("|-: ")]


def table_with(text: str, column: str) -> list[dict[str, str]]:
    """The first table of ``text`` that has ``column``; ``AssertionError`` naming the headers found without one."""
    for rows in tables(text):
        if rows and column in rows[0]:
            return rows
    raise AssertionError(f"no table with a {column!r} column; tables' headers: "
                         f"{[list(rows[0]) for rows in tables(text) if rows]}")


def row_of(text: str, column: str, value: str) -> dict[str, str]:
    """The row of the first table with ``column`` whose ``column`` cell is ``value``."""
    rows = table_with(text, column)
    for row in rows:
        if row.get(column) == value:
            return row
    raise AssertionError(f"no row with {column} = {value!r}: {[row.get(column) for row in rows]}")


__all__ = ["cell_rows", "row_of", "table_with", "tables"]
