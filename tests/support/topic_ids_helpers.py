"""What tests besides tests/protocol/test_topic_ids.py use of it."""
from __future__ import annotations

import datetime
import socket
import struct
import time
import uuid

from kio.schema.errors import ErrorCode

from oncelog.protocol import api_versions as apis
from oncelog.protocol.messages import decode_response, encode_request
from oncelog.protocol.schema import build, request_module

IO_TIMEOUT = 30.0


MS = datetime.timedelta(milliseconds=1)


class Wire:
    """One connection speaking kio-encoded requests at chosen versions."""

    def __init__(self, broker) -> None:
        self.sock = socket.create_connection(("127.0.0.1", broker.port), timeout=IO_TIMEOUT)
        self.next_id = 1

    def call(self, key: int, version: int, cls_name: str, **fields):
        mod = request_module(key, version)
        body = build(getattr(mod, cls_name), **fields)
        self.next_id += 1
        self.sock.sendall(encode_request(key, version, self.next_id, "topic-ids", body))
        (size,) = struct.unpack(">i", self._exact(4))
        got, answer = decode_response(key, version, self._exact(size))
        assert got == self.next_id
        return answer

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        deadline = time.monotonic() + IO_TIMEOUT
        while len(buf) < n:
            assert time.monotonic() < deadline
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


def topic_id(wire: Wire, name: str) -> uuid.UUID:
    mod = request_module(apis.METADATA, 13)
    answer = wire.call(apis.METADATA, 13, "MetadataRequest", topics=(
        build(mod.MetadataRequestTopic, name=name, topic_id=None),),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    (topic,) = answer.topics
    assert topic.error_code == ErrorCode.none and answer.error_code == ErrorCode.none
    return topic.topic_id


def fetch(wire: Wire, version: int, tid: uuid.UUID | None, name: str = "",
          current_leader_epoch: int = -1, whole: bool = False):
    mod = request_module(apis.FETCH, version)
    part = build(mod.FetchPartition, partition=0, current_leader_epoch=current_leader_epoch,
                 fetch_offset=0,
                 last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20,
                 replica_directory_id=None, high_watermark=-1)
    answer = wire.call(apis.FETCH, version, "FetchRequest", cluster_id=None,
                       replica_state=build(mod.ReplicaState, replica_id=-1, replica_epoch=-1)
                       if hasattr(mod, "ReplicaState") else None,
                       replica_id=-1, max_wait=0 * MS, min_bytes=0, max_bytes=1 << 20,
                       isolation_level=0, session_id=0, session_epoch=-1, topics=(
                           build(mod.FetchTopic, topic=name, topic_id=tid,
                                 partitions=(part,)),),
                       forgotten_topics_data=(), rack_id="")
    if whole:
        return answer
    (topic,) = answer.responses
    (partition,) = topic.partitions
    return topic, partition
