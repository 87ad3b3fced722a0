"""Record batches: encode/decode round trips for every codec, checked against real clients."""

import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from oncelog.client.partitioner import murmur2, partition_for_key
from oncelog.protocol.record_batch import read_header, split_batches
from oncelog.protocol.records import CODECS, decode_batch, encode_batch

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
