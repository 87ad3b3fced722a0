"""The broker's own cost per request frame in Connection and FrameReader, in process.

    PYTHONPATH=SRC python bench/_connection_overhead.py   (bench/backpressure.py runs it)

Produce request frames (16 KiB and 1 MB batches) are fed through a real Connection of a real
Broker (uvloop), as the event loop would: get_buffer, up to 256 KiB written into it,
buffer_updated, up to 8 reads per turn of the loop while the connection reads. The broker's
request handler is replaced by one returning a fixed answer and the transport only counts,
so what is left is the connection's work: cutting frames, admitting, queueing, the pass,
the write of the answers. Prints JSON: CPU microseconds per frame (the least of 25 runs).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support import hostile_clients  # the frames

from oncelog.broker.config import BrokerConfig
from oncelog.broker.server import Broker, Connection

READS_PER_TURN = 8
RUNS = 25


class CountingTransport:
    def __init__(self) -> None:
        self.written = 0
        self.paused = False

    def get_extra_info(self, name, default=None):
        return default

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data) -> None:
        self.written += len(data)

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        pass


async def per_frame(broker: Broker, frame: bytes, count: int) -> float:
    stream = frame * count
    best = float("inf")
    for _ in range(RUNS):
        conn, transport = Connection(broker), CountingTransport()
        conn.connection_made(transport)
        pos = 0
        start = time.process_time()
        while pos < len(stream):
            reads = 0
            while pos < len(stream) and not transport.paused and reads < READS_PER_TURN:
                buf = conn.get_buffer(-1)
                n = min(len(buf), len(stream) - pos, 256 * 1024)
                buf[:n] = stream[pos:pos + n]
                pos += n
                conn.buffer_updated(n)
                reads += 1
            await asyncio.sleep(0)
        while transport.written < count * 60:  # the last turn's answers
            await asyncio.sleep(0)
        best = min(best, time.process_time() - start)
        conn.connection_lost(None)
    return best / count * 1e6


async def main() -> None:
    with tempfile.TemporaryDirectory() as data:
        broker = Broker(BrokerConfig({"log.dirs": data}))
        answer = b"x" * 60
        broker.handle_frame = lambda frame, peer, session=None: answer
        results = {
            "16KiB": await per_frame(broker, hostile_clients.produce_frame("t", 16_000), 2000),
            "1MB": await per_frame(broker, hostile_clients.produce_frame("t", 1_000_000), 100),
        }
        await broker.stop()
    print(json.dumps(results))


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
