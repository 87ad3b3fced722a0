"""Answers from another broker read straight into their frames (broker/frame_receiver.py):
over a real loopback connection taken over from asyncio's streams, frames of any size split
at any point come whole and in order; bytes the StreamReader already held come first; a size
out of bounds ends the connection before anything is allocated for it; the StreamWriter's
drain still follows the transport's flow control. And the follower's Fetch answer is read
with its records left in the frame (broker/replica_fetcher.py's decoder), not copied."""

from __future__ import annotations

import asyncio
import datetime
import random
import struct
import tracemalloc

from kio.schema.errors import ErrorCode

from oncelog.broker.frame_receiver import FrameReceiver, FrameSizeInvalid
from oncelog.broker.replica_fetcher import FETCH_VERSION, _decode_fetch
from oncelog.protocol.api_versions import FETCH
from oncelog.protocol.messages import encode_response
from oncelog.protocol.schema import build, response_module

SEED = 20261128


async def _pair(send: bytes, chunk_sizes, before_take_over: int = 0, max_frame=1 << 30,
                after_eof: bool = False):
    """A loopback server writing ``send`` in chunks; the client's streams taken over once
    ``before_take_over`` bytes reached its StreamReader (and, ``after_eof``, once it saw the
    end of the connection too). (frames, lost)"""
    sent = asyncio.Event()

    async def serve(_reader, writer):
        view, sizes = memoryview(send), iter(chunk_sizes)
        while view:
            n = next(sizes, len(view))
            writer.write(view[:n])
            await writer.drain()
            view = view[n:]
            await asyncio.sleep(0)
        sent.set()
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.sockets[0].getsockname()[1])
        if before_take_over:
            async with asyncio.timeout(10):
                while len(reader._buffer) < before_take_over or (after_eof
                                                                 and not reader._eof):
                    await asyncio.sleep(0.001)
        frames, lost = [], asyncio.get_running_loop().create_future()
        FrameReceiver.take_over(reader, writer, max_frame, lambda f: frames.append(bytes(f)),
                                lambda exc: lost.done() or lost.set_result(exc))
        async with asyncio.timeout(10):
            exc = await lost
        writer.close()
        return frames, exc
    finally:
        server.close()


def _framed(payloads):
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


def test_frames_split_anywhere_come_whole_and_in_order():
    rng = random.Random(SEED)
    payloads = [rng.randbytes(n) for n in (4, 5, 1000, 70_000, 2 << 20, 4, 300_001)]
    data = _framed(payloads)
    chunks = [rng.choice((1, 2, 3, 7, 4096, 65_537)) for _ in range(400)]
    frames, exc = asyncio.run(_pair(data, chunks, before_take_over=3))
    assert frames == payloads
    assert isinstance(exc, EOFError)  # the server closed after the last frame


def test_a_size_out_of_bounds_ends_the_connection_unread():
    # a size of 2 GiB - 1: refused on its prefix (nothing allocated), nothing after it read
    data = _framed([b"good"]) + struct.pack(">i", 0x7FFFFFFF) + b"tail"
    frames, exc = asyncio.run(_pair(data, [len(data)], max_frame=1 << 20))
    assert frames == [b"good"]
    assert isinstance(exc, FrameSizeInvalid)
    frames, exc = asyncio.run(_pair(struct.pack(">i", 3) + b"abc", [7]))
    assert frames == [] and isinstance(exc, FrameSizeInvalid)  # below a correlation id's size


def test_an_end_of_connection_the_stream_reader_held_is_not_missed():
    # The server closes after a frame and a half; the StreamReader holds both the bytes and
    # the end of the connection (at_eof() is False while bytes are buffered, and plain
    # asyncio keeps the transport half-open): the frame comes, then the loss.
    data = _framed([b"whole", b"half of it"])[:-4]
    frames, exc = asyncio.run(_pair(data, [len(data)], before_take_over=len(data),
                                    after_eof=True))
    assert frames == [b"whole"]
    assert isinstance(exc, EOFError)


def test_a_huge_size_allocates_only_what_has_arrived():
    # A size of 256 MiB followed by a few bytes and the end of the connection: what is
    # allocated follows the bytes received, not the size announced.
    async def run():
        tracemalloc.start()
        try:
            data = struct.pack(">i", 256 << 20) + bytes(5000)
            frames, exc = await _pair(data, [len(data)])
            return frames, exc, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    frames, exc, peak = asyncio.run(run())
    assert frames == [] and isinstance(exc, EOFError)
    assert peak < 16 << 20, peak


def test_the_writer_still_drains_under_flow_control():
    async def run():
        got = asyncio.get_running_loop().create_future()

        async def serve(reader, writer):
            await asyncio.sleep(0.2)  # the client's writes fill the socket meanwhile
            got.set_result(len(await reader.readexactly(8 << 20)))
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", server.sockets[0].getsockname()[1])
            FrameReceiver.take_over(reader, writer, 1 << 20, lambda f: None, lambda e: None)
            writer.write(bytes(8 << 20))  # above the transport's high-water mark: paused
            async with asyncio.timeout(10):
                await writer.drain()
                assert await got == 8 << 20
            writer.close()
        finally:
            server.close()

    asyncio.run(run())


def test_a_followers_fetch_answer_keeps_its_records_in_the_frame():
    mod = response_module(FETCH, FETCH_VERSION)
    records = bytes(range(256)) * 40
    body = build(mod.FetchResponse, throttle_time=datetime.timedelta(0),
                 error_code=ErrorCode.none, session_id=0, responses=(
                     build(mod.FetchableTopicResponse, topic="t", partitions=(
                         build(mod.PartitionData, partition_index=3,
                               error_code=ErrorCode.none, high_watermark=9,
                               last_stable_offset=9, log_start_offset=2,
                               aborted_transactions=(), preferred_read_replica=-1,
                               records=records),)),))
    frame = memoryview(bytearray(encode_response(FETCH, FETCH_VERSION, 5, body)[4:]))
    correlation, error, [partition] = _decode_fetch(frame.toreadonly())
    assert (correlation, error, partition.topic, partition.partition) == (5, 0, "t", 3)
    assert (partition.high_watermark, partition.log_start_offset) == (9, 2)
    assert bytes(partition.records) == records
    assert partition.records.obj is frame.obj  # a view into the frame: not copied
