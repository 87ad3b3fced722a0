"""Kafka request/response framing on top of kio's schemas: sans-IO, bytes in, objects out.

A frame is a 4-byte big-endian size followed by that many bytes. A request starts with
api key, api version and correlation id (int16, int16, int32); the rest of its header is v1
(client id) or, for flexible versions, v2 (client id + tagged fields). Responses carry header
v0 (correlation id), or v1 (plus empty tagged fields) for flexible versions, except
ApiVersions, whose response header is always v0 so that any client can read it (KIP-511).
"""

from __future__ import annotations

import functools
import io
import struct
from dataclasses import dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer

from . import produce_request
from .api_versions import API_VERSIONS_KEY, PRODUCE, SUPPORTED_VERSIONS
from .errors import ProtocolError, UnsupportedVersion

__all__ = ["ProtocolError", "UnsupportedVersion"]

_PREFIX = struct.Struct(">hhi")
_ASSEMBLE_ABOVE = 64 * 1024
_SIZE = struct.Struct(">i")




@dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any
    size: int


class FrameReader:
    """Accumulates bytes and cuts them into frames; refuses frames over ``max_size``.

    A frame that arrives in pieces is assembled in a buffer of its own size, allocated
    once its size is known, so a megabyte request is copied once, not three times.
    """

    def __init__(self, max_size: int) -> None:
        self._buf = bytearray()
        self._max_size = max_size
        self._frame: bytearray | None = None  # a partly received frame
        self._filled = 0

    def feed(self, data: bytes) -> list[bytes | memoryview]:
        frames: list[bytes | memoryview] = []
        view = memoryview(data)
        if self._frame is not None:
            view = self._fill(view, frames)
            if self._frame is not None:
                return frames
        buf = self._buf
        buf += view
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 8 or size > self._max_size:
                raise ProtocolError(
                    f"frame size {size} is outside 8..{self._max_size} (socket.request.max.bytes)"
                )
            if end - pos - 4 < size:
                break
            frames.append(bytes(memoryview(buf)[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if end - pos >= 4 and size > _ASSEMBLE_ABOVE:
            # Start this frame's own buffer with what has arrived of it.
            self._frame = bytearray(size)
            have = end - pos - 4
            self._frame[:have] = memoryview(buf)[pos + 4 : end]
            self._filled = have
            pos = end
        if pos:
            del buf[:pos]
        return frames

    def _fill(self, view: memoryview, frames: list) -> memoryview:
        frame = self._frame
        assert frame is not None
        n = min(len(view), len(frame) - self._filled)
        frame[self._filled : self._filled + n] = view[:n]
        self._filled += n
        if self._filled == len(frame):
            frames.append(memoryview(frame).toreadonly())  # kio reads only read-only buffers
            self._frame = None
        return view[n:]

    @property
    def buffered(self) -> int:
        return len(self._buf) + self._filled if self._frame is not None else len(self._buf)


@functools.cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


@functools.cache
def _writer(cls: type) -> Any:
    return entity_writer(cls)


@functools.cache
def request_schema(api_key: int, api_version: int) -> type:
    return load_request_schema(api_key, api_version)


@functools.cache
def response_schema(api_key: int, api_version: int) -> type:
    return load_response_schema(api_key, api_version)


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api key, api version, correlation id) of a request frame without decoding the rest."""
    return _PREFIX.unpack_from(frame, 0)


def decode_request(frame: bytes) -> Request:
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
        return _decode_produce(frame, api_version, correlation_id)
    schema = request_schema(api_key, api_version)
    header_cls = RequestHeaderV2 if schema.__flexible__ else RequestHeaderV1
    try:
        header, pos = _reader(header_cls)(frame, 0)
        body, body_size = _reader(schema)(frame, pos)
    except Exception as exc:  # kio raises several types for malformed input
        raise ProtocolError(
            f"malformed api key {api_key} v{api_version} request: {exc!r}"
        ) from exc
    if pos + body_size > len(frame):
        raise ProtocolError(f"api key {api_key} v{api_version} request is truncated")
    # Trailing bytes are tolerated, as Kafka's own parser does: some librdkafka versions send
    # fields a version no longer has.
    return Request(api_key, api_version, correlation_id, header.client_id, body, len(frame))


def _decode_produce(frame: bytes, api_version: int, correlation_id: int) -> Request:
    """The hot path: records stay memoryviews into the frame (see produce_request)."""
    try:
        client_id, pos = produce_request.read_header(frame, api_version)
        body = produce_request.decode(frame, api_version, pos)
    except ProtocolError as exc:
        raise ProtocolError(f"malformed api key {PRODUCE} v{api_version} request: {exc}") \
            from None
    return Request(PRODUCE, api_version, correlation_id, client_id, body, len(frame))


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
