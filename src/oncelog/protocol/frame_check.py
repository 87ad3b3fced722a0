"""Every count and length in a request checked against the frame before any decoder sees it.

kio's native reader reserves room for an array's elements from its count before reading
one: a 21-byte frame whose compact array count is 2^32-2 asks the allocator for 34 GB and
the process aborts, past every ``except``. Kafka checks each count against the bytes left
and refuses the request; this module does the same, for every API and version kio has, by
walking the frame along kio's own schema (its dataclass fields and their ``kafka_type``),
in the order and encoding kio reads it:

* an array of N elements needs at least N times the smallest encoding of one element, and
  N is never more than the bytes left, so the walk is linear in the frame's size;
* a string or bytes of length L needs L bytes; lengths below -1 are refused;
* null (-1) is refused where the schema has no null, as Kafka refuses it (kio would hand
  the handler a None where it expects a tuple);
* an unsigned varint has at most 5 bytes and 32 bits (Kafka's limit);
* a tagged field's size is at most the bytes left; a known tag's value is walked from
  where it starts, as kio reads it (kio does not skip by the size), and an unknown tag is
  refused, as kio refuses it.

What the walk does not check (UTF-8, a boolean's value) is left to the decoder, which
refuses it without allocating for it. The walk also counts the
elements of every array, which says how many objects decoding the request would create
(``Checked.elements``): a decoded request is several times its frame, and that is what
the handlers are given.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from collections.abc import Callable
from typing import NamedTuple

from kio.index import load_request_schema
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)

from .errors import ProtocolError
from .varint import read_uvarint

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

# Bytes of each fixed-width kafka_type kio knows.
_FIXED = {
    "bool": 1, "int8": 1, "uint8": 1,
    "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "timedelta_i64": 8, "datetime_i64": 8,
    "uuid": 16,
}
_VARIABLE = frozenset({"string", "bytes", "records"})


class Checked(NamedTuple):
    end: int  # where the request's body ends in the frame (trailing bytes are tolerated)
    elements: int  # array elements in the request, all levels


class _Tally:
    __slots__ = ("elements",)

    def __init__(self) -> None:
        self.elements = 0


# A step walks one field: (frame, position, end of frame, tally) -> position after it.
Step = Callable[[bytes, int, int, _Tally], int]


class _Walker(NamedTuple):
    step: Step
    min_size: int  # the fewest bytes any encoding of the thing takes
    fixed: bool = False  # always min_size bytes


def _fail(what: str, detail: str) -> ProtocolError:
    return ProtocolError(f"{what}: {detail}")


def _uvarint(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    try:
        value, after = read_uvarint(buf, pos, max_bits=32)
    except IndexError:
        raise _fail(what, "truncated") from None
    except ValueError:
        raise _fail(what, "varint longer than 32 bits") from None
    if after > end:
        raise _fail(what, "truncated")
    return value, after


def _fixed(size: int, what: str) -> _Walker:
    def step(buf: bytes, pos: int, end: int, tally: _Tally) -> int:
        pos += size
        if pos > end:
            raise _fail(what, "truncated")
        return pos
    return _Walker(step, size, True)


def _length(buf: bytes, pos: int, end: int, flexible: bool, wide: bool,
            what: str) -> tuple[int, int]:
    """(length or count, -1 for null; position after it): compact lengths are stored plus
    one; legacy ones as int16 (strings) or int32 (bytes, arrays)."""
    if flexible:
        n, pos = _uvarint(buf, pos, end, what)
        return n - 1, pos
    fmt = _I32 if wide else _I16
    if pos + fmt.size > end:
        raise _fail(what, "truncated")
    (n,) = fmt.unpack_from(buf, pos)
    if n < -1:
        raise _fail(what, f"negative length {n}")
    return n, pos + fmt.size


def _variable(flexible: bool, wide: bool, nullable: bool, what: str) -> _Walker:
    def step(buf: bytes, pos: int, end: int, tally: _Tally) -> int:
        n, pos = _length(buf, pos, end, flexible, wide, what)
        if n < 0 and not nullable:
            raise _fail(what, "null, and the field is not nullable")
        if n > end - pos:
            raise _fail(what, f"length {n} with {end - pos} bytes left")
        return pos + max(n, 0)
    return _Walker(step, 1 if flexible else (4 if wide else 2))


def _array(item: _Walker, flexible: bool, nullable: bool, what: str) -> _Walker:
    item_step, item_min, fixed = item
    item_min = max(item_min, 1)  # as Kafka: a count is never more than the bytes left

    def count(buf: bytes, pos: int, end: int, tally: _Tally) -> tuple[int, int]:
        n, pos = _length(buf, pos, end, flexible, True, what)
        if n < 0 and not nullable:
            raise _fail(what, "null, and the array is not nullable")
        if n * item_min > end - pos:
            raise _fail(what, f"count {n} needs {n * item_min} bytes, {end - pos} left")
        if n > 0:
            tally.elements += n
        return n, pos

    def step(buf: bytes, pos: int, end: int, tally: _Tally) -> int:
        n, pos = count(buf, pos, end, tally)
        for _ in range(n):
            pos = item_step(buf, pos, end, tally)
        return pos

    def fixed_items(buf: bytes, pos: int, end: int, tally: _Tally) -> int:
        n, pos = count(buf, pos, end, tally)
        return pos + max(n, 0) * item_min

    return _Walker(fixed_items if fixed else step, 1 if flexible else 4)


def _nullable_entity(entity: _Walker, what: str) -> _Walker:
    """KIP-893: an int8 marker, -1 for null, then the entity."""
    entity_step = entity.step

    def step(buf: bytes, pos: int, end: int, tally: _Tally) -> int:
        if pos >= end:
            raise _fail(what, "truncated")
        (marker,) = _I8.unpack_from(buf, pos)
        pos += 1
        return pos if marker < 0 else entity_step(buf, pos, end, tally)
    return _Walker(step, 1)


def _field(cls: type, field: dataclasses.Field, flexible: bool, is_tag: bool) -> _Walker:
    what = f"{cls.__name__}.{field.name}"
    kind = classify_field(field)
    nullable = is_optional(field)  # of an array: the array's, never its elements'
    if isinstance(kind, (EntityField, EntityTupleField)):
        item = _entity(kind.type_)
        if isinstance(kind, EntityTupleField):
            return _array(item, flexible, nullable, what)
        return _nullable_entity(item, what) if nullable and not is_tag else item
    kafka_type = field.metadata.get("kafka_type")
    array = isinstance(kind, PrimitiveTupleField)
    if kafka_type in _FIXED:
        item = _fixed(_FIXED[kafka_type], what)
    elif kafka_type in _VARIABLE:
        item = _variable(flexible, kafka_type != "string", nullable and not array, what)
    else:
        raise TypeError(f"{what}: kafka_type {kafka_type!r} is unknown to the frame check")
    return _array(item, flexible, nullable, what) if array else item


def _tagged(cls: type, tags: dict[int, _Walker]) -> Step:
    what = f"{cls.__name__} tagged fields"

    def step(buf: bytes, pos: int, end: int, tally: _Tally) -> int:
        if pos < end and not buf[pos]:
            return pos + 1  # none: what nearly every entity has
        n, pos = _uvarint(buf, pos, end, what)
        if 2 * n > end - pos:  # a tag and a size, a byte each at least
            raise _fail(what, f"count {n} with {end - pos} bytes left")
        for _ in range(n):
            tag, pos = _uvarint(buf, pos, end, what)
            size, pos = _uvarint(buf, pos, end, what)
            if size > end - pos:
                raise _fail(what, f"tag {tag} size {size} with {end - pos} bytes left")
            walker = tags.get(tag)
            if walker is None:
                raise _fail(what, f"unknown tag {tag}")
            pos = walker.step(buf, pos, end, tally)
        return pos
    return step


def _fixed_then_tags(size: int, tags: Step, what: str) -> Step:
    """Fixed-width fields, then the tagged fields (most often none): an element of most
    flexible arrays (ListOffsets' partitions, Fetch's...) in one call."""
    def step(buf: bytes, pos: int, end: int, tally: _Tally) -> int:
        pos += size
        if pos >= end:
            raise _fail(what, "truncated")
        return pos + 1 if not buf[pos] else tags(buf, pos, end, tally)
    return step


@functools.cache
def _entity(cls: type) -> _Walker:
    flexible = cls.__flexible__
    steps: list[Step] = []
    min_size = 0
    tags: dict[int, _Walker] = {}
    run = 0  # fixed-width fields in a row are one bounds check
    for field in dataclasses.fields(cls):
        tag = get_field_tag(field)
        if cls.__name__ == "RequestHeader" and field.name == "client_id":
            walker = _variable(False, False, True, "RequestHeader.client_id")  # always legacy
        else:
            walker = _field(cls, field, flexible, tag is not None)
        if tag is not None:
            tags[int(tag)] = walker
            continue
        min_size += walker.min_size
        if walker.fixed:
            run += walker.min_size
            continue
        if run:
            steps.append(_fixed(run, cls.__name__).step)
            run = 0
        steps.append(walker.step)
    if run:
        steps.append(_fixed(run, cls.__name__).step)
    if flexible:
        steps.append(_tagged(cls, tags))
        min_size += 1
    elif len(steps) <= 1 and run == min_size:
        return _fixed(min_size, cls.__name__)  # an array of these is skipped in one step
    if len(steps) == 1:
        return _Walker(steps[0], min_size)
    if flexible and len(steps) == 2 and run:
        return _Walker(_fixed_then_tags(run, steps[1], cls.__name__), min_size)
    all_steps = tuple(steps)

    def step(buf: bytes, pos: int, end: int, tally: _Tally) -> int:
        for one in all_steps:
            pos = one(buf, pos, end, tally)
        return pos
    return _Walker(step, min_size)


@functools.cache
def _request(api_key: int, api_version: int) -> tuple[Step, Step]:
    body = load_request_schema(api_key, api_version)
    return _entity(body.__header_schema__).step, _entity(body).step


def check_request(frame: bytes, api_key: int, api_version: int) -> Checked:
    """Walk a request frame (without its size prefix; api key and version already read
    from it) along its schema; ProtocolError naming the field at the first count or length
    the frame cannot hold."""
    header, body = _request(api_key, api_version)
    tally = _Tally()
    end = len(frame)
    pos = body(frame, header(frame, 0, end, tally), end, tally)
    return Checked(pos, tally.elements)


def prepare(api_key: int, api_version: int) -> None:
    """Build the walk for one API version now (a broker builds all at start: a schema kio
    cannot describe fails there, not on a client's request)."""
    _request(api_key, api_version)
