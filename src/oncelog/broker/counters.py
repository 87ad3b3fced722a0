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

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's counts go with it (a topic made again later starts from zero)."""
        for key in [k for k in self._counts if k[0] == topic]:
            del self._counts[key]

    def snapshot(self) -> dict[tuple[str, int], dict[str, int]]:
        """A copy, safe to take from another thread (the metrics renderer's): list() copies
        the items in one step, where iterating the dict could see it grow."""
        return {key: dict(counter) for key, counter in list(self._counts.items())}
