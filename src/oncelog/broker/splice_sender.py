"""Writing answers that hold file regions (zero-copy Fetch) to a connection's socket.

A Fetch answer over a plaintext connection is a SplicedAnswer (protocol/spliced.py): its
headers as bytes, its records as regions of segment files (log/regions.py). The regions go
from the page cache to the socket with ``os.sendfile``; nothing reads them into Python.

Ordering: the transport's own buffer is written first (the answers before this one), so a
SpliceSender starts only once ``get_write_buffer_size()`` is 0; from then on, while it holds
anything, every answer of the connection goes through it (Connection._flush), and it writes
them itself on the non-blocking socket, in order. When the socket is full it waits for it to
be writable (``loop.add_writer`` on a duplicate of the socket's descriptor: the transport's
own number is refused) and the connection stops handling and reading, as above the
transport's high-water mark, until everything is written (Connection.resume_writing defers to
it). An answer the socket takes at once (the usual case for a reader keeping up) costs no
wait and no task. TCP_CORK holds the small header pieces back so that they leave with the
records in full segments, not as packets of their own.

A region whose file was cut under it (sendfile meets the end of the file early) has already
had its frame's size written: the connection is closed, never sent a short frame. A file
deleted (retention, compaction) is no matter: the region has its own descriptor.

TLS (or a transport without a socket): the regions are read in and the answer is written as
bytes (``write_answers``), the copying path.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket

from ..log.regions import FileRegion, TruncatedRegion
from ..protocol.spliced import SplicedAnswer
from .log_limits import RateLimitedLog

log = logging.getLogger(__name__)
_truncated = RateLimitedLog(log)


def can_splice(transport) -> bool:
    return transport.get_extra_info("sslcontext") is None and \
        transport.get_extra_info("socket") is not None


def write_answers(conn, out: list) -> None:
    """Write ``out`` (bytes and SplicedAnswers) on ``conn``: through its SpliceSender on a
    plaintext connection, else as bytes."""
    if conn.splicer is None:
        if not can_splice(conn.transport):
            try:
                data = b"".join(a.materialize() if type(a) is SplicedAnswer else a for a in out)
            except OSError as exc:
                _truncated.log(logging.ERROR, "fetch answer unreadable",
                               "%s: a fetch answer's records could not be read (%s); closing "
                               "the connection", conn.peer, exc)
                for a in out:
                    if type(a) is SplicedAnswer:
                        a.close()
                conn.close()
                return
            conn.transport.write(data)
            return
        conn.splicer = SpliceSender(conn)
    conn.splicer.write(out)


class SpliceSender:
    def __init__(self, conn) -> None:
        self.conn = conn
        sock = conn.transport.get_extra_info("socket")
        self.sock = sock
        self.fd = sock.fileno()
        self.queue: collections.deque = collections.deque()
        self.watch = -1  # a duplicate of the socket's descriptor, for add_writer
        self.watching = False
        self.corked = False
        self.paused = False  # it stopped the connection; it resumes it once drained
        self.close_when_done = False

    @property
    def busy(self) -> bool:
        return bool(self.queue)

    def write(self, out: list) -> None:
        queue = self.queue
        for answer in out:
            if type(answer) is SplicedAnswer:
                queue.extend(answer.pieces)
            elif answer:
                queue.append(answer)
        if not self.watching:
            self._send()

    def _send(self) -> None:
        conn = self.conn
        transport = conn.transport
        if transport.is_closing():
            self.drop()
            return
        if transport.get_write_buffer_size():
            self._wait()  # the transport's answers go first
            return
        queue = self.queue
        fd = self.fd
        if not self.corked and len(queue) > 1:
            self._cork(True)
        try:
            while queue:
                piece = queue[0]
                if type(piece) is FileRegion:
                    if piece.length:
                        sent = os.sendfile(fd, piece.fd, piece.offset, piece.length)
                        if sent == 0:
                            self._cut_short(piece)
                            return
                        piece.offset += sent
                        piece.length -= sent
                        self.conn.broker.zero_copy_bytes += sent
                        if piece.length:
                            continue
                    piece.close()
                else:
                    sent = os.write(fd, piece)
                    if sent < len(piece):
                        queue[0] = memoryview(piece)[sent:]
                        continue
                queue.popleft()
        except BlockingIOError:
            self._wait()
            return
        except OSError as exc:  # the peer went (EPIPE, ECONNRESET), or the file failed
            log.info("%s: writing a fetch answer failed (%s); closing the connection",
                     conn.peer, exc)
            self.drop()
            conn.close()
            return
        self._drained()

    def _wait(self) -> None:
        if not self.watching:
            loop = asyncio.get_running_loop()
            if self.watch < 0:
                try:
                    self.watch = os.dup(self.fd)
                except OSError as exc:  # out of descriptors: this answer cannot wait
                    log.error("%s: cannot wait for the reader (%s); closing the connection",
                              self.conn.peer, exc)
                    self.drop()
                    self.conn.close()
                    return
            loop.add_writer(self.watch, self._send)
            self.watching = True
        conn = self.conn
        if not self.paused:
            self.paused = True
            if not conn.write_paused:
                conn.broker.write_pauses += 1
            conn.write_paused = True
            conn._set_reading(False)

    def _drained(self) -> None:
        if self.corked:
            self._cork(False)
        if self.watching:
            asyncio.get_running_loop().remove_writer(self.watch)
            self.watching = False
        if self.close_when_done:
            self.conn.transport.close()
        elif self.paused:
            self.paused = False
            self.conn.resume_writing()

    def _cork(self, on: bool) -> None:
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1 if on else 0)
            self.corked = on
        except OSError:
            self.corked = False

    def _cut_short(self, region: FileRegion) -> None:
        """sendfile met the file's end before the region's: part of the frame is written
        and the rest cannot be; the connection must close (a reader would take the next
        frame's bytes as this one's)."""
        try:
            cut = region.truncated()
        except OSError:
            cut = True
        _truncated.log(logging.ERROR, "segment truncated under a fetch answer",
                       "%s: %s; closing the connection", self.conn.peer,
                       TruncatedRegion(region.path) if cut else "sendfile sent nothing")
        self.drop()
        self.conn.close()

    def drop(self) -> None:
        """Forget what is left (the connection is gone): close every region and the
        duplicate descriptor."""
        if self.watching:
            asyncio.get_running_loop().remove_writer(self.watch)
            self.watching = False
        if self.watch >= 0:
            os.close(self.watch)
            self.watch = -1
        while self.queue:
            piece = self.queue.popleft()
            if type(piece) is FileRegion:
                piece.close()
        self.close_when_done = False
