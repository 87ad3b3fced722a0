"""What tests besides tests/broker/test_bad_input.py use of it."""
from __future__ import annotations

import socket
import struct
import time

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest

from oncelog.protocol.messages import decode_response, encode_request
from support.brokers import BrokerProcess

IO_TIMEOUT = 5.0


PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS, CREATE_TOPICS = 0, 1, 2, 3, 18, 19


VERSIONS = {PRODUCE: 9, FETCH: 12, LIST_OFFSETS: 7, METADATA: 12, API_VERSIONS: 3,
            CREATE_TOPICS: 7}


class _BrokerSince:
    """The module's one broker as one test sees it: its log from where the test began, so a
    test's log assertions see only what its own requests caused."""

    def __init__(self, process: BrokerProcess) -> None:
        self._process = process
        self._start = len(process.log_text())

    def __getattr__(self, name: str):
        return getattr(self._process, name)

    def log_text(self) -> str:
        return self._process.log_text()[self._start:]


@pytest.fixture(scope="module")
def _shared_broker(tmp_path_factory):
    process = BrokerProcess(tmp_path_factory.mktemp("bad-input") / "broker").start()
    yield process
    if process.alive:
        code = process.stop()
        assert code == 0, f"broker exited with {code}; its log:\n{process.log_text()}"


@pytest.fixture
def broker(_shared_broker, monkeypatch):
    """One broker for the module (starting one per test was most of this file's time), each
    test on a topic of its own; after each, the broker must be alive and have logged no
    traceback, as a test's own broker must at its stop."""
    global _tests
    _tests += 1
    monkeypatch.setitem(globals(), "TOPIC", f"bad-input-{_tests}")
    view = _BrokerSince(_shared_broker)
    yield view
    assert _shared_broker.alive, view.log_text()
    assert "Traceback" not in view.log_text(), view.log_text()


_tests = 0


def connect(broker) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=IO_TIMEOUT)
    sock.settimeout(IO_TIMEOUT)
    return sock


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    deadline = time.monotonic() + IO_TIMEOUT
    while len(buf) < n:
        assert time.monotonic() < deadline, f"timed out with {len(buf)} of {n} bytes"
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def read_frame(sock: socket.socket) -> bytes:
    """One response frame, without its size prefix."""
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    assert 4 <= size < 10_000_000, f"absurd response size {size}"
    return recv_exact(sock, size)


def call(sock: socket.socket, api_key: int, body, correlation_id: int = 7):
    """Send one request at our default version and return its decoded response body."""
    version = VERSIONS[api_key]
    sock.sendall(encode_request(api_key, version, correlation_id, "bad-input-test", body))
    got, response = decode_response(api_key, version, read_frame(sock))
    assert got == correlation_id
    return response


def api_versions_request() -> ApiVersionsRequest:
    return ApiVersionsRequest(client_software_name="oncelog-tests",
                              client_software_version="1.0")
