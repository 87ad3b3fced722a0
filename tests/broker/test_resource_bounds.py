"""The most one client can make the broker hold (issue 28, the resource test), for each of
memory, descriptors and disk; the numbers are README.md's Backpressure section's. (Event-loop
time: tests/protocol/test_linear_time.py, every API's largest arrays as a ratio to a tenth of them.)

Memory. A request is at most ``socket.request.max.bytes``; decoded, it is refused past
MAX_REQUEST_ELEMENTS array elements, and its strings are at most its bytes; its answer is
at most ``socket.request.max.bytes`` too (but a Fetch's: ``fetch.max.bytes``). So one request
of the largest size, built to decode and answer as large as it can (every element a long
topic name the broker answers back), costs the broker a bounded multiple of
``socket.request.max.bytes``: asserted here as at most MEMORY_PER_REQUEST_BYTE times. A
request held while its handler waits counts its decoded size against the request budget.

Descriptors: at most half of RLIMIT_NOFILE for segment files, however many partitions a
client writes. Disk: the records as sent, plus a fixed overhead per partition.
"""

from __future__ import annotations

import datetime
import os
import resource
import socket
import time

from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.metadata.v12.request import MetadataRequest
from support.brokers import BrokerProcess, create_topic
from support.hostile_clients import peak_rss, produce_frame, reset_peak_rss, rss, wait_for_metrics

from oncelog.client.network import calls
from oncelog.client.network.connection import connect
from oncelog.protocol import frame_check
from oncelog.protocol.messages import (
    DECODED_BYTES_PER_ELEMENT,
    MAX_REQUEST_ELEMENTS,
    encode_request,
)
from oncelog.protocol.records import encode_batch

MAX_REQUEST_BYTES = 20 << 20
MEMORY_PER_REQUEST_BYTE = 6
ANSWER_TIMEOUT = 120.0


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    deadline = time.monotonic() + ANSWER_TIMEOUT
    while len(buf) < n:
        assert time.monotonic() < deadline, f"{len(buf)} of {n} bytes after {ANSWER_TIMEOUT} s"
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        assert chunk, f"connection closed after {len(buf)} of {n} bytes"
        buf += chunk
    return bytes(buf)


def _read_frame(sock: socket.socket) -> bytes:
    return _recv_exact(sock, int.from_bytes(_recv_exact(sock, 4), "big"))


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _metadata(names: int, name_bytes: int) -> bytes:
    """A Metadata v12 request for ``names`` distinct names of ``name_bytes`` characters,
    spliced from one encoded by kio with none (kio takes 20 s for 800,000 topics)."""
    empty = encode_request(3, 12, 1, "resources", MetadataRequest(
        topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    header, tail = empty[4:-4], empty[-3:]  # the empty topics array is one byte, b"\x01"
    length = _uvarint(max(8, name_bytes) + 1)  # names are at least their 8 digits
    topics = b"".join(b"\0" * 16 + length + f"{i:08d}".ljust(name_bytes, "x").encode()
                      + b"\0" for i in range(names))
    body = header + _uvarint(names + 1) + topics + tail
    return len(body).to_bytes(4, "big") + body


def test_the_largest_request_holds_a_bounded_multiple_of_its_size(start_broker):
    broker = start_broker(socket_request_max_bytes=MAX_REQUEST_BYTES)
    pid = broker.proc.pid
    cases = {
        # as many elements as allowed, each as small as it can be
        "most elements": _metadata(MAX_REQUEST_ELEMENTS, 1),
        # the largest frame, in long names the broker answers back (the answer just under
        # socket.request.max.bytes: past it the connection is closed, see below)
        "longest names": _metadata(MAX_REQUEST_BYTES // 280, 249),
        # the largest frame in the smallest elements: refused before it is decoded
        "too many elements": _metadata(MAX_REQUEST_BYTES // 27, 1),
    }
    for name, frame in cases.items():
        assert len(frame) - 4 <= MAX_REQUEST_BYTES, name
        base = rss(pid)
        reset_peak_rss(pid)
        with socket.create_connection(("127.0.0.1", broker.port), timeout=120) as sock:
            sock.sendall(frame)
            try:
                answer = _read_frame(sock)
            except (AssertionError, ConnectionResetError):
                answer = b""  # closed: the too-large one
        assert (answer == b"") == (name == "too many elements"), name
        grown = peak_rss(pid) - base
        print(f"{name}: a {len(frame) >> 10} KiB request answered in {len(answer) >> 10} KiB; "
              f"peak RSS grew {grown >> 20} MiB")
        assert grown < MEMORY_PER_REQUEST_BYTE * MAX_REQUEST_BYTES, name


def test_an_answer_larger_than_the_largest_frame_closes_the_connection(start_broker):
    """No frame on the Kafka port is larger than socket.request.max.bytes, either way (but
    Fetch's, which fetch.max.bytes bounds): an answer past it is dropped, not held for a
    client, and the connection closed with a log line."""
    broker = start_broker(socket_request_max_bytes=1 << 20)
    frame = _metadata(3900, 249)  # a request under 1 MiB whose answer is over it
    assert len(frame) - 4 < 1 << 20
    with socket.create_connection(("127.0.0.1", broker.port), timeout=60) as sock:
        sock.sendall(frame)
        try:
            assert sock.recv(65536) == b""
        except ConnectionResetError:
            pass
    assert "more than socket.request.max.bytes (1048576)" in broker.log_text()
    with socket.create_connection(("127.0.0.1", broker.port), timeout=60) as sock:
        sock.sendall(_metadata(100, 249))  # the broker goes on answering
        assert len(_read_frame(sock)) < 1 << 20


def _waiting_fetch(topic: str, copies: int) -> bytes:
    """A Fetch that waits for data (60 s at most), naming one partition ``copies`` times."""
    parts = tuple(FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1024)
                  for _ in range(copies))
    body = FetchRequest(max_wait=datetime.timedelta(seconds=60), min_bytes=1,
                        max_bytes=1 << 20, topics=(FetchTopic(topic=topic, partitions=parts),),
                        forgotten_topics_data=())
    return encode_request(1, 12, 1, "resources", body)


def test_a_waiting_request_counts_its_decoded_size_against_the_budget(start_broker):
    """A request held while its handler waits costs its frame and its decoded objects; both
    count against queued.max.request.bytes until it is answered."""
    broker = start_broker()
    create_topic(broker.bootstrap, "idle")
    frame = _waiting_fetch("idle", 20_000)
    elements = frame_check.check_request(frame[4:], 1, 12).elements
    held = len(frame) - 4 + elements * DECODED_BYTES_PER_ELEMENT
    with socket.create_connection(("127.0.0.1", broker.port), timeout=60) as sock:
        sock.sendall(frame)
        wait_for_metrics(broker.metrics_port,
                         lambda m: m["oncelog_queued_request_bytes"] == held,
                         what=f"the waiting Fetch's {held} bytes in the budget")
        with socket.create_connection(("127.0.0.1", broker.port), timeout=60) as other:
            other.sendall(produce_frame("idle", 100))  # the data it waits for
            _read_frame(other)
        assert _read_frame(sock)  # answered now
        wait_for_metrics(broker.metrics_port,
                         lambda m: m["oncelog_queued_request_bytes"] == 0,
                         what="the budget given back")


FD_LIMIT = 96  # the broker's RLIMIT_NOFILE here: segment files get half of it


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _disk_bytes(root, prefix: str) -> tuple[int, int]:
    """(bytes of .log files, blocks of every file) in the partition directories ``prefix-*``."""
    logs = blocks = 0
    for directory in root.glob(f"{prefix}-*"):
        for path in directory.iterdir():
            stat = path.stat()
            blocks += stat.st_blocks * 512
            if path.suffix == ".log":
                logs += stat.st_size
    return logs, blocks


def test_descriptors_and_disk_one_client_can_make_the_broker_hold(tmp_path):
    """Descriptors: a client writing to more partitions than the broker may hold files open
    leaves it holding at most half its RLIMIT_NOFILE for segments (the least recently used
    closed, reopened on demand), counted in /proc/<pid>/fd. Disk: what its produces cost is
    the data plus a fixed overhead per partition (bounded by max.broker.partitions), with no
    space reserved ahead of appends."""
    broker = BrokerProcess(tmp_path / "broker", {}, preexec=_low_fd_limit).start()
    partitions, value = FD_LIMIT, b"v" * 1000  # twice the descriptors segments may hold
    try:
        create_topic(broker.bootstrap, "wide", partitions)
        create_topic(broker.bootstrap, "bulk", 1)
        pid = broker.proc.pid
        with connect(broker.bootstrap, timeout=30) as conn:
            before = _open_fds(pid)
            sent = 0
            for i in range(partitions):
                batch = encode_batch([(None, value, (), int(time.time() * 1000))])
                calls.produce(conn, "wide", i, batch)
                sent += len(batch)
            held = _open_fds(pid) - before
            bulk = 0
            for _ in range(8):  # 8 MiB in batches of 1,000 records of 1,000 bytes
                batch = encode_batch([(None, value, (), int(time.time() * 1000))] * 1000)
                calls.produce(conn, "bulk", 0, batch)
                bulk += len(batch)
        wide_logs, wide_blocks = _disk_bytes(broker.data_dir, "wide")
        bulk_logs, bulk_blocks = _disk_bytes(broker.data_dir, "bulk")
    finally:
        broker.stop()
    per_partition = (wide_blocks - wide_logs) / partitions
    print(f"{partitions} partitions written: {held} more descriptors (bound "
          f"{FD_LIMIT // 2}); on disk {wide_blocks >> 10} KiB for {sent >> 10} KiB sent, "
          f"{per_partition / 1024:.1f} KiB per partition beyond its records; {bulk >> 10} KiB "
          f"in big batches took {bulk_blocks >> 10} KiB ({bulk_blocks / bulk:.3f}x)")
    assert held <= FD_LIMIT // 2
    assert wide_logs == sent  # the records as sent, no reservation
    assert per_partition <= 32 * 1024
    assert bulk_logs == bulk and bulk_blocks <= 1.01 * bulk + 64 * 1024
