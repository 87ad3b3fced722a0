"""Clients that abuse a broker's memory over raw sockets, and ways to watch the broker meanwhile.

Used by tests/broker/test_backpressure.py and bench/backpressure.py. Everything talks to 127.0.0.1
only; every blocking call has a timeout and every loop a bound.

* ``hoard_fetches``: pipelines Fetch requests for a lot of data and never reads an answer.
* ``ProduceFlood``: writes Produce requests as fast as the socket takes them, from a thread,
  reading (and dropping) the answers or not, until told to stop.
* ``announce_frames``: sends the size prefix of a large request and a little of its body,
  then nothing more (a slow sender).
* ``fill`` and ``normal_round_trip`` are a well-behaved client (confluent-kafka).
* ``metrics`` reads the broker's /metrics; ``rss``/``peak_rss`` read /proc/PID/status.
"""

from __future__ import annotations

import datetime
import gc
import http.client
import re
import socket
import struct
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from oncelog.protocol.messages import encode_request
from oncelog.protocol.records import encode_batch

IO_TIMEOUT = 10.0
CLIENT_TIMEOUT = 30.0  # the well-behaved client's flush and reads, on a busy machine
PRODUCE, FETCH = 0, 1
_SAMPLE = re.compile(r"^(oncelog_\w+) (\S+)$", re.MULTILINE)


def connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    """A connection whose receive buffer is ``rcvbuf`` (set before connecting, so that the
    kernel holds little of what we never read)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(IO_TIMEOUT)
    sock.connect(("127.0.0.1", port))
    return sock


def fetch_frame(topic: str, max_bytes: int, correlation_id: int, max_wait_ms: int = 0,
                min_bytes: int = 1, offset: int = 0) -> bytes:
    part = FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=max_bytes)
    body = FetchRequest(max_wait=datetime.timedelta(milliseconds=max_wait_ms),
                        min_bytes=min_bytes, max_bytes=max_bytes,
                        topics=(FetchTopic(topic=topic, partitions=(part,)),),
                        forgotten_topics_data=())
    return encode_request(FETCH, 12, correlation_id, "hostile", body)


def produce_frame(topic: str, batch_bytes: int, acks: int = 1, correlation_id: int = 1) -> bytes:
    """One Produce request holding one batch of about ``batch_bytes``."""
    value = bytes(range(256)) * (batch_bytes // 256 // 4 + 1)
    records = [(None, value, (), 1_700_000_000_000)] * 4
    body = ProduceRequest(acks=acks, timeout=datetime.timedelta(seconds=30), topic_data=(
        TopicProduceData(name=topic, partition_data=(
            PartitionProduceData(index=0, records=encode_batch(records)),)),))
    return encode_request(PRODUCE, 9, correlation_id, "hostile", body)


def hoard_fetches(port: int, topic: str, count: int, max_bytes: int) -> socket.socket:
    """A connection that has sent ``count`` Fetch requests from offset 0 and reads nothing."""
    sock = connect(port, rcvbuf=64 * 1024)
    sock.sendall(b"".join(fetch_frame(topic, max_bytes, i) for i in range(count)))
    return sock


def announce_frames(port: int, size: int, body: int = 1024) -> socket.socket:
    """A connection that announced a ``size``-byte Produce request and sent ``body`` bytes of
    it (a valid header first), then stopped."""
    sock = connect(port)
    header = struct.pack(">hhih", PRODUCE, 9, 1, 1) + b"t" + b"\0"
    sock.sendall(struct.pack(">i", size) + header + bytes(body - len(header)))
    return sock


class ProduceFlood:
    """``connections`` sockets, each written as fast as it takes ``frame`` over and over."""

    def __init__(self, port: int, frame: bytes, connections: int = 1,
                 read_answers: bool = True, head: bytes = b"") -> None:
        self.frame = frame
        self.head = head  # sent first on each connection (e.g. a long-polling Fetch)
        self.read_answers = read_answers
        self.stop = threading.Event()
        self.sent = 0  # requests written, over all connections
        self.errors: list[BaseException] = []
        self.socks = [connect(port, rcvbuf=None if read_answers else 64 * 1024)
                      for _ in range(connections)]
        self.threads = [threading.Thread(target=self._write, args=(s,), daemon=True)
                        for s in self.socks]
        if read_answers:
            self.threads += [threading.Thread(target=self._read, args=(s,), daemon=True)
                             for s in self.socks]
        self._lock = threading.Lock()

    def __enter__(self) -> ProduceFlood:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self.stop.set()
        for sock in self.socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for thread in self.threads:
            thread.join(IO_TIMEOUT)

    def _write(self, sock: socket.socket) -> None:
        sock.settimeout(0.2)  # a full socket is normal: check the stop flag and try again
        pending = memoryview(self.head + self.frame)
        try:
            while not self.stop.is_set():
                try:
                    n = sock.send(pending)
                except TimeoutError:
                    continue
                pending = pending[n:]
                if not pending:
                    with self._lock:
                        self.sent += 1
                    pending = memoryview(self.frame)
        except OSError as exc:
            if not self.stop.is_set():
                self.errors.append(exc)

    def _read(self, sock: socket.socket) -> None:
        sock.settimeout(0.2)
        try:
            while not self.stop.is_set():
                try:
                    if not sock.recv(1 << 20):
                        return
                except TimeoutError:
                    continue
        except OSError as exc:
            if not self.stop.is_set():
                self.errors.append(exc)


# --- a well-behaved client ----------------------------------------------------------------------


def fill(bootstrap: str, topic: str, count: int, size: int = 1024) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, bytes([i % 251]) * size)
    assert producer.flush(CLIENT_TIMEOUT) == 0


def normal_round_trip(bootstrap: str, topic: str, count: int = 500) -> None:
    """A well-behaved client produces ``count`` records and reads them back (both within
    generous timeouts): the proof that others are served."""
    start = _end_offset(bootstrap, topic)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for i in range(count):
        producer.produce(topic, b"normal-%d" % i)
    assert producer.flush(CLIENT_TIMEOUT) == 0, "the normal producer was not served"
    del producer
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "normal",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, start)])
        values = []
        deadline = time.monotonic() + CLIENT_TIMEOUT
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                values.append(message.value())
        assert values == [b"normal-%d" % i for i in range(count)], "the consumer was not served"
    finally:
        consumer.close()
    gc.collect()


def _end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=CLIENT_TIMEOUT)
        return high
    finally:
        consumer.close()


# --- watching the broker ----------------------------------------------------------------------


def metrics(port: int) -> dict[str, float]:
    """The broker's unlabelled samples (its network gauges and counters) from /metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=IO_TIMEOUT)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {name: float(value) for name, value in _SAMPLE.findall(text)}


def wait_for_metrics(port: int, condition, timeout: float = 30.0,
                     what: str = "condition") -> dict[str, float]:
    """Poll /metrics until ``condition(samples)`` holds; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        samples = metrics(port)
        if condition(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last /metrics: {samples}")
        time.sleep(0.05)


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def rss(pid: int) -> int:
    """Resident set size now, in bytes."""
    return _status_kib(pid, "VmRSS") * 1024


def peak_rss(pid: int) -> int:
    """The highest resident set size so far (VmHWM), in bytes."""
    return _status_kib(pid, "VmHWM") * 1024


def reset_peak_rss(pid: int) -> None:
    """Make VmHWM start again from the current RSS (Linux: write 5 to clear_refs)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
