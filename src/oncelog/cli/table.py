"""The one table printer of the ``oncelog`` command, in the two layouts Kafka's tools print,
so that scripts written for Kafka's output read ours:

* ``aligned``: kafka-consumer-groups.sh's printf layout: each column padded to a width the
  caller chose (at least a minimum, else its widest cell) and a space, the last column not
  padded; ``print_aligned`` prints a blank line first, as Kafka does.
* ``tabbed``: Kafka's prettyPrintTable (kafka-transactions.sh): each column as wide as its
  widest cell, header included, cells separated by a tab, trailing blanks dropped.
"""

from __future__ import annotations

from collections.abc import Iterable


def column_width(minimum: int, values: Iterable[str]) -> int:
    """A column's width for ``aligned``: its widest value, at least ``minimum``."""
    return max([minimum, *(len(v) for v in values)])


def aligned(rows: list[tuple[str, ...]], widths: list[int]) -> list[str]:
    return [" ".join(str(cell).ljust(w) for cell, w in zip(row[:-1], widths, strict=False))
            + " " + str(row[-1]) for row in rows]


def print_aligned(rows: list[tuple[str, ...]], widths: list[int]) -> None:
    # Kafka starts every line with a newline and ends with one: a blank line, then the rows.
    print()
    for line in aligned(rows, widths):
        print(line.rstrip())


def tabbed(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    return ["\t".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in (headers, *rows)]


def print_tabbed(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    for line in tabbed(headers, rows):
        print(line)
