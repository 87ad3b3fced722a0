"""The group coordinator: Kafka's classic group protocol and committed offsets.

Every group lives in one partition of ``__consumer_offsets`` (``partition_for``); what the
coordinator knows about a group is rebuilt from that partition's records (``load``) and every
change is written there before it is answered (``OffsetsLog``), so nothing is kept only in
memory: a restart reads the same groups and offsets back. A write that fails changes
nothing in memory.

Requests that must wait (JoinGroup until the rebalance completes, SyncGroup until the leader
has assigned, OffsetCommit until its records are durable) are coroutines; timers (sessions,
rebalance timeouts, the initial rebalance delay) run on the event loop. Each Kafka error is
decided in one place, named after the request it answers.

Writes and decisions: a decision is taken, its records appended and memory changed in one
step, before anything is awaited; what is awaited afterwards is only durability, before the
answer. A request arriving while a write is in flight therefore decides on the state that
write left, never on the state before it (Kafka's coordinator runtime does the same with
its timeline), and nothing is decided twice on one state. The one decision taken after an
await is S11's, as in Kafka, and only if the group is still where it was (state and
generation). An append the log refuses changes nothing (or is undone before anything else
ran); a write that fails to become durable is answered as internal_log.durable_error says
(NOT_COORDINATOR for a failed fsync, as Kafka answers it). Offsets are served only once
durable: a commit waits aside until its write is (offset_rules O7-O9), and a failed write's
offsets are dropped, never answered to an OffsetFetch.

The classic protocol (Kafka's ClassicGroup and GroupMetadataManager), in the order the
checks are made. Before every row: an empty or too long group id INVALID_GROUP_ID; a
partition this coordinator does not serve answers as ownership.py says (loading:
COORDINATOR_LOAD_IN_PROGRESS; in a cluster, led by another broker: NOT_COORDINATOR). "gen": the
request's generation; "cur": the group's; "Completing": CompletingRebalance; "Preparing":
PreparingRebalance; "rebalance": Empty/Stable/Completing -> Preparing (waiting SyncGroups
answered REBALANCE_IN_PROGRESS). The tests: test_group_model.py holds the rows against a
model, test_group_coordinator.py the flows.

    JoinGroup
    | # | group / member                                | answer, next state                   |
    |---|-----------------------------------------------|--------------------------------------|
    |J0 | session timeout outside the broker's bounds / | INVALID_SESSION_TIMEOUT / INCONSIST- |
    |   | no protocol type or none / a string too long  | ENT_GROUP_PROTOCOL / INVALID_REQUEST |
    |J1 | consumer group with members                   | a classic member of it (group_       |
    |   |                                               | migration.py M3-M5)                  |
    |J2 | consumer group, empty                         | its records deleted and a classic    |
    |   |                                               | group put in its place (same step),  |
    |   |                                               | then as J5-J9                        |
    |J3 | no group, member id given                     | UNKNOWN_MEMBER_ID                    |
    |J4 | Dead                                          | COORDINATOR_NOT_AVAILABLE            |
    |J5 | protocol type or names do not fit the group   | INCONSISTENT_GROUP_PROTOCOL          |
    |J6 | no member id, static instance known (KIP-345) | takes the old member's place under a |
    |   |                                               | new id, the old id fenced; Stable and|
    |   |                                               | the protocol unchanged: group record |
    |   |                                               | written (refused: undone), answered  |
    |   |                                               | at cur (leader told to skip); else   |
    |   |                                               | waits (Preparing) or rebalance       |
    |J7 | no member id, group full                      | GROUP_MAX_SIZE_REACHED               |
    |J8 | no member id, require_known_member_id         | MEMBER_ID_REQUIRED, the id pending   |
    |J9 | no member id                                  | added, rebalance, waits              |
    |J10| static instance owned by another id           | FENCED_INSTANCE_ID                   |
    |J11| a pending member id (J8)                      | added, rebalance, waits              |
    |J12| not a member, or Empty                        | UNKNOWN_MEMBER_ID                    |
    |J13| Preparing                                     | protocols updated, waits             |
    |J14| Completing, same protocols                    | answered at cur (a lost answer)      |
    |J15| Completing, other protocols                   | rebalance, waits                     |
    |J16| Stable, the leader or other protocols         | rebalance, waits                     |
    |J17| Stable, a follower, same protocols            | answered at cur                      |
    |J18| Preparing, every member waits in JoinGroup    | cur+1; no members: Empty (record     |
    |   | (or the rebalance timeout: the others dropped)|  written); else Completing, every    |
    |   |                                               |  waiting JoinGroup answered          |

    SyncGroup (S1-S5 also Heartbeat's first checks)
    |S0 | a consumer group with members                 | group_migration.py M6 (Heartbeat M7) |
    |S1 | no group, or an empty consumer group          | UNKNOWN_MEMBER_ID                    |
    |S2 | Dead                                          | COORDINATOR_NOT_AVAILABLE            |
    |S3 | static instance owned by another id           | FENCED_INSTANCE_ID                   |
    |S4 | not a member                                  | UNKNOWN_MEMBER_ID                    |
    |S5 | gen != cur                                    | ILLEGAL_GENERATION                   |
    |S6 | protocol type or name not the group's         | INCONSISTENT_GROUP_PROTOCOL          |
    |S7 | Empty                                         | UNKNOWN_MEMBER_ID                    |
    |S8 | Preparing                                     | REBALANCE_IN_PROGRESS                |
    |S9 | Stable                                        | its assignment                       |
    |S10| Completing, a follower                        | waits (a second SyncGroup of the same|
    |   |                                               | member: the first REBALANCE_IN_PROG.)|
    |S11| Completing, the leader                        | waits; the assignment record written:|
    |   |                                               | refused or not durable -> the waiting|
    |   |                                               | SyncGroups get the error, rebalance; |
    |   |                                               | durable and still Completing at that |
    |   |                                               | gen -> Stable, all answered          |
    |S12| Completing, the leader again while S11's write| waits for that write's outcome (the  |
    |   | is in flight                                  | first REBALANCE_IN_PROGRESS, as S10) |

    Heartbeat: S1-S5, then Empty UNKNOWN_MEMBER_ID, Preparing REBALANCE_IN_PROGRESS, else
    NONE (the session restarts).

    Session expiry (a member's session ends: Heartbeat, JoinGroup and SyncGroup restart it;
    a new member rejoining in Preparing has NEW_MEMBER_JOIN_TIMEOUT_MS)
    |H1 | no longer a member of the group (left, fenced,| nothing                              |
    |   | dropped, replaced)                            |                                      |
    |H2 | waiting in JoinGroup or SyncGroup             | alive: its session starts again      |
    |H3 | otherwise                                     | removed as by LeaveGroup (below):    |
    |   |                                               | Stable/Completing -> rebalance, and  |
    |   |                                               | J18 if the others all wait           |

    LeaveGroup, per member (a consumer group: group_migration.py M8; no group:
    UNKNOWN_MEMBER_ID each; Dead:
    COORDINATOR_NOT_AVAILABLE): an instance id alone finds its member id; FENCED_INSTANCE_ID
    as S3; a pending id is forgotten; not a member UNKNOWN_MEMBER_ID; else removed (its
    waiting requests answered UNKNOWN_MEMBER_ID), Stable/Completing -> rebalance, and J18
    if the others all wait.

    OffsetCommit, TxnOffsetCommit (Kafka's validateOffsetCommit; "anonymous": gen < 0, no
    member id, no instance id)
    |C1 | consumer group                                | member epoch rules (consumer_group); |
    |   |                                               | anonymous TxnOffsetCommit accepted   |
    |C2 | no group or Dead                              | gen < 0 accepted (the group made),   |
    |   |                                               | else ILLEGAL_GENERATION              |
    |C3 | Empty, gen < 0                                | accepted                             |
    |C4 | not anonymous: instance unknown / owned by    | UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ |
    |   | another id / not a member                     | ID / UNKNOWN_MEMBER_ID               |
    |C5 | not anonymous, gen != cur                     | ILLEGAL_GENERATION                   |
    |C6 | anonymous OffsetCommit, not Empty             | UNKNOWN_MEMBER_ID                    |
    |C7 | Completing (after C4-C6)                      | REBALANCE_IN_PROGRESS                |
    |C8 | otherwise                                     | per partition: unknown one UNKNOWN_  |
    |   |                                               | TOPIC_OR_PARTITION, metadata too long|
    |   |                                               | OFFSET_METADATA_TOO_LARGE; the rest  |
    |   |                                               | appended and replayed (offset_rules  |
    |   |                                               | O1, or O7-O9 while its write is not  |
    |   |                                               | durable / O3), answered once durable |

    Deleting (each writes tombstones for the committed and the pending transactional
    offsets it removes, offset_rules O2)
    |D1 | DeleteGroups: no group or Dead                | GROUP_ID_NOT_FOUND                   |
    |D2 | DeleteGroups: not Empty                       | NON_EMPTY_GROUP                      |
    |D3 | DeleteGroups: Empty                           | offsets and group record deleted     |
    |D4 | OffsetDelete: no group or Dead                | GROUP_ID_NOT_FOUND                   |
    |D5 | OffsetDelete: members whose subscriptions     | NON_EMPTY_GROUP                      |
    |   | cannot be read                                |                                      |
    |D6 | OffsetDelete: a subscribed topic / unknown    | GROUP_SUBSCRIBED_TO_TOPIC / UNKNOWN_ |
    |   | partition                                     | TOPIC_OR_PARTITION (that partition)  |
    |D7 | OffsetDelete: otherwise                       | deleted                              |
    |D8 | a topic deleted                               | every group's offsets of it deleted  |
    |D9 | expiry: Empty group, offset past retention    | deleted, unless a transaction holds a|
    |   |                                               | pending offset there; the group too  |
    |   |                                               | when nothing is left                 |
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ..internal_log import (
    KeysByPartition,
    OffsetsLog,
    WriteFailed,
    durable_error,
    partition_for,
)
from ..ownership import Load, Ownership, Status, load_each, load_retrying
from . import consumer_records, group_migration, offset_rules
from . import group_records as rec
from .classic_answers import JoinResult, SyncResult, new_member_id
from .classic_group import (
    NO_ENTRIES,
    ClassicGroup,
    GroupState,
    Member,
    flat_protocols,
    shared_name,
    shared_number,
)
from .consumer_coordinator import ConsumerGroupCoordinator
from .consumer_group import ConsumerGroup, ConsumerGroupConfig, TopicImage
from .session_deadlines import SessionDeadlines, whole_ms

log = logging.getLogger(__name__)

E = ErrorCode
_EMPTY, _PREPARING, _COMPLETING, _STABLE, _DEAD = (
    GroupState.EMPTY, GroupState.PREPARING_REBALANCE, GroupState.COMPLETING_REBALANCE,
    GroupState.STABLE, GroupState.DEAD)
# A member that joined during a rebalance and never completed one is dropped after this
# long without rejoining (Kafka's NewMemberJoinTimeoutMs).
NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000


def _now_ms() -> int:
    return int(time.time() * 1000)


def _as_log_record(record: tuple, index: int
                   ) -> tuple[bytes | None, bytes | None, int, str | None, int]:
    """(key, value, producer id of its transaction or -1, marker "commit"/"abort"/None,
    offset in the log); a bare (key, value) is at its ``index`` in the partition."""
    if len(record) == 2:
        return record[0], record[1], -1, None, index
    if len(record) == 4:
        return record[0], record[1], record[2], record[3], index
    return record[0], record[1], record[2], record[3], record[4]


def _when_written(durable: Awaitable[None], ended: Callable[[bool], None]) -> asyncio.Future:
    """What to await for ``durable``, with ``ended(whether it became durable)`` run first,
    before anyone awaiting it resumes: the answer of a commit finds its offsets committed,
    and a commit whose answer is never awaited (its connection gone), or whose wait is
    cancelled (its task, at a stop), still ends as its write does: shielded, the wait's
    cancelling never cancels the write's future."""
    future = asyncio.ensure_future(durable)

    def done(f: asyncio.Future) -> None:
        ended(not f.cancelled() and f.exception() is None)

    if future.done():  # awaiting it would not yield: ended runs now
        done(future)
        return future
    future.add_done_callback(done)  # before shield's own: ended runs first
    return asyncio.shield(future)


def _too_long(*texts: str) -> bool:
    """Longer than the records' strings can hold (Kafka's STRING: 32767 bytes)."""
    for t in texts:  # (a loop, not any(): this is on the path of every group request)
        if len(t) > 8191 and len(t.encode()) > rec.MAX_STRING_BYTES:
            return True
    return False


def _cancel_timers(group: ClassicGroup) -> None:
    for timer in (group.join_timer, *group.pending_members.values()):
        if timer is not None:
            timer.cancel()
    for member in group.members.values():
        if member.session_timer is not None:
            member.session_timer.cancel()


@dataclass(frozen=True)
class GroupConfig:
    num_partitions: int = 50
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3000
    max_size: int = 2**31 - 1
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    offset_metadata_max_bytes: int = 4096


@dataclass
class OffsetCommitPartition:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None


@dataclass
class GroupOverview:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"


class GroupCoordinator:
    def __init__(self, offsets_log: OffsetsLog, config: GroupConfig,
                 partition_exists: Callable[[str, int], bool],
                 now_ms: Callable[[], int] = _now_ms,
                 consumer_config: ConsumerGroupConfig | None = None,
                 topic_image: TopicImage | None = None, owns_all: bool = True,
                 session_clock: Callable[[], float] | None = None) -> None:
        self.log = offsets_log
        self.config = config
        self.partition_exists = partition_exists  # (topic, partition) is known to the broker
        self.now_ms = now_ms
        self.groups: dict[str, ClassicGroup | ConsumerGroup] = \
            KeysByPartition(self.partition_of)
        # Groups of the consumer protocol (KIP-848) share ``groups`` and the offsets log.
        self.consumer_groups = ConsumerGroupCoordinator(
            self, consumer_config or ConsumerGroupConfig(),
            topic_image if topic_image is not None else {})
        # Which partitions of __consumer_offsets this coordinator serves (ownership.py): all
        # of them on one broker (load_all), those this broker leads in a cluster (elect).
        self.ownership = Ownership()
        # One broker (``owns_all``): every partition loading from the start, at epoch 0.
        self._initial = [self.ownership.elect(p, 0) for p in range(config.num_partitions)] \
            if owns_all else []
        self.commits = 0  # offsets committed, for /metrics
        # Offsets committed inside transactions not yet decided (TxnOffsetCommit).
        self.pending_txn = offset_rules.PendingTxnOffsets()
        # Plain commits whose writes are not durable yet (O7), served once they are.
        self.in_flight = offset_rules.InFlightCommits()
        self._tasks: set[asyncio.Task] = set()
        # Every classic member's session deadline, on one loop timer (with a
        # ``session_clock``, none: the caller runs what is due, ``_sessions.run_due``).
        self._sessions = SessionDeadlines(self._session_expired, session_clock)
        # The coordinator's loop timers all run in this one context, not each in a copy of
        # its caller's (asyncio's default: 120 bytes a timer, and a member has one or two;
        # issue 26); their callbacks read and set no context variable. One a coordinator: a
        # Context is entered by one thread at a time, and each coordinator has its loop.
        self._timers = contextvars.Context()

    def _background(self, work) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- loading --------------------------------------------------------------------------

    async def load_all(self) -> None:
        """One broker: it owns every partition (at coordinator epoch 0); each answers
        COORDINATOR_LOAD_IN_PROGRESS until it is read (a failed load: ownership.py O12).
        In a cluster: nothing (``elect``)."""
        loads, self._initial = self._initial, []
        await load_each(self.ownership, loads, self._load_logged, "__consumer_offsets")

    def elect(self, partition: int, epoch: int) -> None:
        """This broker leads ``partition`` of __consumer_offsets at leader ``epoch``
        (ownership.py O1-O4): its groups are loaded in the background."""
        load = self.ownership.elect(partition, epoch)
        if load is not None:
            log.info("__consumer_offsets-%d: loading its groups (coordinator epoch %d)",
                     partition, epoch)
            self._background(self._load_logged(load))

    def resign(self, partition: int, epoch: int | None) -> None:
        """This broker no longer leads ``partition`` (O5-O9): its groups are dropped, their
        waiting requests answered NOT_COORDINATOR, their timers cancelled."""
        if not self.ownership.resign(partition, epoch):
            return
        dropped = self._drop(partition)
        log.info("__consumer_offsets-%d: resigned at leader epoch %s, %d groups dropped",
                 partition, epoch, dropped)

    def _drop(self, partition: int) -> int:
        """Everything held of ``partition``'s groups dropped; how many groups."""
        dropped = [self.groups[g] for g in self.groups.keys_of(partition)]
        for group in dropped:
            if isinstance(group, ConsumerGroup):
                self.consumer_groups.forget(group)
            else:
                self._stop_group(group, E.not_coordinator)
            del self.groups[group.group_id]
        # Pending transactional offsets too, of groups with or without a group object.
        for group_id in [g for g in self.pending_txn.groups() if self.partition_of(g) == partition]:
            for tp in list(self.pending_txn.partitions(group_id)):
                self.pending_txn.drop(group_id, tp)
        for group_id in [g for g in self.in_flight.groups() if self.partition_of(g) == partition]:
            self.in_flight.forget(group_id)
        return len(dropped)

    def _stop_group(self, group: ClassicGroup, error: ErrorCode) -> None:
        """A classic group's timers cancelled and its waiting requests answered ``error``."""
        _cancel_timers(group)
        for member in group.members.values():
            self._answer_waiters(group, member, error)

    async def _load_logged(self, load: Load) -> None:
        """The load, and its retries while it fails (ownership.py O12-O16)."""
        await load_retrying(self.ownership, load, self._read, self._drop, self._background,
                            "__consumer_offsets")

    async def _read(self, load: Load) -> None:
        partition = load.partition
        now = self.now_ms()
        metadata: dict[str, rec.GroupValue | None] = {}
        offsets: dict[str, dict[tuple[str, int], rec.OffsetValue]] = {}
        modern: list[tuple[bytes, bytes | None]] = []
        # Kept apart until installed: a load that loses the partition meanwhile leaves
        # nothing behind (ownership.py O11).
        pending = offset_rules.PendingTxnOffsets()

        def offsets_of(group_id: str) -> dict[tuple[str, int], rec.OffsetValue]:
            return offsets.setdefault(group_id, {})

        def in_partition(group_id: str) -> bool:
            return self.partition_of(group_id) == partition

        def take(key_bytes: bytes, value_bytes: bytes | None, producer_id: int,
                 at: int) -> None:
            if consumer_records.is_consumer_key(key_bytes):
                if producer_id < 0:
                    modern.append((key_bytes, value_bytes))
                return
            key = rec.read_key(key_bytes)
            if isinstance(key, rec.OffsetKey):
                tp = (key.topic, key.partition)
                if producer_id >= 0:  # O3 (a transaction's tombstone is not written)
                    if value_bytes is not None:
                        pending.add(producer_id, key.group, tp,
                                    rec.read_offset_value(value_bytes, at))
                elif value_bytes is None:
                    offset_rules.replay_tombstone(offsets.get(key.group), pending,
                                                  key.group, tp)
                else:
                    offset_rules.replay_commit(offsets_of(key.group), tp,
                                               rec.read_offset_value(value_bytes, at))
            elif producer_id < 0:
                metadata[key.group] = (None if value_bytes is None
                                       else rec.read_group_value(value_bytes))

        count = 0
        for index, record in enumerate(self.log.read(partition)):
            key_bytes, value_bytes, producer_id, marker, at = _as_log_record(record, index)
            count += 1
            if count % 2000 == 0:
                await asyncio.sleep(0)  # let the broker serve while a large log is read
            if marker is not None:
                offset_rules.replay_marker(pending, producer_id, marker == "commit",
                                           in_partition, offsets_of)
                continue
            if key_bytes is None:
                continue
            try:
                take(key_bytes, value_bytes, producer_id, at)
            except rec.BadRecord as exc:
                log.warning("__consumer_offsets-%d: skipping a record: %s", partition, exc)
        if not self.ownership.loaded(load):
            log.info("__consumer_offsets-%d: resigned while loading; the load is dropped",
                     partition)
            return
        self.pending_txn.merge(pending)
        consumer = ConsumerGroupCoordinator.rebuild(modern, now, partition)
        for group_id, consumer_group in consumer.items():
            consumer_group.offsets = offsets.pop(group_id, {})
            self.groups[group_id] = consumer_group
            self.consumer_groups.loaded(consumer_group)
        for group_id in set(metadata) | set(offsets):
            value = metadata.get(group_id)
            group_offsets = offsets.get(group_id, {})
            if (value is None and not group_offsets) or group_id in consumer:
                continue
            group = (ClassicGroup.from_value(group_id, value, now) if value is not None
                     else ClassicGroup(group_id, state_timestamp=now))
            group.offsets = group_offsets or NO_ENTRIES  # _offsets_of: its own on a commit
            self.groups[group_id] = group
            for member in group.members.values():
                self._schedule_session(group, member)
        if count:
            log.info("__consumer_offsets-%d: loaded %d records, %d groups", partition, count,
                     self.groups.count_of(partition))

    def partition_of(self, group_id: str) -> int:
        return partition_for(group_id, self.config.num_partitions)

    def _unavailable(self, group_id: str | None) -> ErrorCode | None:
        """The error for a group this coordinator cannot serve now, or None."""
        if not group_id or _too_long(group_id):
            return E.invalid_group_id
        return self.not_served(group_id)

    def not_served(self, group_id: str) -> ErrorCode | None:
        """NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS for a group whose partition this
        coordinator does not serve now (ownership.py), else None."""
        return self.ownership.error(self.partition_of(group_id))

    def is_loading(self, group_id: str) -> bool:
        """Not served now (loading, its load failed, or another broker's)."""
        return self.ownership.status(self.partition_of(group_id)) is not Status.OWNED

    # --- JoinGroup ------------------------------------------------------------------------

    async def join(self, group_id: str, member_id: str, instance_id: str | None,
                   client_id: str, client_host: str, session_timeout_ms: int,
                   rebalance_timeout_ms: int, protocol_type: str,
                   protocols: Sequence[tuple[str, bytes]], require_known_member_id: bool,
                   supports_skip_assignment: bool) -> JoinResult:
        error = self._unavailable(group_id)
        if error is not None:
            return JoinResult(error, member_id)
        cfg = self.config
        if not cfg.min_session_timeout_ms <= session_timeout_ms <= cfg.max_session_timeout_ms:
            return JoinResult(E.invalid_session_timeout, member_id)
        if not protocol_type or not protocols:
            return JoinResult(E.inconsistent_group_protocol, member_id)
        if _too_long(protocol_type, instance_id or "", client_id, *(n for n, _ in protocols)):
            return JoinResult(E.invalid_request, member_id)
        protocol_type = shared_name(protocol_type)
        session_timeout_ms = shared_number(session_timeout_ms)
        rebalance_timeout_ms = shared_number(rebalance_timeout_ms)
        # A tuple: a member keeps it (a list comprehension's spare capacity is 40 bytes more).
        protocols = tuple([(shared_name(name), metadata) for name, metadata in protocols])
        group = self.groups.get(group_id)
        if isinstance(group, ConsumerGroup):
            # Kafka: a classic member joins a consumer group with members as a member of it
            # (J1); an empty one becomes a classic group (its offsets stay).
            if group.members:
                return await group_migration.join(
                    self, group, member_id, instance_id, client_id, client_host,
                    session_timeout_ms, rebalance_timeout_ms, protocol_type, protocols,
                    require_known_member_id)
            # Dropped and replaced before any await: a request meanwhile sees the classic
            # group, never the consumer group again (no second conversion).
            try:
                durable = self.consumer_groups.drop(group, "a classic member joins")
            except WriteFailed as exc:
                return JoinResult(exc.error, member_id)
            converted = ClassicGroup(group_id, state_timestamp=self.now_ms())
            converted.offsets = group.offsets
            self.groups[group_id] = converted
            (stored,) = await self.when_durable(group_id, [E.none], durable)
            if stored is not E.none:
                return JoinResult(stored, member_id)
            group = self.groups.get(group_id)
            if not isinstance(group, ClassicGroup):
                return JoinResult(E.coordinator_not_available, member_id)
        if group is None:
            if member_id:
                return JoinResult(E.unknown_member_id, member_id)
            group = self.groups[group_id] = ClassicGroup(group_id, state_timestamp=self.now_ms())
        if group.is_in(_DEAD):
            # Deleted or expired in the meantime: the client looks the coordinator up again.
            return JoinResult(E.coordinator_not_available, member_id)
        if not group.supports(protocol_type, protocols):
            return JoinResult(E.inconsistent_group_protocol, member_id)
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms
        member = Member(member_id, instance_id, client_id, client_host, rebalance_timeout_ms,
                        session_timeout_ms, flat_protocols(protocols))
        if not member_id:
            return await self._join_unknown(group, member, protocol_type, require_known_member_id,
                                            supports_skip_assignment)
        return await self._join_known(group, member, protocol_type)

    async def _join_unknown(self, group: ClassicGroup, joining: Member, protocol_type: str,
                            require_known_member_id: bool, skip_ok: bool) -> JoinResult:
        instance_id = joining.group_instance_id
        if instance_id is not None and instance_id in group.static_members:
            return await self._replace_static_member(group, joining, protocol_type, skip_ok)
        if group.size >= self.config.max_size:
            return JoinResult(E.group_max_size_reached)
        joining.member_id = new_member_id(instance_id or joining.client_id)
        if instance_id is None and require_known_member_id:
            # KIP-394: the id is handed out first, and counts only once it is used.
            loop = asyncio.get_running_loop()
            group.own_pending_members()[joining.member_id] = loop.call_later(
                joining.session_timeout_ms / 1000, self._expire_pending, group,
                joining.member_id, context=self._timers)
            return JoinResult(E.member_id_required, joining.member_id)
        return await self._add_and_rebalance(group, joining, protocol_type,
                                             "a new member joined")

    async def _join_known(self, group: ClassicGroup, joining: Member,
                          protocol_type: str) -> JoinResult:
        member_id, instance_id = joining.member_id, joining.group_instance_id
        if group.fenced(member_id, instance_id):
            return JoinResult(E.fenced_instance_id, member_id)
        if member_id in group.pending_members:
            group.pop_pending(member_id).cancel()
            return await self._add_and_rebalance(group, joining, protocol_type,
                                                 "a pending member joined")
        member = group.members.get(member_id)
        if member is None or group.is_in(_EMPTY, _DEAD):
            return JoinResult(E.unknown_member_id, member_id)
        if instance_id is not None and not group.is_static(member_id, instance_id):
            return JoinResult(E.fenced_instance_id, member_id)
        if group.is_in(_PREPARING):
            return await self._update_and_wait(group, member, joining)
        if group.is_in(_COMPLETING):
            if member.same_protocols(joining.protocols):
                # A repeated join (its answer was lost): the current generation again.
                self._schedule_session(group, member)
                return self._join_answer(group, member)
            return await self._update_and_rebalance(group, member, joining,
                                                    "a member changed its protocols")
        # Stable
        if member.member_id == group.leader or not member.same_protocols(joining.protocols):
            return await self._update_and_rebalance(group, member, joining,
                                                    "the leader or changed metadata rejoined")
        self._schedule_session(group, member)
        return self._join_answer(group, member)

    async def _replace_static_member(self, group: ClassicGroup, joining: Member,
                                     protocol_type: str, skip_ok: bool) -> JoinResult:
        """KIP-345: a static member restarted; it takes its old place under a new member id,
        and the old id is fenced."""
        instance_id = joining.group_instance_id
        old_id = group.static_members[instance_id]
        old = group.members.get(old_id)
        new_id = new_member_id(instance_id)
        joining.member_id = new_id
        if old is None:  # a stale mapping: join as new
            del group.static_members[instance_id]
            return await self._add_and_rebalance(group, joining, protocol_type,
                                                 "a static member joined")
        self._fence(group, old)
        group.remove_member(old_id)
        old_protocols = old.protocols
        self._take_over(old, joining)
        group.members[new_id] = old
        group.own_static_members()[instance_id] = new_id
        was_leader = group.leader == old_id
        if was_leader:
            group.leader = new_id
        if group.is_in(_PREPARING):
            return await self._wait_join(group, old)
        if group.is_in(_COMPLETING):
            return await self._rebalance_and_wait(group, old, "a static member rejoined")
        if group.is_in(_STABLE):
            # Kafka's rule: no rebalance unless the protocol the group would now choose
            # changes; the leader is given the members again but told to skip assigning.
            if group.select_protocol() != group.protocol:
                return await self._rebalance_and_wait(group, old, "a static member rejoined "
                                                      "with other protocols")
            try:
                durable = self._append_group(group)
            except WriteFailed as exc:
                # Not written: undone before anything else saw it, the old id stays.
                group.remove_member(new_id)
                old.member_id = old_id
                old.protocols = old_protocols
                group.members[old_id] = old
                group.own_static_members()[instance_id] = old_id
                if was_leader:
                    group.leader = old_id
                self._schedule_session(group, old)  # _fence ended it
                return JoinResult(exc.error)
            self._schedule_session(group, old)
            try:
                await self._durable(durable)
            except WriteFailed as exc:
                return JoinResult(exc.error)  # in the log all the same: nothing to undo
            answer = self._join_answer(group, old)
            answer.skip_assignment = was_leader and skip_ok
            return answer
        return JoinResult(E.unknown_member_id, new_id)

    @classmethod
    def _take_over(cls, member: Member, joining: Member) -> None:
        member.member_id = joining.member_id
        cls._take_over_protocols(member, joining)

    def _fence(self, group: ClassicGroup, member: Member) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
            member.session_timer = None
        self._answer_waiters(group, member, E.fenced_instance_id)

    @staticmethod
    def _answer_waiters(group: ClassicGroup, member: Member, error: ErrorCode) -> None:
        """End a member's JoinGroup and SyncGroup in waiting with ``error``."""
        for waiter, answer in ((group.pop_join_waiter(member),
                                JoinResult(error, member.member_id)),
                               (group.pop_sync_waiter(member), SyncResult(error))):
            if waiter is not None and not waiter.done():
                waiter.set_result(answer)

    async def _add_and_rebalance(self, group: ClassicGroup, member: Member, protocol_type: str,
                                 reason: str) -> JoinResult:
        group.set_new(member, True)
        group.members[member.member_id] = member
        if member.group_instance_id is not None:
            group.own_static_members()[member.group_instance_id] = member.member_id
        if group.protocol_type is None or not group.protocol_type:
            group.protocol_type = protocol_type
        if group.initial_delay is not None:
            group.new_member_joined = True
        return await self._rebalance_and_wait(group, member, reason)

    async def _update_and_rebalance(self, group: ClassicGroup, member: Member,
                                    joining: Member, reason: str) -> JoinResult:
        self._take_over_protocols(member, joining)
        return await self._rebalance_and_wait(group, member, reason)

    async def _update_and_wait(self, group: ClassicGroup, member: Member,
                               joining: Member) -> JoinResult:
        self._take_over_protocols(member, joining)
        return await self._wait_join(group, member)

    @staticmethod
    def _take_over_protocols(member: Member, joining: Member) -> None:
        member.protocols = joining.protocols
        member.client, member.host_at = joining.client, joining.host_at
        member.session_timeout_ms = joining.session_timeout_ms
        member.rebalance_timeout_ms = joining.rebalance_timeout_ms

    async def _rebalance_and_wait(self, group: ClassicGroup, member: Member,
                                  reason: str) -> JoinResult:
        future = self._await_join(group, member)
        if group.is_in(_STABLE, _COMPLETING, _EMPTY):
            self._prepare_rebalance(group, reason)
        self._maybe_complete_join(group)
        return await future

    async def _wait_join(self, group: ClassicGroup, member: Member) -> JoinResult:
        future = self._await_join(group, member)
        self._maybe_complete_join(group)
        return await future

    def _await_join(self, group: ClassicGroup, member: Member) -> asyncio.Future:
        older = group.join_waiter(member)
        if older is not None and not older.done():
            # The member sent another JoinGroup: the older one is answered as Kafka does.
            older.set_result(JoinResult(E.unknown_member_id, member.member_id))
        future = asyncio.get_running_loop().create_future()
        group.set_join_waiter(member, future)
        return future

    def _join_answer(self, group: ClassicGroup, member: Member) -> JoinResult:
        members: tuple = ()
        if member.member_id == group.leader:
            members = tuple((m.member_id, m.group_instance_id, m.metadata(group.protocol))
                            for m in group.members.values())
        return JoinResult(E.none, member.member_id, group.generation, group.protocol_type,
                          group.protocol, group.leader or "", False, members)

    # --- rebalancing ------------------------------------------------------------------------

    def _prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.is_in(_COMPLETING):
            # Assignments of the generation that never became stable are void.
            for member in group.members.values():
                member.assignment = b""
                waiter = group.pop_sync_waiter(member)
                if waiter is not None and not waiter.done():
                    waiter.set_result(SyncResult(E.rebalance_in_progress))
        if group.join_timer is not None:
            group.join_timer.cancel()
        loop = asyncio.get_running_loop()
        was_empty = group.is_in(_EMPTY)
        group.transition(_PREPARING, self.now_ms())
        timeout = group.rebalance_timeout_ms()
        delay = self.config.initial_rebalance_delay_ms
        if was_empty and delay > 0:
            group.initial_delay = (delay, max(timeout - delay, 0))
            group.new_member_joined = False
            group.join_timer = loop.call_later(min(delay, timeout) / 1000,
                                               self._initial_delay_over, group,
                                               context=self._timers)
        else:
            group.initial_delay = None
            group.join_timer = loop.call_later(timeout / 1000, self._join_timeout, group,
                                               context=self._timers)
        log.info("group %s: preparing to rebalance (generation %d): %s", group.group_id,
                 group.generation, reason)

    def _initial_delay_over(self, group: ClassicGroup) -> None:
        delay, remaining = group.initial_delay or (0, 0)
        if group.new_member_joined and remaining > 0:
            # Members keep arriving: wait one more delay, within the rebalance timeout.
            step = min(delay, remaining)
            group.initial_delay = (delay, remaining - step)
            group.new_member_joined = False
            group.join_timer = asyncio.get_running_loop().call_later(
                step / 1000, self._initial_delay_over, group, context=self._timers)
            return
        group.initial_delay = None
        group.join_timer = None
        self._complete_join(group)

    def _join_timeout(self, group: ClassicGroup) -> None:
        group.join_timer = None
        if group.is_in(_PREPARING):
            self._complete_join(group)

    def _maybe_complete_join(self, group: ClassicGroup) -> None:
        if group.is_in(_PREPARING) and group.initial_delay is None and group.all_rejoined():
            if group.join_timer is not None:
                group.join_timer.cancel()
                group.join_timer = None
            self._complete_join(group)

    def _complete_join(self, group: ClassicGroup) -> None:
        if not group.is_in(_PREPARING):
            return
        for member in [m for m in group.members.values() if group.join_waiter(m) is None]:
            log.info("group %s: member %s did not rejoin in time", group.group_id,
                     member.member_id)
            self._drop_member(group, member)
        for timer in group.pending_members.values():
            timer.cancel()
        group.pending_members = NO_ENTRIES
        now = self.now_ms()
        group.generation += 1
        if not group.members:
            group.protocol = None
            group.leader = None
            group.transition(_EMPTY, now)
            log.info("group %s: empty at generation %d", group.group_id, group.generation)
            self._store_in_background(group)
            return
        group.protocol = group.select_protocol()
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.transition(_COMPLETING, now)
        log.info("group %s: generation %d with %d members, protocol %s, leader %s",
                 group.group_id, group.generation, len(group.members), group.protocol,
                 group.leader)
        for member in group.members.values():
            group.set_new(member, False)
            waiter = group.pop_join_waiter(member)
            self._schedule_session(group, member)
            if waiter is not None and not waiter.done():
                waiter.set_result(self._join_answer(group, member))

    def _store_in_background(self, group: ClassicGroup) -> None:
        async def store() -> None:
            try:
                await self._store_group(group)
            except WriteFailed as exc:
                log.warning("group %s: storing its state failed: %s", group.group_id, exc)
        self._background(store())

    # --- sessions ---------------------------------------------------------------------------

    def _schedule_session(self, group: ClassicGroup, member: Member) -> None:
        """The member's session now ends ``timeout`` from now. Every Heartbeat moves it, so
        a timer that fires no later than the new end is kept (when it fires before the end,
        it is set again for the end) rather than cancelled and made anew each time."""
        timeout = (NEW_MEMBER_JOIN_TIMEOUT_MS if group.is_in(_PREPARING) and group.is_new(member)
                   else member.session_timeout_ms)
        # in whole milliseconds, as its deadline is (session_deadlines.whole_ms)
        member.session_ends = ends = whole_ms(self._sessions.now() + timeout / 1000)
        timer = member.session_timer
        if timer is not None:
            if timer.when() <= ends:
                return
            timer.cancel()
        member.session_timer = self._sessions.call_at(ends, group, member)

    def _session_expired(self, group: ClassicGroup, member: Member) -> None:
        """H1-H3."""
        member.session_timer = None
        if self._sessions.now() < member.session_ends:  # heartbeats moved the end since
            member.session_timer = self._sessions.call_at(member.session_ends, group, member)
            return
        if group.members.get(member.member_id) is not member:  # H1
            return
        if group.join_waiter(member) is not None or group.sync_waiter(member) is not None:  # H2
            self._schedule_session(group, member)
            return
        # H3
        log.info("group %s: member %s's session timed out", group.group_id, member.member_id)
        self._remove_member(group, member, "a member's session timed out")

    def _expire_pending(self, group: ClassicGroup, member_id: str) -> None:
        if member_id in group.pending_members:
            group.pop_pending(member_id)
            log.info("group %s: pending member %s never joined", group.group_id, member_id)
            self._maybe_complete_join(group)

    def _drop_member(self, group: ClassicGroup, member: Member) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
            member.session_timer = None
        group.remove_member(member.member_id)
        instance = member.group_instance_id
        if instance is not None and group.static_members.get(instance) == member.member_id:
            del group.static_members[instance]
        if group.leader == member.member_id:
            group.leader = next(iter(group.members), None)

    def _remove_member(self, group: ClassicGroup, member: Member, reason: str) -> None:
        self._answer_waiters(group, member, E.unknown_member_id)
        self._drop_member(group, member)
        if group.is_in(_STABLE, _COMPLETING):
            self._prepare_rebalance(group, reason)
        self._maybe_complete_join(group)

    def _member_check(self, group: ClassicGroup | ConsumerGroup | None, member_id: str,
                      instance_id: str | None, generation: int) -> ErrorCode | None:
        """The checks SyncGroup and Heartbeat share, in Kafka's order."""
        if group is None or isinstance(group, ConsumerGroup):
            return E.unknown_member_id
        if group.is_in(_DEAD):
            return E.coordinator_not_available
        if group.fenced(member_id, instance_id):
            return E.fenced_instance_id
        if member_id not in group.members:
            return E.unknown_member_id
        if generation != group.generation:
            return E.illegal_generation
        return None

    # --- SyncGroup --------------------------------------------------------------------------

    async def sync(self, group_id: str, generation: int, member_id: str,
                   instance_id: str | None, protocol_type: str | None,
                   protocol: str | None, assignments: list[tuple[str, bytes]]) -> SyncResult:
        error = self._unavailable(group_id)
        if error is not None:
            return SyncResult(error)
        group = self.groups.get(group_id)
        if isinstance(group, ConsumerGroup) and group.members:  # S0
            return group_migration.sync(self, group, generation, member_id, instance_id,
                                        protocol_type, protocol)
        error = self._member_check(group, member_id, instance_id, generation)
        if error is not None:
            return SyncResult(error)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
                protocol is not None and protocol != group.protocol):
            return SyncResult(E.inconsistent_group_protocol)
        member = group.members[member_id]
        if group.is_in(_EMPTY):
            return SyncResult(E.unknown_member_id)
        if group.is_in(_PREPARING):
            return SyncResult(E.rebalance_in_progress)
        if group.is_in(_STABLE):
            self._schedule_session(group, member)
            return SyncResult(E.none, group.protocol_type, group.protocol, member.assignment)
        # CompletingRebalance
        older = group.sync_waiter(member)
        if older is not None and not older.done():
            older.set_result(SyncResult(E.rebalance_in_progress))
        future = asyncio.get_running_loop().create_future()
        group.set_sync_waiter(member, future)
        self._schedule_session(group, member)
        if member_id == group.leader and group.assignment_write != group.generation:
            self._write_assignment(group, dict(assignments))
        return await future

    def _write_assignment(self, group: ClassicGroup, assignments: dict[str, bytes]) -> None:
        """S11: the leader's assignment appended in the step that decided it; the group
        stays CompletingRebalance, marked as writing it (a repeated leader SyncGroup waits
        for this write, S12), until the write is durable."""
        generation = group.generation
        previous = {m.member_id: m.assignment for m in group.members.values()}
        for member in group.members.values():
            member.assignment = assignments.get(member.member_id, b"")
        try:
            durable = self._append_group(group)
        except WriteFailed as exc:
            self._assignment_failed(group, previous, exc.error)
            return
        group.assignment_write = generation
        self._background(self._assignment_durable(group, generation, previous, durable))

    def _assignment_failed(self, group: ClassicGroup, previous: dict[str, bytes],
                           error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = previous.get(member.member_id, b"")
            waiter = group.pop_sync_waiter(member)
            if waiter is not None and not waiter.done():
                waiter.set_result(SyncResult(error))
        self._prepare_rebalance(group, "storing the assignment failed")

    async def _assignment_durable(self, group: ClassicGroup, generation: int,
                                  previous: dict[str, bytes],
                                  durable: Awaitable[None] | None) -> None:
        error = None
        try:
            await self._durable(durable)
        except WriteFailed as exc:
            error = exc.error
        finally:
            if group.assignment_write == generation:
                group.assignment_write = None
        if not group.is_in(_COMPLETING) or group.generation != generation:
            return  # a rebalance began meanwhile; its members were told
        if error is not None:
            self._assignment_failed(group, previous, error)
            return
        # (the waiters taken before the transition, which ends the rebalance holding them)
        waiters = [(member, group.pop_sync_waiter(member)) for member in group.members.values()]
        group.transition(_STABLE, self.now_ms())
        log.info("group %s: stable at generation %d", group.group_id, generation)
        for member, waiter in waiters:
            if waiter is not None and not waiter.done():
                waiter.set_result(SyncResult(E.none, group.protocol_type, group.protocol,
                                             member.assignment))

    # --- Heartbeat and LeaveGroup -----------------------------------------------------------

    def heartbeat(self, group_id: str, generation: int, member_id: str,
                  instance_id: str | None) -> ErrorCode:
        error = self._unavailable(group_id)
        if error is not None:
            return error
        group = self.groups.get(group_id)
        if isinstance(group, ConsumerGroup) and group.members:  # S0
            return group_migration.heartbeat(self, group, generation, member_id, instance_id)
        error = self._member_check(group, member_id, instance_id, generation)
        if error is not None:
            return error
        if group.is_in(_EMPTY):
            return E.unknown_member_id
        self._schedule_session(group, group.members[member_id])
        return E.rebalance_in_progress if group.is_in(_PREPARING) else E.none

    def leave(self, group_id: str, leaving: list[tuple[str, str | None]]
              ) -> tuple[ErrorCode, list[ErrorCode]]:
        """(group error, one error per leaving member)."""
        error = self._unavailable(group_id)
        if error is not None:
            return error, []
        group = self.groups.get(group_id)
        if isinstance(group, ConsumerGroup):
            return E.none, group_migration.leave(self, group, leaving)
        if group is None:
            return E.none, [E.unknown_member_id] * len(leaving)
        if group.is_in(_DEAD):
            return E.coordinator_not_available, []
        errors = []
        for member_id, instance_id in leaving:
            if not member_id and instance_id is not None:
                member_id = group.static_members.get(instance_id, "")
                if not member_id:
                    errors.append(E.unknown_member_id)
                    continue
            if group.fenced(member_id, instance_id):
                errors.append(E.fenced_instance_id)
                continue
            if member_id in group.pending_members:
                group.pop_pending(member_id).cancel()
                self._maybe_complete_join(group)
                errors.append(E.none)
                continue
            member = group.members.get(member_id)
            if member is None:
                errors.append(E.unknown_member_id)
                continue
            log.info("group %s: member %s left", group.group_id, member_id)
            self._remove_member(group, member, "a member left the group")
            errors.append(E.none)
        return E.none, errors

    # --- offsets ----------------------------------------------------------------------------

    async def commit(self, group_id: str, generation: int, member_id: str,
                     instance_id: str | None, retention_ms: int,
                     partitions: list[OffsetCommitPartition]) -> list[ErrorCode]:
        errors, durable = self.commit_now(group_id, generation, member_id, instance_id,
                                          retention_ms, partitions)
        return await self.when_durable(group_id, errors, durable)

    @staticmethod
    async def when_durable(group_id: str, errors: list[ErrorCode],
                           durable: Awaitable[None] | None) -> list[ErrorCode]:
        """The answer of a commit once its records are durable (a failed fsync says so)."""
        if durable is not None:
            try:
                await durable
            except OSError as exc:
                log.error("group %s: offsets not durable: %s", group_id, exc)
                return [durable_error(exc) if e is E.none else e for e in errors]
        return errors

    def commit_now(self, group_id: str, generation: int, member_id: str,
                   instance_id: str | None, retention_ms: int,
                   partitions: list[OffsetCommitPartition]
                   ) -> tuple[list[ErrorCode], Awaitable[None] | None]:
        """OffsetCommit without waiting: the errors, and what to await before answering
        (None: nothing; most commits, so the answer needs no task)."""
        error = self._unavailable(group_id)
        if error is not None:
            return [error] * len(partitions), None
        group = self.groups.get(group_id)
        error = self._commit_check(group, generation, member_id, instance_id)
        if error is not None:
            return [error] * len(partitions), None
        now = self.now_ms()
        expire = now + retention_ms if retention_ms >= 0 else -1
        errors: list[ErrorCode] = []
        records: list[tuple[bytes, bytes | None]] = []
        # (offset, leader epoch, metadata) by partition: the OffsetValues are made once their
        # records' offsets are known (no copy of each to set record_offset).
        values: dict[tuple[str, int], tuple[int, int, str]] = {}
        for p in partitions:
            error = self._partition_commit_error(p)
            errors.append(error)
            if error is not E.none:
                continue
            metadata = p.metadata or ""
            values[p.topic, p.partition] = (p.offset, p.leader_epoch, metadata)
            records.append((rec.offset_key(group_id, p.topic, p.partition),
                            rec.offset_value_of(p.offset, p.leader_epoch, metadata, now, expire)))
        if not records:
            return errors, None
        try:
            base, durable = self.log.append_at(self.partition_of(group_id), records)
        except WriteFailed as exc:
            log.warning("group %s: storing offsets failed: %s", group_id, exc)
            code = (E.invalid_commit_offset_size if exc.error is E.message_too_large
                    else exc.error)
            return [code if e is E.none else e for e in errors], None
        offsets = self._offsets_of(group_id)  # the group exists from the append on
        written = [(tp, rec.OffsetValue(offset, epoch, metadata, now, expire, at))
                   for at, (tp, (offset, epoch, metadata)) in enumerate(values.items(), base)]
        if durable is None:
            for tp, value in written:
                offset_rules.replay_commit(offsets, tp, value)  # O1
            self.commits += len(written)
        else:
            for tp, value in written:
                self.in_flight.add(group_id, tp, value)  # O7

            def ended(ok: bool) -> None:  # O8, O9
                for tp, value in written:
                    self.commits += offset_rules.replay_durable(
                        self.in_flight, group_id, tp, value, ok, self._offsets_of)
            durable = _when_written(durable, ended)
        group = self.groups[group_id]
        if isinstance(group, ClassicGroup) and member_id in group.members:
            self._schedule_session(group, group.members[member_id])
        return errors, durable

    # --- offsets inside transactions (TxnOffsetCommit) ------------------------------------

    async def txn_commit(self, transactional_id: str, group_id: str, producer_id: int,
                         epoch: int, generation: int, member_id: str, instance_id: str | None,
                         partitions: list[OffsetCommitPartition]) -> list[ErrorCode]:
        """Offsets that count only if the producer's transaction commits: written as a
        transactional batch of the producer, kept aside until its marker (complete_txn)."""
        error = self._unavailable(group_id)
        if error is not None:
            return [error] * len(partitions)
        # KIP-447: the member's generation fences zombies.
        error = self._commit_check(self.groups.get(group_id), generation, member_id,
                                   instance_id, transactional=True)
        if error is not None:
            return [error] * len(partitions)
        now = self.now_ms()
        errors = [self._partition_commit_error(p) for p in partitions]
        values = {(p.topic, p.partition): rec.OffsetValue(p.offset, p.leader_epoch,
                                                          p.metadata or "", now)
                  for p, e in zip(partitions, errors, strict=True) if e is E.none}
        if not values:
            return errors
        records = [(rec.offset_key(group_id, t, p), rec.offset_value(v))
                   for (t, p), v in values.items()]
        try:
            base, durable = self.log.append_at(self.partition_of(group_id), records,
                                               producer=(producer_id, epoch))
        except WriteFailed as exc:
            log.warning("group %s: storing offsets of transaction %s failed: %s", group_id,
                        transactional_id, exc)
            return [exc.error if e is E.none else e for e in errors]
        written = [(tp, dataclasses.replace(value, record_offset=at))
                   for at, (tp, value) in enumerate(values.items(), base)]
        for tp, value in written:
            self.pending_txn.add(producer_id, group_id, tp, value)
        if durable is not None:
            def ended(ok: bool) -> None:
                if not ok:  # O9: a marker must not make visible what was never written
                    offset_rules.replay_txn_failed(self.pending_txn, self.in_flight,
                                                   producer_id, group_id, written)
            durable = _when_written(durable, ended)
            try:
                await durable
            except OSError as exc:
                return [durable_error(exc) if e is E.none else e for e in errors]
        return errors

    def complete_txn(self, offsets_partition: int, producer_id: int, commit: bool) -> None:
        """The marker of the producer's transaction was appended to ``offsets_partition``:
        its offsets for the groups of that partition are decided (offset_rules O4, O5)."""
        if self.ownership.status(offsets_partition) is not Status.OWNED:
            # Loading: the loader reads the partition to its end, this marker included, and
            # replays it in order; applying it here too would decide on a half-loaded state.
            # Not owned: whoever loads the partition next reads it.
            return
        self.commits += offset_rules.replay_marker(
            self.pending_txn, producer_id, commit,
            lambda g: self.partition_of(g) == offsets_partition, self._offsets_of)

    def _offsets_of(self, group_id: str) -> dict[tuple[str, int], rec.OffsetValue]:
        """The committed offsets of a group, which exists from its first commit on."""
        group = self.groups.get(group_id)
        if group is None or group.is_in(_DEAD):
            group = self.groups[group_id] = ClassicGroup(group_id,
                                                        state_timestamp=self.now_ms())
        if group.offsets is NO_ENTRIES:  # its first: a dict of its own
            group.offsets = {}
        return group.offsets

    @staticmethod
    def _tombstones(group_id: str, tps: Iterable[tuple[str, int]]
                    ) -> list[tuple[bytes, bytes | None]]:
        return [(rec.offset_key(group_id, t, p), None) for t, p in tps]

    def _forget_offsets(self, group_id: str, tps: Iterable[tuple[str, int]]) -> None:
        """Their tombstones are written: committed and pending offsets go (O2)."""
        group = self.groups.get(group_id)
        offsets = group.offsets if group is not None and group.offsets is not NO_ENTRIES \
            else None
        for tp in tps:
            offset_rules.replay_tombstone(offsets, self.pending_txn, group_id, tp,
                                          self.in_flight)

    def _held(self, group: ClassicGroup | ConsumerGroup) -> set[tuple[str, int]]:
        """Partitions a deletion tombstones: committed, pending, in flight or unsure (O2)."""
        return (set(group.offsets) | self.pending_txn.partitions(group.group_id)
                | self.in_flight.partitions(group.group_id)
                | self.in_flight.unsure_of(group.group_id))

    def unstable(self, group_id: str) -> set[tuple[str, int]]:
        """Partitions with offsets of a transaction not yet decided (require_stable)."""
        return self.pending_txn.partitions(group_id)

    def _commit_check(self, group: ClassicGroup | ConsumerGroup | None, generation: int,
                      member_id: str, instance_id: str | None,
                      transactional: bool = False) -> ErrorCode | None:
        """Rows C1-C7 of the table above (Kafka's validateOffsetCommit): who the committer
        is and its generation first, the group's state last."""
        anonymous = generation < 0 and not member_id and instance_id is None
        if isinstance(group, ConsumerGroup):
            if transactional and anonymous:
                return None  # TxnOffsetCommit needs no member (Kafka's rule for both)
            return group.commit_error(member_id, generation)  # generation: the member epoch
        if group is None or group.is_in(_DEAD):
            # Offsets of a consumer not in a group (assign() users, tools): allowed when no
            # group of that name has members.
            return None if generation < 0 else E.illegal_generation
        if generation < 0 and group.is_in(_EMPTY):
            return None
        if not anonymous:
            if instance_id is not None:
                owner = group.static_members.get(instance_id)
                if owner is None:
                    return E.unknown_member_id
                if owner != member_id:
                    return E.fenced_instance_id
            elif member_id not in group.members:
                return E.unknown_member_id
            if generation != group.generation:
                return E.illegal_generation
        elif not transactional and not group.is_in(_EMPTY):
            return E.unknown_member_id  # no member, no generation: only while empty
        if group.is_in(_COMPLETING):
            # A member of the current generation that has not synced yet.
            return E.rebalance_in_progress
        return None

    def _partition_commit_error(self, p: OffsetCommitPartition) -> ErrorCode:
        if not self.partition_exists(p.topic, p.partition):
            return E.unknown_topic_or_partition
        if p.metadata is not None and len(p.metadata.encode()) > \
                self.config.offset_metadata_max_bytes:
            return E.offset_metadata_too_large
        if p.offset < 0:
            return E.offset_out_of_range
        return E.none

    def fetch(self, group_id: str, topics: list[tuple[str, list[int]]] | None,
              member_id: str | None = None, member_epoch: int = -1
              ) -> tuple[ErrorCode, list[tuple[str, int, rec.OffsetValue | None]]]:
        """(group error, (topic, partition, committed or None)); topics None: all of them.
        A consumer group checks the member and its epoch (OffsetFetch v9)."""
        error = self._unavailable(group_id)
        if error is not None:
            return error, []
        group = self.groups.get(group_id)
        if isinstance(group, ConsumerGroup):
            error = group.fetch_error(member_id, member_epoch)
            if error is not None:
                return error, []
        offsets = group.offsets if group is not None and not group.is_in(_DEAD) else {}
        if topics is None:
            return E.none, [(t, p, v) for (t, p), v in sorted(offsets.items())]
        return E.none, [(t, p, offsets.get((t, p))) for t, parts in topics for p in parts]

    # --- listing, describing, deleting ------------------------------------------------------

    def listing_error(self) -> ErrorCode | None:
        """ListGroups' error while a partition this broker leads is not loaded (ownership.py
        ``incomplete``), else None."""
        return self.ownership.incomplete(self.config.num_partitions)

    def list_groups(self, states: set[str], types: set[str]) -> list[GroupOverview]:
        states = {s.lower() for s in states}
        types = {t.lower() for t in types}
        out = []
        for group in self.groups.values():
            if group.is_in(_DEAD) or self.is_loading(group.group_id):
                continue
            if states and group.state.value.lower() not in states:
                continue
            group_type = getattr(group, "group_type", "classic")
            if types and group_type not in types:
                continue
            out.append(GroupOverview(group.group_id, group.protocol_type or "",
                                     group.state.value, group_type))
        return out

    def describe(self, group_id: str) -> tuple[ErrorCode, ClassicGroup | None]:
        error = self._unavailable(group_id)
        if error is not None:
            return error, None
        group = self.groups.get(group_id)
        if group is None or group.is_in(_DEAD) or isinstance(group, ConsumerGroup):
            # Kafka 4: "Group X is not a classic group" (ConsumerGroupDescribe shows it).
            return E.group_id_not_found, None
        return E.none, group

    async def delete_group(self, group_id: str) -> ErrorCode:
        error = self._unavailable(group_id)
        if error is not None:
            return error
        group = self.groups.get(group_id)
        if group is None or group.is_in(_DEAD):
            return E.group_id_not_found
        if not group.is_in(_EMPTY):
            return E.non_empty_group
        gone = self._held(group)
        records = self._tombstones(group_id, gone) + self._group_tombstones(group)
        try:
            durable = self.log.append(self.partition_of(group_id), records)
        except WriteFailed as exc:
            log.warning("group %s: deleting failed: %s", group_id, exc)
            return exc.error
        self._forget_offsets(group_id, gone)
        self._forget(group)
        log.info("group %s deleted", group_id)
        if durable is not None:
            try:
                await durable
            except OSError as exc:
                return durable_error(exc)
        return E.none

    async def delete_offsets(self, group_id: str, topics: list[tuple[str, list[int]]]
                             ) -> tuple[ErrorCode, list[tuple[str, int, ErrorCode]]]:
        error = self._unavailable(group_id)
        if error is not None:
            return error, []
        group = self.groups.get(group_id)
        if group is None or group.is_in(_DEAD):
            return E.group_id_not_found, []
        subscribed: set[str] = set()
        if not group.is_in(_EMPTY):
            topics_in_use = group.subscribed_topics()
            if topics_in_use is None:
                return E.non_empty_group, []
            subscribed = topics_in_use
        results = []
        held = self._held(group)
        gone: list[tuple[str, int]] = []
        for topic, parts in topics:
            for p in parts:
                if topic in subscribed:
                    results.append((topic, p, E.group_subscribed_to_topic))
                    continue
                if not self.partition_exists(topic, p):
                    results.append((topic, p, E.unknown_topic_or_partition))
                    continue
                results.append((topic, p, E.none))
                if (topic, p) in held:
                    gone.append((topic, p))
        if gone:
            try:
                durable = self.log.append(self.partition_of(group_id),
                                          self._tombstones(group_id, gone))
            except WriteFailed as exc:
                return exc.error, []
            self._forget_offsets(group_id, gone)
            if durable is not None:
                try:
                    await durable
                except OSError as exc:
                    return durable_error(exc), []
        return E.none, results

    def delete_topic_offsets(self, topic: str) -> int:
        """A deleted topic's committed offsets go with it, as Kafka's coordinator removes them:
        a topic created again under the name starts at 0, and an old offset would make its
        consumers skip its first records. Returns how many went."""
        by_partition: dict[int, list[tuple[str, list[tuple[str, int]]]]] = {}
        held: dict[str, set[tuple[str, int]]] = {}
        for group in self.groups.values():
            held[group.group_id] = {tp for tp in group.offsets if tp[0] == topic}
        for group_id in self.pending_txn.groups():
            held.setdefault(group_id, set()).update(
                tp for tp in self.pending_txn.partitions(group_id) if tp[0] == topic)
        for group_id in self.in_flight.groups():
            held.setdefault(group_id, set()).update(
                tp for tp in self.in_flight.partitions(group_id) | self.in_flight.unsure_of(
                    group_id) if tp[0] == topic)
        for group_id, gone in held.items():
            if gone:
                by_partition.setdefault(self.partition_of(group_id), []).append(
                    (group_id, sorted(gone)))
        removed = 0
        for partition, entries in by_partition.items():
            records = [r for group_id, gone in entries for r in self._tombstones(group_id, gone)]
            try:
                self.log.append(partition, records)
            except WriteFailed as exc:
                log.error("offsets of deleted topic %s stay in __consumer_offsets-%d: %s",
                          topic, partition, exc)
                continue
            for group_id, gone in entries:
                self._forget_offsets(group_id, gone)
                removed += len(gone)
        if removed:
            log.info("removed %d committed offsets of deleted topic %s", removed, topic)
        return removed

    # --- expiry -----------------------------------------------------------------------------

    def expire_offsets(self) -> int:
        """Drop the offsets of empty groups older than offsets.retention.minutes (Kafka 2.1+:
        counted from when the group became empty; for offsets committed without a group,
        from the commit) and the groups left with nothing. Returns how many went."""
        now = self.now_ms()
        retention = self.config.offsets_retention_ms
        expired = 0
        for group in list(self.groups.values()):
            if not group.is_in(_EMPTY) or self.is_loading(group.group_id):
                continue
            gone = []
            # An offset a transaction or a write in flight is about to replace does not
            # expire, nor its group (Kafka's rule: the tombstone would drop it too, O2).
            pending = (self.pending_txn.partitions(group.group_id)
                       | self.in_flight.partitions(group.group_id))
            for tp, value in group.offsets.items():
                if tp in pending:
                    continue
                if value.expire_timestamp >= 0:
                    due = value.expire_timestamp
                elif group.protocol_type:
                    due = group.state_timestamp + retention
                else:
                    due = value.commit_timestamp + retention
                if now >= due:
                    gone.append(tp)
            dead = len(gone) == len(group.offsets) and not pending
            if not gone and not dead:
                continue
            # A dead group leaves nothing behind: its unsure partitions are tombstoned too.
            unsure = self.in_flight.unsure_of(group.group_id) - set(gone) if dead else set()
            forgotten = [*gone, *unsure]
            records = self._tombstones(group.group_id, forgotten)
            if dead:
                records += self._group_tombstones(group)
            try:
                self.log.append(self.partition_of(group.group_id), records)
            except WriteFailed as exc:
                log.warning("group %s: expiring offsets failed: %s", group.group_id, exc)
                continue
            self._forget_offsets(group.group_id, forgotten)  # O2: committed and unsure
            expired += len(gone)
            if dead:
                self._forget(group)
                log.info("group %s: expired (offsets.retention.minutes)", group.group_id)
        return expired

    @staticmethod
    def _group_tombstones(group: ClassicGroup | ConsumerGroup
                          ) -> list[tuple[bytes, bytes | None]]:
        if isinstance(group, ConsumerGroup):
            return [consumer_records.to_bytes(r) for r in group.tombstones()]
        return [(rec.group_key(group.group_id), None)]

    def _forget(self, group: ClassicGroup | ConsumerGroup) -> None:
        """A deleted or expired group leaves ``groups``."""
        if isinstance(group, ConsumerGroup):
            self.consumer_groups.forget(group)
        else:
            group.transition(_DEAD, self.now_ms())
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]

    # --- storing a group ----------------------------------------------------------------------

    async def _store_group(self, group: ClassicGroup) -> None:
        await self._durable(self._append_group(group))

    @staticmethod
    async def _durable(durable: Awaitable[None] | None) -> None:
        if durable is not None:
            try:
                await durable
            except OSError as exc:
                raise WriteFailed(durable_error(exc), str(exc)) from exc

    def _append_group(self, group: ClassicGroup) -> Awaitable[None] | None:
        """The group's record appended now (WriteFailed: the log did not take it); returns
        what to await for it to be durable."""
        if self.groups.get(group.group_id) is not group:
            # Dropped by a resignation (a timer or a continuation of it running late): its
            # state is no longer this coordinator's to write, even if the partition is led
            # here again.
            raise WriteFailed(E.not_coordinator, f"group {group.group_id} is not served here")
        try:
            record = (rec.group_key(group.group_id), rec.group_value(group.to_value()))
        except ValueError as exc:  # a string the record cannot hold (refused earlier)
            raise WriteFailed(E.invalid_request, str(exc)) from exc
        try:
            return self.log.append(self.partition_of(group.group_id), [record])
        except WriteFailed as exc:
            error = (E.unknown_server_error if exc.error is E.message_too_large
                     else exc.error)
            raise WriteFailed(error, str(exc)) from exc

    def close(self) -> None:
        self.consumer_groups.close()
        self._sessions.close()
        for task in self._tasks:
            task.cancel()
        for group in self.groups.values():
            if isinstance(group, ConsumerGroup):
                continue
            _cancel_timers(group)
