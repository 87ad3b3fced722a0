"""RecordBatch v2 headers: parse, check and patch without decoding any record.

Layout of the 61-byte header (all big-endian), as Kafka defines it:

    0  baseOffset int64          27 baseTimestamp int64
    8  batchLength int32         35 maxTimestamp int64
    12 partitionLeaderEpoch i32  43 producerId int64
    16 magic int8                51 producerEpoch int16
    17 crc uint32 (CRC32C of     53 baseSequence int32
       bytes 21..end)            57 recordsCount int32
    21 attributes int16
    23 lastOffsetDelta int32

``batchLength`` counts the bytes after itself, so a batch occupies ``12 + batchLength`` bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

import crc32c
from kio.schema.errors import ErrorCode

from .sequences import record_sequence

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the part batchLength does not count
MIN_MESSAGE_OVERHEAD = 14  # the smallest v0 message; Kafka's floor for any batch length
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
CURRENT_MAGIC = 2

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20

HEADER_STRUCT = struct.Struct(">qiibIhiqqqhii")  # the fields of BatchHeader, in order
_OFFSET_AND_LENGTH = struct.Struct(">qi")


class InvalidBatch(Exception):
    """A batch the broker must refuse, with the Kafka error code to answer and, where Kafka
    names them (Produce v8+), the records at fault: (index in the batch, message)."""

    def __init__(self, error: ErrorCode, message: str,
                 record_errors: Sequence[tuple[int, str]] = ()) -> None:
        super().__init__(message)
        self.error = error
        self.record_errors = tuple(record_errors)


class BatchHeader(NamedTuple):
    # A NamedTuple, not a dataclass: one is built per batch on the produce path, and tuple
    # construction and _replace cost a fraction of a frozen dataclass's.
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record, wrapping past 2^31-1 back to 0 as Kafka does."""
        return record_sequence(self.base_sequence, self.last_offset_delta)


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    return BatchHeader(*HEADER_STRUCT.unpack_from(buf, pos))


def pack_header(header: BatchHeader) -> bytes:
    return HEADER_STRUCT.pack(*header)


def crc_of(buf: bytes | bytearray | memoryview, pos: int, size: int) -> int:
    return crc32c.crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET : pos + size])


def split_batches(
    buf: bytes | bytearray | memoryview, max_batch_bytes: int
) -> list[BatchHeader]:
    """Validate a produce request's record set and return its batch headers, in order.

    Raises InvalidBatch with the Kafka error name for: a torn or empty set (CORRUPT_MESSAGE),
    an old message format (UNSUPPORTED_FOR_MESSAGE_FORMAT), a batch over ``max_batch_bytes``
    (MESSAGE_TOO_LARGE), a CRC mismatch (CORRUPT_MESSAGE), inconsistent counts (INVALID_RECORD).
    """
    total = len(buf)
    if total == 0:
        raise InvalidBatch(ErrorCode.corrupt_message, "empty record set")
    headers = []
    pos = 0
    while pos < total:
        if total - pos < LOG_OVERHEAD + 5:
            raise InvalidBatch(ErrorCode.corrupt_message, f"truncated batch header at byte {pos}")
        _, batch_length = _OFFSET_AND_LENGTH.unpack_from(buf, pos)
        size = LOG_OVERHEAD + batch_length
        # Kafka's order: a length that no message format allows is corruption, whatever the
        # magic byte says (zeros are not an old format); only then size, then format.
        if batch_length < MIN_MESSAGE_OVERHEAD:
            raise InvalidBatch(ErrorCode.corrupt_message,
                               f"batch length {batch_length} is out of range")
        if size > max_batch_bytes:
            raise InvalidBatch(
                ErrorCode.message_too_large,
                f"batch of {size} bytes exceeds the limit of {max_batch_bytes} bytes",
            )
        magic = buf[pos + MAGIC_OFFSET]
        if magic != CURRENT_MAGIC:
            raise InvalidBatch(
                ErrorCode.unsupported_for_message_format,
                f"message format v{magic} is not supported, only v2 record batches",
            )
        if batch_length < HEADER_SIZE - LOG_OVERHEAD or pos + size > total:
            raise InvalidBatch(ErrorCode.corrupt_message,
                               f"batch length {batch_length} is out of range")
        header = read_header(buf, pos)
        if crc_of(buf, pos, size) != header.crc:
            raise InvalidBatch(ErrorCode.corrupt_message, "record batch CRC32C does not match")
        if header.records_count <= 0 or header.last_offset_delta != header.records_count - 1:
            raise InvalidBatch(
                ErrorCode.invalid_record,
                f"batch says {header.records_count} records but last offset delta "
                f"{header.last_offset_delta}",
            )
        headers.append(header)
        pos += size
    return headers


_NEW_TUPLE = tuple.__new__


def assign_offsets(buf: bytes | bytearray | memoryview, headers: list[BatchHeader],
                   first_offset: int, leader_epoch: int) -> tuple[list[BatchHeader], list]:
    """The batches with their base offset and leader epoch set, ready for writev.

    Returns the patched headers and the pieces to write: per batch its 61-byte header, packed
    from ``headers`` (so whatever validation set there, such as a recomputed max timestamp
    and its CRC, is what is stored), and a view of the client's records after it, so the bulk
    of the batch is never copied. Neither field set here is covered by the CRC.
    """
    view = memoryview(buf)
    pos = 0
    offset = first_offset
    patched = []
    parts: list = []
    for header in headers:
        # the two fields replaced by hand: _replace costs three times this, per batch
        header = _NEW_TUPLE(BatchHeader, (offset, header[1], leader_epoch, *header[3:]))
        parts.append(HEADER_STRUCT.pack(*header))
        parts.append(view[pos + HEADER_SIZE:pos + header.size])
        patched.append(header)
        offset += header.last_offset_delta + 1
        pos += header.size
    return patched, parts


def scan_batches(buf: bytes | bytearray | memoryview, start: int = 0):
    """Yield (position, BatchHeader) for each complete batch in ``buf`` from ``start``.

    Stops at the first incomplete batch; no CRC check (see ``validate_scan`` for recovery).
    """
    total = len(buf)
    pos = start
    while total - pos >= HEADER_SIZE:
        header = read_header(buf, pos)
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or pos + header.size > total:
            return
        yield pos, header
        pos += header.size
