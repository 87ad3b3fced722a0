"""Decompression bombs (issue 28 #4): a few KB of zstd that expand to hundreds of MB.

What one produce request may decompress is bounded in all (MAX_REQUEST_UNCOMPRESSED_BYTES:
past it RECORD_LIST_TOO_LARGE), and a batch that expands past what the event loop may do
itself is validated in a worker thread while the broker serves everyone else: the stall a
probe client sees during a bomb, as a ratio to its stall during a small produce, stays
small.
"""

from __future__ import annotations

import datetime
import time

import pytest
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from support.brokers import create_topic, loop_cpu
from support.crafted import batch_of, record
from support.raw_wire import connect, read_frame

from oncelog.protocol.messages import encode_request
from oncelog.protocol.produce_response import decode as decode_produce_response
from oncelog.protocol.records import GZIP, ZSTD
from oncelog.protocol.validation import MAX_REQUEST_UNCOMPRESSED_BYTES

TOPIC = "bombs"
MB = 1 << 20


def _bomb(expands_to: int, codec: int = ZSTD) -> bytes:
    """One batch of one record whose value is ``expands_to`` zero bytes."""
    now = int(time.time() * 1000)
    return batch_of(record(0, key=None, value=bytes(expands_to)), 1, now, codec=codec)


def _produce(records: bytes, correlation_id: int = 1) -> bytes:
    body = ProduceRequest(acks=1, timeout=datetime.timedelta(seconds=30), topic_data=(
        TopicProduceData(name=TOPIC, partition_data=(
            PartitionProduceData(index=0, records=records),)),))
    return encode_request(0, 9, correlation_id, "bombs", body)


def _errors(frame: bytes) -> list[int]:
    return [p.error_code for t in decode_produce_response(9, frame)
            for p in t.partition_responses]


def _create_topic(broker, compression: str = "producer") -> None:
    if compression == "producer":
        create_topic(broker.bootstrap, TOPIC)
        return
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1, config={"compression.type": compression})]
                        )[TOPIC].result(30)


def test_a_request_decompresses_at_most_its_bound(broker):
    _create_topic(broker)
    per_batch = 100 * MB
    batches = MAX_REQUEST_UNCOMPRESSED_BYTES // per_batch + 1
    bomb = _bomb(per_batch)
    assert len(bomb) < 16 * 1024
    with connect(broker) as sock:
        sock.settimeout(60)
        sock.sendall(_produce(bomb * batches))
        assert _errors(read_frame(sock)) == [18]  # RECORD_LIST_TOO_LARGE
        sock.sendall(_produce(bomb, 2))  # one is fine
        assert _errors(read_frame(sock)) == [0]
    assert "decompress to more than" in broker.log_text()


@pytest.mark.parametrize(("codec", "compression"),
                         [(ZSTD, "producer"), (GZIP, "producer"), (ZSTD, "lz4")],
                         ids=["zstd", "gzip", "zstd-to-lz4"])
def test_a_bomb_does_not_stall_other_clients(broker, codec, compression):
    """With compression.type=lz4 the zstd bomb is also recompressed: off the loop too."""
    _create_topic(broker, compression)
    bomb = _produce(_bomb(200 * MB, codec))
    small = _produce(_bomb(64 * 1024))

    def send(frame: bytes) -> None:
        with connect(broker) as sock:
            sock.settimeout(60)
            sock.sendall(frame)
            assert _errors(read_frame(sock)) == [0]

    def loop_cpu_of(frame: bytes) -> float:
        before = loop_cpu(broker.proc.pid)
        send(frame)
        time.sleep(0.005)  # the loop finishes what follows the answer
        return loop_cpu(broker.proc.pid) - before

    small_cpu, bomb_cpu = loop_cpu_of(small), loop_cpu_of(bomb)
    print(f"event loop CPU: {small_cpu * 1000:.1f} ms for a small produce, "
          f"{bomb_cpu * 1000:.1f} ms for a 200 MB bomb")
    # The 200 MB are inflated (and recompressed) in a worker: the event loop, which serves
    # every client, spends on the bomb about what it spends on a small produce (on the loop
    # it took hundreds of ms). Its CPU, not the probe's wall clock: with four xdist workers
    # on two cores a probe's round trip swung past 50 ms under others' load.
    assert bomb_cpu < 10 * max(small_cpu, 0.005), (small_cpu, bomb_cpu)
