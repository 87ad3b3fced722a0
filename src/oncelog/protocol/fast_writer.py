"""kio's encoding, without its per-value checks: the writer every answer and request goes through.

kio builds each length and count it writes as a bounds-checked phantom type (``uvarint(n)``,
``i32(len(items))``: a class call, a parse and two isinstance hooks each), walks a dict of
fields per entity, and opens a BytesIO for the tagged fields of every flexible entity even
when it has none. For the small answers the broker gives most often (OffsetCommit, Heartbeat,
a Fetch of a few records) that was most of the encoding, about a quarter of the request
(issue 26). ``writer(cls)`` compiles an entity class once into one function of straight-line
Python (each field read as an attribute, integers packed inline) with the lengths and counts
written directly, and the tagged fields' buffer opened only when a tagged field differs from
its default; the other primitives are kio's own writers.

The output is kio's byte for byte: tests/protocol/test_fast_writer.py encodes random
entities of every request and response version the broker supports both ways. What kio
refuses (a value out of its type's range) is refused here too, as a struct.error instead of
kio's OutOfBoundValue: both are exceptions the caller turns into a closed connection.
"""

from __future__ import annotations

import datetime
import functools
import io
import struct
from dataclasses import MISSING, fields
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial import entity_writer as kio_entity_writer
from kio.serial import writers as kio_writers
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial._serialize import get_writer

_I32 = struct.Struct(">i").pack
_NULL_I32 = _I32(-1)
_NULL_I16 = struct.Struct(">h").pack(-1)
_I16 = struct.Struct(">h").pack
_MARK_NULL = b"\xff"  # KIP-893's nullable struct: int8 -1, or 1 then the struct
_MARK_SET = b"\x01"
_NO_TAGS = b"\x00"
_SMALL = [bytes([n]) for n in range(128)]


def _uvarint(n: int) -> bytes:
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _compact_bytes(buffer, value) -> None:
    if value is None:
        buffer.write(_NO_TAGS)  # null: length 0
        return
    if isinstance(value, str):
        value = value.encode()
    buffer.write(_uvarint(len(value) + 1))
    buffer.write(value)


def _compact_bytes_required(buffer, value) -> None:
    if value is None:
        raise TypeError("Unexpectedly received None value")
    _compact_bytes(buffer, value)


def _legacy_string(buffer, value) -> None:
    if value is None:
        buffer.write(_NULL_I16)
        return
    data = value.encode()
    buffer.write(_I16(len(data)))
    buffer.write(data)


def _legacy_string_required(buffer, value) -> None:
    if value is None:
        raise TypeError("Unexpectedly received None value")
    _legacy_string(buffer, value)


def _legacy_bytes(buffer, value) -> None:
    if value is None:
        buffer.write(_NULL_I32)
        return
    buffer.write(_I32(len(value)))
    buffer.write(value)


def _legacy_bytes_required(buffer, value) -> None:
    if value is None:
        raise TypeError("Unexpectedly received None value")
    _legacy_bytes(buffer, value)


# Every answer has an error code and most a throttle time (zero): kio's writers read the
# code's ``.value`` (an enum property) and convert the timedelta each time.
_ERROR_CODES = {code: _I16(code.value) for code in ErrorCode}
_ZERO_MS = b"\0\0\0\0"
_ZERO = datetime.timedelta(0)


def _error_code(buffer, value) -> None:
    data = _ERROR_CODES.get(value) if type(value) is ErrorCode else None
    if data is None:
        kio_writers.write_error_code(buffer, value)  # (what kio does with anything else)
        return
    buffer.write(data)


def _timedelta_i32(buffer, value) -> None:
    if type(value) is datetime.timedelta and value == _ZERO:
        buffer.write(_ZERO_MS)
        return
    kio_writers.write_timedelta_i32(buffer, value)


_FAST = {  # (kafka type, flexible, optional) -> writer; the rest are kio's own
    ("error_code", True, False): _error_code,
    ("error_code", False, False): _error_code,
    ("timedelta_i32", True, False): _timedelta_i32,
    ("timedelta_i32", False, False): _timedelta_i32,
    ("string", True, False): _compact_bytes_required,
    ("string", True, True): _compact_bytes,
    ("string", False, False): _legacy_string_required,
    ("string", False, True): _legacy_string,
    ("bytes", True, False): _compact_bytes_required,
    ("bytes", True, True): _compact_bytes,
    ("records", True, False): _compact_bytes_required,
    ("records", True, True): _compact_bytes,
    ("bytes", False, False): _legacy_bytes_required,
    ("bytes", False, True): _legacy_bytes,
    ("records", False, False): _legacy_bytes_required,
    ("records", False, True): _legacy_bytes,
}


def _primitive(kafka_type: str, flexible: bool, optional: bool):
    fast = _FAST.get((kafka_type, flexible, optional))
    return fast if fast is not None else get_writer(kafka_type, flexible, optional)


def _array(item, flexible: bool):
    if flexible:
        def write_compact_array(buffer, items) -> None:
            if items is None:
                buffer.write(_NO_TAGS)
                return
            buffer.write(_uvarint(len(items) + 1))
            for value in items:
                item(buffer, value)
        return write_compact_array

    def write_legacy_array(buffer, items) -> None:
        if items is None:
            buffer.write(_NULL_I32)
            return
        buffer.write(_I32(len(items)))
        for value in items:
            item(buffer, value)
    return write_legacy_array


def _nullable(write_entity):
    def write_nullable(buffer, entity) -> None:
        if entity is None:
            buffer.write(_MARK_NULL)
            return
        buffer.write(_MARK_SET)
        write_entity(buffer, entity)
    return write_nullable


def _field_writer(field, flexible: bool, is_tag: bool):
    optional = False if is_tag else is_optional(field)
    kind = classify_field(field)
    if isinstance(kind, (PrimitiveField, PrimitiveTupleField)):
        inner = _primitive(get_schema_field_type(field), flexible,
                           optional and isinstance(kind, PrimitiveField))
    elif isinstance(kind, EntityField):
        inner = _nullable(writer(kind.type_)) if optional else writer(kind.type_)
    elif isinstance(kind, EntityTupleField):
        inner = writer(kind.type_)
    else:
        raise TypeError(f"no writer for {field.name}: {kind!r}")
    return _array(inner, flexible) if kind.is_array else inner


@functools.cache
def writer(cls: type) -> Any:
    """``write(buffer, entity)`` for entities of ``cls``, kio's bytes (see the docstring)."""
    if cls.__name__ == "RequestHeader":
        return kio_entity_writer(cls)  # client_id's special case: kio knows it
    flexible = cls.__flexible__
    plain: list[tuple[str, Any]] = []
    tagged: list[tuple[int, str, Any, Any]] = []
    for field in fields(cls):
        tag = get_field_tag(field)
        write = _field_writer(field, flexible, tag is not None)
        if tag is None:
            plain.append((field.name, write))
        else:
            default = field.default if field.default is not MISSING else \
                get_tagged_field_default(field)
            tagged.append((tag, field.name, write, default))
    tagged.sort()
    return _compiled(cls, tuple(plain), tuple(tagged), flexible)


# kio's integer writers, packed inline by the compiled writers (the same struct formats).
_INLINE = {kio_writers.write_int8: struct.Struct(">b").pack,
           kio_writers.write_int16: struct.Struct(">h").pack,
           kio_writers.write_int32: struct.Struct(">i").pack,
           kio_writers.write_int64: struct.Struct(">q").pack}


def _compiled(cls: type, plain: tuple, tagged: tuple, flexible: bool) -> Any:
    """The entity's writer as one function of straight-line Python (compiled once per
    class): each field read as an attribute and written in turn, integers packed inline;
    what a loop over (name, writer) pairs did with a getattr and a call per field."""
    scope: dict[str, Any] = {"_tagged": tagged, "_write_tags": _write_tags, "_NO_TAGS": _NO_TAGS}
    lines = ["def write_entity(buffer, entity):", "    write = buffer.write"]
    for i, (name, write) in enumerate(plain):
        pack = _INLINE.get(write)
        if pack is not None:
            scope[f"_p{i}"] = pack
            lines.append(f"    write(_p{i}(entity.{name}))")
        else:
            scope[f"_w{i}"] = write
            lines.append(f"    _w{i}(buffer, entity.{name})")
    if flexible:
        lines.append("    _write_tags(buffer, entity, _tagged)" if tagged else
                     "    write(_NO_TAGS)")
    if len(lines) == 2:
        lines.append("    pass")
    code = compile("\n".join(lines), f"<fast_writer {cls.__module__}.{cls.__qualname__}>",
                   "exec")
    exec(code, scope)  # (the source is made above from the class's field names only)
    return scope["write_entity"]


def _write_tags(buffer, entity, tagged: tuple) -> None:
    """A flexible entity's tagged fields: those that differ from their default."""
    written = []
    for tag, name, write, default in tagged:
        value = getattr(entity, name)
        if value is not default and value != default:
            written.append((tag, write, value))
    if not written:
        buffer.write(_NO_TAGS)
        return
    buffer.write(_uvarint(len(written)))
    for tag, write, value in written:
        scratch = io.BytesIO()
        write(scratch, value)
        data = scratch.getvalue()
        buffer.write(_uvarint(tag))
        buffer.write(_uvarint(len(data)))
        buffer.write(data)

