"""The hand-written FetchResponse reader reads what kio writes, every version, the same as
kio reads it; and refuses a truncated frame."""

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from oncelog.protocol import fetch_response
from oncelog.protocol.api_versions import FETCH, SUPPORTED_VERSIONS
from oncelog.protocol.errors import ProtocolError
from oncelog.protocol.messages import decode_response, encode_response
from oncelog.protocol.schema import build, response_module

VERSIONS = range(max(SUPPORTED_VERSIONS[FETCH][0], fetch_response.MIN_VERSION),
                 min(SUPPORTED_VERSIONS[FETCH][1], fetch_response.MAX_VERSION) + 1)

partition = st.fixed_dictionaries({
    "index": st.integers(0, 2**31 - 1),
    "error": st.sampled_from([0, 1, 3, 6, 74, 75]),
    "high": st.integers(-1, 2**62), "lso": st.integers(-1, 2**62),
    "start": st.integers(-1, 2**62),
    "aborted": st.none() | st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 2**62)),
                                    max_size=3),
    "records": st.none() | st.binary(max_size=300),
    "leader": st.none() | st.tuples(st.integers(0, 9), st.integers(0, 99)),  # a tagged field
})
topics = st.lists(st.tuples(st.text(min_size=1, max_size=20),
                            st.lists(partition, min_size=1, max_size=3)), max_size=3)


def kio_frame(version: int, correlation_id: int, error: int, data) -> bytes:
    mod = response_module(FETCH, version)

    def partition_data(p):
        extra = {}
        if p["leader"] is not None and version >= 12:
            extra["current_leader"] = build(mod.LeaderIdAndEpoch, leader_id=p["leader"][0],
                                            leader_epoch=p["leader"][1])
        aborted = None if p["aborted"] is None else tuple(
            build(mod.AbortedTransaction, producer_id=pid, first_offset=first)
            for pid, first in p["aborted"])
        return build(mod.PartitionData, partition_index=p["index"],
                     error_code=ErrorCode(p["error"]), high_watermark=p["high"],
                     last_stable_offset=p["lso"], log_start_offset=p["start"],
                     aborted_transactions=aborted, preferred_read_replica=3,
                     records=p["records"], **extra)

    body = build(mod.FetchResponse, throttle_time=datetime.timedelta(milliseconds=7),
                 error_code=ErrorCode(error), session_id=5, responses=tuple(
                     build(mod.FetchableTopicResponse, topic=name,
                           partitions=tuple(partition_data(p) for p in partitions))
                     for name, partitions in data))
    return encode_response(FETCH, version, correlation_id, body)[4:]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=topics, correlation_id=st.integers(-(2**31), 2**31 - 1),
       error=st.sampled_from([0, 70]), version=st.sampled_from(VERSIONS))
def test_reads_what_kio_reads(data, correlation_id, error, version):
    frame = kio_frame(version, correlation_id, error, data)
    got_id, got_error, got = fetch_response.decode(bytearray(frame), version)
    kio_id, body = decode_response(FETCH, version, frame)
    assert got_id == kio_id == correlation_id
    assert got_error == (int(body.error_code) if version >= 7 else 0)
    expected = [(t.topic, p.partition_index, int(p.error_code), p.high_watermark,
                 getattr(p, "last_stable_offset", -1), getattr(p, "log_start_offset", -1),
                 tuple((a.producer_id, a.first_offset) for a in p.aborted_transactions or ()),
                 p.records)
                for t in body.responses for p in t.partitions]
    assert [(*p[:7], None if p.records is None else bytes(p.records)) for p in got] == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_a_truncated_frame_is_refused(version):
    frame = kio_frame(version, 1, 0, [("t", [{
        "index": 0, "error": 0, "high": 9, "lso": 9, "start": 0, "aborted": [(1, 2)],
        "records": b"x" * 50, "leader": None}])])
    for cut in (3, len(frame) // 2, len(frame) - 1):
        with pytest.raises(ProtocolError):
            fetch_response.decode(frame[:cut], version)


def test_a_version_it_does_not_read_is_refused():
    with pytest.raises(ProtocolError, match="v13"):
        fetch_response.decode(b"\0" * 16, 13)
