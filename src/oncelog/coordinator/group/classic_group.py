"""One consumer group of Kafka's classic protocol: its members and its state.

States and what moves a group between them (Kafka's ClassicGroupState):

- Empty: no members, perhaps committed offsets. A member joins -> PreparingRebalance; its
  offsets expire or DeleteGroups -> Dead.
- PreparingRebalance: members are (re)joining. Every member rejoined, or the rebalance
  timeout -> CompletingRebalance (Empty when nobody rejoined).
- CompletingRebalance: joined, waiting for the leader's assignment. The leader's SyncGroup
  is stored -> Stable; a member joins, leaves or dies -> PreparingRebalance.
- Stable: every member has its assignment. A member joins with new metadata, leaves or
  dies, or the leader rejoins -> PreparingRebalance.
- Dead: deleted or expired; never leaves it.

This module holds the group's data and the rules that need nothing but that data (which
protocol to choose, whether a join is consistent, what DescribeGroups shows). The timing and
the answers to waiting requests are the coordinator's (group_coordinator.py).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

from ...protocol.consumer_protocol import subscription_topics
from .group_records import GroupValue, MemberValue, OffsetValue


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# Most groups never have a static or a pending member, and a group joined has no offset yet:
# their maps start as this shared empty one, which cannot be written (a write raises, it never
# reaches another group), and a group gets a dict of its own with its first entry
# (ClassicGroup.own_static_members / own_pending_members, GroupCoordinator._offsets_of).
# 64 bytes a map (issue 26).
NO_ENTRIES = cast(dict, MappingProxyType({}))

# The values most members repeat (protocol type and names, timeouts) are kept once, however
# many requests bring them: a member holds them as long as it lives. Not client ids or
# hosts, mostly one member's own: each would take a place in the table for good. Bounded, as
# any client may send anything: past the bound, or longer than MAX_SHARED_LENGTH, a value is
# kept as it came.
_NAMES: dict[str, str] = {}
_NUMBERS: dict[int, int] = {}
MAX_SHARED = 1024
MAX_SHARED_LENGTH = 64


def shared_name(name: str) -> str:
    known = _NAMES.get(name)
    if known is not None:
        return known
    if len(_NAMES) < MAX_SHARED and len(name) <= MAX_SHARED_LENGTH:
        _NAMES[name] = name
    return name


def shared_number(number: int) -> int:
    known = _NUMBERS.get(number)
    if known is not None:
        return known
    if len(_NUMBERS) < MAX_SHARED:
        _NUMBERS[number] = number
    return number


@dataclass(eq=False, slots=True, init=False)
class Member:
    member_id: str
    group_instance_id: str | None
    # The member's client id and host (client_id, client_host), its own, as one string: the
    # client id, then the host from ``host_at`` on (one string's header, 49 bytes, less a
    # member than two; issue 26).
    client: str
    host_at: int
    rebalance_timeout_ms: int
    session_timeout_ms: int
    # (no protocol type: the group's is the one answered; a joining member's is read once, as
    # it is added, GroupCoordinator._add_and_rebalance)
    # name, metadata, name, metadata, ... in the member's preference order: one flat tuple
    # (a tuple of pairs was 48 bytes more a member of one protocol, issue 26); flat_protocols
    protocols: tuple[str | bytes, ...]
    assignment: bytes = b""
    session_timer: Any = None
    session_ends: float = 0.0  # the event loop's time the session ends at

    def __init__(self, member_id: str, group_instance_id: str | None, client_id: str,
                 client_host: str, rebalance_timeout_ms: int, session_timeout_ms: int,
                 protocols: tuple[str | bytes, ...], assignment: bytes = b"") -> None:
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.set_client(client_id, client_host)
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.session_timeout_ms = session_timeout_ms
        self.protocols = protocols
        self.assignment = assignment
        self.session_timer = None
        self.session_ends = 0.0

    @property
    def client_id(self) -> str:
        return self.client[:self.host_at]

    @property
    def client_host(self) -> str:
        return self.client[self.host_at:]

    def set_client(self, client_id: str, client_host: str) -> None:
        self.client = client_id + client_host
        self.host_at = len(client_id)

    def metadata(self, protocol: str | None) -> bytes:
        protocols = self.protocols
        for i in range(0, len(protocols), 2):
            if protocols[i] == protocol:
                return cast(bytes, protocols[i + 1])
        return b""

    def protocol_names(self) -> list[str]:
        return cast(list[str], list(self.protocols[::2]))

    def protocol_pairs(self) -> tuple[tuple[str, bytes], ...]:
        """(name, metadata) in the member's preference order."""
        return cast(tuple, tuple(zip(self.protocols[::2], self.protocols[1::2], strict=True)))

    def same_protocols(self, protocols: tuple[str | bytes, ...]) -> bool:
        return self.protocols == protocols


def flat_protocols(pairs: Sequence[tuple[str, bytes]]) -> tuple[str | bytes, ...]:
    """A member's ``protocols`` from (name, metadata) pairs."""
    return tuple([part for pair in pairs for part in pair])


@dataclass(eq=False, slots=True)
class Rebalance:
    """What a group holds only while it rebalances (Kafka's fields of a rebalance in
    progress), made when the first of it is set and gone when the group is Stable, Empty or
    Dead again: a stable group does not carry it (issue 26)."""

    join_timer: Any = None
    initial_delay: tuple[int, int] | None = None  # (delay ms, ms left of the rebalance timeout)
    new_member_joined: bool = False  # during the initial delay
    # The generation whose assignment is being written (SyncGroup of the leader), or None.
    assignment_write: int | None = None
    # The JoinGroup or SyncGroup each member waits in for its answer (the coordinator's
    # futures), and the members that joined during this rebalance; keyed by the Member itself,
    # which keeps its identity when a static member takes a new member id.
    join_waiters: dict[Member, Any] = field(default_factory=dict)
    sync_waiters: dict[Member, Any] = field(default_factory=dict)
    new_members: set[Member] = field(default_factory=set)


def _rebalance_field(name: str, default: Any) -> property:
    """A field of the group's Rebalance read and written as the group's own: its default
    while none is going on (writing the default then makes none)."""
    def get(group: ClassicGroup) -> Any:
        rebalance = group.rebalance
        return default if rebalance is None else getattr(rebalance, name)

    def put(group: ClassicGroup, value: Any) -> None:
        if group.rebalance is not None or value != default:
            setattr(group.rebalancing(), name, value)
    return property(get, put)


class _OneMember(MutableMapping):
    """The members of a group of at most one, held in the group itself (``_members``: the
    member, or None) rather than in a dict of their own (184 bytes, issue 26); a second
    member gives the group a dict. Keys are member ids, as the dict's."""

    __slots__ = ("_group",)

    def __init__(self, group: ClassicGroup) -> None:
        self._group = group

    def __getitem__(self, member_id: str) -> Member:
        member = self._group._members
        if member is None or member.member_id != member_id:
            raise KeyError(member_id)
        return member

    def get(self, member_id: str, default: Any = None) -> Any:
        member = self._group._members
        return member if member is not None and member.member_id == member_id else default

    def __contains__(self, member_id: object) -> bool:
        member = self._group._members
        return member is not None and member.member_id == member_id

    def __setitem__(self, member_id: str, member: Member) -> None:
        group = self._group
        held = group._members
        if member.member_id == member_id and (held is None or held.member_id == member_id):
            group._members = member
        else:  # the dict whole before the group holds it: a reader never sees half of it
            group._members = ({member_id: member} if held is None
                              else {held.member_id: held, member_id: member})

    def __delitem__(self, member_id: str) -> None:
        if self._group.remove_member(member_id) is None:
            raise KeyError(member_id)

    def __iter__(self) -> Iterator[str]:
        member = self._group._members
        if member is not None:
            yield member.member_id

    def __len__(self) -> int:
        return 0 if self._group._members is None else 1


@dataclass(eq=False, slots=True)
class ClassicGroup:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    # The members (``members``): None, the one member, or a dict of two or more by member id.
    _members: Member | dict[str, Member] | None = None
    # instance id -> member id; NO_ENTRIES until the first (own_static_members)
    static_members: dict[str, str] = field(default_factory=lambda: NO_ENTRIES)
    # member id -> its timer; NO_ENTRIES until the first (own_pending_members)
    pending_members: dict[str, Any] = field(default_factory=lambda: NO_ENTRIES)
    # NO_ENTRIES until the first commit (GroupCoordinator._offsets_of gives it its own)
    offsets: dict[tuple[str, int], OffsetValue] = field(default_factory=lambda: NO_ENTRIES)
    state_timestamp: int = -1  # when the group last changed state (ms)
    rebalance: Rebalance | None = None  # while one is going on (rebalancing())

    @property
    def members(self) -> MutableMapping[str, Member]:
        """member id -> Member, in the order they joined; remove one with remove_member.
        Reading changes nothing: the metrics scrape reads it from a thread of its own while
        the loop writes. Hold no reference to this mapping across a change of the group."""
        members = self._members
        return members if type(members) is dict else _OneMember(self)

    def member_count(self) -> int:
        """len(members), with no mapping made (the metrics scrape's, for every group)."""
        members = self._members
        return len(members) if type(members) is dict else 0 if members is None else 1

    def remove_member(self, member_id: str) -> Member | None:
        """The member removed (None: it was not one). The one place a group's members shrink,
        on the loop: a group back at one member holds it in itself again (its dict goes)."""
        members = self._members
        if type(members) is not dict:
            if members is None or members.member_id != member_id:
                return None
            self._members = None
            return members
        member = members.pop(member_id, None)
        if len(members) <= 1:
            self._members = next(iter(members.values()), None)
        return member

    def rebalancing(self) -> Rebalance:
        """The rebalance going on, made if none is."""
        if self.rebalance is None:
            self.rebalance = Rebalance()
        return self.rebalance

    join_timer = _rebalance_field("join_timer", None)
    initial_delay = _rebalance_field("initial_delay", None)
    new_member_joined = _rebalance_field("new_member_joined", False)
    assignment_write = _rebalance_field("assignment_write", None)

    def join_waiter(self, member: Member) -> Any:
        """The member's JoinGroup waiting for its answer, or None."""
        rebalance = self.rebalance
        return None if rebalance is None else rebalance.join_waiters.get(member)

    def sync_waiter(self, member: Member) -> Any:
        """The member's SyncGroup waiting for its answer, or None."""
        rebalance = self.rebalance
        return None if rebalance is None else rebalance.sync_waiters.get(member)

    def set_join_waiter(self, member: Member, waiter: Any) -> None:
        self.rebalancing().join_waiters[member] = waiter

    def set_sync_waiter(self, member: Member, waiter: Any) -> None:
        self.rebalancing().sync_waiters[member] = waiter

    def pop_join_waiter(self, member: Member) -> Any:
        rebalance = self.rebalance
        return None if rebalance is None else rebalance.join_waiters.pop(member, None)

    def pop_sync_waiter(self, member: Member) -> Any:
        rebalance = self.rebalance
        return None if rebalance is None else rebalance.sync_waiters.pop(member, None)

    def is_new(self, member: Member) -> bool:
        """The member joined during the current rebalance."""
        rebalance = self.rebalance
        return rebalance is not None and member in rebalance.new_members

    def set_new(self, member: Member, new: bool) -> None:
        if new:
            self.rebalancing().new_members.add(member)
        elif self.rebalance is not None:
            self.rebalance.new_members.discard(member)

    def own_static_members(self) -> dict[str, str]:
        """``static_members``, to write into."""
        if self.static_members is NO_ENTRIES:
            self.static_members = {}
        return self.static_members

    def own_pending_members(self) -> dict[str, Any]:
        """``pending_members``, to write into."""
        if self.pending_members is NO_ENTRIES:
            self.pending_members = {}
        return self.pending_members

    def pop_pending(self, member_id: str) -> Any:
        """A pending member's timer, the member no longer pending; the last one gone, the
        group's map is the shared empty one again (a one-member group had one pending member,
        for the first JoinGroup of KIP-394, and would keep its dict for good)."""
        timer = self.pending_members.pop(member_id)
        if not self.pending_members:
            self.pending_members = NO_ENTRIES
        return timer

    # --- the rules ------------------------------------------------------------------------

    def transition(self, state: GroupState, now_ms: int) -> None:
        """To ``state``; Stable, Empty or Dead end the rebalance (the coordinator has answered
        its waiting requests and stopped its timer by then)."""
        self.state = state
        self.state_timestamp = now_ms
        if state is GroupState.STABLE or state is GroupState.EMPTY or state is GroupState.DEAD:
            self.rebalance = None

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    @property
    def size(self) -> int:
        return self.member_count() + len(self.pending_members)

    def supports(self, protocol_type: str, protocols: Sequence[tuple[str, bytes]]) -> bool:
        """A joining member's protocols are consistent with the group's (Kafka's rule: the
        same protocol type, and at least one protocol every member supports)."""
        if not protocol_type or not protocols:
            return False
        if not self.members:
            return self.protocol_type in (None, "", protocol_type) or self.is_in(GroupState.EMPTY)
        if protocol_type != self.protocol_type:
            return False
        names = {name for name, _ in protocols}
        return bool(self.candidate_protocols() & names)

    def candidate_protocols(self) -> set[str]:
        members = list(self.members.values())
        if not members:
            return set()
        common = set(members[0].protocol_names())
        for member in members[1:]:
            common &= set(member.protocol_names())
        return common

    def select_protocol(self) -> str:
        """Each member votes for the first protocol of its list that every member supports;
        the most votes win (ties: the first member's preference order)."""
        candidates = self.candidate_protocols()
        votes: Counter[str] = Counter()
        for member in self.members.values():
            for name in member.protocol_names():
                if name in candidates:
                    votes[name] += 1
                    break
        best = max(votes.values())
        for member in self.members.values():
            for name in member.protocol_names():
                if votes.get(name) == best:
                    return name
        raise AssertionError("a group with members always has a protocol")  # pragma: no cover

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def all_rejoined(self) -> bool:
        return not self.pending_members and all(
            self.join_waiter(m) is not None for m in self.members.values())

    def is_static(self, member_id: str, instance_id: str | None) -> bool:
        return instance_id is not None and self.static_members.get(instance_id) == member_id

    def fenced(self, member_id: str, instance_id: str | None) -> bool:
        """A static member whose instance now belongs to another member id."""
        if instance_id is None:
            return False
        owner = self.static_members.get(instance_id)
        return owner is not None and owner != member_id

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to, when the group speaks the consumer protocol and
        it can be read (None: unknown)."""
        if self.protocol_type != "consumer" or not self.members:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            names = subscription_topics(member.metadata(self.protocol))
            if names is None:
                return None
            topics |= names
        return topics

    # --- persistence ------------------------------------------------------------------------

    def to_value(self) -> GroupValue:
        members = tuple(
            MemberValue(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                        m.rebalance_timeout_ms, m.session_timeout_ms, m.metadata(self.protocol),
                        m.assignment)
            for m in self.members.values()
        )
        return GroupValue(self.protocol_type or "", self.generation, self.protocol, self.leader,
                          self.state_timestamp, members)

    @classmethod
    def from_value(cls, group_id: str, value: GroupValue, now_ms: int) -> ClassicGroup:
        group = cls(group_id, generation=value.generation,
                    protocol_type=value.protocol_type or None, protocol=value.protocol,
                    leader=value.leader,
                    state_timestamp=value.state_timestamp if value.state_timestamp >= 0 else now_ms)
        for m in value.members:
            member = Member(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                            m.rebalance_timeout, m.session_timeout,
                            (value.protocol or "", m.subscription), m.assignment)
            group.members[m.member_id] = member
            if m.group_instance_id is not None:
                group.own_static_members()[m.group_instance_id] = m.member_id
        group.state = GroupState.STABLE if group.members else GroupState.EMPTY
        return group
