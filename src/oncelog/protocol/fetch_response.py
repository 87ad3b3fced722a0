"""FetchResponse v4-v12 read directly from the frame, each partition's records left in place.

kio copies every partition's records out of the frame into new bytes and builds an entity
per topic, partition and aborted transaction; for a reader taking megabytes a Fetch (the
Spark source, the audit, oncelog.Consumer) that copy was a tenth of its time. Here the
records are a memoryview into the frame, which the batch walk (``batches.py``) reads as it
is. tests/protocol/test_fetch_response.py checks it against kio for every version.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .errors import ProtocolError
from .produce_request import WireReader

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I16_I32 = struct.Struct(">hi")  # error code, session id (v7+)
_PARTITION = struct.Struct(">ihq")  # index, error code, high watermark
_PAIR = struct.Struct(">qq")  # aborted transaction: producer id, first offset
FLEXIBLE_FROM = 12
MIN_VERSION, MAX_VERSION = 4, 12  # v13+ name topics by id


class FetchedPartition(NamedTuple):
    topic: str
    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int  # -1 before v5
    aborted_transactions: tuple[tuple[int, int], ...]  # (producer id, first offset) each
    records: memoryview | None


def decode(frame: bytes | bytearray | memoryview, version: int
           ) -> tuple[int, int, list[FetchedPartition]]:
    """(correlation id, top-level error code, partitions) of a response frame without its
    size prefix."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ProtocolError(f"fetch response v{version} is not read here")
    flexible = version >= FLEXIBLE_FROM
    r = WireReader(frame, 0, "fetch response")
    (correlation_id,) = r.unpack(_I32)
    r.tags(flexible)  # response header v1
    r.skip(4)  # throttle time
    error_code = r.unpack(_I16_I32)[0] if version >= 7 else 0
    partitions = []
    for _ in range(r.count(flexible)):
        topic = r.string(flexible)
        if topic is None:
            raise ProtocolError("null topic name in a fetch response")
        for _ in range(r.count(flexible)):
            index, code, high = r.unpack(_PARTITION)
            (last_stable,) = r.unpack(_I64)
            log_start = r.unpack(_I64)[0] if version >= 5 else -1
            aborted = []
            for _ in range(max(0, r.length(flexible, wide=True))):  # -1: null
                aborted.append(r.unpack(_PAIR))
                r.tags(flexible)
            if version >= 11:
                r.skip(4)  # preferred read replica
            size = r.length(flexible, wide=True)
            records = None if size < 0 else r.take(size)
            r.tags(flexible)  # diverging epoch, current leader, snapshot id: unused here
            partitions.append(FetchedPartition(topic, index, code, high, last_stable,
                                               log_start, tuple(aborted), records))
        r.tags(flexible)
    r.tags(flexible)
    return correlation_id, error_code, partitions
