"""oncelog.Consumer: read partitions you assign, or join a consumer group, on any Kafka broker.

Two ways to say what to read, as in Kafka's consumers (and exclusive, as there):

- ``assign(partitions)`` and ``seek``: exactly these partitions. With a ``group.id`` their
  positions start from the group's committed offsets, and ``commit()`` works.
- ``subscribe(topics, on_assign=, on_revoke=, on_lost=)`` with a ``group.id``: the group's
  coordinator shares the partitions of the topics (names, or regular expressions written
  with Kafka's leading "^") among the group's members, Java and librdkafka consumers
  included, through Kafka's classic group protocol (``group.protocol=classic``, the default:
  classic_group.py, group_membership.py) or the consumer group protocol of KIP-848
  (``group.protocol=consumer``: consumer_group.py, consumer_group_membership.py), where the
  coordinator assigns (``group.remote.assignor``), resolves a regular expression (matching
  whole topic names, as Kafka does) and moves partitions one member at a time.
  Positions of newly assigned partitions come from the committed offsets, else
  ``auto.offset.reset``. The callbacks run inside poll() and get ``(consumer, partitions)``.
  ``on_lost`` (partitions someone else may own already; defaults to ``on_revoke``) is
  called instead of ``on_revoke`` when the membership was lost.

Every record carries what no Kafka consumer API shows: the producer id, epoch and sequence
number its batch gave it, so exactly-once can be checked record by record. Every codec is
decompressed and, with ``check.crcs`` (the default, as in Kafka), every batch's CRC32C is
verified.

Config keys are Kafka's: ``bootstrap.servers``, ``client.id``, ``auto.offset.reset``
(earliest, latest, error), ``fetch.max.bytes``, ``max.partition.fetch.bytes``,
``fetch.wait.max.ms``, ``check.crcs``, ``isolation.level`` (read_uncommitted, or
read_committed: only committed transactions' records, up to the last stable offset; the
walk of protocol/batches.py leaves out aborted transactions), ``request.timeout.ms``,
``retry.backoff.ms``, ``statistics.interval.ms`` and ``stats_cb`` (Kafka's consumer
metrics as JSON, from poll(): metrics.py); and for groups
``group.id``, ``group.instance.id`` (static membership, KIP-345), ``max.poll.interval.ms``
(300000; the rebalance timeout), ``enable.auto.commit`` (true), ``auto.commit.interval.ms``
(5000), ``group.protocol`` (classic or consumer, read as Java reads it, in any case); with
classic: ``session.timeout.ms`` (45000), ``heartbeat.interval.ms`` (3000),
``partition.assignment.strategy`` (range, roundrobin, cooperative-sticky; default
"range,cooperative-sticky" as Java's, which rebalances eagerly until every member lists
cooperative-sticky alone), ``metadata.max.age.ms`` (how often pattern subscriptions and
the leader's partition counts are looked at again); with consumer: ``group.remote.assignor``
(the coordinator's assignor: uniform, range; unset, the coordinator chooses). As Kafka's
ConsumerConfig does, each protocol's keys are refused (ValueError, Kafka's message) when set
with the other protocol.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from ...protocol.batches import RecordSetError, RecordSetWalk
from ..admin.admin import Admin, ClusterInfo
from ..metrics import ConsumerMetrics, StatsTimer
from ..network import calls
from ..network.connection import BrokerConnection, KafkaError
from ..network.security import SECURITY_DEFAULTS, SECURITY_KEYS, ClientSecurity
from ..producer.transactions import GroupMetadata
from ..topic_partition import OffsetAndMetadata, TopicPartition
from .assignors import parse_strategy
from .classic_group import ClassicGroup
from .consumer_group import ConsumerGroup
from .group_io import CommitCallback
from .group_membership import AssignmentChange, Handoff

log = logging.getLogger(__name__)

EARLIEST, LATEST = calls.EARLIEST, calls.LATEST
_INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
RebalanceCallback = Callable[["Consumer", list[TopicPartition]], None]
_ISOLATION_LEVELS = {"read_uncommitted": 0, "read_committed": 1}
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
    "retry.backoff.ms": 100, "metadata.max.age.ms": 300_000,
    "group.id": None, "group.instance.id": None, "group.protocol": "classic",
    "group.remote.assignor": None,
    "session.timeout.ms": 45_000, "heartbeat.interval.ms": 3_000,
    "max.poll.interval.ms": 300_000, "enable.auto.commit": True,
    "auto.commit.interval.ms": 5_000,
    "partition.assignment.strategy": "range,cooperative-sticky",
    "statistics.interval.ms": 0, "stats_cb": None,
    **SECURITY_DEFAULTS,
}
_INTS = ("fetch.max.bytes", "max.partition.fetch.bytes", "fetch.wait.max.ms",
         "request.timeout.ms", "retry.backoff.ms", "metadata.max.age.ms",
         "session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms",
         "auto.commit.interval.ms", "statistics.interval.ms")


def _as_bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise ValueError(f"{key} must be true or false, not {value!r}")


def _config(config: dict) -> dict:
    unknown = set(config) - set(_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown consumer config {', '.join(sorted(unknown))}")
    merged = {**_DEFAULTS, **config}
    merged["group.protocol"] = str(merged["group.protocol"]).lower()  # as Java reads it
    if merged["group.protocol"] not in ("classic", "consumer"):
        raise ValueError("group.protocol must be classic or consumer")
    _check_protocol_configs(merged["group.protocol"], config)
    if merged["auto.offset.reset"] not in ("earliest", "latest", "error"):
        raise ValueError("auto.offset.reset must be earliest, latest or error")
    if merged["isolation.level"] not in _ISOLATION_LEVELS:
        raise ValueError("isolation.level must be read_uncommitted or read_committed")
    if merged["stats_cb"] is not None and not callable(merged["stats_cb"]):
        raise ValueError("stats_cb must be a callable taking the statistics as JSON")
    for key in _INTS:
        try:
            merged[key] = int(merged[key])
        except (TypeError, ValueError):
            raise ValueError(f"{key} must be an integer, not {merged[key]!r}") from None
    merged["enable.auto.commit"] = _as_bool("enable.auto.commit", merged["enable.auto.commit"])
    parse_strategy(merged["partition.assignment.strategy"])
    if merged["group.instance.id"] and not merged["group.id"]:
        raise ValueError("group.instance.id needs a group.id")
    if merged["heartbeat.interval.ms"] >= merged["session.timeout.ms"]:
        raise ValueError("heartbeat.interval.ms must be lower than session.timeout.ms")
    return merged


# Kafka's ConsumerConfig refuses these, when set (not blank), with the other protocol: the
# consumer protocol's session, heartbeat interval and assignment are the broker's (its
# group.consumer.* settings), and the classic protocol has no server-side assignor.
_CLASSIC_ONLY = ("partition.assignment.strategy", "heartbeat.interval.ms", "session.timeout.ms")
_CONSUMER_ONLY = ("group.remote.assignor",)


def _check_protocol_configs(protocol: str, given: dict) -> None:
    refused = _CLASSIC_ONLY if protocol == "consumer" else _CONSUMER_ONLY
    invalid = [key for key in refused
               if given.get(key) is not None and str(given[key]).strip()]
    if invalid:
        # Kafka's ConfigException message
        raise ValueError(f"{', '.join(invalid)} cannot be set when "
                         f"group.protocol={protocol.upper()}")


class Consumer:
    def __init__(self, config: dict) -> None:
        self.config = _config(config)
        self._security = ClientSecurity.from_config(self.config)
        self._timeout = int(self.config["request.timeout.ms"]) / 1000
        self._isolation = _ISOLATION_LEVELS[self.config["isolation.level"]]
        self._metrics = ConsumerMetrics()
        self._stats = StatsTimer(self._metrics, self.config["client.id"],
                                 self.config["statistics.interval.ms"], self.config["stats_cb"])
        self._admin = self._new_admin()
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
        # Consumer groups: the membership (created with the first group call), what
        # subscribe() was given (topic names, patterns), its callbacks, partitions whose
        # position is to come from the committed offsets, and what was last committed.
        self._group: ClassicGroup | ConsumerGroup | None = None
        self._subscription: tuple[frozenset[str], tuple[re.Pattern, ...]] | None = None
        self._on_assign: RebalanceCallback | None = None
        self._on_revoke: RebalanceCallback | None = None
        self._on_lost: RebalanceCallback | None = None
        self._callback_error: BaseException | None = None
        self._needs_committed: set[TopicPartition] = set()
        self._last_committed: dict[TopicPartition, int] = {}
        self._metadata_due = 0.0
        self._metadata_checked = 0.0
        self._next_auto_commit = 0.0

    # --- assignment and positions ----------------------------------------------------------

    def assign(self, partitions: list[TopicPartition | tuple[str, int]],
               offsets: dict[TopicPartition, int] | None = None) -> None:
        """Consume exactly these partitions, from ``offsets``, else (with a group.id) the
        group's committed offsets, else per auto.offset.reset."""
        if self._subscription is not None:
            raise ValueError("assign() and subscribe() are exclusive: unsubscribe() first")
        wanted = [p if isinstance(p, TopicPartition) else TopicPartition(*p) for p in partitions]
        self._positions = {tp: (offsets or {}).get(tp) for tp in wanted}
        self._needs_committed = {tp for tp, offset in self._positions.items()
                                 if offset is None} if self.config["group.id"] else set()
        self._last_committed = {}
        self._buffered, self._next = [], 0
        self._refresh_leaders()

    def unassign(self) -> None:
        """Consume nothing (the partitions given to assign())."""
        if self._subscription is not None:
            raise ValueError("unassign() is for assign(); use unsubscribe()")
        self.assign([])

    def assignment(self) -> list[TopicPartition]:
        return list(self._positions)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Next poll reads ``tp`` from ``offset`` (EARLIEST and LATEST work too)."""
        self._check_assigned(tp)
        if offset in (EARLIEST, LATEST):
            offset = self._list_offset(tp, offset)
        self._positions[tp] = offset
        self._needs_committed.discard(tp)
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
        if tp in self._needs_committed:
            self._positions_from_committed()
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
        """Up to ``max_records`` records, waiting at most ``timeout`` seconds for some.

        In a group it also rebalances (the callbacks run here), commits automatically and
        heartbeats; it raises what a rebalance callback raised, once the rebalance is done,
        and a fatal group error (FENCED_INSTANCE_ID, ...) as KafkaError."""
        deadline = time.monotonic() + timeout
        if self._group is not None:
            self._group_poll(time.monotonic())
        if self._next >= len(self._buffered):
            self._buffered, self._next = [], 0
            while True:
                if self._positions:
                    self._fetch(max(0, deadline - time.monotonic()))
                else:
                    if self._subscription is not None:
                        self._group_poll(deadline)  # waits for a rebalance in flight
                    if not self._positions:  # nothing to read yet: idle, bounded
                        time.sleep(max(0.0, min(0.05, deadline - time.monotonic())))
                if self._buffered or time.monotonic() >= deadline:
                    break
                if self._group is not None:
                    self._group_poll(time.monotonic())
        self._raise_callback_error()
        self._stats.maybe_emit()
        start = self._next
        self._next = min(start + max_records, len(self._buffered))
        return self._buffered[start:self._next]

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Records until the end of every assigned partition (as of each fetch); subscribed,
        once the group has given this consumer its partitions."""
        while True:
            records = self.poll(timeout=0 if self._subscription is None else 0.1)
            if not records:
                if self._at_end():
                    return
                continue
            yield from records

    def _at_end(self) -> bool:
        if self._subscription is not None and not self._group.membership.stable:
            return False
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
                started = time.monotonic()
                results = self._ahead_results(leader, positions)
                if results is None:
                    results = calls.fetch_many(self._connection(leader), positions, wait_ms,
                                               *self._fetch_sizes(), self._isolation)
                latency = time.monotonic() - started
            except KafkaError as exc:
                if exc.error not in (ErrorCode.network_exception, ErrorCode.request_timed_out):
                    raise
                # The broker went away (a restart, a new leader): reconnect on the next poll.
                self._drop_connection(leader)
                time.sleep(min(wait, 0.1))
                continue
            progressed = False
            before = len(self._buffered)
            for (topic, partition), (error, result) in results.items():
                progressed |= self._take(TopicPartition(topic, partition), error, result)
            self._metrics.fetched(latency, len(self._buffered) - before,
                                  sum(len(r.records) for _, r in results.values()))
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
            calls.send_fetch(self._connection(leader), positions, 0, *self._fetch_sizes(),
                             self._isolation)
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
        walk = RecordSetWalk(result.records, position, check_crcs=self.config["check.crcs"],
                             aborted=result.aborted_transactions if self._isolation else None)
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
        end = result.last_stable_offset if self._isolation else result.high_watermark
        if end >= 0:
            self._metrics.lag((tp.topic, tp.partition), end - walk.position)
        return walk.position != position

    # --- consumer groups -------------------------------------------------------------------

    def subscribe(self, topics: str | re.Pattern | Iterable[str | re.Pattern],
                  on_assign: RebalanceCallback | None = None,
                  on_revoke: RebalanceCallback | None = None,
                  on_lost: RebalanceCallback | None = None) -> None:
        """Join the group (``group.id``) for these topics: names, or regular expressions
        (``re.Pattern``, or strings starting with "^" as in librdkafka) matched against the
        cluster's topics whenever metadata is refreshed (``metadata.max.age.ms``). A new
        subscription replaces the last one (and rebalances)."""
        if self._positions and self._subscription is None:
            raise ValueError("assign() and subscribe() are exclusive: unassign() first")
        group = self._require_group()
        if isinstance(topics, (str, re.Pattern)):
            topics = [topics]
        names: set[str] = set()
        patterns: list[re.Pattern] = []
        for topic in topics:
            if isinstance(topic, re.Pattern):
                patterns.append(topic)
            elif isinstance(topic, str) and topic.startswith("^"):
                patterns.append(re.compile(topic))
            elif isinstance(topic, str) and topic:
                names.add(topic)
            else:
                raise ValueError(f"not a topic name or pattern: {topic!r}")
        if not names and not patterns:
            raise ValueError("subscribe() needs topics (unsubscribe() to stop)")
        self._subscription = (frozenset(names), tuple(patterns))
        self._on_assign, self._on_revoke, self._on_lost = on_assign, on_revoke, on_lost
        self._metadata_due = 0.0
        self._refresh_subscription()
        group.membership.on_poll(time.monotonic())

    def unsubscribe(self) -> None:
        """Give the partitions back (on_revoke, after committing if enable.auto.commit) and
        leave the group."""
        if self._subscription is None:
            return
        self._leave_group("the consumer unsubscribed")
        self._subscription = None
        with self._group.lock:
            self._group.membership.set_subscription(())

    def commit(self, offsets: dict[TopicPartition, int | OffsetAndMetadata | tuple] | None = None,
               asynchronous: bool = False, callback: CommitCallback | None = None
               ) -> dict[TopicPartition, OffsetAndMetadata]:
        """Commit ``offsets`` (partition -> next offset to read, or OffsetAndMetadata /
        (offset, metadata)) or, by default, the position of every assigned partition after
        the records poll() returned. Synchronous: retries what may succeed, raises
        KafkaError otherwise (REBALANCE_IN_PROGRESS during a rebalance, ILLEGAL_GENERATION or
        UNKNOWN_MEMBER_ID when the group moved on). ``asynchronous=True``: returns at once;
        ``callback(error or None, offsets)`` runs inside a later poll(), commit() or close().
        Returns the offsets committed (or being committed)."""
        group = self._require_group()
        if offsets is None:
            chosen = {tp: OffsetAndMetadata(o)
                      for tp, o in self._consumed_positions(self._positions).items()}
        else:
            chosen = {TopicPartition(*tp): _offset_and_metadata(value)
                      for tp, value in offsets.items()}
        if not chosen:
            if asynchronous and callback is not None:
                callback(None, {})
            return {}
        identity = group.commit_identity(self._subscription is not None)
        if asynchronous:
            group.commit(chosen, identity, self._track_commit(callback))
        else:
            group.commit(chosen, identity)
            self._last_committed.update({tp: c.offset for tp, c in chosen.items()})
            group.run_callbacks()
        return chosen

    def consumer_group_metadata(self) -> GroupMetadata:
        """What a transactional producer's send_offsets_to_transaction() needs to commit
        this consumer's offsets in its transaction (KIP-447): the group, and this member's
        generation, member id and group instance id (no member for assign()). Raises
        REBALANCE_IN_PROGRESS between generations: offsets sent then would be refused."""
        group = self._require_group()
        identity = group.commit_identity(self._subscription is not None)
        return GroupMetadata(self.config["group.id"], identity.generation, identity.member_id,
                             identity.instance_id)

    def metrics(self) -> dict[str, float]:
        """Kafka's consumer metrics by name (metrics.py)."""
        return self._metrics.snapshot()

    def committed(self, partitions: Iterable[TopicPartition | tuple[str, int]],
                  timeout: float | None = None) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets (None where it committed nothing)."""
        wanted = [TopicPartition(*tp) for tp in partitions]
        return self._require_group().committed(wanted, timeout)

    def _require_group(self) -> ClassicGroup | ConsumerGroup:
        if self._group is None:
            if not self.config["group.id"]:
                raise ValueError("consumer groups, commit() and committed() need a group.id")
            if self.config["group.protocol"] == "consumer":
                self._group = ConsumerGroup(self.config, self)
            else:
                self._group = ClassicGroup(self.config, self)
        return self._group

    def _group_poll(self, deadline: float) -> None:
        """The group's part of poll(): rebalance (waiting up to ``deadline`` for answers in
        flight), auto commit, commit callbacks, committed offsets of new partitions."""
        group = self._group
        stable = True
        if self._subscription is not None:
            self._refresh_subscription()
            stable = group.ensure_active(deadline)
        group.serve()
        if stable:
            self._maybe_auto_commit()
        if self._needs_committed:
            self._positions_from_committed()

    def _refresh_subscription(self) -> None:
        """Match the patterns against the cluster's topics, and as the group's leader watch
        the partition counts it assigned from (either change means a rebalance)."""
        now = time.monotonic()
        names, patterns = self._subscription
        membership = self._group.membership
        if isinstance(self._group, ConsumerGroup):
            # The coordinator matches the regular expression (the whole topic name, as
            # Kafka does) and follows topics as they come and go.
            regex = "|".join(f"(?:{p.pattern})" if len(patterns) > 1 else p.pattern
                             for p in patterns) or None
            with self._group.lock:
                membership.set_subscription(names, regex)
            return
        with self._group.lock:
            watched = (dict(membership.assigned_counts)
                       if membership.stable and membership.member_id == membership.leader
                       else {})
        due = self._metadata_due
        if 0 in watched.values():  # a subscribed topic does not exist yet: look every second
            due = min(due, self._metadata_checked + 1.0)
        if now < due:
            return
        self._metadata_checked = now
        self._metadata_due = now + self.config["metadata.max.age.ms"] / 1000
        topics = set(names)
        if patterns or watched:
            try:
                info = self._cluster()
            except KafkaError as exc:
                log.warning("group %s: metadata: %s", self.config["group.id"], exc)
                self._metadata_due = now + self.config["retry.backoff.ms"] / 1000
                return
            topics |= {t for t in info.topics if t not in _INTERNAL_TOPICS
                       and any(p.search(t) for p in patterns)}
            counts = {t: len(info.topics[t].partitions) if t in info.topics else 0
                      for t in watched}
            if counts != watched:
                with self._group.lock:
                    membership.request_rejoin(f"partition counts changed: {counts}")
        with self._group.lock:
            membership.set_subscription(topics)

    def _positions_from_committed(self) -> None:
        pending = sorted(self._needs_committed)
        committed = self._require_group().committed(pending)
        for tp in pending:
            if tp in self._needs_committed and tp in self._positions:
                found = committed.get(tp)
                self._positions[tp] = found.offset if found is not None else None
                if found is not None:
                    self._last_committed[tp] = found.offset
        self._needs_committed.difference_update(pending)

    def _consumed_positions(self, partitions: Iterable[TopicPartition]
                            ) -> dict[TopicPartition, int]:
        """Per partition with a position: the offset after the records poll() returned."""
        first_unread: dict[tuple[str, int], int] = {}
        for record in self._buffered[self._next:]:
            first_unread.setdefault((record.topic, record.partition), record.offset)
        result = {}
        for tp in partitions:
            position = self._positions.get(tp)
            if position is not None and tp not in self._needs_committed:
                result[tp] = first_unread.get(tp, position)
        return result

    def _uncommitted(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition,
                                                                          OffsetAndMetadata]:
        return {tp: OffsetAndMetadata(o)
                for tp, o in self._consumed_positions(partitions).items()
                if self._last_committed.get(tp) != o}

    def _track_commit(self, callback: CommitCallback | None) -> CommitCallback:
        def done(error: KafkaError | None, offsets: dict[TopicPartition, OffsetAndMetadata]):
            if error is None:
                self._last_committed.update({tp: c.offset for tp, c in offsets.items()})
            elif callback is None:
                log.warning("group %s: commit failed: %s", self.config["group.id"], error)
            if callback is not None:
                callback(error, offsets)

        return done

    def _maybe_auto_commit(self) -> None:
        if not self.config["enable.auto.commit"]:
            return
        now = time.monotonic()
        if now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self.config["auto.commit.interval.ms"] / 1000
        offsets = self._uncommitted(self._positions)
        if offsets:
            try:
                identity = self._group.commit_identity(self._subscription is not None)
            except KafkaError:
                return  # rebalancing: the revocation commits
            self._group.commit(offsets, identity, self._track_commit(None))

    def _commit_quietly(self, partitions: Iterable[TopicPartition]) -> None:
        """enable.auto.commit's commit before partitions are given up; a failure is logged
        (their records may be read again by their next owner, never skipped)."""
        if not self.config["enable.auto.commit"]:
            return
        offsets = self._uncommitted(partitions)
        if not offsets:
            return
        try:
            identity = self._group.commit_identity(self._subscription is not None)
            self._group.commit(offsets, identity)
            self._last_committed.update({tp: c.offset for tp, c in offsets.items()})
        except KafkaError as exc:
            log.warning("group %s: commit before giving partitions up: %s",
                        self.config["group.id"], exc)

    # What the group tells the consumer (classic_group.GroupListener), in poll()'s thread.

    def group_handoff(self, handoff: Handoff) -> None:
        if handoff.revoked:
            self._revoke(handoff.revoked)
        if handoff.lost:
            self._lose(handoff.lost)

    def group_assigned(self, change: AssignmentChange) -> None:
        if change.revoked:
            self._revoke(change.revoked)
        for tp in change.added:
            self._positions[tp] = None
            self._needs_committed.add(tp)
        if change.added:
            self._refresh_leaders()
        self._user_callback(self._on_assign, change.added)

    def group_partition_counts(self, topics: frozenset[str]) -> dict[str, int]:
        info = self._cluster()
        return {t: len(info.topics[t].partitions) for t in topics if t in info.topics}

    def group_topic_names(self) -> dict[uuid.UUID, str]:
        """Every topic's id and name (the consumer protocol assigns topic ids)."""
        try:
            return calls.topic_names(self._admin.conn)
        except KafkaError as exc:
            if exc.error not in (ErrorCode.network_exception, ErrorCode.request_timed_out):
                raise
            self._admin.close()
            self._admin = self._new_admin()
            return calls.topic_names(self._admin.conn)

    def _revoke(self, partitions: frozenset[TopicPartition]) -> None:
        self._commit_quietly(partitions)
        self._user_callback(self._on_revoke, partitions)
        self._forget(partitions)

    def _lose(self, partitions: frozenset[TopicPartition]) -> None:
        self._user_callback(self._on_lost or self._on_revoke, partitions)
        self._forget(partitions)

    def _forget(self, partitions: frozenset[TopicPartition]) -> None:
        for tp in partitions:
            self._positions.pop(tp, None)
            self._metrics.forget((tp.topic, tp.partition))
            self._leaders.pop(tp, None)
            self._needs_committed.discard(tp)
            self._last_committed.pop(tp, None)
        self._buffered = [r for r in self._buffered[self._next:]
                          if (r.topic, r.partition) not in partitions]
        self._next = 0

    def _user_callback(self, callback: RebalanceCallback | None,
                       partitions: frozenset[TopicPartition]) -> None:
        if callback is None:
            return
        try:
            callback(self, sorted(partitions))
        except Exception as exc:  # raised from poll() once the rebalance is done (as Kafka)
            log.exception("group %s: rebalance callback", self.config["group.id"])
            if self._callback_error is None:
                self._callback_error = exc

    def _raise_callback_error(self) -> None:
        error, self._callback_error = self._callback_error, None
        if error is not None:
            raise error

    def _leave_group(self, reason: str) -> None:
        group = self._group
        with group.lock:
            handoff = group.membership.prepare_leave()
        self.group_handoff(handoff)
        group.leave(reason)


    # --- cluster plumbing ------------------------------------------------------------------

    def _new_admin(self) -> Admin:
        return Admin({"bootstrap.servers": self.config["bootstrap.servers"],
                      "client.id": self.config["client.id"],
                      "request.timeout.ms": str(self.config["request.timeout.ms"]),
                      **{k: v for k in SECURITY_KEYS if (v := self.config[k]) is not None}})

    def _cluster(self) -> ClusterInfo:
        """Every topic's metadata (a broker that went away is reconnected to once)."""
        try:
            return self._admin.metadata(None)
        except KafkaError as exc:
            if exc.error not in (ErrorCode.network_exception, ErrorCode.request_timed_out):
                raise
            self._admin.close()
            self._admin = self._new_admin()
            return self._admin.metadata(None)

    def _reset(self, tp: TopicPartition) -> int:
        policy = self.config["auto.offset.reset"]
        if policy == "error":
            raise KafkaError(ErrorCode.offset_out_of_range,
                             f"{tp.topic}-{tp.partition} has no position and "
                             "auto.offset.reset=error")
        return self._list_offset(tp, EARLIEST if policy == "earliest" else LATEST)

    def _list_offset(self, tp: TopicPartition, timestamp: int) -> int:
        return calls.list_offset(self._idle_connection(self._leaders[tp]), tp.topic,
                                 tp.partition, timestamp, self._isolation)

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
            conn = BrokerConnection(host, port, self.config["client.id"], self._timeout,
                                    self._security)
            self._connections[node] = conn
        return conn

    def _drop_connection(self, node: int) -> None:
        self._ahead.pop(node, None)
        conn = self._connections.pop(node, None)
        if conn is not None:
            conn.close()
        try:
            self._admin.close()
            self._admin = self._new_admin()
            self._refresh_leaders()
        except KafkaError:
            pass  # still down: the next poll tries again

    def close(self) -> None:
        """Commit (enable.auto.commit), give the partitions back (on_revoke) and leave the
        group (a static member stays, as in Kafka), then close the connections."""
        group = self._group
        if group is not None and not group.closed:
            try:
                if self._subscription is not None:
                    self._leave_group("the consumer is closing")
                else:
                    self._commit_quietly(self._positions)
                group.flush_commits(self._timeout)
            except KafkaError as exc:
                log.warning("group %s: while closing: %s", self.config["group.id"], exc)
            finally:
                group.close()
        self._ahead.clear()
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()
        self._admin.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _offset_and_metadata(value: int | OffsetAndMetadata | tuple) -> OffsetAndMetadata:
    if isinstance(value, int):
        return OffsetAndMetadata(value)
    return OffsetAndMetadata(*value)
