"""Base-128 varints, the one implementation: unsigned ones (flexible protocol versions) and
zigzag-signed ones (fields of records in a RecordBatch)."""

from __future__ import annotations


def write_uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def read_uvarint(buf: bytes | memoryview, pos: int, max_bits: int = 64) -> tuple[int, int]:
    """(value, position after it); ValueError when longer than ``max_bits``, IndexError when
    the buffer ends inside it."""
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result >> max_bits:
                raise ValueError("varint is too long")
            return result, pos
        shift += 7
        if shift >= max_bits:
            raise ValueError("varint is too long")


def zigzag(value: int) -> int:
    """A signed 64-bit value as the unsigned one Kafka writes."""
    return (value << 1) ^ (value >> 63)


def unzigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def write_varint(out: bytearray, value: int) -> None:
    write_uvarint(out, zigzag(value))


def read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    # One- and two-byte varints (nearly every record field) without further calls: this is
    # the inner loop of decoding records.
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    c = buf[pos + 1]
    if c < 0x80:
        value = (b & 0x7F) | (c << 7)
        return (value >> 1) ^ -(value & 1), pos + 2
    value, pos = read_uvarint(buf, pos)
    return unzigzag(value), pos


def _encoded(value: int) -> bytes:
    out = bytearray()
    write_varint(out, value)
    return bytes(out)


# Record fields are mostly small: -1 for a null key, deltas and lengths under 16 KiB. A table
# makes writing one a lookup, which matters on the producer's per-record path:
# SMALL_VARINTS[v + 1] is the varint of v, for -1 <= v < SMALL_VARINTS_END.
SMALL_VARINTS_END = 1 << 14
SMALL_VARINTS = tuple(_encoded(v) for v in range(-1, SMALL_VARINTS_END))


def varint_bytes(value: int) -> bytes:
    """The zigzag varint of ``value`` as bytes."""
    if -1 <= value < SMALL_VARINTS_END:
        return SMALL_VARINTS[value + 1]
    return _encoded(value)
