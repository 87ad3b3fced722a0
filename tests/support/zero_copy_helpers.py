"""What tests/broker/test_zero_copy_fetch.py uses: one partition read to its end by each Kafka
client, a raw Fetch over a socket that reads slowly, and the broker's zero-copy counter."""
from __future__ import annotations

import asyncio
import datetime
import socket
import subprocess
import time
import uuid

import kafka
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as CTopicPartition
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic

from oncelog.protocol import fetch_response
from oncelog.protocol.messages import encode_request
from support.hostile_clients import metrics

TIMEOUT = 60.0
FETCH = 1


def zero_copy_bytes(broker) -> int:
    return int(metrics(broker.metrics_port)["oncelog_fetch_zero_copy_bytes_total"])


def read_confluent(bootstrap: str, topic: str, end: int, isolation: str) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "zc",
                         "enable.auto.commit": False, "isolation.level": isolation})
    consumer.assign([CTopicPartition(topic, 0, 0)])
    found = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            if consumer.position([CTopicPartition(topic, 0)])[0].offset >= end:
                break
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                found.append(msg.value())
    finally:
        consumer.close()
    return found


def read_kafka_python(bootstrap: str, topic: str, end: int, isolation: str) -> list[bytes]:
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                   isolation_level=isolation, group_id=None)
    tp = kafka.TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    found = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline and consumer.position(tp) < end:
            for records in consumer.poll(timeout_ms=500).values():
                found += [r.value for r in records]
    finally:
        consumer.close()
    return found


def read_aiokafka(bootstrap: str, topic: str, end: int, isolation: str) -> list[bytes]:
    async def run():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                    isolation_level=isolation)
        await asyncio.wait_for(consumer.start(), TIMEOUT)
        tp = AioTopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        found = []
        deadline = time.monotonic() + TIMEOUT
        try:
            while time.monotonic() < deadline and await consumer.position(tp) < end:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    found += [r.value for r in records]
        finally:
            await consumer.stop()
        return found

    return asyncio.run(run())


def read_kcat(bootstrap: str, topic: str, end: int, isolation: str) -> list[bytes]:
    # Values are printable and newline-free, so one a line; -e stops at the end.
    out = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-p", "0", "-o",
                          "beginning", "-e", "-q", "-X", f"isolation.level={isolation}",
                          "-f", "%s\n"], capture_output=True, timeout=TIMEOUT, check=True)
    return out.stdout.splitlines()


READERS = {"confluent-kafka": read_confluent, "kafka-python": read_kafka_python,
           "aiokafka": read_aiokafka, "kcat": read_kcat}


# --- a raw Fetch over a socket read slowly ------------------------------------------------------


def fetch_frame(topic: str, partitions: int, max_bytes: int, correlation_id: int = 1) -> bytes:
    parts = tuple(FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=max_bytes)
                  for p in range(partitions))
    body = FetchRequest(max_wait=datetime.timedelta(0), min_bytes=1,
                        max_bytes=partitions * max_bytes,
                        topics=(FetchTopic(topic=topic, partitions=parts),),
                        forgotten_topics_data=())
    return encode_request(FETCH, 12, correlation_id, "slow-reader", body)


def slow_socket(port: int) -> socket.socket:
    """A connection with a small receive buffer (set before connecting): what it does not
    read stays with the broker."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(TIMEOUT)
    sock.connect(("127.0.0.1", port))
    return sock


def read_until_closed(sock: socket.socket, want: int) -> bytes:
    """Up to ``want`` bytes, fewer if the broker closes the connection first."""
    buf = bytearray()
    deadline = time.monotonic() + TIMEOUT
    while len(buf) < want:
        assert time.monotonic() < deadline, f"timed out with {len(buf)} of {want} bytes"
        chunk = sock.recv(min(1 << 20, want - len(buf)))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def decode_fetch(frame: bytes) -> dict[int, bytes]:
    """Partition -> records of a Fetch v12 answer (frame without its size prefix)."""
    _, error, partitions = fetch_response.decode(frame, 12)
    assert error == 0
    assert all(p.error_code == 0 for p in partitions), partitions
    return {p.partition: bytes(p.records or b"") for p in partitions}


def round_trips(bootstrap: str, topic: str, count: int) -> float:
    """Seconds for ``count`` ListOffsets round trips of a fresh oncelog connection."""
    from oncelog.client.network import calls
    from oncelog.client.network.connection import connect

    with connect(bootstrap, timeout=TIMEOUT) as conn:
        calls.list_offset(conn, topic, 0, -1)  # connected and warm
        start = time.perf_counter()
        for _ in range(count):
            calls.list_offset(conn, topic, 0, -1)
        return time.perf_counter() - start


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
