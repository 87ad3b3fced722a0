"""TopicPartition: the one form a (topic, partition) pair takes in oncelog's clients.

A NamedTuple, so a plain ``(topic, partition)`` tuple is equal to it and finds the same
dictionary entries: callers may pass either.
"""

from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int
