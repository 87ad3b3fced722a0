"""oncelog.Consumer: read partitions you assign, from offsets you choose, on any Kafka broker.

No consumer groups yet (assign and seek, as with confluent-kafka's ``assign``). Every record
carries what no Kafka consumer API shows: the producer id, epoch and sequence number its batch
gave it, so exactly-once can be checked record by record. Every codec is decompressed and,
with ``check.crcs`` (the default, as in Kafka), every batch's CRC32C is verified.

Config keys are Kafka's: ``bootstrap.servers``, ``client.id``, ``auto.offset.reset``
(earliest, latest, error), ``fetch.max.bytes``, ``max.partition.fetch.bytes``,
``fetch.wait.max.ms``, ``check.crcs``, ``isolation.level`` (read_uncommitted; read_committed
arrives with transactions), ``request.timeout.ms``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from ..protocol.batches import RecordSetError, RecordSetWalk
from . import calls
from .admin import Admin
from .connection import BrokerConnection, KafkaError
from .topic_partition import TopicPartition

EARLIEST, LATEST = calls.EARLIEST, calls.LATEST
_LEADER_ERRORS = (ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available,
                  ErrorCode.unknown_topic_or_partition, ErrorCode.fenced_leader_epoch)


class ConsumerRecord(NamedTuple):
    # A NamedTuple, not a dataclass: one is built per record consumed, and a tuple is built
    # in a fraction of the time.
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: str  # "CreateTime" or "LogAppendTime"
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    producer_id: int
    producer_epoch: int
    sequence: int  # -1 for records of producers without idempotence
    is_transactional: bool


_DEFAULTS = {
    "bootstrap.servers": "127.0.0.1:9092", "client.id": "oncelog-consumer",
    "auto.offset.reset": "latest", "fetch.max.bytes": 52_428_800,
    "max.partition.fetch.bytes": 1_048_576, "fetch.wait.max.ms": 500, "check.crcs": True,
    "isolation.level": "read_uncommitted", "request.timeout.ms": 30_000,
}


def _config(config: dict) -> dict:
    unknown = set(config) - set(_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown consumer config {', '.join(sorted(unknown))}")
    merged = {**_DEFAULTS, **config}
    if merged["auto.offset.reset"] not in ("earliest", "latest", "error"):
        raise ValueError("auto.offset.reset must be earliest, latest or error")
    if merged["isolation.level"] != "read_uncommitted":
        raise ValueError("isolation.level: only read_uncommitted until transactions exist")
    return merged


class Consumer:
    def __init__(self, config: dict) -> None:
        self.config = _config(config)
        self._timeout = int(self.config["request.timeout.ms"]) / 1000
        self._admin = Admin({"bootstrap.servers": self.config["bootstrap.servers"],
                             "client.id": self.config["client.id"],
                             "request.timeout.ms": str(self.config["request.timeout.ms"])})
        self._positions: dict[TopicPartition, int | None] = {}
        self._leaders: dict[TopicPartition, int] = {}
        self._connections: dict[int, BrokerConnection] = {}
        # Records fetched, not yet returned: self._buffered[self._next:].
        self._buffered: list[ConsumerRecord] = []
        self._next = 0
        # A Fetch sent ahead to each broker once its positions moved (the broker reads the
        # next ones while we decode and the caller handles these): the positions it asked
        # for, and its answer once read (read early when another call needs the connection).
        # Used only if the positions are still the ones to fetch from; dropped otherwise.
        self._ahead: dict[int, tuple[dict[tuple[str, int], int],
                                     calls.FetchResults | None]] = {}

    # --- assignment and positions ----------------------------------------------------------

    def assign(self, partitions: list[TopicPartition | tuple[str, int]],
               offsets: dict[TopicPartition, int] | None = None) -> None:
        """Consume exactly these partitions, from ``offsets`` or per auto.offset.reset."""
        wanted = [p if isinstance(p, TopicPartition) else TopicPartition(*p) for p in partitions]
        self._positions = {tp: (offsets or {}).get(tp) for tp in wanted}
        self._buffered, self._next = [], 0
        self._refresh_leaders()

    def assignment(self) -> list[TopicPartition]:
        return list(self._positions)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Next poll reads ``tp`` from ``offset`` (EARLIEST and LATEST work too)."""
        self._check_assigned(tp)
        if offset in (EARLIEST, LATEST):
            offset = self._list_offset(tp, offset)
        self._positions[tp] = offset
        self._buffered = [r for r in self._buffered[self._next:]
                          if (r.topic, r.partition) != (tp.topic, tp.partition)]
        self._next = 0

    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record poll will return for ``tp`` (as Kafka defines it)."""
        for record in self._buffered[self._next:]:
            if record.topic == tp.topic and record.partition == tp.partition:
                return record.offset
        return self._fetch_position(tp)

    def _fetch_position(self, tp: TopicPartition) -> int:
        self._check_assigned(tp)
        if self._positions[tp] is None:
            self._positions[tp] = self._reset(tp)
        return self._positions[tp]

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The first offset whose timestamp is at or after each timestamp (-1: none)."""
        return {tp: self._list_offset(tp, ts) for tp, ts in timestamps.items()}

    def watermarks(self, tp: TopicPartition) -> tuple[int, int]:
        return self._list_offset(tp, EARLIEST), self._list_offset(tp, LATEST)

    def _check_assigned(self, tp: TopicPartition) -> None:
        if tp not in self._positions:
            raise ValueError(f"{tp.topic}-{tp.partition} is not assigned")

    # --- polling ---------------------------------------------------------------------------

    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[ConsumerRecord]:
        """Up to ``max_records`` records, waiting at most ``timeout`` seconds for some."""
        if self._next >= len(self._buffered):
            self._buffered, self._next = [], 0
            deadline = time.monotonic() + timeout
            while True:
                self._fetch(max(0, deadline - time.monotonic()))
                if self._buffered or time.monotonic() >= deadline:
                    break
        start = self._next
        self._next = min(start + max_records, len(self._buffered))
        return self._buffered[start:self._next]

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Records until the end of every assigned partition (as of each fetch)."""
        while True:
            records = self.poll(timeout=0)
            if not records:
                if self._at_end():
                    return
                continue
            yield from records

    def _at_end(self) -> bool:
        return all(self._fetch_position(tp) >= self._list_offset(tp, LATEST)
                   for tp in self._positions)

    def _positions_by_leader(self) -> dict[int, dict[tuple[str, int], int]]:
        """Where to fetch each assigned partition from, grouped by its leader."""
        by_leader: dict[int, dict[tuple[str, int], int]] = {}
        for tp in self._positions:
            by_leader.setdefault(self._leaders[tp], {})[(tp.topic, tp.partition)] = \
                self._fetch_position(tp)
        return by_leader

    def _fetch(self, wait: float) -> None:
        by_leader = self._positions_by_leader()
        for leader in set(self._ahead) - set(by_leader):
            self._settle_ahead(leader)
        wait_ms = min(int(wait * 1000), int(self.config["fetch.wait.max.ms"]))
        moved = []
        for leader, positions in by_leader.items():
            try:
                results = self._ahead_results(leader, positions)
                if results is None:
                    results = calls.fetch_many(self._connection(leader), positions, wait_ms,
                                               *self._fetch_sizes())
            except KafkaError as exc:
                if exc.error not in (ErrorCode.network_exception, ErrorCode.request_timed_out):
                    raise
                # The broker went away (a restart, a new leader): reconnect on the next poll.
                self._drop_connection(leader)
                time.sleep(min(wait, 0.1))
                continue
            progressed = False
            for (topic, partition), (error, result) in results.items():
                progressed |= self._take(TopicPartition(topic, partition), error, result)
            if progressed:
                moved.append(leader)
        if moved:
            ahead = self._positions_by_leader()
            for leader in moved:
                if leader in ahead:  # still leads something after what these answers said
                    self._fetch_ahead(leader, ahead[leader])

    def _fetch_sizes(self) -> tuple[int, int]:
        return int(self.config["fetch.max.bytes"]), int(self.config["max.partition.fetch.bytes"])

    def _fetch_ahead(self, leader: int, positions: dict[tuple[str, int], int]) -> None:
        """Ask now for what follows the records just fetched from ``leader``. Without
        waiting on the broker's side: a poll that finds the answer empty fetches again,
        waiting as it asks."""
        try:
            calls.send_fetch(self._connection(leader), positions, 0, *self._fetch_sizes())
        except KafkaError:
            self._drop_connection(leader)  # the next poll connects again
            return
        self._ahead[leader] = (positions, None)

    def _ahead_results(self, leader: int, positions: dict[tuple[str, int], int]
                       ) -> calls.FetchResults | None:
        """The answer of the Fetch sent ahead to ``leader`` if it asked for ``positions``;
        None (the Fetch read and dropped) when it asked for something else."""
        ahead = self._ahead.get(leader)
        if ahead is None:
            return None
        results = self._settle_ahead(leader)
        return results if ahead[0] == positions else None

    def _settle_ahead(self, leader: int) -> calls.FetchResults | None:
        """Read the answer of the Fetch sent ahead to ``leader`` (if any) and forget it.
        A connection that fails meanwhile is dropped: None, and the caller fetches anew."""
        asked, results = self._ahead.pop(leader, (None, None))
        if asked is not None and results is None:
            try:
                results = calls.read_fetch(self._connections[leader])
            except KafkaError:
                self._drop_connection(leader)
        return results

    def _idle_connection(self, node: int) -> BrokerConnection:
        """The connection to ``node``, with the answer of a Fetch sent ahead read first (it
        is kept for the next poll): a call's answer must be the next one on the wire."""
        ahead = self._ahead.get(node)
        if ahead is not None and ahead[1] is None:
            results = self._settle_ahead(node)  # None: its connection failed, and is gone
            if results is not None:
                self._ahead[node] = (ahead[0], results)
        return self._connection(node)

    def _take(self, tp: TopicPartition, error: ErrorCode, result: calls.FetchResult) -> bool:
        """Buffer the records of one partition's fetch answer; whether its position moved."""
        if error == ErrorCode.offset_out_of_range:
            if self.config["auto.offset.reset"] == "error":
                raise KafkaError(error, f"{tp.topic}-{tp.partition} at {self._positions[tp]}")
            self._positions[tp] = self._reset(tp)
            return False
        if error in _LEADER_ERRORS:
            self._refresh_leaders()
            return False
        if error != ErrorCode.none:
            raise KafkaError(error, f"fetch {tp.topic}-{tp.partition}")
        position = self._positions[tp]
        walk = RecordSetWalk(result.records, position, check_crcs=self.config["check.crcs"])
        buffered = self._buffered
        try:
            for batch in walk:
                batch.append_records(buffered, ConsumerRecord, tp.topic, tp.partition)
        except RecordSetError as exc:
            raise KafkaError(ErrorCode.corrupt_message,
                             f"{tp.topic}-{tp.partition}: {exc}") from None
        if walk.partial and walk.position == position:
            # Brokers since KIP-74 always answer at least one whole batch; an older one cut
            # the only batch asked for at the size limit, so fetching again cannot help.
            raise KafkaError(ErrorCode.message_too_large,
                             f"{tp.topic}-{tp.partition}: the batch at offset {position} is "
                             "larger than max.partition.fetch.bytes / fetch.max.bytes")
        self._positions[tp] = walk.position
        return walk.position != position

    # --- cluster plumbing ------------------------------------------------------------------

    def _reset(self, tp: TopicPartition) -> int:
        policy = self.config["auto.offset.reset"]
        if policy == "error":
            raise KafkaError(ErrorCode.offset_out_of_range,
                             f"{tp.topic}-{tp.partition} has no position and "
                             "auto.offset.reset=error")
        return self._list_offset(tp, EARLIEST if policy == "earliest" else LATEST)

    def _list_offset(self, tp: TopicPartition, timestamp: int) -> int:
        return calls.list_offset(self._idle_connection(self._leaders[tp]), tp.topic,
                                 tp.partition, timestamp)

    def _refresh_leaders(self) -> None:
        topics = sorted({tp.topic for tp in self._positions})
        info = self._admin.metadata(topics) if topics else None
        self._brokers = info.brokers if info else {}
        for tp in self._positions:
            partitions = {p.index: p for p in info.topics[tp.topic].partitions}
            if tp.partition not in partitions:
                raise KafkaError(ErrorCode.unknown_topic_or_partition,
                                 f"{tp.topic}-{tp.partition} does not exist")
            self._leaders[tp] = partitions[tp.partition].leader

    def _connection(self, node: int) -> BrokerConnection:
        conn = self._connections.get(node)
        if conn is None:
            host, port = self._brokers[node]
            conn = BrokerConnection(host, port, self.config["client.id"], self._timeout)
            self._connections[node] = conn
        return conn

    def _drop_connection(self, node: int) -> None:
        self._ahead.pop(node, None)
        conn = self._connections.pop(node, None)
        if conn is not None:
            conn.close()
        try:
            self._admin.close()
            self._admin = Admin({"bootstrap.servers": self.config["bootstrap.servers"],
                                 "client.id": self.config["client.id"],
                                 "request.timeout.ms": str(self.config["request.timeout.ms"])})
            self._refresh_leaders()
        except KafkaError:
            pass  # still down: the next poll tries again

    def close(self) -> None:
        self._ahead.clear()
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()
        self._admin.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
