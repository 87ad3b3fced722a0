"""How the audit's texts count things (the report's and the transaction checks')."""

from __future__ import annotations


def counted(n: int, singular: str, plural: str | None = None) -> str:
    return f"{n:,} {singular if n == 1 else plural or singular + 's'}"
