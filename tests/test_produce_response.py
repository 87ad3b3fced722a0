"""The hand-written ProduceResponse writer produces exactly kio's bytes, every version."""

import datetime

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from oncelog.protocol import produce_response
from oncelog.protocol.api_versions import PRODUCE, SUPPORTED_VERSIONS
from oncelog.protocol.messages import encode_response
from oncelog.protocol.produce_response import PartitionResult
from oncelog.protocol.schema import build, response_module

partition = st.builds(
    PartitionResult,
    index=st.integers(0, 2**31 - 1),
    error_code=st.sampled_from([0, 2, 3, 10, 43, 45, 46, 47, 59, 87]),
    base_offset=st.integers(-1, 2**62),
    log_start_offset=st.integers(-1, 2**62),
    error_message=st.none() | st.text(max_size=40),
)
topics = st.lists(st.tuples(st.text(min_size=1, max_size=30),
                            st.lists(partition, min_size=1, max_size=4)), max_size=4)


def kio_bytes(version: int, correlation_id: int, data) -> bytes:
    mod = response_module(PRODUCE, version)
    body = build(mod.ProduceResponse, throttle_time=datetime.timedelta(0), responses=tuple(
        build(mod.TopicProduceResponse, name=name, partition_responses=tuple(
            build(mod.PartitionProduceResponse, index=p.index,
                  error_code=ErrorCode(p.error_code), base_offset=p.base_offset,
                  log_append_time=None, log_start_offset=p.log_start_offset,
                  record_errors=(), error_message=p.error_message)
            for p in partitions))
        for name, partitions in data))
    return encode_response(PRODUCE, version, correlation_id, body)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(data=topics, correlation_id=st.integers(-(2**31), 2**31 - 1),
       version=st.integers(*SUPPORTED_VERSIONS[PRODUCE]))
def test_same_bytes_as_kio(data, correlation_id, version):
    assert produce_response.encode(version, correlation_id, data) == \
        kio_bytes(version, correlation_id, data)
