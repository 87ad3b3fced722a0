"""A batch the producer fills record by record, and the futures of its records.

Records are encoded into the batch's buffer as they are produced (as Java's
MemoryRecordsBuilder does), so closing a batch is one compression call and a header; the
producer id, epoch and base sequence are stamped when the sender drains it, and stamped
again only if an epoch bump resequences it.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c

from ..protocol import records as codec
from ..protocol.record_batch import ATTRIBUTES_OFFSET, CRC_OFFSET, HEADER_SIZE
from ..protocol.records import NONE, compress, decode_batch
from ..protocol.varint import SMALL_VARINTS as _SMALL
from ..protocol.varint import SMALL_VARINTS_END as _END
from ..protocol.varint import varint_bytes
from .connection import KafkaTimeout

_HEADER = struct.Struct(">qiibIhiqqqhii")
_IDENTITY = struct.Struct(">qhi")  # producer id, epoch, base sequence at offset 43
_IDENTITY_OFFSET = 43
_CRC = struct.Struct(">I")
_NO_KEY = varint_bytes(-1)
_NO_HEADERS = varint_bytes(0)
_ATTRIBUTES = b"\x00"
log = logging.getLogger(__name__)
_compiled_append = codec.compiled.append_record if codec.compiled is not None else None
# Callbacks are added from the caller's thread and run from the sender's; one lock for all
# batches is enough, as it is held for a list append.
_CALLBACKS_LOCK = threading.Lock()

Headers = Sequence[tuple[str, bytes | None]] | dict[str, bytes | None] | None


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a record was stored; ``offset`` is -1 when the broker answered
    DUPLICATE_SEQUENCE_NUMBER (stored before, at an offset it no longer remembers)."""

    topic: str
    partition: int
    offset: int
    timestamp: int


def encode_record(delta: int, ts_delta: int, key: bytes | None, value: bytes | None,
                  headers: Headers) -> bytes:
    """One record of a v2 batch, length prefix included."""
    parts = [_ATTRIBUTES, varint_bytes(ts_delta), varint_bytes(delta)]
    if key is None:
        parts.append(_NO_KEY)
    else:
        parts += (varint_bytes(len(key)), key)
    if value is None:
        parts.append(_NO_KEY)
    else:
        parts += (varint_bytes(len(value)), value)
    if not headers:
        parts.append(_NO_HEADERS)
    else:
        items = headers.items() if isinstance(headers, dict) else headers
        items = list(items)
        parts.append(varint_bytes(len(items)))
        for hkey, hvalue in items:
            name = hkey.encode()
            parts += (varint_bytes(len(name)), name)
            if hvalue is None:
                parts.append(_NO_KEY)
            else:
                hvalue = as_bytes(hvalue, "header value")
                parts += (varint_bytes(len(hvalue)), hvalue)
    body = b"".join(parts)
    return varint_bytes(len(body)) + body


def as_bytes(data: Any, what: str) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"{what} must be bytes, bytearray, memoryview or str, not "
                    f"{type(data).__name__}")


class ProducerBatch:
    """Records for one partition, from creation to acknowledgement."""

    __slots__ = (
        "_callbacks", "_error", "_event", "_loop_future", "accounted", "ambiguous", "attempts",
        "base_offset", "base_sequence", "base_ts", "buf", "closed", "count", "created", "data",
        "epoch", "in_flight", "max_ts", "maybe_stored", "partition", "retry_at",
        "skipped", "timestamps", "topic",
    )

    def __init__(self, topic: str, partition: int, created: float,
                 loop_future: Any = None) -> None:
        self.topic = topic
        self.partition = partition
        self.created = created
        self.buf = bytearray(HEADER_SIZE)
        self.count = 0
        self.accounted = 0  # bytes buffer.memory counts for this batch
        self.base_ts = 0
        self.max_ts = 0
        self.timestamps: list[int] = []
        self.closed = False
        self.data: bytearray | None = None   # the complete batch once closed
        self.base_sequence: int | None = None
        self.epoch = -1
        self.attempts = 0
        self.retry_at = 0.0
        self.in_flight = False
        self.maybe_stored = False  # it may be in the log: in flight now, or ambiguous
        self.ambiguous = False  # some attempt got no definite answer (sticky until settled)
        self.base_offset: int | None = None
        self.skipped = 0  # leading records found already stored (see drop_head)
        self._error: BaseException | None = None
        self._callbacks: list[tuple[int, Callable]] | None = None
        self._event: threading.Event | None = None
        self._loop_future = loop_future

    @property
    def done(self) -> bool:
        return self.base_offset is not None or self._error is not None

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else len(self.buf)

    def append(self, record_timestamp: int, key: bytes | None, value: bytes | None,
               headers: Headers) -> int:
        """Encode one record at the end; returns its index in the batch."""
        index = self.count
        if index == 0:
            self.base_ts = self.max_ts = record_timestamp
            ts_delta = 0
        else:
            if record_timestamp > self.max_ts:
                self.max_ts = record_timestamp
            ts_delta = record_timestamp - self.base_ts
        if headers:
            self.buf += encode_record(index, ts_delta, key, value, headers)
        elif _compiled_append is not None:
            _compiled_append(self.buf, index, ts_delta, key, value)
        else:
            key_len = -1 if key is None else len(key)
            value_len = -1 if value is None else len(value)
            if not (0 <= ts_delta < _END and index < _END and key_len < _END
                    and value_len < _END):
                self.buf += encode_record(index, ts_delta, key, value, headers)
            else:
                # The common record, written with table lookups and one join: this runs
                # once per produce() call.
                ts_bytes = _SMALL[ts_delta + 1]
                index_bytes = _SMALL[index + 1]
                key_bytes = _SMALL[key_len + 1]
                value_bytes = _SMALL[value_len + 1]
                body = (len(ts_bytes) + len(index_bytes) + len(key_bytes) + len(value_bytes)
                        + 2 + (key_len if key_len > 0 else 0)
                        + (value_len if value_len > 0 else 0))
                self.buf += b"".join((_SMALL[body + 1] if body < _END else varint_bytes(body),
                                      _ATTRIBUTES, ts_bytes, index_bytes, key_bytes,
                                      key or b"", value_bytes, value or b"", _NO_HEADERS))
        self.timestamps.append(record_timestamp)
        self.count = index + 1
        return index

    def build(self, codec: int) -> None:
        """Compress and write the header (the identity is stamped later); call once the
        batch is closed to appends."""
        if self.data is not None:
            return
        if codec == NONE:
            data = self.buf
        else:
            data = bytearray(HEADER_SIZE)
            data += compress(codec, bytes(memoryview(self.buf)[HEADER_SIZE:]))
        _HEADER.pack_into(data, 0, 0, len(data) - 12, -1, 2, 0, codec, self.count - 1,
                          self.base_ts, self.max_ts, -1, -1, -1, self.count)
        self.data = data
        self.buf = bytearray()

    def stamp(self, producer_id: int, epoch: int, base_sequence: int) -> None:
        """Write the producer identity into the header and recompute the CRC."""
        assert self.data is not None
        self.base_sequence = base_sequence
        self.epoch = epoch
        _IDENTITY.pack_into(self.data, _IDENTITY_OFFSET, producer_id, epoch, base_sequence)
        self.seal()

    def seal(self) -> None:
        assert self.data is not None
        _CRC.pack_into(self.data, CRC_OFFSET,
                       crc32c.crc32c(memoryview(self.data)[ATTRIBUTES_OFFSET:]))

    def drop_head(self, stored: int, codec: int) -> None:
        """The broker already holds this batch's first ``stored`` records (a resumed producer
        cut its batches differently): rebuild the batch from the rest. Their futures report
        offset -1, as for DUPLICATE_SEQUENCE_NUMBER."""
        assert self.data is not None and 0 < stored < self.count
        _, records = decode_batch(self.data)
        keep = records[stored:]
        self.buf = bytearray(HEADER_SIZE)
        self.count = 0
        for record in keep:
            self.append(record.timestamp, record.key, record.value, record.headers)
        del self.timestamps[-len(keep):]  # append() added them again
        self.skipped += stored
        self.data = None
        self.build(codec)

    @property
    def last_sequence(self) -> int:
        assert self.base_sequence is not None
        return (self.base_sequence + self.count - 1) & 0x7FFFFFFF

    # --- completion ------------------------------------------------------------------------

    def add_callback(self, index: int, callback: Callable) -> None:
        with _CALLBACKS_LOCK:
            if not self.done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append((index, callback))
                return
        self._run(index, callback)

    def complete(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self._finish()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._finish()

    def _finish(self) -> None:
        self.data = None
        with _CALLBACKS_LOCK:
            event = self._event
        if event is not None:
            event.set()
        if self._loop_future is not None and not self._loop_future.done():
            self._loop_future.set_result(None)
        with _CALLBACKS_LOCK:
            callbacks, self._callbacks = self._callbacks, None
        for index, callback in callbacks or ():
            self._run(index, callback)

    def _run(self, index: int, callback: Callable) -> None:
        try:
            callback(self._error, None if self._error else self.metadata(index))
        except Exception:  # a user's callback must not kill the sender
            log.exception("on_delivery callback raised")

    def metadata(self, index: int) -> RecordMetadata:
        offset = -1 if self.base_offset is None or self.base_offset < 0 \
            or index < self.skipped else self.base_offset + index - self.skipped
        return RecordMetadata(self.topic, self.partition, offset, self.timestamps[index])

    def wait(self, timeout: float | None) -> bool:
        if self.done:
            return True
        with _CALLBACKS_LOCK:  # one event however many threads wait
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if self.done:  # completed before the event existed: _finish did not see it
            return True
        return event.wait(timeout)

    def outcome(self, index: int) -> RecordMetadata:
        if self._error is not None:
            raise self._error
        return self.metadata(index)

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def loop_future(self) -> Any:
        return self._loop_future


class RecordFuture:
    """The delivery of one record: ``result()`` blocks (sync) or ``await`` (asyncio)."""

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: ProducerBatch, index: int) -> None:
        self._batch = batch
        self._index = index

    def done(self) -> bool:
        return self._batch.done

    def result(self, timeout: float | None = None) -> RecordMetadata:
        if not self._batch.wait(timeout):
            raise KafkaTimeout(f"record not delivered within {timeout}s")
        return self._batch.outcome(self._index)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._batch.wait(timeout):
            raise KafkaTimeout(f"record not delivered within {timeout}s")
        return self._batch.error

    def add_done_callback(self, fn: Callable[[RecordFuture], Any]) -> None:
        self._batch.add_callback(self._index, lambda _err, _meta: fn(self))

    def __await__(self):
        future = self._batch.loop_future
        if future is None:
            raise TypeError("await works on futures of oncelog.AIOProducer; "
                            "use .result() with oncelog.Producer")
        # Shielded: a caller that gives up on this record must not cancel the batch's
        # future, which every other record of the batch and flush() wait on.
        yield from asyncio.shield(future).__await__()
        return self._batch.outcome(self._index)

