"""TopicPartition: the one form a (topic, partition) pair takes in oncelog's clients, and
OffsetAndMetadata, what a consumer group commits for one.

A NamedTuple, so a plain ``(topic, partition)`` tuple is equal to it and finds the same
dictionary entries: callers may pass either.
"""

from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class OffsetAndMetadata(NamedTuple):
    offset: int  # the next offset to consume (as Kafka commits it)
    metadata: str | None = None
