"""The zero-copy ProduceRequest reader agrees with kio on every version, and refuses junk."""

import datetime
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.protocol import produce_request
from oncelog.protocol.api_versions import PRODUCE, SUPPORTED_VERSIONS
from oncelog.protocol.errors import ProtocolError
from oncelog.protocol.messages import decode_request, encode_request
from oncelog.protocol.schema import build, request_module

partition = st.tuples(st.integers(0, 2**31 - 1), st.none() | st.binary(max_size=300))
topics = st.lists(st.tuples(st.text(min_size=1, max_size=20),
                            st.lists(partition, min_size=1, max_size=3)), max_size=3)
versions = st.integers(*SUPPORTED_VERSIONS[PRODUCE])


def topic_key(version: int, name: str) -> str | uuid.UUID:
    """What names the topic in a request of ``version``: from v13 its id (KIP-516)."""
    return uuid.uuid5(uuid.NAMESPACE_OID, name) if version >= 13 else name


def frame(version, transactional_id, acks, data, client_id="c") -> bytes:
    mod = request_module(PRODUCE, version)
    by_id = version >= 13
    body = build(mod.ProduceRequest, transactional_id=transactional_id, acks=acks,
                 timeout=datetime.timedelta(milliseconds=1234), topic_data=tuple(
                     build(mod.TopicProduceData, name=name,
                           topic_id=topic_key(version, name) if by_id else None,
                           partition_data=tuple(
                               build(mod.PartitionProduceData, index=i, records=r)
                               for i, r in parts))
                     for name, parts in data))
    return encode_request(PRODUCE, version, 77, client_id, body)[4:]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(version=versions, data=topics, acks=st.sampled_from([-1, 0, 1]),
       transactional_id=st.none() | st.text(max_size=10), client_id=st.none() | st.text(max_size=8))
def test_reads_what_kio_writes(version, data, acks, transactional_id, client_id):
    request = decode_request(frame(version, transactional_id, acks, data, client_id))
    assert (request.api_version, request.correlation_id, request.client_id) == \
        (version, 77, client_id)
    body = request.body
    assert (body.transactional_id, body.acks, body.timeout_ms) == (transactional_id, acks, 1234)
    assert [(t.topic_id if version >= 13 else t.name,
             [(p.index, None if p.records is None else bytes(p.records))
              for p in t.partition_data]) for t in body.topic_data] == \
        [(topic_key(version, name), parts) for name, parts in data]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(version=versions, data=topics.filter(bool), cut=st.integers(1, 40))
def test_truncated_requests_are_protocol_errors(version, data, cut):
    whole = frame(version, None, -1, data)
    with pytest.raises(ProtocolError):
        decode_request(whole[:-cut])


@settings(max_examples=100, deadline=None, derandomize=True)
@given(sizes=st.lists(st.integers(8, 300_000), min_size=1, max_size=6),
       chunk=st.integers(1, 100_000))
def test_frame_reader_cuts_any_chunking_into_the_same_frames(sizes, chunk):
    from oncelog.protocol.messages import FrameReader

    frames = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    stream = b"".join(len(f).to_bytes(4, "big") + f for f in frames)
    reader = FrameReader(1 << 20)
    got = []
    for start in range(0, len(stream), chunk):
        got += [bytes(f) for f in reader.feed(stream[start:start + chunk])]
    assert got == frames
    assert reader.buffered == 0


def test_a_large_frame_arriving_in_pieces_decodes_for_every_api():
    """Frames over 64 KiB are assembled in their own buffer; kio must still read them."""
    from oncelog.protocol.messages import FrameReader

    mod = request_module(3, 12)
    names = tuple(build(mod.MetadataRequestTopic, name=f"topic-{i:05d}-" + "x" * 20,
                        topic_id=None) for i in range(3000))
    metadata = encode_request(3, 12, 5, "c", build(mod.MetadataRequest, topics=names,
                                                   allow_auto_topic_creation=False,
                                                   include_topic_authorized_operations=False))
    produce = b"\0\0\0\0" + frame(9, None, -1, [("t", [(0, b"r" * 200_000)])])
    produce = len(produce[4:]).to_bytes(4, "big") + produce[4:]
    assert len(metadata) > 64 * 1024
    reader = FrameReader(1 << 20)
    frames = []
    for whole in (metadata, produce):
        for start in range(0, len(whole), 50_000):
            frames += reader.feed(whole[start:start + 50_000])
    first, second = (decode_request(f) for f in frames)
    assert [t.name for t in first.body.topics] == [t.name for t in names]
    assert bytes(second.body.topic_data[0].partition_data[0].records) == b"r" * 200_000


@settings(max_examples=200, deadline=None, derandomize=True)
@given(version=versions, data=topics.map(lambda ts: [(n, [(i, r or b"") for i, r in ps])
                                                     for n, ps in ts]),
       acks=st.sampled_from([-1, 0, 1]), transactional_id=st.none() | st.text(max_size=10),
       client_id=st.none() | st.text(max_size=8))
def test_the_producer_writes_what_kio_writes(version, data, acks, transactional_id,
                                             client_id):
    keyed = [(topic_key(version, name), ps) for name, ps in data]
    parts = produce_request.encode(version, 77, client_id, transactional_id, acks, 1234, keyed)
    whole = b"".join(parts)
    assert whole[4:] == frame(version, transactional_id, acks, data, client_id)
    assert int.from_bytes(whole[:4], "big") == len(whole) - 4
    records = [r for _, ps in data for _, r in ps]
    # Each partition's records are written as given, not copied into a new frame.
    assert [p for p in parts if any(p is r for r in records)] == records
