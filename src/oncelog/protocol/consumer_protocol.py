"""Kafka's ConsumerProtocol: what consumers of the "consumer" protocol type put in JoinGroup's
metadata (Subscription) and SyncGroup's assignment (Assignment). Each is an int16 version
followed by that version's struct (kio's schemas), version 0 to 3.

The broker reads subscriptions only to tell which topics a group consumes (OffsetDelete,
describe); clients write and read both.
"""

from __future__ import annotations

import functools
import io
import struct
from importlib import import_module
from typing import Any

from kio.serial import entity_reader, entity_writer

NEWEST_VERSION = 3


@functools.cache
def _schema(kind: str, version: int) -> type:
    module = import_module(f"kio.schema.consumer_protocol_{kind}.v{version}.data")
    return getattr(module, f"ConsumerProtocol{kind.capitalize()}")


def _read(kind: str, data: bytes) -> Any:
    if len(data) < 2:
        raise ValueError(f"a {kind} needs at least its version")
    (version,) = struct.unpack_from(">h", data)
    # Newer versions only add fields at the end: read what we know.
    version = min(version, NEWEST_VERSION)
    if version < 0:
        raise ValueError(f"{kind} version {version}")
    value, _ = entity_reader(_schema(kind, version))(data, 2)
    return value


def _write(kind: str, version: int, **values: Any) -> bytes:
    cls = _schema(kind, version)
    names = {f for f in cls.__dataclass_fields__}
    buffer = io.BytesIO()
    buffer.write(struct.pack(">h", version))
    entity_writer(cls)(buffer, cls(**{k: v for k, v in values.items() if k in names}))
    return buffer.getvalue()


def read_subscription(data: bytes) -> Any:
    return _read("subscription", data)


def read_assignment(data: bytes) -> Any:
    return _read("assignment", data)


def write_subscription(version: int, **values: Any) -> bytes:
    return _write("subscription", version, **values)


def write_assignment(version: int, **values: Any) -> bytes:
    return _write("assignment", version, **values)


def subscription_topics(data: bytes) -> set[str] | None:
    """The topics a subscription names, None when it cannot be read."""
    try:
        return set(read_subscription(data).topics)
    except Exception:  # anything a client sent: unreadable means unknown, never a crash
        return None


def assigned_partitions(data: bytes) -> list[tuple[str, int]] | None:
    """(topic, partition) of an assignment, None when it cannot be read (empty: none)."""
    if not data:
        return []
    try:
        value = read_assignment(data)
    except Exception:
        return None
    return [(tp.topic, p) for tp in value.assigned_partitions for p in tp.partitions]
