"""ApiVersions is a promise: every version of every API the broker advertises is answered.

One broker, one connection: a request for every (api key, version) of the broker's own
ApiVersions answer is sent pipelined, each encoded by kafka-python's protocol classes (a
client we did not write) where it has the API and by kio otherwise, with a minimal body;
each must be answered with its correlation id, in order, on the open connection. And the
table holds at least what a Kafka 4.1 broker serves, for clients pinned to that version.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import pkgutil
import socket
import struct
import time
import typing
import uuid

import kafka.protocol
import pytest
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.broker_version_data import BROKER_API_VERSIONS

from oncelog.protocol import api_versions as apis
from oncelog.protocol.messages import decode_response, encode_request
from oncelog.protocol.schema import request_module

IO_TIMEOUT = 60.0
# Kafka 4.1's APIs that this broker does not serve, and why; anything else Kafka 4.1 serves
# must be served here at least in Kafka 4.1's versions.
NOT_SERVED = {
    57: "UpdateFeatures: no finalized features",
    64: "UnregisterBroker: one broker",
    76: "ShareGroupHeartbeat: no share groups (KIP-932)",
    77: "ShareGroupDescribe: no share groups",
    78: "ShareFetch: no share groups",
    79: "ShareAcknowledge: no share groups",
    80: "AddRaftVoter: a one-node quorum",
    81: "RemoveRaftVoter: a one-node quorum",
    83: "InitializeShareGroupState: no share groups",
    84: "ReadShareGroupState: no share groups",
    85: "WriteShareGroupState: no share groups",
    86: "DeleteShareGroupState: no share groups",
    87: "ReadShareGroupStateSummary: no share groups",
    90: "DescribeShareGroupOffsets: no share groups",
    91: "AlterShareGroupOffsets: no share groups",
    92: "DeleteShareGroupOffsets: no share groups",
}
# Produce v0-v2 are listed only for librdkafka's sake and refused when used, as Kafka 4 does
# (see api_versions._ADVERTISED_MIN).
LISTED_NOT_SERVED = {(apis.PRODUCE, v) for v in range(3)}


def test_the_table_holds_kafka_4_1s():
    kafka_41 = BROKER_API_VERSIONS[(4, 1)]
    ours = {key: (lo, hi) for key, lo, hi in apis.ADVERTISED_VERSIONS}
    for key, (lo, hi) in kafka_41.items():
        if key in NOT_SERVED:
            assert key not in ours, f"api {key} is served now: drop it from NOT_SERVED"
            continue
        assert key in ours, f"Kafka 4.1 serves api {key} v{lo}-{hi}; this broker does not"
        assert ours[key][0] <= lo and ours[key][1] >= hi, \
            f"api {key}: Kafka 4.1 serves v{lo}-{hi}, this broker v{ours[key][0]}-{ours[key][1]}"
    assert set(ours) <= set(kafka_41), "an API Kafka 4.1 does not serve"


def _kafka_python_requests() -> dict[int, type]:
    found = {}
    for info in pkgutil.walk_packages(kafka.protocol.__path__, "kafka.protocol."):
        if ".old" in info.name or "generate" in info.name:
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, ApiMessage) \
                    and getattr(value, "_json", None) and value._json.get("type") == "request":
                found[value.API_KEY] = value
    return found


def _minimal(cls: type) -> typing.Any:
    """A kio entity with every field without a default at its least value."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        values[f.name] = _least(hints[f.name])
    return cls(**values)


def _least(hint: typing.Any) -> typing.Any:
    origin = typing.get_origin(hint)
    if origin is tuple:
        return ()
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if type(None) in typing.get_args(hint):
            return None
        hint = typing.get_args(hint)[0]
    if dataclasses.is_dataclass(hint):
        return _minimal(hint)
    if isinstance(hint, type):
        if issubclass(hint, datetime.timedelta):
            return datetime.timedelta(0)
        if issubclass(hint, bool):
            return False
        if issubclass(hint, int):
            return hint(0)
        if issubclass(hint, str):
            return hint("")
        if issubclass(hint, uuid.UUID):
            return None
        if issubclass(hint, bytes):
            return b""
    raise TypeError(f"no least value for {hint!r}")


def _frame(library: dict[int, type], key: int, version: int, correlation_id: int) -> bytes:
    cls = library.get(key)
    if cls is None:
        body = _minimal(request_module(key, version).__dict__[_request_class(key, version)])
        return encode_request(key, version, correlation_id, "every-version", body)
    fields = {"acks": -1, "timeout_ms": 1000} if key == apis.PRODUCE else {}
    if key == apis.FETCH:
        fields = {"max_wait_ms": 0, "max_bytes": 1 << 20}
    request = cls(version=version, **fields)
    request.with_header(correlation_id=correlation_id, client_id="every-version")
    return request.encode(header=True, framed=True)


def _request_class(key: int, version: int) -> str:
    module = request_module(key, version)
    (name,) = [n for n, v in vars(module).items()
               if isinstance(v, type) and getattr(v, "__type__", None) is not None
               and v.__type__.name == "request"]
    return name


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    deadline = time.monotonic() + IO_TIMEOUT
    while len(buf) < n:
        assert time.monotonic() < deadline, "timed out"
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


def test_every_advertised_version_of_every_api_is_answered(broker):
    library = _kafka_python_requests()
    with socket.create_connection(("127.0.0.1", broker.port), timeout=IO_TIMEOUT) as sock:
        sock.sendall(encode_request(apis.API_VERSIONS_KEY, 3, 1, "every-version",
                                    _minimal(request_module(apis.API_VERSIONS_KEY, 3)
                                             .ApiVersionsRequest)))
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        _, answer = decode_response(apis.API_VERSIONS_KEY, 3, _recv_exact(sock, size))
        advertised = [(k.api_key, v) for k in answer.api_keys
                      for v in range(k.min_version, k.max_version + 1)
                      if (k.api_key, v) not in LISTED_NOT_SERVED]
        assert {k for k, _ in advertised} == set(apis.SUPPORTED_VERSIONS)
        sent = {}
        frames = []
        for i, (key, version) in enumerate(advertised):
            sent[100 + i] = (key, version, "kafka-python" if key in library else "kio")
            frames.append(_frame(library, key, version, 100 + i))
        sock.sendall(b"".join(frames))
        answered = []
        for correlation_id, what in sent.items():
            try:
                (size,) = struct.unpack(">i", _recv_exact(sock, 4))
                got = struct.unpack(">i", _recv_exact(sock, size)[:4])[0]
            except ConnectionError:
                pytest.fail(f"connection closed at api {what[0]} v{what[1]} ({what[2]}'s "
                            f"encoding) after {len(answered)} answers; broker log:\n"
                            f"{broker.log_text()[-3000:]}")
            assert got == correlation_id, f"{what}: answer for {got}, not {correlation_id}"
            answered.append(what)
    assert len(answered) == len(advertised)
    assert "closing the connection" not in broker.log_text()
