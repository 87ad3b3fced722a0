"""Counts and lengths a client sends are checked against the frame before any decoder sees
them (issue 28 #1): a 21-byte request whose array count is 2^32-2 aborted the broker in
kio's native reader, which reserves room for the elements before reading one.

The in-process checks walk every API and version the broker serves (SUPPORTED_VERSIONS,
whatever it holds when the test runs); the broker tests send the issue's frames to a real
broker process.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.hostile_clients import peak_rss
from support.raw_wire import api_versions_request, call, connect
from support.request_frames import random_frame

from oncelog.protocol.api_versions import SUPPORTED_VERSIONS
from oncelog.protocol.errors import ProtocolError
from oncelog.protocol.frame_check import check_request
from oncelog.protocol.messages import decode_request, request_schema

TESTS = Path(__file__).parents[1]
ALL_VERSIONS = [(key, version) for key, (lo, hi) in sorted(SUPPORTED_VERSIONS.items())
                for version in range(lo, hi + 1)]


def _header(api_key: int, version: int, flexible: bool) -> bytes:
    return struct.pack(">hhih", api_key, version, 7, -1) + (b"\x00" if flexible else b"")


# The frames (no size prefix): a first array whose count the frame cannot hold.
HUGE_COUNTS = {
    "Metadata v12 compact count 2^32-2":
        _header(3, 12, True) + b"\xff\xff\xff\xff\x0f" + b"\x00\x00\x00",
    "DescribeConfigs v4 compact count 2^32-2":
        _header(32, 4, True) + b"\xff\xff\xff\xff\x0f" + b"\x00\x00",
    "FindCoordinator v4 compact count 2^32-2":
        _header(10, 4, True) + b"\x00" + b"\xff\xff\xff\xff\x0f" + b"\x00",
    "Metadata v4 int32 count 2^31-1":
        _header(3, 4, False) + struct.pack(">i", 2**31 - 1) + b"\x00",
    "DeleteTopics v1 int32 count 2^31-1":
        _header(20, 1, False) + struct.pack(">i", 2**31 - 1) + b"\x00\x00\x00\x00",
}


@pytest.mark.parametrize("frame", HUGE_COUNTS.values(), ids=HUGE_COUNTS.keys())
def test_a_count_the_frame_cannot_hold_is_refused_before_decoding(frame):
    api_key, version = struct.unpack_from(">hh", frame)
    with pytest.raises(ProtocolError, match="count"):
        check_request(frame, api_key, version)
    with pytest.raises(ProtocolError, match="count"):
        decode_request(frame)


def test_the_walk_ends_where_kio_ends_for_every_served_version():
    """A well-formed request of every API and version passes the walk and the walk ends
    where kio's reader ends (decode_request refuses it otherwise)."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    for api_key, version in ALL_VERSIONS:
        for _ in range(20):
            frame = random_frame(api_key, version, rng)[4:]
            request = decode_request(frame)
            assert (request.api_key, request.api_version) == (api_key, version)


_BROKEN_FRAMES_CHILD = textwrap.dedent("""
    import random, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
    sys.path.insert(0, {tests!r})
    from support.request_frames import broken_frames
    from oncelog.protocol.api_versions import SUPPORTED_VERSIONS
    from oncelog.protocol.errors import ProtocolError
    from oncelog.protocol.messages import decode_request, request_schema
    rng = random.Random({seed})
    tried = refused = 0
    for key, (lo, hi) in sorted(SUPPORTED_VERSIONS.items()):
        for version in range(lo, hi + 1):
            flexible = request_schema(key, version).__flexible__
            for frame in broken_frames(key, version, flexible, rng, {per_version}):
                tried += 1
                try:
                    decode_request(frame[4:])
                except ProtocolError:
                    refused += 1
    print(tried, refused)
""")


def test_broken_counts_and_lengths_never_reach_an_allocation():
    """Every count, length and varint of a random request of every served version set to
    0, -1, 2^31-1, 2^32-2 (and more), every truncation and some padding: decoding refuses
    with ProtocolError or succeeds, in a process whose address space is capped at 1 GiB,
    so that any allocation sized from a count (kio's reserve aborts the process) fails the
    test instead of passing by the grace of overcommit."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    code = _BROKEN_FRAMES_CHILD.format(limit=1 << 30, tests=str(TESTS), seed=seed,
                                       per_version=2)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "RUST_BACKTRACE": "0"})
    assert done.returncode == 0, f"seed {seed}: exit {done.returncode}\n{done.stderr[-3000:]}"
    tried, refused = map(int, done.stdout.split())
    assert tried > 1000 and 0 < refused < tried, done.stdout


# --- against a broker process ------------------------------------------------------------


def _closed_without_answer(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("name", HUGE_COUNTS)
def test_a_huge_count_closes_the_connection_and_the_broker_lives(broker, name):
    frame = HUGE_COUNTS[name]
    with connect(broker) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        assert _closed_without_answer(sock)
    assert broker.alive, broker.log_text()[-2000:]
    with connect(broker) as other:
        assert call(other, 18, api_versions_request()).error_code == 0
    assert peak_rss(broker.proc.pid) < 400 << 20
    api_key, version = struct.unpack_from(">hh", frame)
    assert f"malformed api key {api_key} v{version} request" in broker.log_text()
    assert "closing the connection" in broker.log_text()



@pytest.mark.parametrize(("api_key", "version", "body", "refused"), [
    (15, 4, struct.pack(">i", -1) + b"\x00", True),  # DescribeGroups.groups
    (34, 1, struct.pack(">i", -1), True),  # AlterReplicaLogDirs.dirs
    (3, 12, b"\x00\x00\x00\x00", False),  # Metadata.topics is nullable
])
def test_null_is_refused_where_the_schema_has_none(api_key, version, body, refused):
    """kio hands the handler None for a null array it does not allow (the handler then
    raised); Kafka refuses the request, and so does the walk."""
    frame = _header(api_key, version, request_schema(api_key, version).__flexible__) + body
    if not refused:
        check_request(frame, api_key, version)
        return
    with pytest.raises(ProtocolError, match="not nullable"):
        check_request(frame, api_key, version)
