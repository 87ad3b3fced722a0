"""One consumer group of the new consumer protocol (KIP-848): its state, and every decision
ConsumerGroupHeartbeat makes.

Theory of operation (Kafka's GroupMetadataManager and CurrentAssignmentBuilder):

- The *group epoch* goes up whenever what the group must assign changes: a member joins,
  leaves or changes its subscription, a subscribed topic appears, disappears or grows.
- The *target assignment* is the assignor's answer for the group epoch it was computed at
  (the *assignment epoch*); it is recomputed on the next heartbeat after the group epoch
  moved. Nobody stops: each member is reconciled towards its own target, one heartbeat at a
  time.
- A member's *member epoch* is the assignment epoch it has caught up with. To catch up it
  first gives back what its target no longer holds: those partitions are *pending
  revocation* and the member stays at its epoch (state UNREVOKED_PARTITIONS) until a
  heartbeat no longer lists them as owned. Then it moves to the target epoch and receives the
  new partitions that are free; a partition still owned (assigned or pending revocation) by
  another member is *unreleased* and is given on a later heartbeat (state
  UNRELEASED_PARTITIONS). So no partition is ever owned by two members, and a partition that
  stays with its member is never revoked.
- A heartbeat's epoch must be the member's (or the one before, when the answer that raised it
  was lost and the member owns no more than it holds): else FENCED_MEMBER_EPOCH, and the
  member rejoins with epoch 0 after giving up everything.

Every change is a list of records (consumer_records.py) that ``replay`` applies: a heartbeat
is planned from the current state, its records are written to ``__consumer_offsets``, and
only then replayed into memory; loading after a restart replays the same records. Timers and
the resolution of regular expressions are soft state, redone after a restart.

Pure: no I/O, no clocks (``now_ms`` comes in), no event loop. The coordinator
(consumer_coordinator.py) appends a plan's records and replays them in the same step,
before awaiting their durability, so the next heartbeat is planned from the state this one
left: no two heartbeats are planned from one state.

ConsumerGroupHeartbeat, in the order the checks are made ("epoch": the request's member
epoch; Kafka's GroupMetadataManager.consumerGroupHeartbeat):

    | # | request / group                                  | answer, records                   |
    |---|--------------------------------------------------|-----------------------------------|
    |K0 | a request-level check fails (``validate``)       | INVALID_REQUEST, INVALID_GROUP_ID,|
    |   |                                                  | UNSUPPORTED_ASSIGNOR, INVALID_    |
    |   |                                                  | REGULAR_EXPRESSION (RE2)          |
    |K1 | the id is a classic group's: epoch 0, the group  | it becomes this group (its record |
    |   | Empty or Dead, no pending member; with members:  | deleted, its offsets kept); with  |
    |   | group_migration.py's M1/M2                       | members: upgraded (M1); else      |
    |   |                                                  | GROUP_ID_NOT_FOUND                |
    |K2 | epoch -1 / -2 (leaving): no group; member or     | GROUP_ID_NOT_FOUND; UNKNOWN_MEMBER|
    |   | instance unknown; instance owned by another id   | _ID; FENCED_INSTANCE_ID           |
    |K3 | epoch -2, static                                 | stays with its partitions until it|
    |   |                                                  | returns or its session ends       |
    |K4 | epoch -1                                         | removed, group epoch + 1          |
    |K5 | no group, epoch != 0                             | GROUP_ID_NOT_FOUND                |
    |K6 | a new member, group at group.consumer.max.size   | GROUP_MAX_SIZE_REACHED            |
    |K7 | dynamic, unknown member, epoch != 0              | UNKNOWN_MEMBER_ID                 |
    |K8 | static, epoch 0, instance held by a member that  | UNRELEASED_INSTANCE_ID            |
    |   | did not leave with -2                            |                                   |
    |K9 | static, epoch 0, instance left with -2           | takes the old id's place and      |
    |   |                                                  | partitions                        |
    |K10| static, epoch > 0: instance unknown / owned by   | UNKNOWN_MEMBER_ID / FENCED_       |
    |   | another id                                       | INSTANCE_ID                       |
    |K11| epoch > the member's, or < it and not (the       | FENCED_MEMBER_EPOCH               |
    |   | previous epoch and owning no more than assigned) |                                   |
    |K12| epoch 0, a known member                          | rejoins from nothing (same id)    |
    |K13| otherwise                                        | metadata stored; group epoch + 1  |
    |   |                                                  | when a subscription, a regex's    |
    |   |                                                  | topics or the topics' partitions  |
    |   |                                                  | changed; target recomputed when   |
    |   |                                                  | the group epoch is ahead; the     |
    |   |                                                  | member reconciled (revoke first,  |
    |   |                                                  | then the target epoch with the    |
    |   |                                                  | partitions no one else owns)      |

Timers: a session that ends, or a revocation not done within the rebalance timeout, removes
the member as K4 (a classic member's session is its JoinGroup's; a member of the consumer
protocol leaving a group of classic members downgrades it, group_migration.py's M9).
Offsets (``commit_error``, ``fetch_error``): epoch < 0 with no members (or
no member id for a fetch) is accepted; an unknown member UNKNOWN_MEMBER_ID; another epoch
than the member's STALE_MEMBER_EPOCH (ILLEGAL_GENERATION for a classic member, whose epoch
is its generation). The offsets' own rules are offset_rules.py's.
"""

from __future__ import annotations

import enum
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from kio.schema.errors import ErrorCode

from ...protocol.client_regex import InvalidClientRegex, compile_client_regex
from . import consumer_records as cr
from .assignors import ASSIGNORS, MemberSpec
from .consumer_records import Assignment, Key, Record
from .group_records import OffsetValue

E = ErrorCode
LEAVE_EPOCH = -1  # a member leaves
STATIC_LEAVE_EPOCH = -2  # a static member leaves for now and comes back with its instance id
MAX_MEMBER_ID_BYTES = 1024  # oncelog's limit (Kafka has none; a record key holds 32767 bytes)
# Regular expressions are resolved again when the number of topics changed or after this long.
REGEX_REFRESH_MS = 10_000

TopicImage = Mapping[str, tuple[uuid.UUID, int]]  # topic name -> (id, partitions)


class MemberState(enum.IntEnum):  # Kafka's values, as stored in records
    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2


class ConsumerGroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


class Refusal(Exception):
    """A heartbeat refused with a Kafka error; nothing changes."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


@dataclass(frozen=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    classic: cr.ClassicMemberMetadata | None = None  # a member of the classic protocol

    def metadata(self) -> cr.MemberMetadataValue:
        return cr.MemberMetadataValue(
            self.instance_id, self.rack_id, self.client_id, self.client_host,
            self.subscribed_topic_names, self.subscribed_topic_regex, self.rebalance_timeout_ms,
            self.server_assignor, self.classic)

    def current(self) -> cr.CurrentAssignmentValue:
        return cr.CurrentAssignmentValue(self.member_epoch, self.previous_member_epoch,
                                         int(self.state), self.assigned,
                                         self.pending_revocation)

    def with_current(self, value: cr.CurrentAssignmentValue) -> ConsumerMember:
        try:
            state = MemberState(value.state)
        except ValueError:
            state = MemberState.UNREVOKED_PARTITIONS  # unknown: it reconciles from scratch
        return replace(self, member_epoch=value.member_epoch,
                       previous_member_epoch=value.previous_member_epoch, state=state,
                       assigned=dict(value.assigned),
                       pending_revocation=dict(value.pending_revocation))

    def owned(self) -> Iterable[tuple[uuid.UUID, int]]:
        for a in (self.assigned, self.pending_revocation):
            for topic_id, partitions in a.items():
                for p in partitions:
                    yield topic_id, p


@dataclass(frozen=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None  # None: unchanged since the last heartbeat
    client_id: str = ""
    client_host: str = ""
    version: int = 1
    classic: cr.ClassicMemberMetadata | None = None  # a JoinGroup (group_migration.py)


@dataclass(frozen=True)
class ConsumerGroupConfig:
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    max_size: int = 2**31 - 1
    assignors: tuple[str, ...] = ("uniform", "range")
    migration_policy: str = "bidirectional"  # group.consumer.migration.policy


@dataclass
class HeartbeatPlan:
    """What a heartbeat decided: records to write, then the answer and the timers."""

    records: list[Record]
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment | None = None  # None: not sent
    resolved_regexes: dict[str, frozenset[str]] | None = None  # soft state to keep
    session: str | None = None  # member whose session timer restarts
    revocation: tuple[str, int, int] | None = None  # (member, epoch, timeout ms) to start
    stop_revocation: str | None = None
    removed: tuple[str, ...] = ()  # members whose timers all stop


def validate(req: HeartbeatRequest, cfg: ConsumerGroupConfig) -> None:
    """The request-level checks (Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid)."""
    bad = E.invalid_request
    if req.version >= 1 or req.member_epoch > 0 or req.member_epoch == LEAVE_EPOCH:
        if req.member_id == "":
            raise Refusal(bad, "MemberId can't be empty.")
    if len(req.member_id.encode()) > MAX_MEMBER_ID_BYTES:
        raise Refusal(bad, f"MemberId can't be longer than {MAX_MEMBER_ID_BYTES} bytes.")
    if not req.group_id:
        raise Refusal(bad, "GroupId can't be empty.")
    if len(req.group_id.encode()) > cr.MAX_STRING_BYTES:  # as the classic coordinator says
        raise Refusal(E.invalid_group_id, f"GroupId can't be longer than "
                      f"{cr.MAX_STRING_BYTES} bytes.")
    if req.instance_id == "":
        raise Refusal(bad, "InstanceId can't be empty.")
    if req.rack_id == "":
        raise Refusal(bad, "RackId can't be empty.")
    if req.member_epoch == 0:
        if req.rebalance_timeout_ms == -1:
            raise Refusal(bad, "RebalanceTimeoutMs must be provided in first request.")
        if req.owned is None or req.owned:
            raise Refusal(bad, "TopicPartitions must be empty when (re-)joining.")
        if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
            raise Refusal(bad, "Either SubscribedTopicNames or SubscribedTopicRegex must be "
                          "non-null when (re-)joining.")
    elif req.member_epoch == STATIC_LEAVE_EPOCH:
        if req.instance_id is None:
            raise Refusal(bad, "InstanceId can't be null.")
    elif req.member_epoch < STATIC_LEAVE_EPOCH:
        raise Refusal(bad, "MemberEpoch is invalid.")
    if req.server_assignor is not None and req.server_assignor not in cfg.assignors:
        raise Refusal(E.unsupported_assignor,
                      f"ServerAssignor {req.server_assignor} is not supported. Supported "
                      f"assignors: {', '.join(cfg.assignors)}.")
    if req.subscribed_topic_regex:
        compile_regex(req.subscribed_topic_regex)


def compile_regex(regex: str):
    """Compiled as Kafka compiles it, with RE2 (linear in the text; RE2/J's syntax, so
    back-references and look-arounds are refused as Kafka refuses them)."""
    try:
        return compile_client_regex(regex)
    except InvalidClientRegex as exc:
        raise Refusal(E.invalid_regular_expression,
                      f"SubscribedTopicRegex `{regex}` is not a valid regular expression: "
                      f"{exc}.") from None


@dataclass(eq=False)
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    subscription_metadata: dict[str, cr.TopicMetadata] = field(default_factory=dict)
    offsets: dict[tuple[str, int], OffsetValue] = field(default_factory=dict)
    # Derived from members: who owns each partition (assigned or pending revocation).
    owners: dict[tuple[uuid.UUID, int], str] = field(default_factory=dict)
    # Soft state: regular expression -> topic names it matches, and when it was resolved.
    resolved_regexes: dict[str, frozenset[str]] = field(default_factory=dict)
    regexes_resolved_at: tuple[int, int] = (-1, -1)  # (ms, number of topics then)
    state_timestamp: int = -1  # when the group became empty (offset expiry counts from it)
    protocol_type = "consumer"
    group_type = "consumer"

    # --- what the group is ----------------------------------------------------------------

    @property
    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        for m in self.members.values():
            if m.member_epoch != self.assignment_epoch or m.state != MemberState.STABLE:
                return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def member_count(self) -> int:
        """As ClassicGroup's (the metrics scrape reads both)."""
        return len(self.members)

    def is_in(self, *states: enum.Enum) -> bool:
        """Whether the group is in one of the states, by name: Empty and Dead mean the same
        in both protocols, so the classic coordinator's offset rules read the same here."""
        return any(s.value == self.state.value for s in states)

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        for m in self.members.values():
            if m.instance_id == instance_id:
                return m
        return None

    def subscribed_topics(self) -> set[str]:
        """Topic names some member consumes (by name or through its regex)."""
        topics: set[str] = set()
        for m in self.members.values():
            topics.update(self.effective_subscription(m))
        return topics

    def effective_subscription(self, m: ConsumerMember) -> frozenset[str]:
        names = frozenset(m.subscribed_topic_names)
        if m.subscribed_topic_regex:
            names |= self.resolved_regexes.get(m.subscribed_topic_regex, frozenset())
        return names

    def preferred_assignor(self, cfg: ConsumerGroupConfig,
                           members: Iterable[ConsumerMember] | None = None) -> str:
        """The assignor most members ask for (ties: the configured order); else the
        first of group.consumer.assignors."""
        votes = Counter(m.server_assignor for m in
                        (self.members.values() if members is None else members)
                        if m.server_assignor in cfg.assignors)
        if not votes:
            return cfg.assignors[0]
        best = max(votes.values())
        return next(a for a in cfg.assignors if votes.get(a) == best)

    # --- applying records -----------------------------------------------------------------

    def replay(self, record: Record) -> None:
        key, value = record.key, record.value
        kind, member_id = key.kind, key.member or ""
        if kind == cr.GROUP_METADATA:
            self.group_epoch = value.epoch if value is not None else 0
        elif kind == cr.PARTITION_METADATA:
            self.subscription_metadata = {} if value is None else {
                t.name: t for t in value.topics}
        elif kind == cr.TARGET_METADATA:
            self.assignment_epoch = value.assignment_epoch if value is not None else 0
        elif kind == cr.TARGET_MEMBER:
            if value is None:
                self.target.pop(member_id, None)
            else:
                self.target[member_id] = dict(value.partitions)
        elif kind == cr.MEMBER_METADATA:
            if value is None:
                old = self.members.pop(member_id, None)
                if old is not None:
                    self._disown(old)
                return
            old = self.members.get(member_id) or ConsumerMember(member_id)
            self.members[member_id] = replace(
                old, instance_id=value.instance_id, rack_id=value.rack_id,
                client_id=value.client_id, client_host=value.client_host,
                subscribed_topic_names=value.subscribed_topic_names,
                subscribed_topic_regex=value.subscribed_topic_regex,
                rebalance_timeout_ms=value.rebalance_timeout_ms,
                server_assignor=value.server_assignor, classic=value.classic)
        elif kind == cr.CURRENT_ASSIGNMENT:
            old = self.members.get(member_id)
            if old is not None:
                self._disown(old)
            if value is None:
                if old is not None:
                    # The member goes with its metadata tombstone, which follows.
                    self.members[member_id] = replace(
                        old, member_epoch=LEAVE_EPOCH, assigned={}, pending_revocation={})
                return
            member = (old or ConsumerMember(member_id)).with_current(value)
            self.members[member_id] = member
            for tp in member.owned():
                self.owners[tp] = member_id

    def _disown(self, member: ConsumerMember) -> None:
        for tp in member.owned():
            if self.owners.get(tp) == member.member_id:
                del self.owners[tp]

    def finish_loading(self) -> None:
        """After replaying a partition's records: drop half-written members (a current
        assignment without metadata cannot be served) and rebuild the owner index."""
        for member_id in [m for m, v in self.members.items() if v.member_epoch == LEAVE_EPOCH]:
            del self.members[member_id]
        self.owners = {tp: m.member_id for m in self.members.values() for tp in m.owned()}

    # --- records of a whole group -----------------------------------------------------------

    def tombstones(self) -> list[Record]:
        """Records that delete the group (its offsets are the coordinator's)."""
        g = self.group_id
        out: list[Record] = []
        for member_id in set(self.members) | set(self.target):
            out += _member_tombstones(g, member_id)
        out += [Record(Key(cr.TARGET_METADATA, g), None),
                Record(Key(cr.PARTITION_METADATA, g), None),
                Record(Key(cr.GROUP_METADATA, g), None)]
        return out

    # --- offsets (Kafka's ConsumerGroup.validateOffsetCommit / validateOffsetFetch) ---------

    def commit_error(self, member_id: str | None, member_epoch: int) -> ErrorCode | None:
        if member_epoch < 0 and not self.members:
            return None  # the admin client, or a consumer outside the group
        return self._member_epoch_error(member_id, member_epoch)

    def fetch_error(self, member_id: str | None, member_epoch: int) -> ErrorCode | None:
        if member_epoch < 0 and member_id is None:
            return None
        return self._member_epoch_error(member_id, member_epoch)

    def _member_epoch_error(self, member_id: str | None, member_epoch: int
                            ) -> ErrorCode | None:
        member = self.members.get(member_id or "")
        if member is None:
            return E.unknown_member_id
        if member_epoch != member.member_epoch:
            # A classic member's epoch is its generation (Kafka's validateMemberEpoch).
            return E.illegal_generation if member.classic else E.stale_member_epoch
        return None


def _member_tombstones(group_id: str, member_id: str) -> list[Record]:
    # The order matters to Kafka's replay: assignment, target, then the member itself.
    return [Record(Key(cr.CURRENT_ASSIGNMENT, group_id, member_id), None),
            Record(Key(cr.TARGET_MEMBER, group_id, member_id), None),
            Record(Key(cr.MEMBER_METADATA, group_id, member_id), None)]


def _subscription_metadata(topics: Iterable[str], image: TopicImage
                           ) -> dict[str, cr.TopicMetadata]:
    out = {}
    for name in sorted(topics):
        found = image.get(name)
        if found is not None:
            out[name] = cr.TopicMetadata(found[0], name, found[1])
    return out


def _metadata_record(group_id: str, metadata: dict[str, cr.TopicMetadata]) -> Record:
    return Record(Key(cr.PARTITION_METADATA, group_id),
                  cr.PartitionMetadataValue(tuple(metadata.values())))


# --- leaving and being removed ----------------------------------------------------------------

def fence_records(group: ConsumerGroup, member: ConsumerMember, image: TopicImage
                  ) -> list[Record]:
    """Remove a member: its records go, the subscribed topics are recomputed without it, and
    the group epoch goes up so the others are reassigned its partitions."""
    g = group.group_id
    records = _member_tombstones(g, member.member_id)
    others = [m for m in group.members.values() if m.member_id != member.member_id]
    topics: set[str] = set()
    for m in others:
        topics |= group.effective_subscription(m)
    metadata = _subscription_metadata(topics, image)
    if metadata != group.subscription_metadata:
        records.append(_metadata_record(g, metadata))
    records.append(Record(Key(cr.GROUP_METADATA, g), cr.GroupMetadataValue(group.group_epoch + 1)))
    return records


def leave(group: ConsumerGroup | None, req: HeartbeatRequest, image: TopicImage
          ) -> HeartbeatPlan:
    if group is None:
        raise Refusal(E.group_id_not_found, f"Consumer group {req.group_id} not found.")
    if req.instance_id is None:
        member = group.members.get(req.member_id)
        if member is None:
            raise Refusal(E.unknown_member_id, f"Member {req.member_id} is not a member of "
                          f"group {req.group_id}.")
        records = fence_records(group, member, image)
        removed: tuple[str, ...] = (member.member_id,)
    else:
        member = group.static_member(req.instance_id)
        if member is None:
            raise Refusal(E.unknown_member_id, f"Instance id {req.instance_id} is unknown.")
        if member.member_id != req.member_id:
            raise Refusal(E.fenced_instance_id, f"Static member {req.member_id} with instance "
                          f"id {req.instance_id} was fenced by member {member.member_id}.")
        if req.member_epoch == STATIC_LEAVE_EPOCH:
            # It keeps its partitions (nobody else gets them) until it is back or its session
            # ends.
            gone = replace(member, member_epoch=STATIC_LEAVE_EPOCH, pending_revocation={})
            records = [Record(Key(cr.CURRENT_ASSIGNMENT, group.group_id, member.member_id),
                              gone.current())]
            removed = ()
        else:
            records = fence_records(group, member, image)
            removed = (member.member_id,)
    return HeartbeatPlan(records, req.member_id, req.member_epoch, 0, removed=removed,
                         stop_revocation=member.member_id)


# --- the heartbeat ----------------------------------------------------------------------------

def _check_epoch(member: ConsumerMember, epoch: int, owned: Assignment | None) -> None:
    """Kafka's throwIfConsumerGroupMemberEpochIsInvalid."""
    if epoch > member.member_epoch:
        raise Refusal(E.fenced_member_epoch, f"The consumer group member has a greater member "
                      f"epoch ({epoch}) than the one known by the group coordinator "
                      f"({member.member_epoch}). The member must abandon all its partitions "
                      f"and rejoin.")
    if epoch < member.member_epoch:
        # The answer that raised its epoch may have been lost: the previous epoch is fine
        # while it owns no more than it is assigned.
        if epoch != member.previous_member_epoch or not _is_subset(owned, member.assigned):
            raise Refusal(E.fenced_member_epoch, f"The consumer group member has a smaller "
                          f"member epoch ({epoch}) than the one known by the group "
                          f"coordinator ({member.member_epoch}). The member must abandon all "
                          f"its partitions and rejoin.")


def _is_subset(owned: Assignment | None, assigned: Assignment) -> bool:
    if owned is None:
        return False
    return all(ps <= assigned.get(t, frozenset()) for t, ps in owned.items() if ps)


def _joining(existing: ConsumerMember) -> ConsumerMember:
    """A known member that joins again with epoch 0 has given up all its partitions (KIP-848:
    a fenced member rejoins with epoch 0): it starts from nothing, keeping its identity."""
    return replace(existing, member_epoch=0, previous_member_epoch=-1,
                   state=MemberState.STABLE, assigned={}, pending_revocation={})


def resolve_regexes(group: ConsumerGroup, regexes: set[str], image: TopicImage, now_ms: int
                    ) -> tuple[dict[str, frozenset[str]], bool]:
    """The topics each regular expression matches (the whole name, as Java's matches()),
    reusing the last resolution while the topics did not visibly change; and whether it was
    resolved anew."""
    resolved_at, topic_count = group.regexes_resolved_at
    fresh = (set(group.resolved_regexes) >= regexes and topic_count == len(image)
             and now_ms - resolved_at < REGEX_REFRESH_MS)
    if fresh or not regexes:
        return {r: group.resolved_regexes[r] for r in regexes}, False
    out = {}
    names = list(image)
    for regex in regexes:
        try:
            pattern = compile_regex(regex)
        except Refusal:
            out[regex] = frozenset()  # refused when it came; never matches
            continue
        out[regex] = frozenset(n for n in names if pattern.fullmatch(n))
    return out, True


def heartbeat(group: ConsumerGroup | None, req: HeartbeatRequest, image: TopicImage,
              cfg: ConsumerGroupConfig, now_ms: int) -> HeartbeatPlan:
    """Plan a ConsumerGroupHeartbeat (``validate`` passed): raises Refusal, or returns the
    records to write and the answer. ``group`` None: no group of that id yet."""
    if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
        return leave(group, req, image)
    joining = req.member_epoch == 0
    g = req.group_id
    if group is None:
        if not joining:
            raise Refusal(E.group_id_not_found, f"Consumer group {g} not found.")
        group = ConsumerGroup(g)
    member_id = req.member_id or str(uuid.uuid4())  # v0 lets the coordinator choose
    if len(group.members) >= cfg.max_size and member_id not in group.members:
        raise Refusal(E.group_max_size_reached, f"The consumer group has reached its maximum "
                      f"capacity of {cfg.max_size} members.")
    records: list[Record] = []
    replaced: ConsumerMember | None = None
    stored = group.members.get(member_id)
    if req.instance_id is None:
        if stored is None:
            if not joining:
                raise Refusal(E.unknown_member_id, f"Member {member_id} is not a member of "
                              f"group {g}.")
            member = ConsumerMember(member_id)
        elif joining:
            member = _joining(stored)
        else:
            _check_epoch(stored, req.member_epoch, req.owned)
            member = stored
    else:
        existing = group.static_member(req.instance_id)
        if joining:
            if existing is None or existing.member_id == member_id:
                member = _joining(stored) if stored is not None else ConsumerMember(member_id)
            else:
                if existing.member_epoch != STATIC_LEAVE_EPOCH:
                    raise Refusal(E.unreleased_instance_id, f"Static member {member_id} with "
                                  f"instance id {req.instance_id} cannot join the group "
                                  f"because the instance id is owned by "
                                  f"{existing.member_id} member.")
                # The restarted static member takes the place (and partitions) of the old id.
                replaced = existing
                member = replace(existing, member_id=member_id, member_epoch=0,
                                 previous_member_epoch=0)
                records += _member_tombstones(g, existing.member_id)
                records.append(Record(Key(cr.MEMBER_METADATA, g, member_id), member.metadata()))
                records.append(Record(Key(cr.TARGET_MEMBER, g, member_id), cr.TargetMemberValue(
                    group.target.get(existing.member_id, {}))))
                records.append(Record(Key(cr.CURRENT_ASSIGNMENT, g, member_id),
                                      member.current()))
                stored = member
        else:
            if existing is None:
                raise Refusal(E.unknown_member_id, f"Instance id {req.instance_id} is unknown.")
            if existing.member_id != member_id:
                raise Refusal(E.fenced_instance_id, f"Static member {member_id} with instance "
                              f"id {req.instance_id} was fenced by member "
                              f"{existing.member_id}.")
            _check_epoch(existing, req.member_epoch, req.owned)
            member = existing

    # 1. The member's metadata; the group epoch goes up when what must be assigned changed.
    updated = replace(
        member,
        instance_id=req.instance_id if req.instance_id is not None else member.instance_id,
        rack_id=req.rack_id if req.rack_id is not None else member.rack_id,
        rebalance_timeout_ms=(req.rebalance_timeout_ms if req.rebalance_timeout_ms != -1
                              else member.rebalance_timeout_ms),
        server_assignor=(req.server_assignor if req.server_assignor is not None
                         else member.server_assignor),
        subscribed_topic_names=(tuple(req.subscribed_topic_names)
                                if req.subscribed_topic_names is not None
                                else member.subscribed_topic_names),
        subscribed_topic_regex=(req.subscribed_topic_regex
                                if req.subscribed_topic_regex is not None
                                else member.subscribed_topic_regex) or None,
        client_id=req.client_id, client_host=req.client_host, classic=req.classic)
    if stored is None or updated.metadata() != stored.metadata():
        records.append(Record(Key(cr.MEMBER_METADATA, g, member_id), updated.metadata()))
    members = {m.member_id: m for m in group.members.values()
               if m.member_id not in (member_id, replaced.member_id if replaced else None)}
    members[member_id] = updated
    regexes = {m.subscribed_topic_regex for m in members.values() if m.subscribed_topic_regex}
    resolved, refreshed = resolve_regexes(group, regexes, image, now_ms)
    bump = group.group_epoch == 0 or resolved != {
        r: group.resolved_regexes.get(r) for r in resolved}

    def subscription(m: ConsumerMember) -> frozenset[str]:
        names = frozenset(m.subscribed_topic_names)
        return names | resolved.get(m.subscribed_topic_regex, frozenset()) \
            if m.subscribed_topic_regex else names

    before = group.effective_subscription(stored) if stored is not None else frozenset()
    bump |= subscription(updated) != before
    topics: set[str] = set()
    for m in members.values():
        topics |= subscription(m)
    metadata = _subscription_metadata(topics, image)
    if metadata != group.subscription_metadata:
        records.append(_metadata_record(g, metadata))
        bump = True
    group_epoch = group.group_epoch + 1 if bump else group.group_epoch
    if bump:
        records.append(Record(Key(cr.GROUP_METADATA, g), cr.GroupMetadataValue(group_epoch)))

    # 2. The target assignment, when the group epoch moved past it.
    if group_epoch > group.assignment_epoch:
        ids = {name: t.topic_id for name, t in metadata.items()}
        specs = {}
        for m in members.values():
            current = group.target.get(replaced.member_id if replaced is not None and
                                       m is updated else m.member_id, {})
            specs[m.member_id] = MemberSpec(
                frozenset(ids[n] for n in subscription(m) if n in ids), m.instance_id, current)
        assignor = ASSIGNORS[group.preferred_assignor(cfg, members.values())]
        new_target = assignor(specs, {t.topic_id: t.num_partitions for t in metadata.values()})
        for m, partitions in new_target.items():
            known = group.target.get(m) if not (replaced and m == member_id) else None
            if known != partitions:
                records.append(Record(Key(cr.TARGET_MEMBER, g, m),
                                      cr.TargetMemberValue(partitions)))
        records.append(Record(Key(cr.TARGET_METADATA, g), cr.TargetMetadataValue(group_epoch)))
        target_epoch, target = group_epoch, new_target.get(member_id, {})
    else:
        target_epoch = group.assignment_epoch
        target = group.target.get(replaced.member_id if replaced else member_id, {})

    # 3. Reconcile the member towards its target.
    subscribed_ids = {t.topic_id for n, t in metadata.items() if n in subscription(updated)}
    reconciled = reconcile(updated, target_epoch, target, req.owned, subscribed_ids,
                           lambda tp: group.owners.get(tp))
    plan = HeartbeatPlan(records, member_id, reconciled.member_epoch, cfg.heartbeat_interval_ms,
                         resolved_regexes=resolved if refreshed else None, session=member_id,
                         removed=(replaced.member_id,) if replaced else ())
    if stored is None or reconciled.current() != stored.current():
        records.append(Record(Key(cr.CURRENT_ASSIGNMENT, g, member_id), reconciled.current()))
        if reconciled.state == MemberState.UNREVOKED_PARTITIONS:
            timeout = reconciled.rebalance_timeout_ms
            plan.revocation = (member_id, reconciled.member_epoch,
                               timeout if timeout > 0 else cfg.session_timeout_ms)
        else:
            plan.stop_revocation = member_id
    full = joining or (req.rebalance_timeout_ms != -1 and req.owned is not None and (
        req.subscribed_topic_names is not None or req.subscribed_topic_regex is not None))
    if full or stored is None or reconciled.assigned != stored.assigned:
        plan.assignment = reconciled.assigned
    return plan


def reconcile(member: ConsumerMember, target_epoch: int, target: Assignment,
              owned: Assignment | None, subscribed: set[uuid.UUID],
              owner_of: Callable[[tuple[uuid.UUID, int]], str | None]) -> ConsumerMember:
    """Kafka's CurrentAssignmentBuilder: the member's next state towards its target.

    ``owned`` is what the member reports holding (None: not reported, so nothing is known
    to be revoked); ``owner_of`` tells who holds a partition now (assigned or pending
    revocation)."""
    if member.state == MemberState.UNREVOKED_PARTITIONS and _owns_any(
            owned, member.pending_revocation):
        return member  # it must revoke first
    if (member.state == MemberState.STABLE and member.member_epoch == target_epoch
            and all(t in subscribed for t in member.assigned)):
        return member
    assigned: dict[uuid.UUID, frozenset[int]] = {}
    revoke: dict[uuid.UUID, frozenset[int]] = {}
    pending_assignment: dict[uuid.UUID, frozenset[int]] = {}
    unreleased = False
    for topic_id in set(target) | set(member.assigned):
        want = target.get(topic_id, frozenset()) if topic_id in subscribed else frozenset()
        have = member.assigned.get(topic_id, frozenset())
        keep, give_back = have & want, have - want
        new = frozenset(p for p in want - keep
                        if owner_of((topic_id, p)) in (None, member.member_id))
        unreleased |= len(new) < len(want - keep)
        if keep:
            assigned[topic_id] = keep
        if give_back:
            revoke[topic_id] = give_back
        if new:
            pending_assignment[topic_id] = new
    if revoke and _owns_any(owned, revoke):
        # Give back first; the epoch stays until the member says it no longer owns them.
        return replace(member, state=MemberState.UNREVOKED_PARTITIONS, assigned=assigned,
                       pending_revocation=revoke)
    for topic_id, partitions in pending_assignment.items():
        assigned[topic_id] = assigned.get(topic_id, frozenset()) | partitions
    return replace(member, state=(MemberState.UNRELEASED_PARTITIONS if unreleased
                                  else MemberState.STABLE),
                   previous_member_epoch=(member.member_epoch
                                          if member.member_epoch != target_epoch
                                          else member.previous_member_epoch),
                   member_epoch=target_epoch, assigned=assigned, pending_revocation={})


def _owns_any(owned: Assignment | None, partitions: Assignment) -> bool:
    if owned is None:
        return True
    return any(owned.get(t, frozenset()) & ps for t, ps in partitions.items())
