"""Answers from another broker read straight into their frames (a BufferedProtocol), for
inter_broker.py's BrokerConnection once its connection is set up.

A follower's Fetch answers are up to a megabyte each. Read through an asyncio StreamReader,
each one was copied three times in user space, every copy a fresh allocation whose pages the
kernel had to fault in: the event loop's bytes per read, the reader's buffer, the frame
``readexactly`` cut out (bench/replication.py: about two thirds of a follower's CPU per
megabyte replicated). Here the transport writes each frame's bytes into one ``bytearray``
of exactly its size, allocated once its size prefix is read and checked against the
largest frame allowed (nothing is allocated for a size before it is checked). Only sizes up
to ``at_once`` (per connection: what its largest legitimate answer is) are allocated whole
at once; a larger frame grows by doubling as its bytes arrive, so what a peer announces
costs memory only once it has sent about half of it.

The connection's StreamWriter still writes the requests: its StreamReaderProtocol keeps
getting the transport's flow control and the end of the connection, so ``drain`` behaves
as before; bytes its StreamReader had already received are taken over first.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

_SIZE = struct.Struct(">i")
AT_ONCE = 1 << 20  # an answer other than a follower's Fetch is far below it


class FrameSizeInvalid(Exception):
    """A size prefix below 4 (no room for a correlation id) or above the largest frame."""



class FrameReceiver(asyncio.BufferedProtocol):
    """Size-prefixed frames, each handed to ``on_frame`` (a read-only view of its bytes,
    valid as long as the caller keeps it) as soon as it is whole; ``on_lost`` is told once
    when the connection ends or a size is out of bounds."""

    def __init__(self, streams: asyncio.StreamReaderProtocol, max_frame: int,
                 on_frame: Callable[[memoryview], None],
                 on_lost: Callable[[BaseException | None], None], at_once: int = AT_ONCE
                 ) -> None:
        self._streams = streams
        self._max_frame = max_frame
        self._at_once = at_once
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._head = bytearray(4)
        self._frame: bytearray | None = None  # None: reading a size prefix into _head
        self._size = 0  # of the frame being read (_frame may be shorter: still growing)
        self._filled = 0
        self._lost = False
        self._transport: asyncio.BaseTransport | None = None

    @classmethod
    def take_over(cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  max_frame: int, on_frame: Callable[[memoryview], None],
                  on_lost: Callable[[BaseException | None], None], at_once: int = AT_ONCE
                  ) -> FrameReceiver:
        """Reads the connection of ``reader``/``writer`` from now on."""
        transport = writer.transport
        receiver = cls(transport.get_protocol(), max_frame, on_frame, on_lost, at_once)
        receiver._transport = transport
        # What the StreamReader holds already (nothing, between requests: a broker only
        # answers) comes first, then the end of the connection if it saw it. Neither has a
        # public accessor (at_eof() is False while bytes are buffered), so their names are
        # checked rather than guessed around.
        if not (hasattr(reader, "_buffer") and hasattr(reader, "_eof")):
            raise RuntimeError("asyncio.StreamReader no longer has _buffer and _eof")
        pending, ended = bytes(reader._buffer), reader._eof or reader.exception() is not None
        transport.set_protocol(receiver)
        if pending:
            receiver.feed(pending)
        if ended:
            # plain asyncio keeps the transport half-open after the end: nothing more comes
            receiver._lose(reader.exception() or EOFError("the other broker closed the "
                                                           "connection"))
            transport.close()
        elif not transport.is_closing() and not transport.is_reading():
            transport.resume_reading()  # the StreamReader paused it, its buffer full
        return receiver

    def feed(self, data: bytes) -> None:
        """Bytes received another way, as if read."""
        view = memoryview(data)
        while view and not self._lost:
            buf = self.get_buffer(len(view))
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            view = view[n:]
            self.buffer_updated(n)

    # --- the transport's calls ----------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._lost:  # what still comes before the transport closes is dropped
            return memoryview(bytearray(4096))
        if self._frame is None:
            return memoryview(self._head)[self._filled:]
        return memoryview(self._frame)[self._filled:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._lost:
            return
        self._filled += nbytes
        if self._frame is None:
            if self._filled < 4:
                return
            (size,) = _SIZE.unpack(self._head)
            if not 4 <= size <= self._max_frame:
                self._lose(FrameSizeInvalid(f"the other broker sent a frame size of {size} "
                                            f"bytes (4 to {self._max_frame} allowed)"))
                if self._transport is not None:
                    self._transport.close()  # nothing after it can be read as frames
                return
            self._frame, self._size, self._filled = bytearray(min(size, self._at_once)), size, 0
            return
        if self._filled < len(self._frame):
            return
        if self._filled < self._size:
            # a new array and one copy: the transport may still hold a view of this one,
            # which forbids resizing it in place; doubling keeps the copies below the size
            grown = bytearray(min(self._size, 2 * len(self._frame)))
            grown[:self._filled] = self._frame
            self._frame = grown
            return
        frame, self._frame, self._filled = self._frame, None, 0
        self._on_frame(memoryview(frame).toreadonly())

    def eof_received(self) -> bool | None:
        self._lose(EOFError("the other broker closed the connection"))
        return None  # the transport closes itself

    def pause_writing(self) -> None:
        self._streams.pause_writing()  # the StreamWriter's drain waits on it

    def resume_writing(self) -> None:
        self._streams.resume_writing()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._streams.connection_lost(exc)  # wakes a drain waiting
        self._lose(exc or EOFError("the connection to the other broker was lost"))

    def _lose(self, exc: BaseException | None) -> None:
        if not self._lost:
            self._lost = True
            self._on_lost(exc)
