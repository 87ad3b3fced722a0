"""The hand-written ProduceResponse writer produces exactly kio's bytes, every version."""

import datetime
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from oncelog.protocol import produce_response
from oncelog.protocol.api_versions import PRODUCE, SUPPORTED_VERSIONS
from oncelog.protocol.errors import ProtocolError
from oncelog.protocol.messages import encode_response
from oncelog.protocol.produce_response import PartitionResult
from oncelog.protocol.schema import build, response_module, without_paths

partition = st.builds(
    PartitionResult,
    index=st.integers(0, 2**31 - 1),
    error_code=st.sampled_from([0, 2, 3, 10, 43, 45, 46, 47, 59, 87]),
    base_offset=st.integers(-1, 2**62),
    log_start_offset=st.integers(-1, 2**62),
    error_message=st.none() | st.text(max_size=40),
    log_append_time=st.just(-1) | st.integers(0, 2**45),
    record_errors=st.lists(st.tuples(st.integers(0, 2**31 - 1), st.none() | st.text(max_size=9)),
                           max_size=2).map(tuple),
    current_leader=st.none(),
)
# KIP-951's leader hint (v10+), as the broker gives it with NOT_LEADER_OR_FOLLOWER
hinted = st.builds(lambda p, leader: p._replace(error_code=6, current_leader=leader),
                   partition, st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1)))
topics = st.lists(st.tuples(st.text(min_size=1, max_size=30),
                            st.lists(partition, min_size=1, max_size=4)), max_size=4)
hinted_topics = st.lists(st.tuples(st.text(min_size=1, max_size=30),
                                   st.lists(partition | hinted, min_size=1, max_size=4)),
                         max_size=4)
endpoints = st.lists(st.builds(produce_response.NodeEndpoint, st.integers(0, 2**31 - 1),
                               st.text(min_size=1, max_size=12), st.integers(0, 65535),
                               st.none() | st.text(max_size=5)), max_size=2)


def keyed(version: int, data):
    """The topics as a response of ``version`` names them: from v13 by id."""
    if version < 13:
        return data
    return [(uuid.uuid5(uuid.NAMESPACE_OID, name), parts) for name, parts in data]


def kio_bytes(version: int, correlation_id: int, data, nodes=()) -> bytes:
    mod = response_module(PRODUCE, version)
    hints = version >= 10

    def leader(p: PartitionResult) -> dict:
        if not hints or p.current_leader is None:
            return {}
        return {"current_leader": build(mod.LeaderIdAndEpoch, leader_id=p.current_leader[0],
                                        leader_epoch=p.current_leader[1])}

    def errors(p: PartitionResult) -> tuple:
        return tuple(build(mod.BatchIndexAndErrorMessage, batch_index=i,
                           batch_index_error_message=m)
                     for i, m in p.record_errors) if version >= 8 else ()

    def append_time(p: PartitionResult):
        if p.log_append_time < 0:
            return None
        return datetime.datetime.fromtimestamp(p.log_append_time / 1000, datetime.UTC)

    body = build(mod.ProduceResponse, throttle_time=datetime.timedelta(0), responses=tuple(
        build(mod.TopicProduceResponse, name=name, topic_id=name, partition_responses=tuple(
            build(mod.PartitionProduceResponse, index=p.index,
                  error_code=ErrorCode(p.error_code), base_offset=p.base_offset,
                  log_append_time=append_time(p), log_start_offset=p.log_start_offset,
                  record_errors=errors(p), error_message=p.error_message, **leader(p))
            for p in partitions))
        for name, partitions in keyed(version, data)),
        node_endpoints=tuple(build(mod.NodeEndpoint, **n._asdict()) for n in nodes if hints))
    return encode_response(PRODUCE, version, correlation_id, body)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(data=hinted_topics, nodes=endpoints, correlation_id=st.integers(-(2**31), 2**31 - 1),
       version=st.integers(*SUPPORTED_VERSIONS[PRODUCE]))
def test_same_bytes_as_kio(data, nodes, correlation_id, version):
    assert produce_response.encode(version, correlation_id, keyed(version, data), nodes) == \
        kio_bytes(version, correlation_id, data, nodes)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(data=topics, version=st.integers(*SUPPORTED_VERSIONS[PRODUCE]))
def test_the_producer_reads_what_kio_writes(data, version):
    """The producer's reader (produce_response.decode) against kio's writer, record errors
    (v8+) and log append times included."""
    frame = kio_bytes(version, 5, data)[4:]
    expected = [(name, [p._replace(error_message=without_paths(p.error_message)) if version >= 8
                        else p._replace(error_message=None, record_errors=())
                        for p in partitions]) for name, partitions in keyed(version, data)]
    if version < 5:
        expected = [(n, [p._replace(log_start_offset=-1) for p in ps]) for n, ps in expected]
    assert [(t.topic_id if version >= 13 else t.name, t.partition_responses)
            for t in produce_response.decode(version, frame)] == expected


@settings(max_examples=200, deadline=None, derandomize=True)
@given(data=topics.filter(bool), version=st.integers(*SUPPORTED_VERSIONS[PRODUCE]),
       cut=st.integers(1, 30))
def test_a_truncated_response_is_a_protocol_error(data, version, cut):
    frame = produce_response.encode(version, 5, keyed(version, data))[4:]
    with pytest.raises(ProtocolError):
        produce_response.decode(version, frame[:-4 - cut])  # the throttle time and more
