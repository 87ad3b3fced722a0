"""Broken frames of every API and version the broker serves, sent to a broker process
(issue 28, "close the class"): counts, lengths and varints at their limits (0, -1, 2^31-1,
2^32-2 and more), truncated frames and padded ones, and well-formed random requests among
them. The broker answers or closes each connection, never dies, keeps answering a probe
client between rounds, logs no traceback, and its memory stays within a bound.

Bounded: a fixed number of frames per version, sent on many connections at once, each
round waiting at most ROUND_WAIT for answers (a Produce with acks=0 has none; a JoinGroup
or a long-polling Fetch may answer later, and its connection is closed by the test).
"""

from __future__ import annotations

import random
import selectors
import socket
import time

from support.hostile_clients import peak_rss, rss
from support.raw_wire import api_versions_request, call, connect
from support.request_frames import broken_frames, random_frame

from oncelog.protocol.api_versions import SUPPORTED_VERSIONS
from oncelog.protocol.messages import request_schema

BROKEN_PER_VERSION = 6
VALID_PER_VERSION = 2
ROUND = 64  # connections at once
ROUND_WAIT = 3.0
MEMORY_BOUND = 200 << 20  # growth of the broker's peak RSS over the whole test


def _frames(rng: random.Random) -> list[tuple[str, bytes]]:
    out = []
    for api_key, (lo, hi) in sorted(SUPPORTED_VERSIONS.items()):
        for version in range(lo, hi + 1):
            flexible = request_schema(api_key, version).__flexible__
            broken = broken_frames(api_key, version, flexible, rng, 1, likely=True)
            out += [(f"{api_key} v{version} broken", frame)
                    for frame in rng.sample(broken, min(BROKEN_PER_VERSION, len(broken)))]
            out += [(f"{api_key} v{version} valid", random_frame(api_key, version, rng))
                    for _ in range(VALID_PER_VERSION)]
    rng.shuffle(out)
    return out


def _round(port: int, frames: list[tuple[str, bytes]]) -> dict[str, int]:
    """Send each frame on its own connection; wait for an answer or a close on each."""
    outcomes = {"answered": 0, "closed": 0, "pending": 0}
    sel = selectors.DefaultSelector()
    socks = []
    try:
        for _, frame in frames:
            sock = socket.create_connection(("127.0.0.1", port), timeout=ROUND_WAIT)
            sock.sendall(frame)
            sock.setblocking(False)
            socks.append(sock)
            sel.register(sock, selectors.EVENT_READ, bytearray())
        deadline = time.monotonic() + ROUND_WAIT
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.1):
                try:
                    data = key.fileobj.recv(65536)
                except ConnectionResetError:
                    data = b""
                got = key.data
                if not data:
                    outcomes["answered" if got else "closed"] += 1
                    sel.unregister(key.fileobj)
                    continue
                got += data
                if len(got) >= 4 and len(got) >= 4 + int.from_bytes(got[:4], "big"):
                    outcomes["answered"] += 1
                    sel.unregister(key.fileobj)
        outcomes["pending"] = len(sel.get_map())
    finally:
        sel.close()
        for sock in socks:
            sock.close()
    return outcomes


def test_broken_frames_of_every_version_never_kill_the_broker(broker):
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    frames = _frames(rng)
    pid = broker.proc.pid
    with connect(broker) as probe:
        assert call(probe, 18, api_versions_request()).error_code == 0
        base = rss(pid)
        totals = {"answered": 0, "closed": 0, "pending": 0}
        for start in range(0, len(frames), ROUND):
            batch = frames[start:start + ROUND]
            for name, count in _round(broker.port, batch).items():
                totals[name] += count
            assert broker.alive, (f"seed {seed}: the broker died in a round of "
                                  f"{[name for name, _ in batch]}\n{broker.log_text()[-3000:]}")
            assert call(probe, 18, api_versions_request()).error_code == 0
    print(f"{len(frames)} frames: {totals}")
    assert totals["closed"] > len(frames) // 4 and totals["answered"] > len(frames) // 10
    grown = peak_rss(pid) - base
    assert grown < MEMORY_BOUND, f"seed {seed}: peak RSS grew {grown >> 20} MiB"
