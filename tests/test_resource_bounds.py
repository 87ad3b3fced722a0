"""The most memory one request can make the broker hold (issue 28, the resource test).

A request is at most ``socket.request.max.bytes``; decoded, it is refused past
MAX_REQUEST_ELEMENTS array elements, and its strings are at most its bytes; its answer names
what it asked about. So one request of the largest size, built to decode and answer as
large as it can (every element a long topic name the broker answers back), costs the broker
a bounded multiple of ``socket.request.max.bytes``: asserted here as at most
MEMORY_PER_REQUEST_BYTE times, the figure README.md's Backpressure section gives.
"""

from __future__ import annotations

import socket
import time

from hostile_clients import peak_rss, reset_peak_rss, rss
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

from oncelog.protocol.messages import MAX_REQUEST_ELEMENTS, encode_request

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


def _metadata(names: int, name_bytes: int) -> bytes:
    topics = tuple(MetadataRequestTopic(topic_id=None, name=f"{i:08d}".ljust(name_bytes, "x"))
                   for i in range(names))
    body = MetadataRequest(topics=topics, allow_auto_topic_creation=False,
                           include_topic_authorized_operations=False)
    return encode_request(3, 12, 1, "resources", body)


def test_the_largest_request_holds_a_bounded_multiple_of_its_size(start_broker):
    broker = start_broker(socket_request_max_bytes=MAX_REQUEST_BYTES)
    pid = broker.proc.pid
    cases = {
        # as many elements as allowed, each as small as it can be
        "most elements": _metadata(MAX_REQUEST_ELEMENTS, 1),
        # the largest frame, in long names the broker answers back
        "longest names": _metadata(MAX_REQUEST_BYTES // 270, 249),
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
