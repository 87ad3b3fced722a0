"""Random well-formed requests for any API version kio has, and ways to break their counts,
lengths and varints on purpose.

The requests are built from kio's schemas (their dataclass fields and ``kafka_type``) and
encoded with kio's writer, so they are what a client would send. Where the counts are is
not taken from the broker's own walk (oncelog.protocol.frame_check): ``length_positions``
names every place one could be, and ``with_limit`` writes a limit there.
"""

from __future__ import annotations

import dataclasses
import datetime
import random
import struct
import uuid
from typing import Any

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)

from oncelog.protocol.messages import encode_request

# The counts and lengths a hostile client writes: 0, -1 (null), and the limits of int32 and
# of a compact (unsigned varint) count.
LIMITS = (0, -1, 2**31 - 1, 2**32 - 2, 2**15 - 1, 1 << 20)


def _value(kafka_type: str, optional: bool, rng: random.Random) -> Any:
    if optional and rng.random() < 0.2:
        return None
    if kafka_type in ("int8",):
        return rng.randint(-128, 127)
    if kafka_type in ("int16",):
        return rng.randint(-1, 3)
    if kafka_type in ("int32",):
        return rng.choice((-1, 0, 1, 5, 2**31 - 1))
    if kafka_type in ("int64",):
        return rng.choice((-1, 0, 7, 2**63 - 1))
    if kafka_type in ("uint8", "uint16", "uint32", "uint64"):
        return rng.randint(0, 200)
    if kafka_type == "float64":
        return rng.random()
    if kafka_type == "bool":
        return rng.random() < 0.5
    if kafka_type == "uuid":
        return uuid.UUID(int=rng.getrandbits(128))
    if kafka_type == "error_code":
        return ErrorCode.none
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=rng.randint(0, 5000))
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(rng.randint(0, 2**31), datetime.UTC)
    if kafka_type == "string":
        return "".join(rng.choice("abc-._") for _ in range(rng.randint(0, 12)))
    if kafka_type in ("bytes", "records"):
        return rng.randbytes(rng.randint(0, 20))
    raise TypeError(f"no random value for kafka_type {kafka_type!r}")


def random_entity(cls: type, rng: random.Random, depth: int = 0) -> Any:
    values = {}
    for field in dataclasses.fields(cls):
        tagged = get_field_tag(field) is not None
        if tagged and rng.random() < 0.5:
            continue  # left at its default: not written
        kind = classify_field(field)
        optional = is_optional(field) and not tagged
        if isinstance(kind, (EntityTupleField, PrimitiveTupleField)):
            if optional and rng.random() < 0.2:
                values[field.name] = None
                continue
            n = rng.randint(0, 3 if depth < 2 else 1)
            if isinstance(kind, EntityTupleField):
                values[field.name] = tuple(random_entity(kind.type_, rng, depth + 1)
                                           for _ in range(n))
            else:
                values[field.name] = tuple(_value(field.metadata["kafka_type"], False, rng)
                                           for _ in range(n))
        elif isinstance(kind, EntityField):
            values[field.name] = None if optional and rng.random() < 0.3 else \
                random_entity(kind.type_, rng, depth + 1)
        else:
            values[field.name] = _value(field.metadata["kafka_type"], optional, rng)
    return cls(**values)


def random_frame(api_key: int, api_version: int, rng: random.Random) -> bytes:
    """A well-formed request frame, size prefix included."""
    body = random_entity(load_request_schema(api_key, api_version), rng)
    return encode_request(api_key, api_version, rng.randint(0, 2**31 - 1), "fuzz", body)


def with_size(frame: bytes | bytearray) -> bytes:
    """The frame with its size prefix made true again."""
    return struct.pack(">i", len(frame) - 4) + bytes(frame[4:])


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_positions(frame: bytes, flexible: bool, likely: bool = False
                     ) -> list[tuple[int, int]]:
    """(position, width) of every place in the frame (after the size prefix and the fixed
    header) that could hold a count or a length: every int16/int32 (legacy) or every byte
    that starts a varint (flexible). A superset: writing a limit there breaks the frame in
    every way a count or length can. ``likely``: only those whose value is one a count or
    length of random_entity's requests has (arrays of 0-3, strings of 0-20)."""
    start = 4 + 8
    if flexible:
        return [(i, 1) for i in range(start, len(frame)) if not likely or frame[i] <= 21]
    out = []
    for width, fmt, top in ((2, ">h", 12), (4, ">i", 20)):
        for i in range(start, len(frame) - width + 1):
            if not likely or -1 <= struct.unpack_from(fmt, frame, i)[0] <= top:
                out.append((i, width))
    return out


def with_limit(frame: bytes, pos: int, width: int, flexible: bool, value: int) -> bytes:
    """The frame with ``value`` written over the ``width`` bytes at ``pos`` (a varint
    replaces one byte, a legacy count or length its int16/int32), size prefix fixed."""
    if flexible:
        encoded = uvarint((value + 1) & 0xFFFFFFFF)
    elif width == 2:
        encoded = struct.pack(">h", max(-(2**15), min(value, 2**15 - 1)))
    else:
        encoded = struct.pack(">i", max(-(2**31), min(value, 2**31 - 1)))
    return with_size(frame[:pos] + encoded + frame[pos + width:])


def broken_frames(api_key: int, api_version: int, flexible: bool, rng: random.Random,
                  requests: int, likely: bool = False) -> list[bytes]:
    """For ``requests`` random requests: every place a count or length could be (see
    length_positions) set to each of LIMITS, every truncation, and the whole padded with
    random bytes (size prefixes true)."""
    out = []
    for _ in range(requests):
        frame = random_frame(api_key, api_version, rng)
        out += [with_limit(frame, pos, width, flexible, limit)
                for pos, width in length_positions(frame, flexible, likely)
                for limit in LIMITS]
        out += [with_size(frame[:end]) for end in range(12, len(frame))]
        out.append(with_size(frame + rng.randbytes(rng.randint(1, 64))))
    return out
