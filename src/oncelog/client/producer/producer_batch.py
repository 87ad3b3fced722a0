"""A batch the producer fills record by record, and the futures of its records.

Records are encoded into the batch's buffer as they are produced (as Java's
MemoryRecordsBuilder does), so closing a batch is one compression call and a header; the
producer id, epoch and base sequence are stamped when the sender drains it, and stamped
again only if an epoch bump resequences it, or when its first records are split off to be
sent as a batch of their own (``split_head``: idempotence.py row 10). A batch's futures
settle once its own records and every split-off head's are settled.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c

from ...protocol import records
from ...protocol.record_batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER_SIZE,
    HEADER_STRUCT,
    TRANSACTIONAL_BIT,
)
from ...protocol.records import NONE, compress, decode_batch
from ...protocol.sequences import record_sequence
from ..network.connection import KafkaTimeout
from .fast_append import FutureBase

_IDENTITY = struct.Struct(">qhi")  # producer id, epoch, base sequence at offset 43
_IDENTITY_OFFSET = 43
_CRC = struct.Struct(">I")
log = logging.getLogger(__name__)
# Callbacks are added from the caller's thread and run from the sender's; one lock for all
# batches is enough, as it is held for a list append.
_CALLBACKS_LOCK = threading.Lock()

Headers = Sequence[tuple[str, bytes | None]] | dict[str, bytes | None] | None


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a record was stored; ``offset`` is -1 when the broker answered
    DUPLICATE_SEQUENCE_NUMBER (stored before, at an offset it no longer remembers) or the
    producer sent it with acks=0."""

    topic: str
    partition: int
    offset: int
    timestamp: int


EncodedHeaders = list[tuple[bytes, bytes | None]]


def encode_headers(headers: Headers) -> EncodedHeaders:
    """Headers as produce() takes them, as a record holds them; TypeError or ValueError for
    what cannot be a header (before any record is touched)."""
    items = headers.items() if isinstance(headers, dict) else headers or ()
    encoded = []
    for name, hvalue in items:
        if not isinstance(name, str):
            raise TypeError(f"a header name must be a str, not {type(name).__name__}")
        try:
            encoded_name = name.encode()
        except UnicodeEncodeError as exc:
            raise ValueError(f"header name {name!r}: {exc}") from None
        encoded.append((encoded_name,
                        None if hvalue is None else as_bytes(hvalue, "header value")))
    return encoded


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
        "_callbacks", "_done", "_error", "_event", "_loop_future", "ambiguous", "attempts",
        "base_offset", "base_sequence", "created", "data", "epoch", "heads", "in_flight",
        "maybe_stored", "owner", "partition", "records", "retry_at", "topic",
    )

    def __init__(self, topic: str, partition: int, created: float,
                 loop_future: Any = None) -> None:
        self.topic = topic
        self.partition = partition
        self.created = created
        self.records = records.RecordBuilder(HEADER_SIZE)
        self.data: bytearray | None = None   # the complete batch once closed
        self.base_sequence: int | None = None
        self.epoch = -1
        self.attempts = 0
        self.retry_at = 0.0
        self.in_flight = False
        self.maybe_stored = False  # it may be in the log: in flight now, or ambiguous
        # Why it may be in the log although the broker refused some attempt (an attempt got
        # no answer, ...): idempotence.py; None while every attempt was answered or refused.
        self.ambiguous: str | None = None
        self.base_offset: int | None = None
        self._error: BaseException | None = None
        self._done = False  # settled, its heads too: futures and callbacks have their outcome
        # Batches its first records were split off into, in record order (split_head), and
        # for such a head, the batch it came from.
        self.heads: list[ProducerBatch] = []
        self.owner: ProducerBatch | None = None
        # (index, on_delivery) of its records; None once run. A list from the start: the
        # fast path (_append.c) appends to this very list.
        self._callbacks: list[tuple[int, Callable]] | None = []
        self._event: threading.Event | None = None
        self._loop_future = loop_future

    @property
    def done(self) -> bool:
        return self._done

    @property
    def settled(self) -> bool:
        """Its own records have their outcome (split-off heads may still be on their way)."""
        return self.base_offset is not None or self._error is not None

    # Kept in the record builder, where produce()'s fast path (_append.c) reads and writes
    # them: see accumulator.py for who may change them and how.
    @property
    def closed(self) -> bool:
        """No record may join the batch any more."""
        return self.records.closed

    @closed.setter
    def closed(self, closed: bool) -> None:
        self.records.closed = closed

    @property
    def accounted(self) -> int:
        """Bytes buffer.memory counts for this batch."""
        return self.records.accounted

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else self.records.size

    @property
    def count(self) -> int:
        return self.records.count

    def append(self, timestamp: int | None, key: bytes | None, value: bytes | None,
               headers: EncodedHeaders | None) -> int:
        """Encode one record at the end (a timestamp of None is now); returns its index in
        the batch."""
        builder = self.records
        if not headers:
            return builder.append(timestamp, key, value)
        if timestamp is None:
            timestamp = records.now_ms()
        return builder.append_encoded(timestamp, records.encode_record(
            builder.count, builder.delta(timestamp), key, value, headers))

    def build(self, codec: int) -> None:
        """Compress and write the header (the identity is stamped later); call once the
        batch is closed to appends."""
        if self.data is not None:
            return
        builder = self.records
        buffer = builder.take_buffer()
        if codec == NONE:
            data = buffer
        else:
            data = bytearray(HEADER_SIZE)
            data += compress(codec, bytes(memoryview(buffer)[HEADER_SIZE:]))
        count = builder.count
        HEADER_STRUCT.pack_into(data, 0, 0, len(data) - 12, -1, 2, 0, codec, count - 1,
                          builder.base_ts, builder.max_ts, -1, -1, -1, count)
        self.data = data

    def stamp(self, producer_id: int, epoch: int, base_sequence: int,
              transactional: bool = False) -> None:
        """Write the producer identity (and the transactional attribute) into the header and
        recompute the CRC."""
        assert self.data is not None
        self.base_sequence = base_sequence
        self.epoch = epoch
        _IDENTITY.pack_into(self.data, _IDENTITY_OFFSET, producer_id, epoch, base_sequence)
        if transactional:
            self.data[ATTRIBUTES_OFFSET + 1] |= TRANSACTIONAL_BIT  # the low byte of the int16
        self.seal()

    def seal(self) -> None:
        assert self.data is not None
        _CRC.pack_into(self.data, CRC_OFFSET,
                       crc32c.crc32c(memoryview(self.data)[ATTRIBUTES_OFFSET:]))

    def split_head(self, count: int, codec: int) -> ProducerBatch:
        """Idempotence.py row 10: the first ``count`` records leave for a batch of their own
        (returned, not yet stamped), whose outcome will be theirs; this one keeps the rest."""
        assert self.data is not None and 0 < count < self.count
        _, decoded = decode_batch(self.data)
        head = ProducerBatch(self.topic, self.partition, self.created)
        head.owner = self
        for record in decoded[:count]:
            head.append(record.timestamp, record.key, record.value,
                        encode_headers(record.headers))
        head.closed = True
        head.build(codec)
        old, self.records = self.records, records.RecordBuilder(HEADER_SIZE)
        self.records.closed = True
        self.records.accounted = old.accounted  # what finished() releases
        for record in decoded[count:]:
            self.append(record.timestamp, record.key, record.value,
                        encode_headers(record.headers))
        self.heads.append(head)
        self.data = None
        self.build(codec)
        return head

    @property
    def total(self) -> int:
        """Records its futures count: its own and its split-off heads'."""
        return self.count + sum(head.total for head in self.heads)

    def _locate(self, index: int) -> tuple[ProducerBatch, int]:
        """The batch holding the record its futures call ``index``, and its index there."""
        for head in self.heads:
            size = head.total
            if index < size:
                return head._locate(index)
            index -= size
        return self, index

    @property
    def last_sequence(self) -> int:
        assert self.base_sequence is not None
        return record_sequence(self.base_sequence, self.count - 1)

    # --- completion ------------------------------------------------------------------------

    def add_callback(self, index: int, callback: Callable) -> None:
        with _CALLBACKS_LOCK:
            if not self.done:
                assert self._callbacks is not None  # None only once done
                self._callbacks.append((index, callback))
                return
        self._run(index, callback)

    def complete(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.data = None
        self._settle()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self.data = None
        self._settle()

    def _settle(self) -> None:
        if not self._done and self.settled and all(head.done for head in self.heads):
            self._finish()
            if self.owner is not None:
                self.owner._settle()

    def _finish(self) -> None:
        self._done = True
        with _CALLBACKS_LOCK:
            event = self._event
        if event is not None:
            event.set()
        if self._loop_future is not None and not self._loop_future.done():
            self._loop_future.set_result(None)
        with _CALLBACKS_LOCK:
            callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            # In record order, as Kafka runs them: RecordFuture.add_done_callback may add
            # one for an earlier record after later records' on_delivery.
            for index, callback in sorted(callbacks, key=operator.itemgetter(0)):
                self._run(index, callback)
            callbacks.clear()  # the fast path's entry for the batch may still hold the list

    def _run(self, index: int, callback: Callable) -> None:
        error = self.error_of(index)
        try:
            callback(error, None if error else self.metadata(index))
        except Exception:  # a user's callback must not kill the sender
            log.exception("on_delivery callback raised")

    def metadata(self, index: int) -> RecordMetadata:
        batch, index = self._locate(index)
        offset = -1 if batch.base_offset is None or batch.base_offset < 0 \
            else batch.base_offset + index
        return RecordMetadata(self.topic, self.partition, offset,
                              batch.records.timestamp(index))

    def error_of(self, index: int) -> BaseException | None:
        return self._locate(index)[0]._error

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
        error = self.error_of(index)
        if error is not None:
            raise error
        return self.metadata(index)

    @property
    def error(self) -> BaseException | None:
        """The error of its own records (a split-off head has its own)."""
        return self._error

    @property
    def loop_future(self) -> Any:
        return self._loop_future


class RecordFuture(FutureBase):
    """The delivery of one record: ``result()`` blocks (sync) or ``await`` (asyncio).
    ``RecordFuture(batch, index)``; its fields are FutureBase's, so that produce()'s fast
    path (_append.c) can make one without running Python code."""

    __slots__ = ()

    def done(self) -> bool:
        return self._batch.done

    def result(self, timeout: float | None = None) -> RecordMetadata:
        if not self._batch.wait(timeout):
            raise KafkaTimeout(f"record not delivered within {timeout}s")
        return self._batch.outcome(self._index)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._batch.wait(timeout):
            raise KafkaTimeout(f"record not delivered within {timeout}s")
        return self._batch.error_of(self._index)

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

