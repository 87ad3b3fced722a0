"""Kafka's ConsumerProtocol: the bytes consumers put in JoinGroup metadata and SyncGroup
assignments (protocol type "consumer").

The broker never reads them; the group's leader does. So every consumer of a group, whoever
wrote it (Java, librdkafka, kafka-python, oncelog), must encode them as Kafka's
ConsumerProtocolSubscription / ConsumerProtocolAssignment schemas do: an int16 version, then
that version's fields. Versions only append fields, so a reader parses a version newer than
it knows with the newest schema it knows and ignores the rest (as Kafka's ConsumerProtocol
does). kio holds the schemas; this module holds the framing and plain values.
"""

from __future__ import annotations

import functools
import io
import struct
from dataclasses import dataclass

from kio.schema.consumer_protocol_assignment.v3 import data as assignment_v3
from kio.schema.consumer_protocol_subscription.v0 import data as subscription_v0
from kio.schema.consumer_protocol_subscription.v1 import data as subscription_v1
from kio.schema.consumer_protocol_subscription.v2 import data as subscription_v2
from kio.schema.consumer_protocol_subscription.v3 import data as subscription_v3
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32

from .topic_partition import TopicPartition

PROTOCOL_TYPE = "consumer"
SUBSCRIPTION_VERSION = 3
ASSIGNMENT_VERSION = 3
_VERSION = struct.Struct(">h")
_SUBSCRIPTIONS = {0: subscription_v0, 1: subscription_v1, 2: subscription_v2, 3: subscription_v3}
_reader = functools.cache(entity_reader)
_writer = functools.cache(entity_writer)


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


def _by_topic(partitions, make):
    topics: dict[str, list[int]] = {}
    for tp in partitions:
        topics.setdefault(tp.topic, []).append(tp.partition)
    return tuple(make(topic=topic, partitions=tuple(i32(p) for p in sorted(parts)))
                 for topic, parts in sorted(topics.items()))


def _flatten(topics) -> tuple[TopicPartition, ...]:
    return tuple(TopicPartition(t.topic, int(p)) for t in topics for p in t.partitions)


def encode_subscription(subscription: Subscription) -> bytes:
    schema = subscription_v3
    body = schema.ConsumerProtocolSubscription(
        topics=tuple(subscription.topics), user_data=subscription.user_data,
        owned_partitions=_by_topic(subscription.owned_partitions, schema.TopicPartition),
        generation_id=i32(subscription.generation), rack_id=subscription.rack_id)
    buffer = io.BytesIO()
    buffer.write(_VERSION.pack(SUBSCRIPTION_VERSION))
    _writer(schema.ConsumerProtocolSubscription)(buffer, body)
    return buffer.getvalue()


def _read(data: bytes, cls: type, what: str):
    if len(data) < _VERSION.size:
        raise ConsumerProtocolError(f"a {what} of {len(data)} bytes")
    (version,) = _VERSION.unpack_from(data, 0)
    if version < 0:
        raise ConsumerProtocolError(f"a {what} of version {version}")
    try:
        body, _ = _reader(cls(version))(data, _VERSION.size)
    except Exception as exc:  # kio's reader raises several kinds on truncated input
        raise ConsumerProtocolError(f"a malformed {what} (version {version}): {exc}") from None
    return body


def decode_subscription(data: bytes) -> Subscription:
    body = _read(data, lambda v: _SUBSCRIPTIONS[min(v, SUBSCRIPTION_VERSION)]
                 .ConsumerProtocolSubscription, "subscription")
    return Subscription(
        topics=tuple(body.topics),
        owned_partitions=_flatten(getattr(body, "owned_partitions", ())),
        generation=int(getattr(body, "generation_id", -1)), user_data=body.user_data,
        rack_id=getattr(body, "rack_id", None))


def encode_assignment(assignment: Assignment) -> bytes:
    schema = assignment_v3
    body = schema.ConsumerProtocolAssignment(
        assigned_partitions=_by_topic(assignment.partitions, schema.TopicPartition),
        user_data=assignment.user_data)
    buffer = io.BytesIO()
    buffer.write(_VERSION.pack(ASSIGNMENT_VERSION))
    _writer(schema.ConsumerProtocolAssignment)(buffer, body)
    return buffer.getvalue()


def decode_assignment(data: bytes) -> Assignment:
    """An empty assignment for empty bytes: what the broker hands a member the leader left
    out of its SyncGroup."""
    if not data:
        return Assignment(())
    # Versions 0-3 share one layout.
    body = _read(data, lambda v: assignment_v3.ConsumerProtocolAssignment, "assignment")
    return Assignment(_flatten(body.assigned_partitions), body.user_data)
