"""TopicPartition: the one form a (topic, partition) pair takes in oncelog's clients,
OffsetAndMetadata, what a consumer group commits for one, and CommitIdentity, who commits.

A NamedTuple, so a plain ``(topic, partition)`` tuple is equal to it and finds the same
dictionary entries: callers may pass either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class OffsetAndMetadata(NamedTuple):
    offset: int  # the next offset to consume (as Kafka commits it)
    metadata: str | None = None


@dataclass(frozen=True, slots=True)
class CommitIdentity:
    """The membership an OffsetCommit names: generation (the member epoch under KIP-848),
    member id and group.instance.id."""

    generation: int
    member_id: str
    instance_id: str | None


SIMPLE_COMMIT = CommitIdentity(-1, "", None)  # assign() with a group.id, or a tool: no membership
