"""A response frame whose record sets are not in memory (zero-copy Fetch).

kio's encoder (and fast_writer.py, its bytes) writes a ``records`` field as its length, then
``buffer.write(records)``.
``encode_spliced`` gives it a buffer that keeps bytes in one growing bytearray and, when
handed anything else (a file region: any object with a length), ends the bytes run there and
keeps the object as the next piece: the frame is the same bytes kio writes, with the records
left where they are. The connection sends the pieces in order (sendfile for the regions) or,
where it cannot (TLS), reads them in (``SplicedAnswer.materialize``).

tests/protocol/test_spliced_fetch.py holds it to kio's encoding for every Fetch version.
"""

from __future__ import annotations

import struct
from typing import Any

from .api_versions import API_VERSIONS_KEY
from .fast_writer import writer

_SIZE = struct.Struct(">i")


class SplicedAnswer:
    """A frame as pieces: ``bytes`` and regions (objects with ``len``, ``read()`` giving
    their bytes and ``close()``), in the order they go on the wire; ``size`` is the frame's
    whole length, its size prefix included."""

    __slots__ = ("pieces", "size")

    def __init__(self, pieces: list[Any], size: int) -> None:
        self.pieces = pieces
        self.size = size

    def __len__(self) -> int:
        return self.size

    def materialize(self) -> bytes:
        """The frame's bytes, the regions read in (and closed)."""
        try:
            return b"".join(p if type(p) is bytes else p.read() for p in self.pieces)
        finally:
            self.close()

    def close(self) -> None:
        for piece in self.pieces:
            if type(piece) is not bytes:
                piece.close()


class _Pieces:
    """The Writable kio encodes into."""

    __slots__ = ("buf", "pieces", "size")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.pieces: list[Any] = []
        self.size = 0

    def write(self, data: Any) -> None:
        try:
            self.buf += data
        except TypeError:  # a region
            self._cut()
            self.pieces.append(data)
            self.size += len(data)

    def _cut(self) -> None:
        if self.buf:
            self.pieces.append(self.buf)
            self.size += len(self.buf)
            self.buf = bytearray()


def encode_spliced(api_key: int, api_version: int, correlation_id: int,
                   body: Any) -> bytes | SplicedAnswer:
    """The response frame, size prefix included: bytes when no field held a region (what
    messages.encode_response gives), else a SplicedAnswer."""
    out = _Pieces()
    out.buf += b"\0\0\0\0"
    out.buf += _SIZE.pack(correlation_id)
    if type(body).__flexible__ and api_key != API_VERSIONS_KEY:
        out.buf += b"\0"  # response header v1: no tagged fields
    writer(type(body))(out, body)
    if not out.pieces:
        frame = out.buf
        _SIZE.pack_into(frame, 0, len(frame) - 4)
        return bytes(frame)
    out._cut()
    pieces = out.pieces
    _SIZE.pack_into(pieces[0], 0, out.size - 4)
    return SplicedAnswer([bytes(p) if type(p) is bytearray else p for p in pieces], out.size)
