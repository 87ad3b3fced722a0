"""TopicReader: reads offset ranges of one topic's partitions with the standard Kafka APIs only
(Metadata for each partition's leader, ListOffsets, Fetch), so it works against Kafka, Redpanda
or any other Kafka-compatible broker as well as oncelog. The audit and the Spark source read
through it; the batches come out of the one walk in ``protocol/batches.py``.

A read of ``[start, end)`` gets every batch holding an offset of the range, or fails saying why.
It never stops short quietly:

* Records proven deleted are data loss, reported to ``on_loss`` (which may raise) and skipped:
  the partition's log start moved past them (ListOffsets earliest, asked after an empty answer
  or an OFFSET_OUT_OF_RANGE), or the topic is gone. Nothing else is.
* Offsets the log legitimately lacks (control batches, compaction) are walked over.
* Anything else that keeps the read from moving on (a broker slow to answer or answering
  nothing, a log ending before ``end``, a leader that cannot be found) is waited out for at
  most ``poll_timeout`` seconds from the last progress, then a ``ReadTimeout`` that names the
  topic, partition and offsets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from ..protocol.batches import Batch, RecordSetError, RecordSetWalk
from ..protocol.records import Record
from .admin.admin import Admin
from .network import calls
from .network.connection import BrokerConnection, KafkaError, KafkaTimeout
from .network.security import ClientSecurity

log = logging.getLogger(__name__)

RETRIABLE = frozenset({
    ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available,
    ErrorCode.unknown_topic_or_partition, ErrorCode.fenced_leader_epoch,
    ErrorCode.unknown_leader_epoch, ErrorCode.network_exception, ErrorCode.request_timed_out,
    ErrorCode.kafka_storage_error, ErrorCode.offset_not_available,
    ErrorCode.replica_not_available,
})
MAX_FETCH_BYTES = 1 << 30  # a batch larger than this cannot be read
_LONG_POLL_MS = 500  # how long one Fetch may wait on the broker's side for records


class UnknownTopicOrPartition(KafkaError):
    """The topic, or a partition asked for, does not exist."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.unknown_topic_or_partition, message)
        self.detail = message


class ReadTimeout(KafkaTimeout):
    """A read made no progress for its whole poll timeout."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.detail = message


# Why records were lost (``Lost.reason``).
DELETED = "deleted (the log start moved past them)"
TOPIC_GONE = "gone with their topic"


class Lost(NamedTuple):
    """Offsets [first, end) of a partition that were deleted before they were read."""

    partition: int
    first: int
    end: int
    reason: str

    def describe(self, topic: str) -> str:
        return f"offsets {self.first}..{self.end - 1} of {topic}-{self.partition} were " \
               f"{self.reason} before they were read"


class TopicReader:
    """Reads partitions of one topic from their leaders, with the standard Kafka APIs.

    ``timeout`` bounds each request; ``attempts`` bounds the retries of a call outside a read
    (a read is bounded by its poll timeout instead).
    """

    def __init__(self, bootstrap: str, topic: str, timeout: float = 30.0,
                 max_bytes: int = 8 << 20, attempts: int = 8,
                 client_id: str = "oncelog-reader",
                 security: Mapping[str, str] | None = None) -> None:
        self.topic = topic
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.attempts = attempts
        self.client_id = client_id
        self.security = ClientSecurity.from_config(security or {})
        self._admin_config = {**(security or {}), "bootstrap.servers": bootstrap,
                              "request.timeout.ms": str(int(timeout * 1000)),
                              "client.id": client_id}
        self._conns: dict[int, BrokerConnection] = {}
        self.brokers: dict[int, tuple[str, int]] = {}
        self.leaders: dict[int, int] = {}
        self.admin = Admin(self._admin_config)
        try:
            self.refresh()
        except BaseException:
            self.close()
            raise

    def refresh(self) -> None:
        """Look up the topic's partitions and their leaders again."""
        try:
            try:
                info = self.admin.metadata([self.topic])
            except KafkaError as exc:
                if exc.error not in (ErrorCode.network_exception, ErrorCode.request_timed_out):
                    raise
                self.admin.close()  # the bootstrap broker dropped us: connect again, once
                self.admin = Admin(self._admin_config)
                info = self.admin.metadata([self.topic])
        except KafkaError as exc:
            if exc.error == ErrorCode.unknown_topic_or_partition:
                raise UnknownTopicOrPartition(f"topic {self.topic!r} does not exist") from None
            raise
        self.brokers = info.brokers
        self.leaders = {p.index: p.leader for p in info.topics[self.topic].partitions}

    @property
    def partitions(self) -> list[int]:
        return sorted(self.leaders)

    def _leader(self, partition: int) -> int:
        leader = self.leaders.get(partition, -1)
        if leader < 0 or leader not in self.brokers:
            raise KafkaError(ErrorCode.leader_not_available,
                             f"no leader for {self.topic}-{partition}")
        return leader

    def connect_leader(self, partition: int) -> BrokerConnection:
        """A new connection to the partition's leader, the caller's alone (to close)."""
        host, port = self.brokers[self._leader(partition)]
        return BrokerConnection(host, port, self.client_id, self.timeout, self.security)

    def _conn(self, partition: int) -> BrokerConnection:
        leader = self._leader(partition)
        conn = self._conns.get(leader)
        if conn is None:
            conn = self._conns[leader] = self.connect_leader(partition)
        return conn

    def _on_leader(self, partition: int, call: Callable[[BrokerConnection], object],
                   deadline: float | None = None):
        """``call`` on the partition's leader; on a leadership or network error, look the
        leader up again and retry with backoff: until ``deadline`` (time.monotonic()) when
        given, else at most ``attempts`` times."""
        attempt = 0
        while True:
            try:
                return call(self._conn(partition))
            except KafkaError as exc:
                if exc.error not in RETRIABLE:
                    raise
                attempt += 1
                pause = min(2.0, 0.1 * 2 ** (attempt - 1))
                if deadline is None:
                    if attempt >= self.attempts:
                        raise
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise
                    pause = min(pause, left)
                conn = self._conns.pop(self.leaders.get(partition, -1), None)
                if conn is not None:
                    conn.close()
                time.sleep(pause)
                try:
                    self.refresh()
                except UnknownTopicOrPartition:
                    raise
                except KafkaError as again:
                    if again.error not in RETRIABLE:
                        raise

    def offsets(self, partition: int, deadline: float | None = None) -> tuple[int, int]:
        """The partition's (log start offset, high watermark)."""
        start = self._on_leader(partition, lambda c: calls.list_offset(
            c, self.topic, partition, calls.EARLIEST), deadline)
        end = self._on_leader(partition, lambda c: calls.list_offset(
            c, self.topic, partition, calls.LATEST), deadline)
        return start, end

    def last_stable_offset(self, partition: int, deadline: float | None = None) -> int:
        """The partition's last stable offset (ListOffsets latest, read_committed)."""
        return self._on_leader(partition, lambda c: calls.list_offset(
            c, self.topic, partition, calls.LATEST, isolation_level=1), deadline)

    def ranges(self, partitions: Iterable[int] | None = None) -> dict[int, tuple[int, int]]:
        """(log start offset, high watermark) of each of ``partitions`` (default: all)."""
        indexes = self.partitions if partitions is None else list(dict.fromkeys(partitions))
        unknown = [p for p in indexes if p not in self.leaders]
        if unknown:
            raise UnknownTopicOrPartition(
                f"topic {self.topic!r} has no partition {', '.join(map(str, unknown))} "
                f"(it has {len(self.leaders)})")
        return {p: self.offsets(p) for p in indexes}

    def fetch(self, partition: int, offset: int, max_bytes: int, max_wait_ms: int = 100,
              deadline: float | None = None, isolation_level: int = 0) -> calls.FetchResult:
        return self._on_leader(partition, lambda c: calls.fetch(
            c, self.topic, partition, offset, max_wait_ms=max_wait_ms, max_bytes=max_bytes,
            isolation_level=isolation_level), deadline)

    def read(self, partition: int, start: int, end: int, *, poll_timeout: float | None = None,
             check_crcs: bool = True, skip_corrupt: bool = False,
             on_loss: Callable[[Lost], None] | None = None, isolation_level: int = 0,
             controls: bool = False) -> RangeRead:
        """The batches of ``partition`` holding offsets of [start, end): iterate the result.
        See the module's rules; ``poll_timeout`` defaults to the request timeout.
        ``isolation_level`` 1 reads as a read_committed consumer does (``end`` at most the
        last stable offset); ``controls`` yields the control batches too."""
        return RangeRead(self, partition, start, end,
                         self.timeout if poll_timeout is None else poll_timeout,
                         check_crcs, skip_corrupt, on_loss, isolation_level, controls)

    def record_at(self, partition: int, offset: int) -> Record | None:
        """The record at ``offset``, or None if there is none (gone, or never a record)."""
        try:
            result = self.fetch(partition, offset, 1 << 20)
            batch = next(iter(RecordSetWalk(result.records, offset, offset + 1)), None)
            fields = batch.record_fields() if batch is not None else []
        except (KafkaError, RecordSetError):
            return None
        base = batch.header.base_offset if batch is not None else 0
        for delta, ts_delta, key, value, headers in fields:
            if base + delta == offset:
                return Record(offset, batch.header.base_timestamp + ts_delta, key, value,
                              headers)
        return None

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        self.admin.close()

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RangeRead:
    """One read of [start, end) of a partition (``TopicReader.read``). Iterate for the batches;
    ``position`` is the next offset to read, ``corrupt_batches`` the batches skipped for their
    CRC (with ``skip_corrupt``), ``lost`` the offsets deleted before they were read."""

    def __init__(self, reader: TopicReader, partition: int, start: int, end: int,
                 poll_timeout: float, check_crcs: bool, skip_corrupt: bool,
                 on_loss: Callable[[Lost], None] | None, isolation_level: int = 0,
                 controls: bool = False) -> None:
        self.reader = reader
        self.isolation_level, self.controls = isolation_level, controls
        self.partition = partition
        self.start, self.end = start, end
        self.poll_timeout = poll_timeout
        self.check_crcs, self.skip_corrupt = check_crcs, skip_corrupt
        self.on_loss = on_loss
        self.position = start
        self.corrupt_batches = 0
        self.lost: list[Lost] = []
        self._ahead_conn: BrokerConnection | None = None
        self._ahead: tuple[int, int] | None = None  # (position, max bytes) of the Fetch sent

    @property
    def where(self) -> str:
        return f"{self.reader.topic}-{self.partition}"

    def __iter__(self) -> Iterator[Batch]:
        try:
            yield from self._batches()
        finally:
            self._drop_ahead()

    def _batches(self) -> Iterator[Batch]:
        reader = self.reader
        max_bytes = reader.max_bytes
        deadline = time.monotonic() + self.poll_timeout
        log_range: tuple[int, int] | None = None  # as last listed, for the timeout's message
        while self.position < self.end:
            position = self.position
            try:
                result = self._fetch(position, max_bytes, deadline)
                data = result.records
                aborted = result.aborted_transactions if self.isolation_level else None
            except UnknownTopicOrPartition:
                self._lose(position, self.end, TOPIC_GONE)
                return
            except KafkaError as exc:
                if exc.error in RETRIABLE:  # retried until the deadline
                    raise self._timeout(log_range, exc) from None
                if exc.error != ErrorCode.offset_out_of_range:
                    raise
                data, aborted = b"", None
            walk = RecordSetWalk(data, position, self.end, check_crcs=self.check_crcs,
                                 skip_corrupt=self.skip_corrupt, aborted=aborted,
                                 controls=self.controls)
            # The whole answer is walked (headers and CRCs, no records) before its batches
            # go out, so that the next Fetch is on its way while the caller reads them.
            walked: list[tuple[Batch, int, int]] = []
            failure: RecordSetError | None = None
            try:
                for batch in walk:
                    walked.append((batch, walk.position, walk.corrupt_batches))
            except RecordSetError as exc:
                failure = type(exc)(f"{self.where}: {exc}", exc.offset)
            if failure is None and position < walk.position < self.end:
                self._send_ahead(walk.position, max_bytes, deadline)
            corrupt = self.corrupt_batches
            for batch, after, skipped in walked:
                self.position = after
                self.corrupt_batches = corrupt + skipped
                yield batch
            if failure is not None:
                raise failure
            self.position = walk.position
            self.corrupt_batches = corrupt + walk.corrupt_batches
            if self.position > position:
                deadline = time.monotonic() + self.poll_timeout
                continue
            if walk.partial:  # one batch larger than max_bytes (brokers before KIP-74)
                if max_bytes >= MAX_FETCH_BYTES:
                    raise KafkaError(ErrorCode.message_too_large,
                                     f"the batch of {self.where} at offset {position} does not "
                                     f"fit in {MAX_FETCH_BYTES} bytes")
                max_bytes *= 2
                continue
            # Nothing at the position: either the records are gone (proven only by the log
            # start past them), or they are not there yet (wait, within the deadline).
            try:
                log_range = reader.offsets(self.partition, deadline)
            except UnknownTopicOrPartition:
                self._lose(position, self.end, TOPIC_GONE)
                return
            except KafkaError as exc:
                if exc.error not in RETRIABLE:
                    raise
                raise self._timeout(log_range, exc) from None
            if log_range[0] > position:
                self._lose(position, log_range[0], DELETED)
                deadline = time.monotonic() + self.poll_timeout
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._timeout(log_range)
            time.sleep(min(0.05, left))  # the next Fetch waits on the broker's side

    # A Fetch sent ahead goes on a connection of this read's own, so that no other call on
    # the reader's connections (another read, a ListOffsets) can take its answer. It is
    # only ever a head start: when it fails, or asked for other offsets than the read
    # wants, the read fetches through the reader (whose retries and errors are the rules).

    def _send_ahead(self, position: int, max_bytes: int, deadline: float) -> None:
        left_ms = int((deadline - time.monotonic()) * 1000)
        try:
            if self._ahead_conn is None:
                self._ahead_conn = self.reader.connect_leader(self.partition)
            calls.send_fetch(self._ahead_conn, {(self.reader.topic, self.partition): position},
                             max(0, min(_LONG_POLL_MS, left_ms)), max_bytes, max_bytes,
                             self.isolation_level)
        except KafkaError:
            self._drop_ahead()
            return
        self._ahead = (position, max_bytes)

    def _fetch(self, position: int, max_bytes: int, deadline: float) -> calls.FetchResult:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if ahead == (position, max_bytes):
                try:
                    return calls.fetch_result(calls.read_fetch(self._ahead_conn, reuse=True),
                                              self.reader.topic, self.partition, position)
                except KafkaError:
                    pass
            self._drop_ahead()  # its answer, if it comes, is not read
        left_ms = int((deadline - time.monotonic()) * 1000)
        return self.reader.fetch(self.partition, position, max_bytes,
                                 max(0, min(_LONG_POLL_MS, left_ms)), deadline,
                                 self.isolation_level)

    def _drop_ahead(self) -> None:
        self._ahead = None
        if self._ahead_conn is not None:
            self._ahead_conn.close()
            self._ahead_conn = None

    def _lose(self, first: int, end: int, reason: str) -> None:
        lost = Lost(self.partition, first, min(end, self.end), reason)
        self.lost.append(lost)
        self.position = lost.end
        if self.on_loss is not None:
            self.on_loss(lost)
        else:
            log.warning("%s", lost.describe(self.reader.topic))

    def _timeout(self, log_range: tuple[int, int] | None,
                 cause: Exception | None = None) -> ReadTimeout:
        holds = "" if log_range is None else \
            f"; the log holds offsets {log_range[0]}..{log_range[1] - 1}"
        why = "" if cause is None else f"; last error: {cause}"
        return ReadTimeout(f"reading offsets {self.start}..{self.end - 1} of {self.where}: no "
                           f"progress at offset {self.position} in {self.poll_timeout:g}s"
                           f"{holds}{why}")
