"""encode_batch writes the bytes it wrote before its one-record path (issue 26): the broker's
coordinators store every record through it, and a stored batch may not change. The
reference below is the previous implementation, kept here as the specification."""
from __future__ import annotations

import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.protocol.record_batch import (
    ATTRIBUTES_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    pack_header,
)
from oncelog.protocol.records import (
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    compress,
    encode_batch,
    encode_record,
)


def _reference(records, compression=NONE, base_offset=0, producer_id=-1, producer_epoch=-1,
               base_sequence=-1, transactional=False) -> bytes:
    base_ts = records[0][3]
    max_ts = max(r[3] for r in records)
    body = bytearray()
    for delta, (key, value, headers, ts) in enumerate(records):
        body += encode_record(delta, ts - base_ts, key, value,
                              [(name.encode(), hvalue) for name, hvalue in headers])
    payload = compress(compression, bytes(body))
    attributes = compression | (0x10 if transactional else 0)
    length = HEADER_SIZE - LOG_OVERHEAD + len(payload)
    header = BatchHeader(base_offset, length, -1, 2, 0, attributes, len(records) - 1, base_ts,
                         max_ts, producer_id, producer_epoch, base_sequence, len(records))
    unsigned = pack_header(header)
    crc = crc32c.crc32c(payload, crc32c.crc32c(unsigned[ATTRIBUTES_OFFSET:]))
    return pack_header(header._replace(crc=crc)) + payload


_maybe_bytes = st.none() | st.binary(max_size=300)
_record = st.tuples(_maybe_bytes, _maybe_bytes,
                    st.lists(st.tuples(st.text(max_size=8), _maybe_bytes), max_size=2),
                    st.integers(0, 2**45))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(records=st.lists(_record, min_size=1, max_size=4),
       codec=st.sampled_from((NONE, NONE, GZIP, SNAPPY, LZ4, ZSTD)),
       base_offset=st.integers(0, 2**40), producer_id=st.integers(-1, 2**40),
       producer_epoch=st.integers(-1, 2**15 - 1), base_sequence=st.integers(-1, 2**31 - 1),
       transactional=st.booleans())
def test_the_bytes_of_the_reference(records, codec, base_offset, producer_id, producer_epoch,
                                    base_sequence, transactional):
    args = (records, codec, base_offset, producer_id, producer_epoch, base_sequence,
            transactional)
    assert encode_batch(*args) == _reference(*args)
