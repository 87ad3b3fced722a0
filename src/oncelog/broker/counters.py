"""Per-partition counts of produce outcomes (appended, each error), for operators."""

from __future__ import annotations

import collections


class Counters:
    def __init__(self) -> None:
        self._counts: dict[tuple[str, int], collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )

    def inc(self, topic: str, partition: int, outcome: str, n: int = 1) -> None:
        self._counts[(topic, partition)][outcome] += n

    def snapshot(self) -> dict[tuple[str, int], dict[str, int]]:
        return {key: dict(counter) for key, counter in self._counts.items()}
