"""The hot small requests decoded in one pass: the frame check and kio's reader, compiled.

A small request (a commit, a heartbeat, a Fetch of one partition) spent about 60% of its
decode in the frame check (frame_check.py: a closure per field walking the frame so that no
count reaches kio's reader unchecked) and more in kio's reader and the header's. ``reader``
compiles a request schema once into Python source (one function per entity, fixed-width
fields in a row read by one struct call, strings and counts by small helpers) that checks
each count and length against the bytes left before it allocates anything, exactly as
frame_check does, and builds the same kio dataclass instances kio's reader builds (their
slots set directly, as kio's native reader does, not through the frozen ``__init__``).

It handles the shape clients send and nothing more: whatever else it meets (a tagged field,
a count or length the frame cannot hold, a null where the schema has none, a varint past 32
bits, text that is not UTF-8, a boolean that is not 0 or 1, a KIP-893 marker that is not -1
or 1) raises one of ``FALLBACK``, and messages.decode_request then decodes the frame the
general way, which decides the error. So malformed input gets exactly the answer it got
before, and this module never has to agree with kio on how to refuse; it only has to build
what kio builds when both accept, which tests/protocol/test_fast_reader.py holds for random
and broken frames of every version of every API in ``HOT``.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from collections.abc import Callable
from dataclasses import MISSING
from typing import Any

from kio.index import load_request_schema
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)
from kio.serial._parse import get_reader

from .api_versions import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    CONSUMER_GROUP_HEARTBEAT,
    END_TXN,
    FETCH,
    FIND_COORDINATOR,
    HEARTBEAT,
    INIT_PRODUCER_ID,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_OFFSETS,
    METADATA,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    SYNC_GROUP,
    TXN_OFFSET_COMMIT,
)
from .varint import read_uvarint

# What consumers and producers send over and over: a consumer's fetches, commits and
# heartbeats (classic and KIP-848), and a transactional producer's requests of every
# transaction. Produce has its own reader (produce_request.py), which leaves the records in
# the frame; the rest (admin, inter-broker) is decoded the general way.
HOT = frozenset({FETCH, LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH,
                 FIND_COORDINATOR, HEARTBEAT, JOIN_GROUP, SYNC_GROUP, LEAVE_GROUP,
                 CONSUMER_GROUP_HEARTBEAT, INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN,
                 ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT})


class Fallback(Exception):
    """Not the plain shape: decode the general way."""


# IndexError: a byte read at or past the frame's end; struct.error: a fixed-width read past
# it; UnicodeDecodeError and ValueError: kio's readers and ours refusing a value.
FALLBACK = (Fallback, IndexError, struct.error, ValueError)

_FALLBACK = Fallback()
_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_INTS = {"int8": "b", "int16": "h", "int32": "i", "int64": "q",
         "uint8": "B", "uint16": "H", "uint32": "I", "uint64": "Q"}
_FIXED = {"bool": 1, "uuid": 16, "timedelta_i32": 4, "timedelta_i64": 8, "float64": 8,
          "datetime_i64": 8, "error_code": 2}  # read by kio's own primitive readers


def _uvarint(buf, pos: int, end: int) -> tuple[int, int]:
    """A varint of two bytes or more (one byte is read inline); Kafka's 32-bit limit."""
    value, pos = read_uvarint(buf, pos, max_bits=32)
    if pos > end:
        raise _FALLBACK
    return value, pos


def _compact_length(buf, pos: int, end: int) -> tuple[int, int]:
    """(length, -1 for null; position after it)."""
    n = buf[pos]
    if n & 0x80:
        n, pos = _uvarint(buf, pos, end)
        return n - 1, pos
    return n - 1, pos + 1


def _legacy_count(buf, pos: int, end: int) -> tuple[int, int]:
    if pos + 4 > end:
        raise _FALLBACK
    (n,) = _I32(buf, pos)
    if n < -1:
        raise _FALLBACK
    return n, pos + 4


def _text(buf, pos: int, n: int, end: int) -> str:
    if n > end - pos:
        raise _FALLBACK
    return str(buf[pos:pos + n], "utf-8")


def _compact_string(buf, pos: int, end: int) -> tuple[str, int]:
    n, pos = _compact_length(buf, pos, end)
    if n < 0:
        raise _FALLBACK  # null where the schema has none
    return _text(buf, pos, n, end), pos + n


def _compact_string_nullable(buf, pos: int, end: int) -> tuple[str | None, int]:
    n, pos = _compact_length(buf, pos, end)
    if n < 0:
        return None, pos
    return _text(buf, pos, n, end), pos + n


def _legacy_string(buf, pos: int, end: int) -> tuple[str, int]:
    if pos + 2 > end:
        raise _FALLBACK
    (n,) = _I16(buf, pos)
    pos += 2
    if n < 0:
        raise _FALLBACK
    return _text(buf, pos, n, end), pos + n


def _legacy_string_nullable(buf, pos: int, end: int) -> tuple[str | None, int]:
    if pos + 2 > end:
        raise _FALLBACK
    (n,) = _I16(buf, pos)
    pos += 2
    if n < 0:
        if n < -1:
            raise _FALLBACK
        return None, pos
    return _text(buf, pos, n, end), pos + n


def _compact_bytes(buf, pos: int, end: int) -> tuple[bytes, int]:
    n, pos = _compact_length(buf, pos, end)
    if n < 0 or n > end - pos:
        raise _FALLBACK
    return bytes(buf[pos:pos + n]), pos + n


def _legacy_bytes(buf, pos: int, end: int) -> tuple[bytes, int]:
    n, pos = _legacy_count(buf, pos, end)
    if n < 0 or n > end - pos:
        raise _FALLBACK
    return bytes(buf[pos:pos + n]), pos + n


_STRINGS = {  # (kafka type, flexible, nullable) -> reader
    ("string", True, False): _compact_string,
    ("string", True, True): _compact_string_nullable,
    ("string", False, False): _legacy_string,
    ("string", False, True): _legacy_string_nullable,
    ("bytes", True, False): _compact_bytes,
    ("bytes", False, False): _legacy_bytes,
}


class _Source:
    """The functions of one request's reader as Python source, with the objects they use."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {
            "FB": _FALLBACK, "NEW": object.__new__, "compact_length": _compact_length,
            "legacy_count": _legacy_count, "unpack_from": struct.unpack_from,
            "unpack_i16": _I16,
        }
        self.entities: dict[type, str] = {}

    def name(self, value: Any, hint: str) -> str:
        key = f"{hint}{len(self.names)}"
        self.names[key] = value
        return key


def _min_size(cls: type) -> int:
    """The fewest bytes an entity takes, as frame_check counts it (its array check)."""
    flexible = cls.__flexible__
    size = 1 if flexible else 0
    for field in dataclasses.fields(cls):
        if get_field_tag(field) is not None:
            continue
        kind = classify_field(field)
        kafka_type = field.metadata.get("kafka_type")
        if isinstance(kind, (EntityTupleField, PrimitiveTupleField)):
            size += 1 if flexible else 4
        elif isinstance(kind, EntityField):
            size += 1 if is_optional(field) else _min_size(kind.type_)
        elif kafka_type in _INTS:
            size += struct.calcsize(">" + _INTS[kafka_type])
        elif kafka_type in _FIXED:
            size += _FIXED[kafka_type]
        else:
            size += 1 if flexible else (2 if kafka_type == "string" else 4)
    return size


def _inline_string(src: _Source, var: str, flexible: bool, nullable: bool) -> list[str]:
    """A string of under 127 bytes read in place (a call and a tuple less: most fields of a
    small request are strings); null, longer ones and truncation go to the helper."""
    read = src.name(_STRINGS["string", flexible, nullable], "str")
    if flexible:
        return [
            "    n = buf[pos]",
            f"    if n & 0x80 or not n: {var}, pos = {read}(buf, pos, end)",
            "    else:",
            "        start = pos + 1",
            "        pos += n",
            "        if pos > end: raise FB",
            f"        {var} = str(buf[start:pos], 'utf-8')",
        ]
    return [
        "    n, = unpack_i16(buf, pos)",
        f"    if n < 0: {var}, pos = {read}(buf, pos, end)",
        "    else:",
        "        start = pos + 2",
        "        pos = start + n",
        "        if pos > end: raise FB",
        f"        {var} = str(buf[start:pos], 'utf-8')",
    ]


def _entity(src: _Source, cls: type) -> str:
    """The name of ``read(buf, pos, end, tally) -> (entity, pos)`` for ``cls``, compiled into
    ``src`` with the readers of the entities it holds."""
    done = src.entities.get(cls)
    if done is not None:
        return done
    fn = f"read_{cls.__name__}_{len(src.entities)}"
    src.entities[cls] = fn
    flexible = cls.__flexible__
    body: list[str] = []
    values: list[tuple[str, str]] = []  # (field name, local variable or constant name)
    fixed: list[tuple[str, str, bool]] = []  # a run of fixed-width fields: (variable, type,
    # nullable)

    def flush_fixed() -> None:
        if not fixed:
            return
        width = 0
        ints: list[tuple[str, int, str]] = []
        others: list[tuple[str, int, str, bool]] = []
        for var, kafka_type, nullable in fixed:
            if kafka_type in _INTS:
                ints.append((var, width, _INTS[kafka_type]))
                width += struct.calcsize(">" + _INTS[kafka_type])
            else:
                others.append((var, width, kafka_type, nullable))
                width += _FIXED[kafka_type]
        body.append(f"    if pos + {width} > end: raise FB")
        if ints and not others:
            unpack = src.name(struct.Struct(">" + "".join(c for _, _, c in ints)).unpack_from,
                              "ints")
            names = "".join(f"{v}, " for v, _, _ in ints)
            body.append(f"    {names}= {unpack}(buf, pos)")
        else:
            for var, offset, code in ints:
                unpack = src.name(struct.Struct(">" + code).unpack_from, "int")
                body.append(f"    {var}, = {unpack}(buf, pos + {offset})")
        for var, offset, kafka_type, nullable in others:
            read = src.name(get_reader(kafka_type, flexible, nullable), "kio")
            body.append(f"    {var} = {read}(buf, pos + {offset})[0]")
        body.append(f"    pos += {width}")
        fixed.clear()

    def count(var: str, nullable: bool, min_size: int) -> None:
        """``var`` = the array's count (its elements to come), None left for null."""
        reader = "compact_length" if flexible else "legacy_count"
        body.append(f"    {var}, pos = {reader}(buf, pos, end)")
        body.append(f"    if {var} < 0:")
        body.append(f"        {'pass' if nullable else 'raise FB'}")
        body.append(f"    elif {var} * {max(min_size, 1)} > end - pos: raise FB")
        body.append(f"    else: tally[0] += {var}")

    for field in dataclasses.fields(cls):
        var = f"v_{field.name}"
        if get_field_tag(field) is not None:
            default = field.default if field.default is not MISSING else \
                get_tagged_field_default(field)
            values.append((field.name, src.name(default, "default")))
            continue
        values.append((field.name, var))
        kind = classify_field(field)
        kafka_type = field.metadata.get("kafka_type")
        nullable = is_optional(field)
        if not isinstance(kind, (EntityField, EntityTupleField, PrimitiveTupleField)) and \
                (kafka_type in _INTS or kafka_type in _FIXED):
            fixed.append((var, kafka_type, nullable))
            continue
        flush_fixed()
        if isinstance(kind, EntityTupleField):
            item = _entity(src, kind.type_)
            count("n", nullable, _min_size(kind.type_))
            body.append(f"    if n < 0: {var} = None")
            body.append("    else:")
            body.append("        items = []")
            body.append("        for _ in range(n):")
            body.append(f"            x, pos = {item}(buf, pos, end, tally)")
            body.append("            items.append(x)")
            body.append(f"        {var} = tuple(items)")
        elif isinstance(kind, PrimitiveTupleField):
            if kafka_type in _INTS:
                code = _INTS[kafka_type]
                width = struct.calcsize(">" + code)
                count("n", nullable, width)
                body.append(f"    if n < 0: {var} = None")
                body.append("    else:")
                body.append(f"        {var} = unpack_from('>%d{code}' % n, buf, pos)")
                body.append(f"        pos += n * {width}")
            elif (kafka_type, flexible, False) in _STRINGS:
                read = src.name(_STRINGS[kafka_type, flexible, False], "str")
                count("n", nullable, 1 if flexible else (2 if kafka_type == "string" else 4))
                body.append(f"    if n < 0: {var} = None")
                body.append("    else:")
                body.append("        items = []")
                body.append("        for _ in range(n):")
                body.append(f"            x, pos = {read}(buf, pos, end)")
                body.append("            items.append(x)")
                body.append(f"        {var} = tuple(items)")
            else:
                raise TypeError(f"{cls.__name__}.{field.name}: array of {kafka_type}")
        elif isinstance(kind, EntityField):
            item = _entity(src, kind.type_)
            if nullable:  # KIP-893: an int8 marker, -1 for null, then the entity
                body.append("    marker = buf[pos]")
                body.append("    pos += 1")
                body.append(f"    if marker == 255: {var} = None")
                body.append(f"    elif marker == 1: {var}, pos = {item}(buf, pos, end, tally)")
                body.append("    else: raise FB")
            else:
                body.append(f"    {var}, pos = {item}(buf, pos, end, tally)")
        elif kafka_type == "string":
            body += _inline_string(src, var, flexible, nullable)
        elif (kafka_type, flexible, nullable) in _STRINGS:
            read = src.name(_STRINGS[kafka_type, flexible, nullable], "str")
            body.append(f"    {var}, pos = {read}(buf, pos, end)")
        else:
            raise TypeError(f"{cls.__name__}.{field.name}: kafka_type {kafka_type!r}")
    flush_fixed()
    if flexible:
        body.append("    if buf[pos]: raise FB  # tagged fields: the general path reads them")
        body.append("    pos += 1")
    entity = src.name(cls, "cls")
    body.append(f"    o = NEW({entity})")
    for field_name, value in values:
        setter = src.name(cls.__dict__[field_name].__set__, "set")
        body.append(f"    {setter}(o, {value})")
    body.append("    return o, pos")
    src.lines.append(f"def {fn}(buf, pos, end, tally):")
    src.lines += body
    src.lines.append("")
    return fn


RequestReader = Callable[[Any], tuple[Any, Any, int]]


@functools.cache
def reader(api_key: int, api_version: int) -> RequestReader | None:
    """``read(frame) -> (client id, body, array elements)`` for a request frame (without its
    size prefix) of an API in HOT, raising one of FALLBACK for anything but the plain shape;
    None for other APIs."""
    if api_key not in HOT:
        return None
    schema = load_request_schema(api_key, api_version)
    src = _Source()
    body = _entity(src, schema)
    # The header: api key, version and correlation id (read by the caller), then the client
    # id, a legacy string in both header versions; header v2's tagged fields.
    src.lines += ["def read_request(buf):", "    end = len(buf)", "    pos = 8"]
    src.lines += _inline_string(src, "client_id", False, True)
    if schema.__flexible__:
        src.lines += ["    if buf[pos]: raise FB", "    pos += 1"]
    src.lines += ["    tally = [0]", f"    request, pos = {body}(buf, pos, end, tally)",
                  "    return client_id, request, tally[0]"]
    namespace = dict(src.names)
    exec(compile("\n".join(src.lines), f"<fast_reader {schema.__module__}>", "exec"),
         namespace)
    return namespace["read_request"]
