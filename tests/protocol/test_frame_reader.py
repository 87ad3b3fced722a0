"""FrameReader through the BufferedProtocol interface the broker uses: ``buffer()`` says where
the next bytes go, ``received(n)`` that ``n`` of them arrived, ``frames()`` cuts.

``receive`` below plays the kernel: each read writes at most ``chunk`` bytes, and never more
than the buffer it was given, into that buffer.
"""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.protocol.messages import FrameReader, ProtocolError

LARGE = 64 * 1024 + 1  # the smallest frame that gets a buffer of its own


def framed(*payloads: bytes) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


def payload(size: int, seed: int) -> bytes:
    return bytes((seed + i) % 251 for i in range(size))


def receive(reader: FrameReader, stream: bytes, chunks) -> list[bytes]:
    """Deliver ``stream`` in reads of the sizes ``chunks`` yields; the frames cut, as bytes."""
    got: list[bytes] = []
    pos = 0
    while pos < len(stream):
        target = reader.buffer()
        assert len(target) > 0 and not target.readonly
        n = min(next(chunks), len(target), len(stream) - pos)
        target[:n] = stream[pos:pos + n]
        reader.received(n)
        got += [bytes(f) for f in reader.frames()]
        pos += n
    return got


def every(n: int):
    while True:
        yield n


def test_split_at_every_byte_boundary():
    payloads = [payload(8, 1), payload(LARGE, 2), payload(100, 3), payload(9, 4),
                payload(LARGE - 1, 5)]
    stream = framed(*payloads)
    for cut in range(1, len(stream)):
        reader = FrameReader(1 << 20)
        # Split at ``cut``, every boundary of every frame and prefix; the rest as the
        # buffers offered allow.
        chunks = itertools.chain([cut], every(len(stream)))
        assert receive(reader, stream, chunks) == payloads, cut
        assert reader.buffered == 0


def test_one_byte_reads():
    payloads = [payload(LARGE + 3, 9), payload(12, 1)]
    reader = FrameReader(1 << 20)
    assert receive(reader, framed(*payloads), every(1)) == payloads
    assert reader.buffered == 0


@settings(max_examples=100, deadline=None, derandomize=True)
@given(sizes=st.lists(st.integers(8, 300_000), min_size=1, max_size=8),
       chunks=st.lists(st.integers(1, 400_000), min_size=1, max_size=20))
def test_any_read_sizes_give_the_same_frames(sizes, chunks):
    payloads = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    reader = FrameReader(1 << 20)

    def cycle():
        while True:
            yield from chunks

    assert receive(reader, framed(*payloads), cycle()) == payloads
    assert reader.buffered == 0


def test_many_small_frames_through_the_shared_buffer():
    """More small frames than the shared buffer holds, in reads that end mid-frame."""
    payloads = [payload(1000 + i % 17, i) for i in range(2000)]
    reader = FrameReader(1 << 20)
    assert receive(reader, framed(*payloads), every(99_991)) == payloads


def test_a_large_frame_is_received_in_place_and_no_read_passes_its_end():
    body = payload(500_000, 3)
    tail = framed(payload(20, 7))
    reader = FrameReader(1 << 20)
    stream = framed(body) + tail
    receive(reader, stream[:1000], every(1000))
    target = reader.buffer()
    # The rest of the frame, and only that, is offered: the kernel writes into the frame.
    assert len(target) == len(body) - (1000 - 4)
    target[:] = body[996:]
    reader.received(len(target))
    (frame,) = reader.frames()
    assert frame.obj is target.obj and frame.readonly and bytes(frame) == body
    assert receive(reader, tail, every(5)) == [payload(20, 7)]


@pytest.mark.parametrize("size", [-1, 0, 7, 100_001, 2**31 - 1])
def test_a_size_out_of_range_is_refused_from_the_prefix_alone(size):
    reader = FrameReader(100_000)
    reader.buffer()[:4] = struct.pack(">i", size)
    reader.received(4)
    with pytest.raises(ProtocolError, match=f"frame size {size} is outside 8..100000"):
        reader.frames()


def test_a_frame_of_exactly_the_limit_is_taken():
    reader = FrameReader(100_000)
    assert receive(reader, framed(payload(100_000, 1)), every(65_536)) == [payload(100_000, 1)]


def test_a_prefix_longer_than_what_follows_waits_for_the_rest():
    reader = FrameReader(1 << 20)
    stream = struct.pack(">i", 200_000) + payload(150_000, 1)
    assert receive(reader, stream, every(40_000)) == []
    assert reader.buffered == 150_000
    assert len(reader.buffer()) == 50_000


def test_a_prefix_shorter_than_its_frame_makes_the_rest_a_bad_prefix():
    # The frame's tail is read as the next prefix: 0x7f7f7f7f is far over the limit.
    reader = FrameReader(1 << 20)
    stream = struct.pack(">i", 70_000) + b"\x7f" * 80_000
    with pytest.raises(ProtocolError, match="frame size 2139062143 is outside"):
        receive(reader, stream, every(100_000))


def test_pending_bytes_can_be_taken_before_any_cut():
    """The broker peeks at the first bytes to tell HTTP from Kafka, then takes them."""
    reader = FrameReader(1 << 20)
    request = b"GET /metrics HTTP/1.1\r\n\r\n"
    reader.buffer()[:len(request)] = request
    reader.received(len(request))
    assert reader.pending()[:4] == b"GET "
    assert reader.take_pending() == request
    assert reader.buffered == 0


def test_readers_sharing_spare_buffers_keep_their_frames_apart():
    """A reader with nothing pending hands its receive buffer on to the next reader that
    needs one; frames already cut, and another reader's uncut bytes, must not change."""
    sizes = [1000, 1001, 1002]
    expected = [[payload(size, i + k) for i in range(400)] for k, size in enumerate(sizes)]
    streams = [framed(*frames) for frames in expected]
    readers = [FrameReader(1 << 20) for _ in streams]
    kept: list[list] = [[] for _ in streams]  # the frames as returned, read at the end
    positions = [0] * len(streams)
    step = 0
    while any(p < len(s) for p, s in zip(positions, streams, strict=True)):
        k = step % len(streams)
        step += 1
        if positions[k] >= len(streams[k]):
            continue
        # Every other read ends on a frame boundary, so the reader gives its buffer back.
        framed_size = sizes[k] + 4
        boundary = (positions[k] // framed_size + 1 + step % 5) * framed_size
        n = boundary - positions[k] if step % 2 else 1 + 997 * step % (5 * framed_size)
        target = readers[k].buffer()
        n = min(n, len(target), len(streams[k]) - positions[k])
        target[:n] = streams[k][positions[k]:positions[k] + n]
        readers[k].received(n)
        kept[k] += readers[k].frames()
        positions[k] += n
    for k, frames in enumerate(expected):
        assert [bytes(f) for f in kept[k]] == frames
        assert readers[k].buffered == 0
