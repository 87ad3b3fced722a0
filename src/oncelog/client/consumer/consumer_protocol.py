"""Kafka's ConsumerProtocol as the consumer uses it: its subscription (JoinGroup metadata)
and assignment (SyncGroup) as plain values with TopicPartitions.

The broker never reads these for the group's sake; the group's leader does. So every
consumer of a group, whoever wrote it (Java, librdkafka, kafka-python, oncelog), must encode
them as Kafka's ConsumerProtocolSubscription / ConsumerProtocolAssignment schemas do. The
framing (an int16 version, then that version's fields; a newer version read as the newest
known) is protocol/consumer_protocol.py's; this module maps it to the client's values.
"""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.consumer_protocol_assignment.v3.data import TopicPartition as AssignedTopic
from kio.schema.consumer_protocol_subscription.v3.data import TopicPartition as OwnedTopic
from kio.static.primitive import i32

from ...protocol import consumer_protocol as wire
from ..topic_partition import TopicPartition

PROTOCOL_TYPE = "consumer"
VERSION = 3  # what we write: Java's and librdkafka's current version


class ConsumerProtocolError(ValueError):
    """Bytes that are not a ConsumerProtocol subscription or assignment."""


@dataclass(frozen=True, slots=True)
class Subscription:
    topics: tuple[str, ...]
    owned_partitions: tuple[TopicPartition, ...] = ()
    generation: int = -1  # the generation owned_partitions were assigned in (v2+)
    user_data: bytes | None = None
    rack_id: str | None = None


@dataclass(frozen=True, slots=True)
class Assignment:
    partitions: tuple[TopicPartition, ...]
    user_data: bytes | None = None


def _by_topic(partitions, make) -> tuple:
    topics: dict[str, list[int]] = {}
    for tp in partitions:
        topics.setdefault(tp.topic, []).append(tp.partition)
    return tuple(make(topic=topic, partitions=tuple(i32(p) for p in sorted(parts)))
                 for topic, parts in sorted(topics.items()))


def _flatten(topics) -> tuple[TopicPartition, ...]:
    return tuple(TopicPartition(t.topic, int(p)) for t in topics for p in t.partitions)


def encode_subscription(subscription: Subscription) -> bytes:
    return wire.write_subscription(
        VERSION, topics=tuple(subscription.topics), user_data=subscription.user_data,
        owned_partitions=_by_topic(subscription.owned_partitions, OwnedTopic),
        generation_id=i32(subscription.generation), rack_id=subscription.rack_id)


def decode_subscription(data: bytes) -> Subscription:
    try:
        body = wire.read_subscription(data)
    except Exception as exc:  # kio raises several kinds on malformed input
        raise ConsumerProtocolError(f"a malformed subscription: {exc}") from None
    return Subscription(
        topics=tuple(body.topics),
        owned_partitions=_flatten(getattr(body, "owned_partitions", ())),
        generation=int(getattr(body, "generation_id", -1)), user_data=body.user_data,
        rack_id=getattr(body, "rack_id", None))


def encode_assignment(assignment: Assignment) -> bytes:
    return wire.write_assignment(
        VERSION, assigned_partitions=_by_topic(assignment.partitions, AssignedTopic),
        user_data=assignment.user_data)


def decode_assignment(data: bytes) -> Assignment:
    """An empty assignment for empty bytes: what the broker hands a member the leader left
    out of its SyncGroup."""
    if not data:
        return Assignment(())
    try:
        body = wire.read_assignment(data)
    except Exception as exc:
        raise ConsumerProtocolError(f"a malformed assignment: {exc}") from None
    return Assignment(_flatten(body.assigned_partitions), body.user_data)
