"""Record batches: encode/decode round trips for every codec, checked against real clients."""

import struct
import time

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from oncelog.client.producer.partitioner import murmur2, partition_for_key
from oncelog.protocol.record_batch import HEADER_SIZE, read_header, split_batches
from oncelog.protocol.records import (
    CODECS,
    PyRecordBuilder,
    _decode_records,
    decode_batch,
    encode_batch,
    encode_record,
)
from oncelog.protocol.records import compiled as _compiled

record = st.tuples(
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=300),
    st.lists(st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=10)), max_size=3),
    st.integers(min_value=0, max_value=2**41),
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(records=st.lists(record, min_size=1, max_size=20), codec=st.sampled_from(sorted(CODECS)))
def test_encode_decode_round_trip(records, codec):
    batch = encode_batch(records, CODECS[codec], base_offset=7, producer_id=3, producer_epoch=1,
                         base_sequence=11)
    header = read_header(batch)
    assert split_batches(batch, 1 << 30) == [header]
    assert header.crc == crc32c.crc32c(batch[21:])
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (3, 1, 11)
    decoded_header, decoded = decode_batch(batch)
    assert decoded_header == header
    assert [(r.key, r.value, list(r.headers), r.timestamp) for r in decoded] == \
        [(k, v, [(hk, hv) for hk, hv in h], ts) for k, v, h, ts in records]
    assert [r.offset for r in decoded] == list(range(7, 7 + len(records)))


def test_long_varints_decode():
    """Lengths and offset deltas of three bytes and more (the decoder reads short ones in
    line and longer ones by a call): a 20 KB record and offsets past 8192."""
    records = [(None, b"v" * 20_000, [], 5)] + [(b"k", b"%d" % i, [], 5) for i in range(9000)]
    _, decoded = decode_batch(encode_batch(records))
    assert decoded[0].value == b"v" * 20_000
    assert [r.offset for r in decoded[-2:]] == [8999, 9000]
    assert decoded[-1].value == b"8999"


@settings(max_examples=300, deadline=None, derandomize=True)
@given(key=st.binary(max_size=64))
def test_murmur2_matches_kafka_python(key):
    # kafka-python returns the same 32 bits unsigned
    assert murmur2(key) & 0xFFFFFFFF == kafka_python_murmur2(key)


def test_keys_land_where_java_puts_them():
    # Values computed by Java's Utils.murmur2 / DefaultPartitioner (Kafka's own test vectors).
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert partition_for_key(b"foobar", 10) == (-790332482 & 0x7FFFFFFF) % 10


# --- the compiled codec (protocol/_records.c) and its Python twin ------------------------

def _outcome(decode, payload, count):
    """What a decoder returns, or that it refused (any error a corrupt batch may raise)."""
    try:
        return decode(payload, count)
    except (ValueError, IndexError, struct.error, UnicodeDecodeError):
        return "refused"


def _payload(records):
    batch = encode_batch(records)
    return batch[HEADER_SIZE:], len(records)


varied_record = st.tuples(
    st.none() | st.binary(max_size=300),
    st.none() | st.binary(max_size=20_000),
    st.lists(st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=10)), max_size=3),
    st.integers(min_value=0, max_value=2**62),
)


def test_the_compiled_codec_is_built():
    # make test builds it (gcc and the Python headers are on every machine we set up); the
    # tests below would otherwise compare the Python codec with itself.
    assert _compiled is not None, "oncelog.protocol._records was not built"


@settings(max_examples=200, deadline=None, derandomize=True)
@given(records=st.lists(varied_record, min_size=1, max_size=12))
def test_compiled_decoder_equals_python_decoder(records):
    payload, count = _payload(records)
    assert _compiled.decode_records(payload, count) == _decode_records(payload, count)
    assert _compiled.decode_records(memoryview(payload), count) == \
        _decode_records(payload, count)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(records=st.lists(record, min_size=1, max_size=5), data=st.data())
def test_compiled_decoder_refuses_what_python_refuses(records, data):
    """Damaged payloads (bytes changed, cut short, or claiming more records than they hold):
    both decoders give the same records or both refuse."""
    payload, count = _payload(records)
    damaged = bytearray(payload)
    for _ in range(data.draw(st.integers(0, 4), label="changes")):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    damaged = bytes(damaged[:data.draw(st.integers(0, len(damaged)), label="cut")])
    count += data.draw(st.integers(0, 2), label="extra count")
    assert _outcome(_compiled.decode_records, damaged, count) == \
        _outcome(_decode_records, damaged, count)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(garbage=st.binary(max_size=64), count=st.integers(0, 4))
def test_compiled_decoder_on_garbage(garbage, count):
    assert _outcome(_compiled.decode_records, garbage, count) == \
        _outcome(_decode_records, garbage, count)


def test_overlong_varints_are_refused_by_both():
    eleven_bytes = b"\x80" * 10 + b"\x01"
    too_big = b"\xff" * 9 + b"\x02"  # ten bytes, but more than 64 bits
    for payload in (eleven_bytes, too_big):
        assert _outcome(_compiled.decode_records, payload, 1) == "refused"
        assert _outcome(_decode_records, payload, 1) == "refused"


def test_wrong_record_lengths_are_refused_by_both():
    """Each record's length prefix made 1 or 2 bytes shorter or longer (its fields unchanged):
    random damage seldom lands on a length byte, so every one is tried here."""
    records = [(b"k%d" % i, b"v" * i, [("h", b"x")] if i % 2 else [], 5) for i in range(6)]
    payload, count = _payload(records)
    starts, pos = [], 0
    for _ in range(count):
        starts.append(pos)
        pos += 1 + (payload[pos] >> 1)  # one-byte lengths (under 64) in this batch
    for start in starts:
        for change in (-4, -2, 2, 4):  # zigzag: length -2, -1, +1, +2
            damaged = bytearray(payload)
            damaged[start] += change
            assert _outcome(_compiled.decode_records, bytes(damaged), count) == "refused"
            assert _outcome(_decode_records, bytes(damaged), count) == "refused"


@settings(max_examples=200, deadline=None, derandomize=True)
@given(appends=st.lists(st.tuples(st.integers(0, 2**42), st.none() | st.binary(max_size=40),
                                  st.none() | st.binary(max_size=20_000),
                                  st.lists(st.tuples(st.text(max_size=5),
                                                     st.none() | st.binary(max_size=5)),
                                           max_size=2)),
                        max_size=30))
def test_compiled_record_builder_equals_python_builder(appends):
    """Both builders fill a batch the same way (and as encode_batch would), keep the same
    count and timestamps, and hand over the same buffer."""
    builders = [_compiled.RecordBuilder(HEADER_SIZE), PyRecordBuilder(HEADER_SIZE)]
    for timestamp, key, value, headers in appends:
        indexes = set()
        for builder in builders:
            if headers:
                encoded = encode_record(
                    builder.count, builder.delta(timestamp), key, value,
                    [(name.encode(), hvalue) for name, hvalue in headers])
                indexes.add(builder.append_encoded(timestamp, encoded))
            else:
                indexes.add(builder.append(timestamp, key, value))
        assert len(indexes) == 1
    compiled, python = builders
    assert (compiled.count, compiled.base_ts, compiled.max_ts, compiled.size) == \
        (python.count, python.base_ts, python.max_ts, python.size)
    assert [compiled.timestamp(i) for i in range(compiled.count)] == \
        [python.timestamp(i) for i in range(python.count)] == [a[0] for a in appends]
    taken = compiled.take_buffer()
    assert taken == python.take_buffer()
    assert compiled.size == python.size == 0
    if appends:
        batch = encode_batch([(k, v, h, ts) for ts, k, v, h in appends])
        assert bytes(taken[HEADER_SIZE:]) == batch[HEADER_SIZE:]


def test_record_builder_refuses_bad_input():
    builder = _compiled.RecordBuilder(HEADER_SIZE)
    with pytest.raises(TypeError):
        builder.append(0, "text", None)
    with pytest.raises(IndexError):
        builder.timestamp(0)
    with pytest.raises(TypeError):
        _compiled.RecordBuilder()
    uninitialised = _compiled.RecordBuilder.__new__(_compiled.RecordBuilder)
    with pytest.raises(RuntimeError):
        uninitialised.append(0, None, b"v")


def test_record_builders_read_the_clock_when_given_no_timestamp():
    for builder in (_compiled.RecordBuilder(HEADER_SIZE), PyRecordBuilder(HEADER_SIZE)):
        before = time.time_ns() // 1_000_000
        builder.append(None, None, b"now")
        builder.append(before - 5, None, b"earlier")
        after = time.time_ns() // 1_000_000
        assert before <= builder.timestamp(0) <= after
        assert builder.base_ts == builder.max_ts == builder.timestamp(0)
        assert builder.timestamp(1) == before - 5
