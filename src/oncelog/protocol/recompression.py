"""compression.type: the broker stores a batch with the topic's codec, as Kafka's LogValidator
does when the codec a producer used differs from the topic's (``producer`` keeps each batch as
sent, and so does a topic whose codec the batch already has: no work on the common path).

A recompressed batch keeps every header field but its codec, length and CRC: producer id,
epoch, base sequence and the transactional bit (so idempotent retries still deduplicate,
judged by those fields before any recompression), timestamps and their type as validation
left them. Its records are the same bytes, decompressed and compressed again.

Sans-IO: validated batches in, batches to store out (or InvalidBatch when the recompressed
batch is larger than the topic allows, MESSAGE_TOO_LARGE as Kafka answers).
"""

from __future__ import annotations

import crc32c
from kio.schema.errors import ErrorCode

from . import records
from .record_batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    InvalidBatch,
    pack_header,
)

# compression.type -> the codec batches are stored with; None: as the producer sent them.
STORED_CODECS: dict[str, int | None] = {
    "producer": None,
    "uncompressed": records.NONE,
    "gzip": records.GZIP,
    "snappy": records.SNAPPY,
    "lz4": records.LZ4,
    "zstd": records.ZSTD,
}

# validation.py decompressed every batch within this bound already.
_MAX_UNCOMPRESSED = 256 << 20


def needs_recompression(headers: list[BatchHeader], codec: int) -> bool:
    return any(header.compression != codec for header in headers)


def recompress(buf: bytes | bytearray | memoryview, headers: list[BatchHeader], codec: int,
               level: int | None, max_batch_bytes: int) -> tuple[bytes, list[BatchHeader]]:
    """The batches of ``buf`` (described by the validated ``headers``) with ``codec``."""
    view = memoryview(buf)
    parts: list[bytes | memoryview] = []
    stored: list[BatchHeader] = []
    pos = 0
    for header in headers:
        batch = view[pos:pos + header.size]
        pos += header.size
        if header.compression == codec:
            parts += (pack_header(header), batch[HEADER_SIZE:])
            stored.append(header)
            continue
        payload = batch[HEADER_SIZE:]
        if header.compression != records.NONE:
            payload = records.decompress_at_most(header.compression, payload, _MAX_UNCOMPRESSED)
        # no bytes() copy: 200 MB of fresh pages faulted in with the GIL held stalled the
        # event loop for seconds while a worker thread recompressed
        data = records.compress(codec, payload, level)
        new = header._replace(
            attributes=(header.attributes & ~COMPRESSION_MASK) | codec,
            batch_length=HEADER_SIZE - LOG_OVERHEAD + len(data), crc=0)
        if new.size > max_batch_bytes:
            raise InvalidBatch(ErrorCode.message_too_large,
                               f"batch of {new.size} bytes after recompression exceeds the "
                               f"limit of {max_batch_bytes} bytes")
        signed = pack_header(new)[ATTRIBUTES_OFFSET:]
        new = new._replace(crc=crc32c.crc32c(data, crc32c.crc32c(signed)))
        parts += (pack_header(new), data)
        stored.append(new)
    return b"".join(parts), stored
