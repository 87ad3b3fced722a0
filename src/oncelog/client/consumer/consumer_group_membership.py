"""A consumer's membership of a group under the consumer group protocol (KIP-848), as a
state machine.

Rules of this file:

- Every decision the member side of KIP-848 makes lives here: what each
  ConsumerGroupHeartbeat carries, what its answer's error means, which partitions the
  assignment it brings revokes, adds or loses, when the member rejoins or leaves.
- It does no I/O, starts no thread and reads no clock: requests come out as plain values,
  answers go in as plain values, and every call that depends on time is given ``now``
  (seconds on a monotonic clock). The driver (consumer_group.py) sends and receives; the unit
  tests feed answers directly.

Theory of operation (Kafka's ConsumerMembershipManager and HeartbeatState). The member
picks its own member id (v1, KIP-1082) and joins with member epoch 0 and a full request:
its subscription (topic names and/or a regular expression the broker resolves), the
rebalance timeout (max.poll.interval.ms), the server assignor (group.remote.assignor) and,
for a static member, its instance id. Afterwards a heartbeat carries only what changed since
the last one that was answered; after a failed heartbeat, everything again. The coordinator
answers with the member epoch, the heartbeat interval and, when it changed, the member's
whole assignment as topic ids and partitions.

The coordinator never gives a member a partition another member still owns. So the member
reconciles in one step, in the consumer's thread: it revokes what the assignment no longer
holds (committing first with enable.auto.commit, then on_revoke), assigns what is new
(on_assign; positions from the committed offsets), and reports what it now owns in the next
heartbeat, sent at once: that acknowledgement lets the coordinator hand the revoked partitions
on and give this member the ones it was waiting for. Topic ids are resolved to names through
Metadata (v10+); partitions of ids not resolved yet wait.

Phases::

    UNSUBSCRIBED --set_subscription--> JOINING --answer(epoch > 0)--> MEMBER
                                          ^                              |
                                          +-- take_lost() <-- FENCED <---+ FENCED_MEMBER_EPOCH,
                                          |                              |   UNKNOWN_MEMBER_ID
                                          +-- take_lost() <-- STALE <----+ poll timeout (left)
    MEMBER --leave_request--> UNSUBSCRIBED (close, unsubscribe: epoch -1, or -2 if static)

What each heartbeat error does:

    error                               decision
    FENCED_MEMBER_EPOCH,                owned partitions are lost (on_lost); rejoin with
    UNKNOWN_MEMBER_ID                   epoch 0 and the same member id
    NOT_COORDINATOR,                    find the coordinator again; the next heartbeat is full
    COORDINATOR_NOT_AVAILABLE,
    network errors
    COORDINATOR_LOAD_IN_PROGRESS        retry after retry.backoff.ms; the next one is full
    anything else                       fatal, raised from poll(): UNRELEASED_INSTANCE_ID,
                                        FENCED_INSTANCE_ID, GROUP_MAX_SIZE_REACHED,
                                        UNSUPPORTED_ASSIGNOR, INVALID_REGULAR_EXPRESSION,
                                        GROUP_ID_NOT_FOUND, INVALID_REQUEST, ...

OffsetCommit is made as (member id, member epoch); STALE_MEMBER_EPOCH is retried with the
latest epoch, UNKNOWN_MEMBER_ID fails the commit (the heartbeat decides the membership).
"""

from __future__ import annotations

import base64
import enum
import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ..network.connection import KafkaError
from ..topic_partition import TopicPartition
from .group_membership import AssignmentChange, CommitIdentity, Handoff, shared_commit_error

log = logging.getLogger(__name__)

LEAVE_EPOCH = -1  # a member leaves the group
STATIC_LEAVE_EPOCH = -2  # a static member leaves for now; its partitions wait for it
JOIN_EPOCH = 0

Assignment = Mapping[uuid.UUID, frozenset[int]]  # topic id -> partitions

_COORDINATOR_MOVED = (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available)
_NETWORK = (ErrorCode.network_exception, ErrorCode.request_timed_out)
_FENCED = (ErrorCode.fenced_member_epoch, ErrorCode.unknown_member_id)


def new_member_id() -> str:
    """A member id as Kafka's clients make one (Uuid.toString: 22 url-safe base64 chars)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class Phase(enum.Enum):
    UNSUBSCRIBED = "unsubscribed"  # no subscription, or the member left
    JOINING = "joining"  # a heartbeat with epoch 0 is due
    MEMBER = "member"  # epoch > 0: heartbeating, reconciling towards the assignment
    FENCED = "fenced"  # the coordinator fenced it: lose what it owns, then join again
    STALE = "stale"  # it left after the poll timeout: lose, then join at the next poll


class Step(enum.Enum):
    """What the driver does next (next_step)."""

    FAILED = "failed"  # self.fatal says why
    IDLE = "idle"  # no subscription
    FIND_COORDINATOR = "find coordinator"
    BACKOFF = "backoff"  # wait until self.backoff_until
    LOSE = "lose"  # take_lost(): hand over the lost partitions (on_lost), then join again
    RESOLVE = "resolve"  # unresolved_topic_ids() to names through Metadata: on_topic_names()
    RECONCILE = "reconcile"  # reconcile(), hand over its change, then on_reconciled()
    HEARTBEAT = "heartbeat"  # a heartbeat is due now (a join, an acknowledgement)
    STABLE = "stable"


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeat:
    """A ConsumerGroupHeartbeat request; None (and -1) fields are "unchanged"."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: tuple[tuple[uuid.UUID, tuple[int, ...]], ...] | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None  # None: unchanged since the last answer


@dataclass(frozen=True, slots=True)
class _Sent:
    """The fields the coordinator has (Kafka's HeartbeatState.sentFields)."""

    subscription: tuple[frozenset[str], str | None]
    owned: frozenset[TopicPartition]


class ConsumerMembership:
    def __init__(self, group_id: str, *, instance_id: str | None = None,
                 server_assignor: str | None = None, rebalance_timeout_ms: int = 300_000,
                 retry_backoff_ms: int = 100, member_id: str | None = None) -> None:
        if not group_id:
            raise ValueError("group.id must not be empty")
        self.group_id = group_id
        self.instance_id = instance_id
        self.server_assignor = server_assignor
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.max_poll_interval = rebalance_timeout_ms / 1000
        self.retry_backoff = retry_backoff_ms / 1000
        self.member_id = member_id or new_member_id()  # kept for the consumer's lifetime

        self.phase = Phase.UNSUBSCRIBED
        self.member_epoch = JOIN_EPOCH
        self.topics: frozenset[str] = frozenset()
        self.regex: str | None = None
        # The last assignment the coordinator gave (topic ids), the names known for topic
        # ids, and what the consumer holds now, with each held topic's id.
        self.target: dict[uuid.UUID, frozenset[int]] = {}
        self.names: dict[uuid.UUID, str] = {}
        self.owned: frozenset[TopicPartition] = frozenset()
        self._owned_ids: dict[str, uuid.UUID] = {}
        self._sent: _Sent | None = None  # None: the next heartbeat carries every field
        self._sending: _Sent | None = None  # what the heartbeat in flight carries
        self.coordinator: tuple[int, str, int] | None = None
        self.backoff_until = 0.0
        self.resolve_due = 0.0
        self.heartbeat_interval = 3.0  # until the coordinator says
        self._next_regular = 0.0
        self.fatal: KafkaError | None = None
        self.last_poll: float | None = None

    # --- what next -------------------------------------------------------------------------

    def next_step(self, now: float) -> Step:
        if self.fatal is not None:
            return Step.FAILED
        if self.phase == Phase.UNSUBSCRIBED:
            return Step.IDLE
        if self.phase in (Phase.FENCED, Phase.STALE):
            return Step.LOSE
        if self.phase == Phase.MEMBER:
            if self.unresolved_topic_ids() and now >= self.resolve_due:
                return Step.RESOLVE
            if self._resolved_target() != self.owned:
                return Step.RECONCILE
        if self.coordinator is None:
            return Step.BACKOFF if now < self.backoff_until else Step.FIND_COORDINATOR
        if self._urgent():
            if now >= self.backoff_until:
                return Step.HEARTBEAT
            if self.phase == Phase.JOINING:
                return Step.BACKOFF
        return Step.STABLE

    @property
    def stable(self) -> bool:
        """In the group, holding (and having reported) exactly what it was assigned."""
        return (self.fatal is None and self.phase == Phase.MEMBER
                and not self.unresolved_topic_ids() and self._resolved_target() == self.owned
                and self._sent is not None and self._sent.owned == self.owned)

    @property
    def next_heartbeat(self) -> float:
        """When the heartbeat thread should look again (a due heartbeat: now or earlier)."""
        if self.phase not in (Phase.JOINING, Phase.MEMBER) or self.coordinator is None:
            return float("inf")
        if self._urgent():
            return self.backoff_until
        return self._next_regular

    def _urgent(self) -> bool:
        """A heartbeat that must go now: a join, or what the coordinator should learn (the
        partitions now owned, a new subscription)."""
        if self.phase == Phase.JOINING:
            return True
        if self.phase != Phase.MEMBER:
            return False
        return self._sent is None or self._sent != self._now_state()

    def _now_state(self) -> _Sent:
        return _Sent((self.topics, self.regex), self.owned)

    # --- the subscription ------------------------------------------------------------------

    def set_subscription(self, topics: Iterable[str], regex: str | None = None) -> bool:
        """The topic names and the regular expression (the broker resolves it) to consume;
        empty ends nothing by itself (leave_request does). Returns whether it changed."""
        topics = frozenset(topics)
        if (topics, regex) == (self.topics, self.regex):
            return False
        self.topics, self.regex = topics, regex
        if self.phase == Phase.UNSUBSCRIBED and (topics or regex):
            self._rejoin()
        return True

    def _rejoin(self) -> None:
        self.phase = Phase.JOINING
        self.member_epoch = JOIN_EPOCH
        self.target = {}
        self._sent = self._sending = None

    # --- the coordinator -------------------------------------------------------------------

    def on_coordinator(self, node: int, host: str, port: int) -> None:
        self.coordinator = (node, host, port)

    def on_coordinator_error(self, error: ErrorCode, now: float) -> None:
        """FindCoordinator failed (or no broker answered)."""
        if error in (*_COORDINATOR_MOVED, *_NETWORK, ErrorCode.coordinator_load_in_progress):
            self.backoff_until = now + self.retry_backoff
        else:
            self._fail(error, "FindCoordinator")

    def coordinator_lost(self, now: float, why: str = "") -> None:
        if self.coordinator is not None:
            log.info("group %s: coordinator %s lost%s", self.group_id, self.coordinator,
                     f": {why}" if why else "")
        self.coordinator = None
        self._sent = self._sending = None
        self.backoff_until = now + self.retry_backoff

    # --- heartbeats ------------------------------------------------------------------------

    def heartbeat_request(self, now: float, force: bool = False) -> ConsumerHeartbeat | None:
        """The heartbeat to send now, if one is due (one in flight at a time: the caller
        holds the heartbeat connection until its answer went to on_heartbeat)."""
        if (self.fatal is not None or self.coordinator is None
                or self.phase not in (Phase.JOINING, Phase.MEMBER)):
            return None
        if not force and now < self.next_heartbeat:
            return None
        state = self._now_state()
        self._sending = state
        self._next_regular = now + self.heartbeat_interval
        joining = self.phase == Phase.JOINING
        full = joining or self._sent is None
        subscription_changed = full or self._sent.subscription != state.subscription
        owned = None
        if full or self._sent.owned != state.owned:
            owned = () if joining else self._owned_by_id()
        return ConsumerHeartbeat(
            self.group_id, self.member_id, self.member_epoch,
            instance_id=self.instance_id if full else None,
            rebalance_timeout_ms=self.rebalance_timeout_ms if full else -1,
            subscribed_topic_names=tuple(sorted(self.topics)) if subscription_changed else None,
            # "" clears a regular expression the coordinator may have; a join has none
            subscribed_topic_regex=(self.regex or (None if joining else ""))
            if subscription_changed else None,
            server_assignor=self.server_assignor if full else None,
            owned=owned)

    def _owned_by_id(self) -> tuple[tuple[uuid.UUID, tuple[int, ...]], ...]:
        by_id: dict[uuid.UUID, list[int]] = {}
        for tp in self.owned:
            by_id.setdefault(self._owned_ids[tp.topic], []).append(tp.partition)
        return tuple((topic_id, tuple(sorted(ps))) for topic_id, ps in sorted(by_id.items()))

    def on_heartbeat(self, sent: ConsumerHeartbeat, result: HeartbeatResult, now: float) -> None:
        sending, self._sending = self._sending, None
        if sent.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return
        if (self.phase not in (Phase.JOINING, Phase.MEMBER)
                or sent.member_epoch != self.member_epoch):
            return  # about a membership given up since (fenced, left)
        error = result.error
        if error == ErrorCode.none:
            if result.member_id:
                self.member_id = result.member_id  # v0: the coordinator chose it
            if result.member_epoch != self.member_epoch:
                log.info("group %s: member %s at epoch %d", self.group_id, self.member_id,
                         result.member_epoch)
            self.member_epoch = result.member_epoch
            if result.heartbeat_interval_ms > 0:
                self.heartbeat_interval = result.heartbeat_interval_ms / 1000
            self._next_regular = now + self.heartbeat_interval
            self._sent = sending
            if result.assignment is not None:
                self.target = {t: frozenset(ps) for t, ps in result.assignment.items() if ps}
            if self.member_epoch > 0:
                self.phase = Phase.MEMBER
            return
        self._sent = None  # whatever the coordinator has now, tell it everything again
        if error in _FENCED:
            log.warning("group %s: member %s fenced at epoch %d (%s): its partitions are "
                        "lost; it joins again", self.group_id, self.member_id,
                        self.member_epoch, error.name)
            self.phase = Phase.FENCED
            self.member_epoch = JOIN_EPOCH
            self.target = {}
        elif error == ErrorCode.coordinator_load_in_progress:
            self.backoff_until = now + self.retry_backoff
            self._next_regular = now + self.retry_backoff
        elif error in _COORDINATOR_MOVED or error in _NETWORK:
            self.coordinator_lost(now, error.name)
        else:
            self._fail(error, "ConsumerGroupHeartbeat", result.message)

    # --- reconciliation --------------------------------------------------------------------

    def unresolved_topic_ids(self) -> frozenset[uuid.UUID]:
        return frozenset(t for t in self.target if t not in self.names)

    def on_topic_names(self, names: Mapping[uuid.UUID, str], now: float) -> None:
        """Topic ids' names from Metadata; ids still unknown are asked again later."""
        self.names.update(names)
        if self.unresolved_topic_ids():
            self.resolve_due = now + self.retry_backoff

    def _resolved_target(self) -> frozenset[TopicPartition]:
        return frozenset(TopicPartition(self.names[t], p)
                         for t, ps in self.target.items() if t in self.names for p in ps)

    def reconcile(self) -> AssignmentChange:
        """What to hand over to hold the assignment: ``revoked`` first (commit, on_revoke),
        then ``added`` (on_assign); on_reconciled() once done."""
        assigned = self._resolved_target()
        return AssignmentChange(assigned, assigned - self.owned, self.owned - assigned)

    def on_reconciled(self, change: AssignmentChange) -> None:
        """The consumer holds ``change.assigned`` now; the next heartbeat says so."""
        ids = {self.names[t]: t for t in self.target if t in self.names}
        self._owned_ids = {tp.topic: ids.get(tp.topic, self._owned_ids.get(tp.topic))
                           for tp in change.assigned}
        self.owned = change.assigned
        if change.added or change.revoked:
            log.info("group %s: epoch %d: %d partitions (+%d -%d)", self.group_id,
                     self.member_epoch, len(self.owned), len(change.added), len(change.revoked))

    def take_lost(self) -> Handoff:
        """After fencing or a poll timeout: everything owned is lost (someone else may own
        it already: nothing of it may be committed); the member joins again with epoch 0."""
        lost, self.owned = self.owned, frozenset()
        self._owned_ids = {}
        if self.topics or self.regex:
            self._rejoin()
        else:
            self.phase = Phase.UNSUBSCRIBED
        return Handoff(lost=lost)

    # --- poll timeout and leaving ----------------------------------------------------------

    def on_poll(self, now: float) -> None:
        self.last_poll = now

    def poll_timed_out(self, now: float) -> bool:
        """Kafka's rule: a member that has not polled within max.poll.interval.ms leaves the
        group so that its partitions go to someone who consumes them; the caller sends
        leave_request(stale=True)."""
        if (self.last_poll is None or self.phase != Phase.MEMBER
                or now - self.last_poll <= self.max_poll_interval):
            return False
        log.warning("group %s: poll() not called within max.poll.interval.ms (%d ms): "
                    "leaving the group", self.group_id, int(self.max_poll_interval * 1000))
        return True

    def prepare_leave(self) -> Handoff:
        """Everything owned, given up before leaving: revoked (committed first), or lost
        when the coordinator no longer counts this member in."""
        owned, self.owned = self.owned, frozenset()
        self._owned_ids = {}
        if not owned:
            return Handoff()
        if self.phase == Phase.MEMBER and self.member_epoch > 0:
            return Handoff(revoked=owned)
        return Handoff(lost=owned)

    def leave_request(self, reason: str, stale: bool = False) -> ConsumerHeartbeat | None:
        """The heartbeat that leaves (epoch -1; -2 for a static member, whose partitions
        then wait for it for the session timeout), if the member is in the group; the
        membership is given up either way (``stale``: it joins again at the next poll)."""
        leave = None
        if self.phase == Phase.MEMBER and self.member_epoch > 0 and self.coordinator is not None:
            epoch = STATIC_LEAVE_EPOCH if self.instance_id is not None else LEAVE_EPOCH
            leave = ConsumerHeartbeat(self.group_id, self.member_id, epoch,
                                      instance_id=self.instance_id)
            log.info("group %s: member %s leaves (epoch %d): %s", self.group_id,
                     self.member_id, epoch, reason)
        self.member_epoch = JOIN_EPOCH
        self.target = {}
        self._sent = self._sending = None
        self.phase = Phase.STALE if stale else Phase.UNSUBSCRIBED
        if not stale:
            self.topics, self.regex = frozenset(), None
        return leave

    # --- commits ---------------------------------------------------------------------------

    def commit_identity(self) -> CommitIdentity:
        """Whom a commit is made as: the member id and its latest epoch."""
        if self.fatal is not None:
            raise self.fatal
        if self.phase != Phase.MEMBER or self.member_epoch <= 0:
            raise KafkaError(ErrorCode.unknown_member_id,
                             f"group {self.group_id}: not a member yet (joining); commit once "
                             "partitions are assigned")
        return CommitIdentity(self.member_epoch, self.member_id, self.instance_id)

    def fetch_identity(self) -> tuple[str | None, int]:
        """Whom an OffsetFetch names (v9): the member and its epoch while in the group."""
        if self.phase == Phase.MEMBER and self.member_epoch > 0:
            return self.member_id, self.member_epoch
        return None, -1

    def on_commit_error(self, identity: CommitIdentity, error: ErrorCode, now: float) -> bool:
        """An OffsetCommit error's effect on the membership; whether a retry may succeed."""
        shared = shared_commit_error(self, identity, error, now)
        if shared is not None:
            return shared
        # KIP-848: retried with the latest epoch, while the member is in the group.
        return error == ErrorCode.stale_member_epoch and self.phase == Phase.MEMBER

    # --- helpers ---------------------------------------------------------------------------

    def _fail(self, error: ErrorCode, what: str, message: str | None = None) -> None:
        text = f"{what} for group {self.group_id}"
        if error == ErrorCode.unreleased_instance_id:
            text += f": group.instance.id {self.instance_id!r} is still used by another member"
        elif error == ErrorCode.fenced_instance_id:
            text += f": another consumer has group.instance.id {self.instance_id!r}"
        if message:
            text += f": {message}"
        log.error("%s failed: %s", text, error.name)
        self.fatal = KafkaError(error, text)
