"""spark/columns.py without Spark: the compiled column builder (``_records.ArrowColumns``) and
its pure-Python twin turn the same fetched record sets into the same Arrow batches, and both
match the records the consumer's decoder reads."""

from __future__ import annotations

import crc32c
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.protocol import records as codec
from oncelog.protocol.batches import CorruptBatch, RecordSetWalk
from oncelog.protocol.control import marker_batch
from oncelog.protocol.record_batch import (
    ATTRIBUTES_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    pack_header,
)
from oncelog.spark.columns import ArrowColumns, PyRecordColumns, arrow_schema

T0 = 1_700_000_000_000

maybe_bytes = st.none() | st.binary(max_size=40)
# Header names as bytes: also ones that are not UTF-8 (read with U+FFFD, as the decoder does).
header = st.tuples(st.text(max_size=6).map(str.encode) | st.binary(max_size=6), maybe_bytes)
record = st.tuples(maybe_bytes, maybe_bytes, st.lists(header, max_size=3),
                   st.integers(-5, 5_000))
batch = st.fixed_dictionaries({
    "records": st.lists(record, min_size=1, max_size=12),
    "compression": st.sampled_from(sorted(codec.CODECS.values())),
    "log_append": st.booleans(),
    "producer": st.sampled_from([(-1, -1, -1), (7, 0, 0), (9, 3, 2**31 - 4), (11, 2, 100)]),
    "transactional": st.booleans(),
    "marker": st.booleans(),  # a control batch after it
})


def encode(spec: dict, base_offset: int) -> bytes:
    """A v2 batch (with codec.encode_record, which takes header names as bytes)."""
    records = spec["records"]
    body = b"".join(codec.encode_record(i, ts, key, value, headers)
                    for i, (key, value, headers, ts) in enumerate(records))
    payload = codec.compress(spec["compression"], body)
    attributes = spec["compression"] | (TIMESTAMP_TYPE_BIT if spec["log_append"] else 0) | \
        (TRANSACTIONAL_BIT if spec["transactional"] else 0)
    pid, epoch, sequence = spec["producer"]
    header = BatchHeader(base_offset, HEADER_SIZE - LOG_OVERHEAD + len(payload), -1, 2, 0,
                         attributes, len(records) - 1, T0, T0 + 9_999, pid, epoch, sequence,
                         len(records))
    crc = crc32c.crc32c(payload, crc32c.crc32c(pack_header(header)[ATTRIBUTES_OFFSET:]))
    return pack_header(header._replace(crc=crc)) + payload


def record_set(specs: list[dict]) -> tuple[bytes, int]:
    """The batches one after the other, each with a marker after it where asked; and the
    offset after the last."""
    data, offset = b"", 5
    for spec in specs:
        data += encode(spec, offset)
        offset += len(spec["records"])
        if spec["marker"]:
            data += marker_batch(max(spec["producer"][0], 0), 0, True, 0, T0, offset)
            offset += 1
    return data, offset


def columns(cls, data: bytes, first: int, end: int, headers: bool,
            take_every: int) -> list[pa.RecordBatch]:
    built = cls("topic", 3, headers)
    out = []
    for i, b in enumerate(RecordSetWalk(data, first, end)):
        built.add_batch(b)
        if i % take_every == take_every - 1 and len(built):
            out.append(built.take())
    if len(built):
        out.append(built.take())
    return out


def test_the_compiled_builder_is_there():
    # Else the comparisons below would compare the Python builder with itself.
    assert codec.compiled is not None and hasattr(codec.compiled, "ArrowColumns")


@settings(max_examples=150, deadline=None)
@given(st.lists(batch, min_size=1, max_size=6), st.integers(0, 30), st.integers(0, 30),
       st.booleans(), st.integers(1, 3))
def test_compiled_and_python_builders_give_the_same_batches(specs, cut_start, cut_end,
                                                            headers, take_every):
    data, after = record_set(specs)
    first, end = 5 + cut_start, max(5, after - cut_end)
    compiled = columns(ArrowColumns, data, first, end, headers, take_every)
    python = columns(PyRecordColumns, data, first, end, headers, take_every)
    assert [b.num_rows for b in compiled] == [b.num_rows for b in python]
    for got, want in zip(compiled, python, strict=True):
        got.validate(full=True)
        assert got.schema == arrow_schema(headers)
        assert got.equals(want), (got.to_pylist(), want.to_pylist())

    # And what the consumer's decoder reads: the wanted records, no control records.
    rows = [row for b in compiled for row in b.to_pylist()]
    expected = []
    for b in RecordSetWalk(data, first, end):
        h = b.header
        for delta, ts_delta, key, value, hdrs in b.record_fields():
            ts = h.max_timestamp if h.attributes & TIMESTAMP_TYPE_BIT else h.base_timestamp \
                + ts_delta
            expected.append((h.base_offset + delta, key, value, ts, list(hdrs)))
    assert [(r["offset"], r["key"], r["value"], int(r["timestamp"].timestamp() * 1000),
             [(x["key"], x["value"]) for x in r["headers"]] if headers else list(e[4]))
            for r, e in zip(rows, expected, strict=True)] == expected


@pytest.mark.parametrize("cls", [ArrowColumns, PyRecordColumns])
def test_records_that_do_not_parse_are_a_corrupt_batch(cls):
    spec = {"records": [(b"k", b"v", [], 0)] * 3, "compression": codec.NONE,
            "log_append": False, "producer": (-1, -1, -1), "transactional": False,
            "marker": False}
    data = bytearray(encode(spec, 0))
    data[HEADER_SIZE] = 0x7F  # the first record's length: past the end of the batch
    built = cls("topic", 0, False)
    with pytest.raises(CorruptBatch, match="batch at offset 0"):
        for b in RecordSetWalk(bytes(data), 0, check_crcs=False):
            built.add_batch(b)
