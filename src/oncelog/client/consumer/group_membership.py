"""A consumer's membership of a group under Kafka's classic protocol, as a state machine.

Rules of this file:

- Every decision the member side of the classic group protocol makes lives here: when to
  find the coordinator, (re)join, assign (as leader), sync and heartbeat; what each answer's
  error means; which partitions an answer assigns, revokes or loses; when the member must
  leave because poll() was not called.
- It does no I/O, starts no thread and reads no clock: requests come out as plain values,
  answers go in as plain values, and every call that depends on time is given ``now``
  (seconds on a monotonic clock). The driver (classic_group.py) sends and receives; the unit
  tests feed answers directly.

Theory of operation. A member finds its group's coordinator (FindCoordinator, key type 0),
then joins: JoinGroup carries one protocol per configured assignor, each with the member's
subscription (ConsumerProtocol bytes). A first join without a member id is answered
MEMBER_ID_REQUIRED with the id to join with (KIP-394); a static member (group.instance.id,
KIP-345) is given its id at once. The coordinator answers every member once all have
joined: the leader gets the members' subscriptions and computes the assignment with the
assignor the group chose; everyone then sends SyncGroup (the leader with the assignment) and
gets its own partitions back. From then on the member heartbeats every
heartbeat.interval.ms; an answer REBALANCE_IN_PROGRESS means "rejoin".

Before a join the member hands partitions back (prepare_join): under the eager protocol
(range, roundrobin) all of them, revoked; under the cooperative one (KIP-429) only those of
topics it no longer subscribes to, and after the sync exactly those the new assignment took
away (then it rejoins at once, so that the next rebalance can give them to their new
member). Partitions of a membership the coordinator no longer recognises (UNKNOWN_MEMBER_ID,
ILLEGAL_GENERATION, poll timeout) are lost, not revoked: someone else may own them already,
so nothing of theirs may be committed.

Phases::

    UNJOINED --join_request--> JOINING --on_join(ok)--> JOINED --sync_request--> SYNCING
        ^                         |                      (leader: assign first)     |
        |                         +-- errors: see the table, back to UNJOINED        |
        +--- rejoin (heartbeat says so, revoked partitions, new subscription) --- STABLE

What each error does (J = JoinGroup, S = SyncGroup, H = Heartbeat, C = OffsetCommit):

    error                          J / S / H / C        decision
    MEMBER_ID_REQUIRED             J                    rejoin now with the id given
    REBALANCE_IN_PROGRESS          J, S                 rejoin now
                                   H                    rejoin (keep heartbeating until then)
                                   C                    the commit fails; rejoin
    UNKNOWN_MEMBER_ID,             J, S, H, C           forget member id and generation;
    ILLEGAL_GENERATION                                  owned partitions are lost; rejoin
    NOT_COORDINATOR,               J, S, H, C           find the coordinator again (C retries)
    COORDINATOR_NOT_AVAILABLE
    COORDINATOR_LOAD_IN_PROGRESS   J, S, H, C           retry after retry.backoff.ms
    FENCED_INSTANCE_ID             J, S, H, C           fatal: another member has our
                                                        group.instance.id
    anything else                  J, S, H              fatal (INCONSISTENT_GROUP_PROTOCOL,
                                                        INVALID_SESSION_TIMEOUT,
                                                        GROUP_MAX_SIZE_REACHED, ...)
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from kio.schema.errors import ErrorCode

from ..network.connection import KafkaError
from ..topic_partition import SIMPLE_COMMIT, CommitIdentity, TopicPartition
from .assignors import COOPERATIVE, Assignor, Member, rebalance_protocol
from .consumer_protocol import (
    Assignment,
    ConsumerProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)

log = logging.getLogger(__name__)

_COORDINATOR_MOVED = (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available)
_MEMBERSHIP_GONE = (ErrorCode.unknown_member_id, ErrorCode.illegal_generation)
_NETWORK = (ErrorCode.network_exception, ErrorCode.request_timed_out)


class Phase(enum.Enum):
    UNJOINED = "unjoined"
    JOINING = "joining"  # JoinGroup in flight
    JOINED = "joined"  # JoinGroup answered; SyncGroup (after the leader's assignment) next
    SYNCING = "syncing"  # SyncGroup in flight
    STABLE = "stable"


class Step(enum.Enum):
    """What the driver does next (next_step)."""

    FAILED = "failed"  # self.fatal says why; nothing more will work
    FIND_COORDINATOR = "find coordinator"
    BACKOFF = "backoff"  # wait until self.backoff_until
    JOIN = "join"  # prepare_join(), hand over what it says, then send join_request()
    ASSIGN = "assign"  # leader: metadata for leader_topics(), assign(), send sync_request()
    SYNC = "sync"  # send sync_request()
    AWAIT = "await"  # a JoinGroup or SyncGroup answer is in flight
    STABLE = "stable"


# --- requests and answers, as plain values ---------------------------------------------------

@dataclass(frozen=True, slots=True)
class JoinGroup:
    group_id: str
    member_id: str
    instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    reason: str | None


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    generation: int = -1
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # id, instance id, metadata
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncGroup:
    group_id: str
    generation: int
    member_id: str
    instance_id: str | None
    protocol_name: str | None
    assignments: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    group_id: str
    generation: int
    member_id: str
    instance_id: str | None


@dataclass(frozen=True, slots=True)
class LeaveGroup:
    group_id: str
    member_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Handoff:
    """Partitions the consumer gives up: revoked (commit them first, then on_revoke) or lost
    (on_lost; never committed)."""

    revoked: frozenset[TopicPartition] = frozenset()
    lost: frozenset[TopicPartition] = frozenset()


@dataclass(frozen=True, slots=True)
class AssignmentChange:
    """What a completed SyncGroup changes: ``revoked`` first (cooperative only), then
    ``added`` (positions from committed offsets), ``assigned`` being the whole assignment."""

    assigned: frozenset[TopicPartition]
    added: frozenset[TopicPartition]
    revoked: frozenset[TopicPartition]


class _Coordinated(Protocol):
    def coordinator_lost(self, now: float, why: str = "") -> None: ...


def shared_commit_error(membership: _Coordinated, identity: CommitIdentity, error: ErrorCode,
                        now: float) -> bool | None:
    """What both protocols' memberships do with an OffsetCommit error before their own
    rules: retry on a loading coordinator or the network, find a moved coordinator again and
    retry, and fail any other error of a commit made outside a membership; None: the
    protocol's own rules decide."""
    if error in (ErrorCode.coordinator_load_in_progress, *_NETWORK):
        return True
    if error in _COORDINATOR_MOVED:
        membership.coordinator_lost(now, error.name)
        return True
    if identity == SIMPLE_COMMIT:
        return False
    return None


class ClassicMembership:
    def __init__(self, group_id: str, assignors: list[Assignor], *,
                 instance_id: str | None = None, session_timeout_ms: int = 45_000,
                 rebalance_timeout_ms: int = 300_000, heartbeat_interval_ms: int = 3_000,
                 retry_backoff_ms: int = 100) -> None:
        if not group_id:
            raise ValueError("group.id must not be empty")
        self.group_id = group_id
        self.assignors = {a.name: a for a in assignors}
        self.protocol = rebalance_protocol(assignors)
        self.instance_id = instance_id
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.heartbeat_interval = heartbeat_interval_ms / 1000
        self.retry_backoff = retry_backoff_ms / 1000
        self.max_poll_interval = rebalance_timeout_ms / 1000

        self.phase = Phase.UNJOINED
        self.member_id = ""
        self.generation = -1
        self.protocol_name: str | None = None
        self.leader = ""
        self.members: tuple[tuple[str, str | None, bytes], ...] = ()
        self.skip_assignment = False
        self.subscription: frozenset[str] = frozenset()
        self.owned: frozenset[TopicPartition] = frozenset()
        self.rejoin_needed = True
        self.rejoin_reason = "joining the group"
        self.coordinator: tuple[int, str, int] | None = None
        self.backoff_until = 0.0
        self.fatal: KafkaError | None = None
        self.next_heartbeat = 0.0
        self.last_heartbeat_ok = 0.0
        self.last_poll: float | None = None
        # What the leader assigned from: every member's topics and their partition counts
        # (a change means a new assignment is due: Kafka's leader watches the same).
        self.assigned_counts: dict[str, int] = {}

    # --- what next -------------------------------------------------------------------------

    def next_step(self, now: float) -> Step:
        if self.fatal is not None:
            return Step.FAILED
        if self.phase in (Phase.JOINING, Phase.SYNCING):
            return Step.AWAIT
        if self.phase == Phase.JOINED:
            if self.member_id == self.leader and not self.skip_assignment:
                return Step.ASSIGN
            return Step.SYNC
        if self.phase == Phase.STABLE and not self.rejoin_needed:
            return Step.STABLE
        if now < self.backoff_until:
            return Step.BACKOFF
        if self.coordinator is None:
            return Step.FIND_COORDINATOR
        return Step.JOIN

    @property
    def stable(self) -> bool:
        return self.phase == Phase.STABLE and self.fatal is None

    # --- the subscription ------------------------------------------------------------------

    def set_subscription(self, topics: Iterable[str]) -> bool:
        """The topics to consume; a change means a rejoin. Returns whether it changed."""
        topics = frozenset(topics)
        if topics == self.subscription:
            return False
        self.subscription = topics
        self.request_rejoin("the subscription changed")
        return True

    def request_rejoin(self, reason: str) -> None:
        if not self.rejoin_needed:
            log.info("group %s: rejoining: %s", self.group_id, reason)
        self.rejoin_needed = True
        self.rejoin_reason = reason

    # --- the coordinator -------------------------------------------------------------------

    def on_coordinator(self, node: int, host: str, port: int) -> None:
        self.coordinator = (node, host, port)

    def on_coordinator_error(self, error: ErrorCode, now: float) -> None:
        """FindCoordinator failed (or no broker answered)."""
        if error in (ErrorCode.coordinator_not_available, *_NETWORK,
                     ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator):
            self.backoff_until = now + self.retry_backoff
        else:
            self._fail(error, "FindCoordinator")

    def coordinator_lost(self, now: float, why: str = "") -> None:
        """The coordinator connection failed or an answer did not come in time: a join or
        sync in flight will never be answered; find the coordinator again."""
        if self.coordinator is not None:
            log.info("group %s: coordinator %s lost%s", self.group_id, self.coordinator,
                     f": {why}" if why else "")
        self.coordinator = None
        if self.phase in (Phase.JOINING, Phase.JOINED, Phase.SYNCING):
            self.phase = Phase.UNJOINED
            self.rejoin_needed = True
        self.backoff_until = now + self.retry_backoff

    # --- joining ---------------------------------------------------------------------------

    def prepare_join(self) -> Handoff:
        """What to give up before sending JoinGroup (Kafka's onJoinPrepare)."""
        if not self.owned:
            return Handoff()
        if self.generation < 0:
            lost, self.owned = self.owned, frozenset()
            return Handoff(lost=lost)
        if self.protocol == COOPERATIVE:
            revoked = frozenset(tp for tp in self.owned if tp.topic not in self.subscription)
        else:
            revoked = self.owned
        self.owned -= revoked
        return Handoff(revoked=revoked)

    def prepare_leave(self) -> Handoff:
        """Everything owned, given up before leaving (Kafka's onLeavePrepare): revoked, or
        lost when the coordinator no longer knows this membership."""
        owned, self.owned = self.owned, frozenset()
        if not owned:
            return Handoff()
        return Handoff(lost=owned) if self.generation < 0 else Handoff(revoked=owned)

    def join_request(self) -> JoinGroup:
        assert self.coordinator is not None and self.fatal is None
        self.phase = Phase.JOINING
        reason, self.rejoin_reason = self.rejoin_reason, ""
        metadata = encode_subscription(Subscription(
            tuple(sorted(self.subscription)), tuple(sorted(self.owned)), self.generation))
        return JoinGroup(self.group_id, self.member_id, self.instance_id,
                         self.session_timeout_ms, self.rebalance_timeout_ms,
                         tuple((name, metadata) for name in self.assignors), reason or None)

    def on_join(self, result: JoinResult, now: float) -> None:
        if self.phase != Phase.JOINING:
            return  # the answer to a join given up (the connection failed, we left)
        self.phase = Phase.UNJOINED
        error = result.error
        if error == ErrorCode.none:
            if result.protocol_name not in self.assignors:
                self._fail(ErrorCode.inconsistent_group_protocol,
                           f"the group chose assignor {result.protocol_name!r}")
                return
            self.member_id = result.member_id
            self.generation = result.generation
            self.protocol_name = result.protocol_name
            self.leader = result.leader
            self.members = result.members
            self.skip_assignment = result.skip_assignment
            self.phase = Phase.JOINED
            log.info("group %s: joined generation %d as %s%s", self.group_id, self.generation,
                     self.member_id, " (leader)" if self.leader == self.member_id else "")
        elif error == ErrorCode.member_id_required:
            self.member_id = result.member_id  # KIP-394: join again, now, with this id
        else:
            self._join_or_sync_failed(error, now, "JoinGroup")

    def _join_or_sync_failed(self, error: ErrorCode, now: float, api: str) -> None:
        """What a JoinGroup or SyncGroup error leaves to do (their answers agree on every
        error but the ones each handles first)."""
        if error == ErrorCode.rebalance_in_progress:
            pass  # join again now
        elif error in _MEMBERSHIP_GONE:
            self._reset_membership()
        elif error == ErrorCode.coordinator_load_in_progress:
            self.backoff_until = now + self.retry_backoff
        elif error in _COORDINATOR_MOVED or error in _NETWORK:
            self.coordinator_lost(now, error.name)
        else:
            self._fail(error, api)

    # --- the leader's assignment -----------------------------------------------------------

    def _member_subscriptions(self) -> list[tuple[str, str | None, Subscription]]:
        result = []
        for member_id, instance_id, metadata in self.members:
            try:
                result.append((member_id, instance_id, decode_subscription(metadata)))
            except ConsumerProtocolError as exc:
                log.warning("group %s: member %s sent %s; it gets nothing", self.group_id,
                            member_id, exc)
                result.append((member_id, instance_id, Subscription(())))
        return result

    def leader_topics(self) -> frozenset[str]:
        """Every topic some member subscribes to: the metadata the leader assigns from."""
        return frozenset(t for _, _, s in self._member_subscriptions() for t in s.topics)

    def assign(self, counts: Mapping[str, int]) -> dict[str, list[TopicPartition]]:
        """The leader's assignment with the group's assignor; ``counts`` holds the partition
        count of each existing topic of leader_topics()."""
        assert self.phase == Phase.JOINED and self.member_id == self.leader
        assignor = self.assignors[self.protocol_name]
        members = [Member(member_id, frozenset(s.topics), instance_id, s.owned_partitions,
                          s.generation)
                   for member_id, instance_id, s in self._member_subscriptions()]
        self.assigned_counts = {t: counts.get(t, 0) for t in self.leader_topics()}
        return assignor.assign(members, counts)

    def sync_request(self, assignments: Mapping[str, list[TopicPartition]] | None = None
                     ) -> SyncGroup:
        assert self.phase == Phase.JOINED
        self.phase = Phase.SYNCING
        encoded = tuple((member_id, encode_assignment(Assignment(tuple(partitions))))
                        for member_id, partitions in (assignments or {}).items())
        return SyncGroup(self.group_id, self.generation, self.member_id, self.instance_id,
                         self.protocol_name, encoded)

    def on_sync(self, result: SyncResult, now: float) -> AssignmentChange | None:
        """The new assignment (None when the sync failed: next_step says what follows)."""
        if self.phase != Phase.SYNCING:
            return None  # the answer to a sync given up
        self.phase = Phase.UNJOINED
        error = result.error
        if error == ErrorCode.none:
            try:
                assigned = frozenset(decode_assignment(result.assignment).partitions)
            except ConsumerProtocolError as exc:
                self._fail(ErrorCode.inconsistent_group_protocol, f"SyncGroup: {exc}")
                return None
            added, revoked = assigned - self.owned, self.owned - assigned
            self.owned = assigned
            self.phase = Phase.STABLE
            self.rejoin_needed = False
            self.next_heartbeat = now + self.heartbeat_interval
            self.last_heartbeat_ok = now
            if revoked:
                self.request_rejoin("partitions revoked: the next rebalance hands them on")
            return AssignmentChange(assigned, added, revoked)
        self._join_or_sync_failed(error, now, "SyncGroup")
        return None

    # --- heartbeats ------------------------------------------------------------------------

    def heartbeat_request(self, now: float) -> Heartbeat | None:
        """The Heartbeat to send now, if one is due (one in flight at a time: the next is due
        only after this one's answer)."""
        if self.phase != Phase.STABLE or self.coordinator is None or self.fatal is not None:
            return None
        if now - self.last_heartbeat_ok > self.session_timeout_ms / 1000:
            # No heartbeat got through for a whole session: the coordinator may have moved.
            self.coordinator_lost(now, "no heartbeat answered within session.timeout.ms")
            return None
        if now < self.next_heartbeat:
            return None
        self.next_heartbeat = float("inf")
        return Heartbeat(self.group_id, self.generation, self.member_id, self.instance_id)

    def on_heartbeat(self, sent: Heartbeat, error: ErrorCode, now: float) -> None:
        self.next_heartbeat = now + self.heartbeat_interval
        if (sent.generation, sent.member_id) != (self.generation, self.member_id):
            return  # an answer about a membership we have since left
        if error in (ErrorCode.none, ErrorCode.rebalance_in_progress):
            self.last_heartbeat_ok = now
            if error == ErrorCode.rebalance_in_progress:
                self.request_rejoin("the group is rebalancing")
        elif error in _MEMBERSHIP_GONE:
            self._reset_membership()
        elif error == ErrorCode.coordinator_load_in_progress:
            self.next_heartbeat = now + self.retry_backoff
        elif error in _COORDINATOR_MOVED or error in _NETWORK:
            self.coordinator_lost(now, error.name)
        else:
            self._fail(error, "Heartbeat")

    # --- poll timeout and leaving ----------------------------------------------------------

    def on_poll(self, now: float) -> None:
        self.last_poll = now

    def poll_timed_out(self, now: float) -> bool:
        """Kafka's rule: a member that has not polled within max.poll.interval.ms leaves the
        group so that its partitions go to someone who consumes them. True when that just
        happened; the caller then sends leave_request() (None for a static member)."""
        if (self.last_poll is None or self.generation < 0
                or now - self.last_poll <= self.max_poll_interval):
            return False
        log.warning("group %s: poll() not called within max.poll.interval.ms (%d ms): "
                    "leaving the group", self.group_id, int(self.max_poll_interval * 1000))
        return True

    def leave_request(self, reason: str) -> LeaveGroup | None:
        """LeaveGroup for a dynamic member that is in the group, and forget the membership.
        Static members do not send it (Kafka's rule: their partitions wait for them for
        session.timeout.ms)."""
        leave = None
        if self.member_id and self.instance_id is None and self.coordinator is not None:
            leave = LeaveGroup(self.group_id, self.member_id, reason)
        self._reset_membership()
        return leave

    # --- commits ---------------------------------------------------------------------------

    def commit_identity(self) -> CommitIdentity:
        """Whom a commit is made as; REBALANCE_IN_PROGRESS while the member is between
        generations (Kafka's commitSync throws RebalanceInProgressException then)."""
        if self.fatal is not None:
            raise self.fatal
        if self.phase != Phase.STABLE:
            raise KafkaError(ErrorCode.rebalance_in_progress,
                             f"group {self.group_id} is rebalancing; commit after it")
        return CommitIdentity(self.generation, self.member_id, self.instance_id)

    def on_commit_error(self, identity: CommitIdentity, error: ErrorCode, now: float) -> bool:
        """An OffsetCommit error's effect on the membership; whether a retry may succeed."""
        shared = shared_commit_error(self, identity, error, now)
        if shared is not None:
            return shared
        if (identity.generation, identity.member_id) != (self.generation, self.member_id):
            return False  # about a membership already left
        if error in _MEMBERSHIP_GONE:
            self._reset_membership()
        elif error == ErrorCode.rebalance_in_progress:
            self.request_rejoin("the group is rebalancing")
        elif error == ErrorCode.fenced_instance_id:
            self._fail(error, "OffsetCommit")
        return False

    # --- helpers ---------------------------------------------------------------------------

    def _reset_membership(self) -> None:
        """The coordinator no longer knows us (or we left): owned partitions are lost."""
        self.member_id = ""
        self.generation = -1
        if self.phase not in (Phase.JOINING, Phase.SYNCING):  # else its answer decides
            self.phase = Phase.UNJOINED
        self.rejoin_needed = True
        self.rejoin_reason = "the member's generation was reset"

    def _fail(self, error: ErrorCode, what: str) -> None:
        message = f"{what} for group {self.group_id}"
        if error == ErrorCode.fenced_instance_id:
            message += f": another consumer has group.instance.id {self.instance_id!r}"
        log.error("%s failed: %s", message, error.name)
        self.fatal = KafkaError(error, message)
