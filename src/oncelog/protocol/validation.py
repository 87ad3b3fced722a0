"""Trust no header: a produced batch's records checked as Kafka's LogValidator checks them.

``split_batches`` (record_batch.py) vouches for the batch frame: lengths, magic, CRC, and a
record count that agrees with the last offset delta. This module vouches for what is inside,
so that every batch the log takes, every reader can read:

- the records fill the (decompressed) payload exactly, as many as the header says, each
  one's length covering its fields, every varint within its type, offset deltas 0, 1, 2, ...
  (Kafka rebuilds a compressed batch whose deltas are not; the broker stores what it was
  given, so it refuses one instead), timestamp deltas that do not overflow;
- no control batch (clients may not write control records; markers come from the
  transaction coordinator), no batch claiming LogAppendTime (transactional batches are
  judged by producer state: producer_state/rules.py, rows T1-T4);
- per record, as Kafka reports them (Produce v8+ ``record_errors``): a key on a topic whose
  ``cleanup.policy`` includes ``compact``; with CreateTime, a timestamp within
  ``message.timestamp.before.max.ms`` / ``after.max.ms`` of the broker's clock (KIP-937).

Then the header the log stores is made true: the max timestamp recomputed from the records
(librdkafka writes 0 when its records carry none, -1, and retention would read that as 1970),
or with LogAppendTime the broker's clock as base and max timestamp and the timestamp-type
attribute set; the CRC is recomputed only when something changed.

Sans-IO: bytes, plain settings (``RecordRules``) and the broker's clock in; the headers to
store, or InvalidBatch, out. The per-record walk is ``check_records`` in the compiled codec
(_records.c), with ``_check_records`` below as its Python twin.
"""

from __future__ import annotations

from dataclasses import dataclass

import crc32c
from kio.schema.errors import ErrorCode

from . import records
from .record_batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    CONTROL_BIT,
    HEADER_SIZE,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    InvalidBatch,
    pack_header,
)

LONG_MIN = -(1 << 63)
LONG_MAX = (1 << 63) - 1
NO_TIMESTAMP = -1

# Kafka 4's defaults for log.message.timestamp.before.max.ms / after.max.ms.
DEFAULT_BEFORE_MAX_MS = LONG_MAX
DEFAULT_AFTER_MAX_MS = 3_600_000

# A compressed batch is decompressed whole; a few hundred bytes of zstd can claim gigabytes,
# so it may not claim more than this (MESSAGE_TOO_LARGE).
MAX_UNCOMPRESSED_BYTES = 256 << 20
# ... nor may all the batches of one produce request together (RECORD_LIST_TOO_LARGE): 8 KB
# of zstd per 250 MB, a 100 MB request would otherwise be hours of work.
MAX_REQUEST_UNCOMPRESSED_BYTES = 256 << 20
# What the event loop decompresses itself, per request: past this a batch is validated in a
# worker thread (cramjam lets go of the GIL while it decompresses), and the loop serves the
# other clients meanwhile (InflateOffLoop).
INLINE_UNCOMPRESSED_BYTES = 4 << 20
# Kafka names every record at fault; a batch of 100,000 keyless records on a compacted topic
# would make a response of megabytes, so the answer names the first ones (the message says
# how many there were).
MAX_RECORD_ERRORS = 1000

_CODEC_NAMES = {code: name for name, code in records.CODECS.items()}
_NO_KEY, _BAD_TIMESTAMP = 0, 1  # the kinds check_records reports


class InflateOffLoop(Exception):
    """A batch decompresses to more than the event loop may take on: validate it again
    with ``off_loop=True`` in a worker thread."""


class Inflation:
    """What the batches of one produce request may still decompress: in all (``left``) and
    on the event loop (``inline_left``). One request's batches are validated one at a time,
    so no lock: the handler waits for the worker before the next batch."""

    __slots__ = ("inline_left", "left")

    def __init__(self, total: int = MAX_REQUEST_UNCOMPRESSED_BYTES,
                 inline: int = INLINE_UNCOMPRESSED_BYTES) -> None:
        self.left = total
        self.inline_left = inline

    def limit(self, off_loop: bool) -> int:
        return max(0, min(MAX_UNCOMPRESSED_BYTES, self.left if off_loop else self.inline_left))

    def spend(self, size: int, off_loop: bool) -> None:
        self.left -= size
        if not off_loop:
            self.inline_left -= size


@dataclass(frozen=True, slots=True)
class RecordRules:
    """What a topic's configuration asks of the records it takes."""

    keys_required: bool = False  # cleanup.policy includes compact
    log_append_time: bool = False  # message.timestamp.type=LogAppendTime
    timestamp_before_max_ms: int = DEFAULT_BEFORE_MAX_MS
    timestamp_after_max_ms: int = DEFAULT_AFTER_MAX_MS
    # compression.type: the codec batches are stored with (recompression.py); None: producer,
    # each batch as it was sent
    compression: int | None = None
    compression_level: int | None = None  # compression.<codec>.level; None: the codec's


DEFAULT_RULES = RecordRules()  # a topic with Kafka's defaults


def validate_batches(buf: bytes | bytearray | memoryview, headers: list[BatchHeader],
                     rules: RecordRules, now_ms: int, inflation: Inflation | None = None,
                     off_loop: bool = False) -> list[BatchHeader]:
    """The headers to store for the batches ``split_batches`` found in ``buf``; raises
    InvalidBatch for the first batch Kafka would refuse, and nothing may then be stored.

    ``inflation``: what a client's request may still decompress (None: the broker's own
    writes, bounded per batch only); InflateOffLoop when a batch needs more than the event
    loop may do and ``off_loop`` is false."""
    budget = (inflation, off_loop)
    if rules.log_append_time:
        bounds = (LONG_MIN, LONG_MAX)  # Kafka checks the bounds on CreateTime only
    else:
        bounds = (max(LONG_MIN, now_ms - rules.timestamp_before_max_ms),
                  min(LONG_MAX, now_ms + rules.timestamp_after_max_ms))
    view = memoryview(buf)
    if len(headers) == 1:  # what every client sends
        return [_validate(view, headers[0], rules, bounds, now_ms, budget)]
    checked = []
    pos = 0
    for header in headers:
        checked.append(_validate(view[pos:pos + header.size], header, rules, bounds, now_ms,
                                 budget))
        pos += header.size
    return checked


def _validate(batch: memoryview, header: BatchHeader, rules: RecordRules,
              bounds: tuple[int, int], now_ms: int,
              budget: tuple[Inflation | None, bool]) -> BatchHeader:
    attributes = header.attributes
    if attributes & CONTROL_BIT:
        raise InvalidBatch(ErrorCode.invalid_record,
                           "Clients are not allowed to write control records")
    if attributes & TRANSACTIONAL_BIT and header.producer_id < 0:
        raise InvalidBatch(ErrorCode.invalid_record,
                           "a transactional batch needs a producer id")
    payload = batch[HEADER_SIZE:] if not attributes & COMPRESSION_MASK else \
        _decompressed(batch, header, *budget)
    claims_append_time = attributes & TIMESTAMP_TYPE_BIT
    low, high = (LONG_MIN, LONG_MAX) if claims_append_time else bounds
    walk = getattr(records.compiled, "check_records", None) or _check_records
    try:
        max_timestamp, bad = walk(payload, header.records_count, header.base_timestamp,
                                  rules.keys_required, low, high)
    except ValueError as exc:
        raise InvalidBatch(ErrorCode.invalid_record, f"Invalid record structure: {exc}") from None
    if bad or claims_append_time:
        raise _record_errors(header, bad or [], bool(claims_append_time), low, high)
    if rules.log_append_time or max_timestamp != header.max_timestamp:
        return _stored_header(batch, header, max_timestamp, rules.log_append_time, now_ms)
    return header


def _decompressed(batch: memoryview, header: BatchHeader, inflation: Inflation | None,
                  off_loop: bool) -> bytes | memoryview:
    codec = header.compression
    name = _CODEC_NAMES.get(codec)
    if name is None:
        raise InvalidBatch(ErrorCode.invalid_record,
                           f"the batch attributes name compression codec {codec}, which does "
                           "not exist")
    limit = MAX_UNCOMPRESSED_BYTES if inflation is None else inflation.limit(off_loop)
    try:
        payload = records.decompress_at_most(codec, batch[HEADER_SIZE:], limit)
    except records.TooLarge as exc:
        if limit == MAX_UNCOMPRESSED_BYTES:
            raise InvalidBatch(ErrorCode.message_too_large, f"{name} batch {exc}") from None
        assert inflation is not None
        if not off_loop and inflation.inline_left < inflation.left:
            raise InflateOffLoop() from None
        raise InvalidBatch(ErrorCode.record_list_too_large,
                           f"{name} batch: the request's batches decompress to more than "
                           f"{MAX_REQUEST_UNCOMPRESSED_BYTES} bytes in all") from None
    except ValueError as exc:
        # Kafka's reader fails here with a plain KafkaException, which its broker answers as
        # UNKNOWN_SERVER_ERROR; CORRUPT_MESSAGE is what the error means ("or is otherwise
        # corrupt") and what Kafka chose when it caught this before (KAFKA-3160).
        raise InvalidBatch(ErrorCode.corrupt_message,
                           f"{name} batch does not decompress: {exc}") from None
    if inflation is not None:
        inflation.spend(len(payload), off_loop)
    return payload


def _record_errors(header: BatchHeader, bad: list[tuple[int, int, int]],
                   claims_append_time: bool, low: int, high: int) -> InvalidBatch:
    """Kafka's answer for records that break a per-record rule: every one of them named,
    INVALID_TIMESTAMP when any timestamp is at fault, else INVALID_RECORD."""
    messages: dict[int, str] = {}
    for index, kind, timestamp in bad:
        if kind == _NO_KEY:
            messages[index] = "Compacted topic cannot accept message without key"
        else:
            messages[index] = (f"Timestamp {timestamp} of message with offset "
                               f"{header.base_offset + index} is out of range. The timestamp "
                               f"should be within [{low}, {high}]")
    if claims_append_time:
        for index in range(header.records_count):
            messages.setdefault(index, f"Invalid timestamp type in message {index}. Producer "
                                       "should not set timestamp type to LogAppendTime.")
    errors = sorted(messages.items())
    timestamps = claims_append_time or any(kind == _BAD_TIMESTAMP for _, kind, _ in bad)
    shown = "; ".join(f"record {index}: {message}" for index, message in errors[:3])
    cause = "invalid timestamp" if timestamps else "record errors"
    return InvalidBatch(
        ErrorCode.invalid_timestamp if timestamps else ErrorCode.invalid_record,
        f"One or more records have been rejected due to {cause}: {len(errors)} in total, "
        f"the first ones: {shown}",
        errors[:MAX_RECORD_ERRORS])


def _stored_header(batch: memoryview, header: BatchHeader, max_timestamp: int,
                   log_append_time: bool, now_ms: int) -> BatchHeader:
    if log_append_time:
        # Readers take every record's timestamp from the max timestamp then. Kafka sets the
        # base timestamp too when it rebuilds a batch (not when it patches one in place):
        # here it is always set, so that nothing of the client's clock is left in the header.
        stored = header._replace(attributes=header.attributes | TIMESTAMP_TYPE_BIT,
                                 base_timestamp=now_ms, max_timestamp=now_ms)
    else:
        stored = header._replace(max_timestamp=max_timestamp)
    signed = pack_header(stored)[ATTRIBUTES_OFFSET:]
    return stored._replace(crc=crc32c.crc32c(batch[HEADER_SIZE:], crc32c.crc32c(signed)))


# --- the Python twin of _records.check_records ------------------------------------------------

class _Problem(Exception):
    pass


def _varint(buf: bytes, pos: int, end: int, bits: int) -> tuple[int, int]:
    """A zigzag varint of at most ``bits`` bits ending before ``end``: (value, next pos)."""
    raw = shift = 0
    while True:
        if pos >= end:
            raise _Problem("a varint is cut short")
        b = buf[pos]
        pos += 1
        if shift + 7 > bits and b >= 1 << (bits - shift):
            raise _Problem("a varint is too long")
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def _skip_field(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    length, pos = _varint(buf, pos, end, 32)
    if length > end - pos:
        raise _Problem("a field runs past the end of the record")
    return length, pos + max(length, 0)


def _check_records(payload: bytes | memoryview, count: int, base_timestamp: int,
                   need_key: bool, low: int, high: int
                   ) -> tuple[int, list[tuple[int, int, int]] | None]:
    """What _records.check_records answers, for when the compiled codec is missing: written
    for clarity, not speed."""
    buf = bytes(payload)
    pos, end = 0, len(buf)
    max_timestamp = NO_TIMESTAMP
    bad: list[tuple[int, int, int]] = []
    for i in range(count):
        if pos == end:
            raise ValueError(f"batch says {count} records but holds {i}")
        try:
            pos, key_length, timestamp = _check_record(buf, pos, end, i, base_timestamp)
        except _Problem as problem:
            raise ValueError(f"record {i}: {problem}") from None
        max_timestamp = max(max_timestamp, timestamp)
        if need_key and key_length < 0:
            bad.append((i, _NO_KEY, timestamp))
        elif timestamp != NO_TIMESTAMP and not low <= timestamp <= high:
            bad.append((i, _BAD_TIMESTAMP, timestamp))
    if pos != end:
        raise ValueError(f"batch says {count} records but more bytes follow them")
    return max_timestamp, bad or None


def _check_record(buf: bytes, pos: int, end: int, index: int,
                  base_timestamp: int) -> tuple[int, int, int]:
    """One record: (position after it, its key length, its timestamp)."""
    length, pos = _varint(buf, pos, end, 32)
    if length < 0:
        raise _Problem(f"negative length {length}")
    if length > end - pos:
        raise _Problem(f"length {length} runs past the end of the batch")
    start, record_end = pos, pos + length
    if pos >= record_end:
        raise _Problem("a field runs past the end of the record")
    pos += 1  # attributes: unused in v2
    timestamp_delta, pos = _varint(buf, pos, record_end, 64)
    offset_delta, pos = _varint(buf, pos, record_end, 32)
    if offset_delta != index:
        raise _Problem(f"offset delta {offset_delta}, expected {index}")
    key_length, pos = _skip_field(buf, pos, record_end)
    _, pos = _skip_field(buf, pos, record_end)
    header_count, pos = _varint(buf, pos, record_end, 32)
    if header_count < 0:
        raise _Problem(f"negative header count {header_count}")
    for _ in range(header_count):
        name_length, pos = _skip_field(buf, pos, record_end)
        if name_length < 0:
            raise _Problem("a header key is null")
        _, pos = _skip_field(buf, pos, record_end)
    if pos != record_end:
        raise _Problem(f"length {length} does not match its fields ({pos - start} bytes)")
    timestamp = base_timestamp + timestamp_delta
    if not LONG_MIN <= timestamp <= LONG_MAX:
        raise _Problem(f"timestamp delta {timestamp_delta} overflows")
    return pos, key_length, timestamp
