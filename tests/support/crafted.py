"""Records and batches crafted byte by byte, right or wrong, for the validation tests: every
field can lie, while the batch CRC stays right, so that only what is inside can be wrong."""

from __future__ import annotations

import crc32c

from oncelog.protocol.record_batch import HEADER_SIZE, LOG_OVERHEAD, BatchHeader, pack_header
from oncelog.protocol.records import compress
from oncelog.protocol.varint import varint_bytes


def field(data: bytes | None) -> bytes:
    return varint_bytes(-1) if data is None else varint_bytes(len(data)) + data


def record(offset_delta: int, key: bytes | None = b"k", value: bytes | None = b"v",
           ts_delta: int = 0, headers: list[tuple[bytes | None, bytes | None]] | None = None,
           body: bytes | None = None, length: int | None = None) -> bytes:
    """One record; ``body`` replaces its fields, ``length`` its length prefix."""
    if body is None:
        hdrs = headers or []
        body = (b"\x00" + varint_bytes(ts_delta) + varint_bytes(offset_delta) + field(key)
                + field(value) + varint_bytes(len(hdrs))
                + b"".join(field(k) + field(v) for k, v in hdrs))
    return varint_bytes(len(body) if length is None else length) + body


def with_payload(header: BatchHeader, payload: bytes) -> bytes:
    """``header`` (its length and CRC made right) followed by ``payload`` as it is."""
    header = header._replace(batch_length=HEADER_SIZE - LOG_OVERHEAD + len(payload), crc=0)
    crc = crc32c.crc32c(payload, crc32c.crc32c(pack_header(header)[21:]))
    return pack_header(header._replace(crc=crc)) + payload


def batch_of(payload: bytes, count: int, base_ts: int, max_ts: int | None = None,
             attributes: int = 0, producer_id: int = -1, codec: int = 0) -> bytes:
    """A batch of ``count`` records around ``payload`` (compressed with ``codec``)."""
    idempotent = producer_id >= 0
    header = BatchHeader(0, 0, -1, 2, 0, attributes | codec, count - 1, base_ts,
                         base_ts if max_ts is None else max_ts, producer_id,
                         0 if idempotent else -1, 0 if idempotent else -1, count)
    return with_payload(header, compress(codec, payload))
