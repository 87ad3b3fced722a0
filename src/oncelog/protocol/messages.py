"""Kafka request/response framing on top of kio's schemas: sans-IO, bytes in, objects out.

A frame is a 4-byte big-endian size followed by that many bytes. A request starts with
api key, api version and correlation id (int16, int16, int32); the rest of its header is v1
(client id) or, for flexible versions, v2 (client id + tagged fields). Responses carry header
v0 (correlation id), or v1 (plus empty tagged fields) for flexible versions, except
ApiVersions, whose response header is always v0 so that any client can read it (KIP-511).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader

from . import fast_reader, fast_writer, frame_check, produce_request
from .api_versions import API_VERSIONS_KEY, PRODUCE, SUPPORTED_VERSIONS
from .errors import ProtocolError, UnsupportedVersion

__all__ = ["ProtocolError", "UnsupportedVersion"]

_PREFIX = struct.Struct(">hhi")
_ASSEMBLE_ABOVE = 64 * 1024
_RECEIVE_SIZE = 256 * 1024  # uvloop's own receive buffer is as large
_MIN_RECEIVE = 64 * 1024  # less room than this left: move what is uncut to the front first
# Receive buffers of readers with nothing pending, for the next reader that needs one: an
# idle connection holds no buffer, and a busy one gets a buffer without allocating and
# zeroing 256 KiB per read.
_SPARE_BUFFERS: list[bytearray] = []
_SPARE_BUFFERS_KEPT = 16
_SIZE = struct.Struct(">i")
_NO_LIMIT = 1 << 62
# Decoded, a request is several times its frame (a 93.5 MB ListOffsets of 5.8 million
# partitions peaked at 1.7 GB and answered 148 MB): past this many array elements in all
# (topics, partitions, configs...: far more than one broker holds) the request is refused
# before it is decoded. ~250 bytes of objects per element: about 50 MB at most.
MAX_REQUEST_ELEMENTS = 200_000
# What a decoded request holds besides its strings (which are about its frame's bytes), per
# array element: measured 96 (ListOffsets) to 113 (Metadata) bytes of objects, more with a
# string each. A request held while its handler waits counts this against the request
# budget as well as its frame (server.py).
DECODED_BYTES_PER_ELEMENT = 200




@dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any
    size: int
    peer: str = ""  # host:port of the client (JoinGroup records its host)
    elements: int = 0  # array elements, all levels (frame_check); 0 for Produce
    # Who sent it: the connection's security session (oncelog.broker.session.Session), set
    # by the broker; the protocol layer carries it and never reads it.
    session: Any = None
    # How long the client is throttled for a quota (ms; set by the broker before the
    # request is handled, so that its answer carries it).
    throttle_ms: int = 0


class FrameReader:
    """Cuts a byte stream into frames; refuses frames over ``max_size``.

    Shaped for asyncio's BufferedProtocol: ``buffer()`` is where the next bytes are to be
    received and ``received(n)`` says that ``n`` of them were, so the kernel copies into the
    reader's memory directly. Small frames are received in one shared buffer and copied out
    whole. A frame over 64 KiB gets a buffer of its own size as soon as its size prefix is in,
    and the rest of it is received straight into that buffer: a megabyte request is not
    copied in user space at all, and nothing of it is copied after its last byte arrives.

    What a frame costs is decided before it is taken on (``frames``' allowance, or
    ``admit(size)``), and a frame refused stays received and uncut (a large one gets no
    buffer) until a later call, so a peer announcing 100 MB frames costs nothing it was not
    granted.
    """

    def __init__(self, max_size: int) -> None:
        self._max_size = max_size
        self._buf: bytearray | None = None  # held only while something in it is uncut
        self._start = 0  # the first byte received in _buf and not yet cut into a frame
        self._end = 0  # the end of what was received in _buf
        self._frame: bytearray | None = None  # a large frame being received
        self._filled = 0
        self.held_back = False  # the last frames() left a frame that admit refused
        self.free_used = (0, 0)  # frames, bytes the last frames() took on without asking

    def buffer(self) -> memoryview:
        """Where to receive the next bytes: never empty, never past the current large frame
        (so that a read cannot mix its tail with the next frame's bytes)."""
        if self._frame is not None:
            return memoryview(self._frame)[self._filled:]
        buf = self._buf
        if buf is None:
            buf = self._buf = _SPARE_BUFFERS.pop() if _SPARE_BUFFERS \
                else bytearray(_RECEIVE_SIZE)
        elif len(buf) - self._end < _MIN_RECEIVE and self._start:
            # What is left uncut is under 4 + 64 KiB (longer frames move to their own
            # buffer), so moving it to the front always leaves room.
            rest = self._end - self._start
            buf[:rest] = buf[self._start:self._end]
            self._start, self._end = 0, rest
        return memoryview(buf)[self._end:]

    def received(self, n: int) -> None:
        """``n`` bytes were written at the start of the last ``buffer()``."""
        if self._frame is not None:
            self._filled += n
        else:
            self._end += n

    def pending(self) -> bytes:
        """The bytes received and not yet cut into frames (not counting a large frame's)."""
        if self._buf is None:
            return b""
        return bytes(self._buf[self._start:self._end])

    def take_pending(self) -> bytes:
        data = self.pending()
        self._release()
        return data

    def _release(self) -> None:
        buf, self._buf = self._buf, None
        self._start = self._end = 0
        if buf is not None and len(_SPARE_BUFFERS) < _SPARE_BUFFERS_KEPT:
            _SPARE_BUFFERS.append(buf)

    def frames(self, free_frames: int = _NO_LIMIT, free_bytes: int = _NO_LIMIT,
               admit: Callable[[int], bool] | None = None) -> list[bytes | memoryview]:
        """The frames completed by what was received, in order; call after ``received``.

        A frame is taken on (a small one once it is wholly received: it is copied out; a
        large one once its size prefix is: its buffer is allocated) while the frames taken
        on in this call stay within ``free_frames`` and ``free_bytes``; ``free_used`` says
        how many and their bytes. A frame beyond that is taken on only if ``admit(size)``
        says yes. When one is not, it and all after it stay as they are, ``held_back`` is
        true, and a later call takes them, with or without new bytes. The receiver must not
        ask for ``buffer()`` while ``held_back``: uncut frames may fill it.
        """
        self.held_back = False
        self.free_used = (0, 0)
        free_left, free_bytes_left = free_frames, free_bytes
        frames: list[bytes | memoryview] = []
        if self._frame is not None:
            if self._filled < len(self._frame):
                return frames
            frames.append(memoryview(self._frame).toreadonly())  # kio reads only read-only
            self._frame = None
            self._filled = 0
        buf = self._buf
        if buf is None:
            return frames
        pos, end = self._start, self._end
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 8 or size > self._max_size:
                raise ProtocolError(
                    f"frame size {size} is outside 8..{self._max_size} (socket.request.max.bytes)"
                )
            large = size > _ASSEMBLE_ABOVE
            if not large and end - pos - 4 < size:
                break  # a small frame is taken on once wholly received
            if free_left and size <= free_bytes_left:
                free_left -= 1
                free_bytes_left -= size
            elif admit is None or not admit(size):
                self.held_back = True
                break
            if large:
                frame = bytearray(size)
                have = min(end - pos - 4, size)
                frame[:have] = memoryview(buf)[pos + 4 : pos + 4 + have]
                pos += 4 + have
                if have < size:
                    self._frame, self._filled = frame, have
                    break
                frames.append(memoryview(frame).toreadonly())
                continue
            frames.append(bytes(memoryview(buf)[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        self.free_used = (free_frames - free_left, free_bytes - free_bytes_left)
        if pos == end:
            self._release()  # frames were copied out or own their buffer: nothing refers to it
        else:
            self._start, self._end = pos, end
        return frames

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes | memoryview]:
        """``buffer``/``received``/``frames`` for bytes that are already in memory."""
        frames: list[bytes | memoryview] = []
        view = memoryview(data)
        while view:
            target = self.buffer()
            n = min(len(target), len(view))
            target[:n] = view[:n]
            self.received(n)
            frames += self.frames()
            view = view[n:]
        return frames

    @property
    def buffered(self) -> int:
        return self._end - self._start + self._filled


@functools.cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


@functools.cache
def _writer(cls: type) -> Any:
    return fast_writer.writer(cls)  # kio's bytes, without its per-value checks


@functools.cache
def request_schema(api_key: int, api_version: int) -> type:
    return load_request_schema(api_key, api_version)


@functools.cache
def response_schema(api_key: int, api_version: int) -> type:
    return load_response_schema(api_key, api_version)


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api key, api version, correlation id) of a request frame without decoding the rest."""
    return _PREFIX.unpack_from(frame, 0)


def decode_request(frame: bytes, peer: str = "", session: Any = None) -> Request:
    """Decode a request frame (without its size prefix).

    Raises UnsupportedVersion for an API or version outside SUPPORTED_VERSIONS and
    ProtocolError for anything that does not parse.
    """
    if len(frame) < _PREFIX.size:
        raise ProtocolError("request shorter than its header")
    api_key, api_version, correlation_id = _PREFIX.unpack_from(frame, 0)
    versions = SUPPORTED_VERSIONS.get(api_key)
    if versions is None or not versions[0] <= api_version <= versions[1]:
        raise UnsupportedVersion(api_key, api_version, correlation_id)
    if api_key == PRODUCE:
        # Its own reader allocates nothing ahead of the bytes it has read.
        return _decode_produce(frame, api_version, correlation_id, peer, session)
    fast = fast_reader.reader(api_key, api_version)
    if fast is not None:
        try:
            client_id, body, elements = fast(frame)
        except fast_reader.FALLBACK:
            pass  # not the plain shape: the general path below decides what it is
        else:
            if elements <= MAX_REQUEST_ELEMENTS:
                return _new_request(api_key, api_version, correlation_id, client_id, body,
                                    len(frame), peer, elements, session)
    return decode_general(frame, api_key, api_version, correlation_id, peer, session)


def decode_general(frame: bytes, api_key: int, api_version: int, correlation_id: int,
                   peer: str = "", session: Any = None) -> Request:
    """Any request but Produce, through the frame check and kio's reader: what decides the
    error for a frame the fast reader does not take."""
    try:
        # kio reserves room for an array from its count before reading it (a 2^32-2 count
        # aborts the process): no count or length reaches kio that the frame cannot hold.
        checked = frame_check.check_request(frame, api_key, api_version)
    except ProtocolError as exc:
        raise ProtocolError(f"malformed api key {api_key} v{api_version} request: {exc}") \
            from None
    if checked.elements > MAX_REQUEST_ELEMENTS:
        raise ProtocolError(f"api key {api_key} v{api_version} request has "
                            f"{checked.elements} array elements, more than "
                            f"{MAX_REQUEST_ELEMENTS}")
    schema = request_schema(api_key, api_version)
    header_cls = RequestHeaderV2 if schema.__flexible__ else RequestHeaderV1
    try:
        header, pos = _reader(header_cls)(frame, 0)
        body, body_size = _reader(schema)(frame, pos)
    except Exception as exc:  # kio raises several types for malformed input
        raise ProtocolError(
            f"malformed api key {api_key} v{api_version} request: {exc!r}"
        ) from exc
    if pos + body_size != checked.end:  # the check walked another frame than kio read
        raise ProtocolError(f"api key {api_key} v{api_version} request: the frame check "
                            f"ended at {checked.end}, the decoder at {pos + body_size}")
    # Trailing bytes are tolerated, as Kafka's own parser does: some librdkafka versions send
    # fields a version no longer has.
    return Request(api_key, api_version, correlation_id, header.client_id, body, len(frame),
                   peer, checked.elements, session)


_SET_REQUEST = tuple(Request.__dict__[f.name].__set__ for f in dataclasses.fields(Request))
(_SET_KEY, _SET_VERSION, _SET_CORRELATION, _SET_CLIENT, _SET_BODY, _SET_SIZE, _SET_PEER,
 _SET_ELEMENTS, _SET_SESSION, _SET_THROTTLE) = _SET_REQUEST


def _new_request(api_key: int, api_version: int, correlation_id: int, client_id: str | None,
                 body: Any, size: int, peer: str, elements: int, session: Any) -> Request:
    """``Request(...)`` with its slots set directly: the frozen dataclass's ``__init__``
    sets each field through ``object.__setattr__``, a third of a small request's decode."""
    request = object.__new__(Request)
    _SET_KEY(request, api_key)
    _SET_VERSION(request, api_version)
    _SET_CORRELATION(request, correlation_id)
    _SET_CLIENT(request, client_id)
    _SET_BODY(request, body)
    _SET_SIZE(request, size)
    _SET_PEER(request, peer)
    _SET_ELEMENTS(request, elements)
    _SET_SESSION(request, session)
    _SET_THROTTLE(request, 0)
    return request


def _decode_produce(frame: bytes, api_version: int, correlation_id: int, peer: str,
                    session: Any) -> Request:
    """The hot path: records stay memoryviews into the frame (see produce_request)."""
    try:
        client_id, pos = produce_request.read_header(frame, api_version)
        body = produce_request.decode(frame, api_version, pos)
    except ProtocolError as exc:
        raise ProtocolError(f"malformed api key {PRODUCE} v{api_version} request: {exc}") \
            from None
    return _new_request(PRODUCE, api_version, correlation_id, client_id, body, len(frame),
                        peer, 0, session)


def encode_response(request_api_key: int, api_version: int, correlation_id: int,
                    body: Any) -> bytes:
    """A complete response frame, size prefix included."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(_SIZE.pack(correlation_id))
    if type(body).__flexible__ and request_api_key != API_VERSIONS_KEY:
        out.write(b"\0")  # response header v1: no tagged fields
    _writer(type(body))(out, body)
    frame = out.getbuffer()
    _SIZE.pack_into(frame, 0, len(frame) - 4)
    del frame
    return out.getvalue()


def encode_request(api_key: int, api_version: int, correlation_id: int, client_id: str | None,
                   body: Any) -> bytes:
    """A complete request frame (used by oncelog's own clients and by tests)."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    header_cls = RequestHeaderV2 if type(body).__flexible__ else RequestHeaderV1
    header = header_cls(
        request_api_key=api_key,
        request_api_version=api_version,
        correlation_id=correlation_id,
        client_id=client_id,
    )
    _writer(header_cls)(out, header)
    _writer(type(body))(out, body)
    frame = out.getbuffer()
    _SIZE.pack_into(frame, 0, len(frame) - 4)
    del frame
    return out.getvalue()


def decode_response(api_key: int, api_version: int, frame: bytes) -> tuple[int, Any]:
    """(correlation id, body) of a response frame without its size prefix."""
    schema = response_schema(api_key, api_version)
    (correlation_id,) = _SIZE.unpack_from(frame, 0)
    pos = 4
    if schema.__flexible__ and api_key != API_VERSIONS_KEY:
        pos += 1  # tagged fields of header v1; we never send any, Kafka neither
    body, _ = _reader(schema)(frame, pos)
    return correlation_id, body
