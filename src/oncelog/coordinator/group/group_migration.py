"""KIP-848's online migration: a classic group becomes a consumer group when a member of the
consumer protocol joins it, classic members keep speaking JoinGroup/SyncGroup/Heartbeat/
LeaveGroup to that consumer group, and the group becomes classic again when the last member
of the consumer protocol leaves (Kafka's GroupMetadataManager: ``validateOnlineUpgrade``,
``convertToConsumerGroup``, ``classicGroup*ToConsumerGroup``,
``validateOnlineDowngradeWithFencedMember``, ``convertToClassicGroup``).

``group.consumer.migration.policy`` says which way is allowed: ``bidirectional`` (Kafka 4's
default), ``upgrade``, ``downgrade`` or ``disabled``.

    | # | request / group                                    | answer, records                 |
    |---|----------------------------------------------------|---------------------------------|
    |M1 | ConsumerGroupHeartbeat, epoch 0, on a classic group| upgrade: the classic record     |
    |   | with members, protocol type ``consumer``, upgrade  | deleted and the consumer group's|
    |   | allowed, members <= group.consumer.max.size, every | records written in the batch of |
    |   | subscription readable                              | the heartbeat (K13 then runs on |
    |   |                                                    | it); waiting JoinGroup/SyncGroup|
    |   |                                                    | REBALANCE_IN_PROGRESS; each     |
    |   |                                                    | member keeps its generation as  |
    |   |                                                    | epoch and its assignment as     |
    |   |                                                    | target and current (Stable)     |
    |M2 | the same, any condition of M1 unmet                | GROUP_ID_NOT_FOUND (K1)         |
    |M3 | JoinGroup on a consumer group with members: policy | INCONSISTENT_GROUP_PROTOCOL /   |
    |   | ``disabled`` (KAFKA-20640) / group full (a new     | GROUP_MAX_SIZE_REACHED /        |
    |   | member) / protocol type not ``consumer``, no       | INCONSISTENT_GROUP_PROTOCOL     |
    |   | protocol every classic member has, or the          |                                 |
    |   | subscription unreadable                            |                                 |
    |M4 | the same: no member id, require_known_member_id /  | MEMBER_ID_REQUIRED (a new id) / |
    |   | a static instance held by another id, a member id  | FENCED_INSTANCE_ID / it takes   |
    |   | given / none given                                 | the old id's place (as K9)      |
    |M5 | the same, otherwise                                | a heartbeat K5-K13 of the member|
    |   |                                                    | (epoch: its own, 0 when new;    |
    |   |                                                    | owned: its subscription's owned |
    |   |                                                    | partitions) with its protocols  |
    |   |                                                    | stored; answered at once: gen = |
    |   |                                                    | member epoch, the member's first|
    |   |                                                    | protocol, no leader             |
    |M6 | SyncGroup to a consumer group: instance unknown /  | UNKNOWN_MEMBER_ID / FENCED_     |
    |   | fenced / not a member or not classic / gen !=      | INSTANCE_ID / UNKNOWN_MEMBER_ID |
    |   | member epoch / protocol not its first / group      | / ILLEGAL_GENERATION / INCONSIS-|
    |   | epoch > member epoch and not revoking              | TENT_GROUP_PROTOCOL / REBALANCE_|
    |   |                                                    | IN_PROGRESS; else its assigned  |
    |   |                                                    | partitions                      |
    |M7 | Heartbeat to a consumer group: M6's member checks; | REBALANCE_IN_PROGRESS when the  |
    |   | the session restarts                               | group epoch is ahead, it must   |
    |   |                                                    | revoke, or partitions it waits  |
    |   |                                                    | for are free (and unless one    |
    |   |                                                    | runs: a join timer, removing it |
    |   |                                                    | as K4 if it has not rejoined    |
    |   |                                                    | within its rebalance timeout;   |
    |   |                                                    | M5 stops it); else NONE         |
    |M8 | LeaveGroup to a consumer group, per member: M6's   | removed as K4                   |
    |   | member checks                                      |                                 |
    |M9 | a member of the consumer protocol leaves (K4 or a  | downgrade in the same batch: the|
    |   | timer) and every other member is classic, >= 1 of  | consumer group's records deleted|
    |   | them, downgrade allowed, <= group.max.size of them,| and a classic group record      |
    |   | a protocol they all have                           |                                 |
    |   |                                                    | (generation = group epoch, each |
    |   |                                                    | member's target as assignment); |
    |   |                                                    | the group then rebalances       |

Offsets belong to the group id, not to its kind: both conversions hand them over, and the
records of either kind of group supersede the other kind's (a tombstone of one is in the
batch that writes the other), so a restart loads what was converted.

Classic members of a consumer group revoke by rejoining: the partitions they must give back
are left out of the assignment SyncGroup answers, the client drops them and rejoins, and its
JoinGroup's owned partitions (none for eager clients) let it move on.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

from kio.schema.consumer_protocol_assignment.v0.data import (
    TopicPartition as AssignedPartitions,
)
from kio.schema.errors import ErrorCode

from ...protocol import consumer_protocol
from . import consumer_group as cg
from . import consumer_records as cr
from . import group_records as rec
from .classic_answers import JoinResult, SyncResult, new_member_id
from .classic_group import NO_ENTRIES, ClassicGroup, GroupState, Member, flat_protocols
from .consumer_group import ConsumerGroup, ConsumerGroupConfig, HeartbeatRequest

log = logging.getLogger(__name__)
E = ErrorCode
PROTOCOL_TYPE = "consumer"
POLICIES = ("disabled", "downgrade", "upgrade", "bidirectional")


class ConsumerGroupCoordinator(Protocol):
    """What the migration uses of the KIP-848 coordinator (consumer_coordinator.py), named
    here so that this module, which that one imports, does not import it back."""

    coordinator: Any  # the GroupCoordinator below
    image: Any  # topic name -> (topic id, partition count)

    def config_for(self, group_id: str) -> ConsumerGroupConfig: ...

    async def classic_heartbeat(self, req: HeartbeatRequest, view: ConsumerGroup) -> Any: ...

    def _append(self, group_id: str, records: list[Any],
                extra: list[tuple[bytes, bytes | None]] = ...) -> Awaitable[None] | None: ...

    def schedule_session(self, group_id: str, member_id: str) -> None: ...

    def start_join_timer(self, group_id: str, member: cg.ConsumerMember) -> None: ...

    def stop_join_timer(self, group_id: str, member_id: str) -> None: ...

    def _remove(self, group_id: str, member_id: str, reason: str) -> ErrorCode: ...

    def forget(self, group: ConsumerGroup) -> None: ...


class GroupCoordinator(Protocol):
    """What the migration uses of the classic coordinator (group_coordinator.py), which
    imports this module."""

    groups: dict[str, Any]  # group id -> ClassicGroup | ConsumerGroup
    consumer_groups: ConsumerGroupCoordinator

    def now_ms(self) -> int: ...

    def _answer_waiters(self, group: ClassicGroup, member: Member, error: ErrorCode
                        ) -> None: ...

    def _prepare_rebalance(self, group: ClassicGroup, reason: str) -> None: ...

    def _schedule_session(self, group: ClassicGroup, member: Member) -> None: ...


def upgrade_enabled(policy: str) -> bool:
    return policy.lower() in ("upgrade", "bidirectional")


def downgrade_enabled(policy: str) -> bool:
    return policy.lower() in ("downgrade", "bidirectional")


# --- upgrade (M1, M2) -------------------------------------------------------------------------

@dataclasses.dataclass
class Upgrade:
    group: ConsumerGroup  # the converted group, not yet in the coordinator's groups
    records: list[tuple[bytes, bytes | None]]  # to write before the heartbeat's records


def plan_upgrade(classic: ClassicGroup, cfg: ConsumerGroupConfig, image: cg.TopicImage,
                 now_ms: int) -> Upgrade | None:
    """M1: the consumer group a classic group with members becomes, or None (M2)."""
    if not upgrade_enabled(cfg.migration_policy):
        log.info("group %s: not upgraded: group.consumer.migration.policy is %s",
                 classic.group_id, cfg.migration_policy)
        return None
    if classic.protocol_type != PROTOCOL_TYPE or classic.is_in(GroupState.DEAD):
        return None
    if len(classic.members) > cfg.max_size:
        log.info("group %s: not upgraded: %d members exceed group.consumer.max.size",
                 classic.group_id, len(classic.members))
        return None
    g = classic.group_id
    epoch = classic.generation
    records: list[cr.Record] = []
    current: list[cr.Record] = []
    for m in classic.members.values():
        try:
            subscription = consumer_protocol.read_subscription(m.metadata(classic.protocol))
        except Exception:  # what a client sent: unreadable means the group stays classic
            log.info("group %s: not upgraded: member %s's subscription cannot be read", g,
                     m.member_id)
            return None
        assigned = _assignment_ids(m.assignment, image)
        member = cg.ConsumerMember(
            m.member_id, m.group_instance_id, getattr(subscription, "rack_id", None) or None,
            m.client_id, m.client_host, tuple(subscription.topics), None,
            m.rebalance_timeout_ms, None, epoch, epoch, cg.MemberState.STABLE, assigned, {},
            cr.ClassicMemberMetadata(m.session_timeout_ms, m.protocol_pairs()))
        records.append(cr.Record(cr.Key(cr.MEMBER_METADATA, g, m.member_id), member.metadata()))
        records.append(cr.Record(cr.Key(cr.TARGET_MEMBER, g, m.member_id),
                                 cr.TargetMemberValue(assigned)))
        current.append(cr.Record(cr.Key(cr.CURRENT_ASSIGNMENT, g, m.member_id),
                                 member.current()))
    records.append(cr.Record(cr.Key(cr.GROUP_METADATA, g), cr.GroupMetadataValue(epoch)))
    records.append(cr.Record(cr.Key(cr.TARGET_METADATA, g), cr.TargetMetadataValue(epoch)))
    records += current
    group = ConsumerGroup(g, state_timestamp=now_ms)
    for record in records:
        group.replay(record)
    group.finish_loading()
    group.offsets = classic.offsets
    encoded = [(rec.group_key(g), None), *(cr.to_bytes(r) for r in records)]
    return Upgrade(group, encoded)


def install_upgrade(coordinator: GroupCoordinator, classic: ClassicGroup,
                    upgrade: Upgrade) -> None:
    """The converted group takes the classic one's place (in the step that wrote it): the
    classic group's timers stop and its waiting requests are told to rejoin."""
    if classic.join_timer is not None:
        classic.join_timer.cancel()
        classic.join_timer = None
    for timer in classic.pending_members.values():
        timer.cancel()
    classic.pending_members = NO_ENTRIES
    for member in classic.members.values():
        if member.session_timer is not None:
            member.session_timer.cancel()
            member.session_timer = None
        coordinator._answer_waiters(classic, member, E.rebalance_in_progress)
    classic.transition(GroupState.DEAD, coordinator.now_ms())
    coordinator.groups[classic.group_id] = upgrade.group
    for member_id in upgrade.group.members:
        coordinator.consumer_groups.schedule_session(classic.group_id, member_id)
    log.info("group %s: the classic group with %d members became a consumer group at epoch "
             "%d", classic.group_id, len(upgrade.group.members), upgrade.group.group_epoch)


def _assignment_ids(data: bytes, image: cg.TopicImage) -> cr.Assignment:
    out: dict[uuid.UUID, set[int]] = {}
    for topic, partition in consumer_protocol.assigned_partitions(data) or []:
        found = image.get(topic)
        if found is not None and 0 <= partition < found[1]:
            out.setdefault(found[0], set()).add(partition)
    return {t: frozenset(ps) for t, ps in out.items()}


# --- downgrade (M9) ---------------------------------------------------------------------------

def may_downgrade(group: ConsumerGroup, leaving: str, cfg: ConsumerGroupConfig,
                  classic_max_size: int) -> bool:
    """Kafka's validateOnlineDowngradeWithFencedMember."""
    member = group.members.get(leaving)
    if member is None or member.classic is not None:
        return False
    others = [m for m in group.members.values() if m.member_id != leaving]
    if not others or any(m.classic is None for m in others):
        return False
    if not downgrade_enabled(cfg.migration_policy):
        log.info("group %s: not downgraded: group.consumer.migration.policy is %s",
                 group.group_id, cfg.migration_policy)
        return False
    common = set.intersection(*({p for p, _ in m.classic.protocols} for m in others))
    # No protocol they all speak (one rejoined with others): a classic group could not
    # choose one, so the group stays as it is.
    return bool(common) and len(others) <= classic_max_size


def downgrade(cc: ConsumerGroupCoordinator, group: ConsumerGroup, leaving: str
              ) -> Awaitable[None] | None:
    """M9: the consumer group's records deleted and the classic group's written in one
    batch; the classic group replaces it in memory at once and starts a rebalance. Raises
    what ``cc._append`` raises (nothing changed then)."""
    coordinator = cc.coordinator
    g = group.group_id
    classic = ClassicGroup(g, GroupState.STABLE, group.group_epoch, PROTOCOL_TYPE,
                           state_timestamp=coordinator.now_ms())
    names = {topic_id: name for name, (topic_id, _) in cc.image.items()}
    for m in group.members.values():
        if m.member_id == leaving or m.classic is None:
            continue
        classic.members[m.member_id] = Member(
            m.member_id, m.instance_id, m.client_id, m.client_host,
            m.rebalance_timeout_ms if m.rebalance_timeout_ms > 0 else m.classic.session_timeout_ms,
            m.classic.session_timeout_ms, flat_protocols(m.classic.protocols))
        if m.instance_id is not None:
            classic.own_static_members()[m.instance_id] = m.member_id
    classic.protocol = classic.select_protocol()
    classic.leader = next(iter(classic.members))
    for member in classic.members.values():
        member.assignment = _assignment_bytes(group.target.get(member.member_id, {}), names,
                                              member.metadata(classic.protocol))
    records = [cr.to_bytes(r) for r in group.tombstones()]
    records.append((rec.group_key(g), rec.group_value(classic.to_value())))
    durable = cc._append(g, [], records)
    cc.forget(group)
    classic.offsets = group.offsets
    coordinator.groups[g] = classic
    for member in classic.members.values():
        coordinator._schedule_session(classic, member)
    log.info("group %s: member %s of the consumer protocol left; the group of %d classic "
             "members becomes a classic group at generation %d", g, leaving,
             len(classic.members), classic.generation)
    coordinator._prepare_rebalance(classic, "downgraded from a consumer group")
    return durable


def _assignment_bytes(assignment: cr.Assignment, names: dict[uuid.UUID, str],
                      subscription: bytes) -> bytes:
    """The member's partitions as the consumer protocol's Assignment, in the version of its
    subscription (as Kafka answers it)."""
    version = 0
    if len(subscription) >= 2:
        version = max(0, min(int.from_bytes(subscription[:2], "big", signed=True),
                             consumer_protocol.NEWEST_VERSION))
    by_name: dict[str, list[int]] = {}
    for topic_id, partitions in assignment.items():
        name = names.get(topic_id)
        if name:
            by_name.setdefault(name, []).extend(sorted(partitions))
    topics = tuple(AssignedPartitions(topic=n, partitions=tuple(ps))
                   for n, ps in sorted(by_name.items()))
    return consumer_protocol.write_assignment(version, assigned_partitions=topics,
                                              user_data=None)


# --- classic requests to a consumer group (M3-M8) ---------------------------------------------

def _member(group: ConsumerGroup, member_id: str, instance_id: str | None
            ) -> tuple[ErrorCode | None, cg.ConsumerMember | None]:
    """Kafka's validateConsumerGroupMember and throwIfMemberDoesNotUseClassicProtocol."""
    if instance_id is None:
        member = group.members.get(member_id)
    else:
        member = group.static_member(instance_id)
        if member is not None and member_id and member.member_id != member_id:
            return E.fenced_instance_id, None
    if member is None or member.classic is None:
        return E.unknown_member_id, None
    return None, member


def _supports(group: ConsumerGroup, protocol_type: str, names: set[str]) -> bool:
    """Kafka's ConsumerGroup.supportsClassicProtocols."""
    if protocol_type != PROTOCOL_TYPE or not names:
        return False
    classic = [{p for p, _ in m.classic.protocols} for m in group.members.values()
               if m.classic is not None]
    return any(all(n in supported for supported in classic) for n in names)


async def join(coordinator: GroupCoordinator, group: ConsumerGroup, member_id: str,
               instance_id: str | None, client_id: str, client_host: str,
               session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
               protocols: Sequence[tuple[str, bytes]], require_known_member_id: bool
               ) -> JoinResult:
    """M3-M5."""

    cc = coordinator.consumer_groups
    cfg = cc.config_for(group.group_id)
    if cfg.migration_policy == "disabled":
        # Kafka (KAFKA-20640): no classic member in a consumer group that can never become
        # classic again.
        return JoinResult(E.inconsistent_group_protocol, member_id)
    new_id = member_id or new_member_id(client_id)
    if new_id not in group.members and len(group.members) >= cfg.max_size:
        return JoinResult(E.group_max_size_reached, member_id)
    if not _supports(group, protocol_type, {n for n, _ in protocols}):
        return JoinResult(E.inconsistent_group_protocol, member_id)
    if not member_id and instance_id is None and require_known_member_id:
        return JoinResult(E.member_id_required, new_id)
    try:
        subscription = consumer_protocol.read_subscription(protocols[0][1])
    except Exception:  # a client's bytes
        return JoinResult(E.inconsistent_group_protocol, member_id)
    cc.stop_join_timer(group.group_id, new_id)
    view = group
    held = group.static_member(instance_id) if instance_id is not None else None
    if held is not None and held.member_id != new_id:
        if member_id:
            return JoinResult(E.fenced_instance_id, member_id)  # Kafka's classic rule (J10)
        # A restarted static member takes its instance's place and partitions, as a classic
        # group lets it (K9's replacement, planned as if the old id had left with -2).
        view = dataclasses.replace(group, members={
            **group.members, held.member_id: dataclasses.replace(
                held, member_epoch=cg.STATIC_LEAVE_EPOCH)})
    stored = group.members.get(new_id) if member_id else None
    epoch = stored.member_epoch if stored is not None else 0
    owned = _owned(subscription, cc.image) if epoch else {}
    req = HeartbeatRequest(
        group.group_id, new_id, epoch, instance_id,
        getattr(subscription, "rack_id", None) or None, rebalance_timeout_ms,
        tuple(subscription.topics), None, None, owned, client_id, client_host,
        classic=cr.ClassicMemberMetadata(session_timeout_ms, tuple(protocols)))
    answer = await cc.classic_heartbeat(req, view)
    if answer.error is not E.none:
        return JoinResult(answer.error, member_id)
    return JoinResult(E.none, answer.member_id or new_id, answer.member_epoch, PROTOCOL_TYPE,
                      protocols[0][0], "", False, ())


def _owned(subscription, image: cg.TopicImage) -> cr.Assignment:
    out: dict[uuid.UUID, set[int]] = {}
    for tp in getattr(subscription, "owned_partitions", None) or ():
        found = image.get(tp.topic)
        if found is not None:
            out.setdefault(found[0], set()).update(tp.partitions)
    return {t: frozenset(ps) for t, ps in out.items()}


def sync(coordinator: GroupCoordinator, group: ConsumerGroup, generation: int,
         member_id: str, instance_id: str | None, protocol_type: str | None,
         protocol: str | None) -> SyncResult:
    """M6."""

    error, member = _member(group, member_id, instance_id)
    if error is not None:
        return SyncResult(error)
    if generation != member.member_epoch:
        return SyncResult(E.illegal_generation)
    name = member.classic.protocols[0][0] if member.classic.protocols else ""
    if (protocol_type is not None and protocol_type != PROTOCOL_TYPE) or (
            protocol is not None and protocol != name):
        return SyncResult(E.inconsistent_group_protocol)
    if group.group_epoch > member.member_epoch and \
            member.state != cg.MemberState.UNREVOKED_PARTITIONS:
        return SyncResult(E.rebalance_in_progress)
    cc = coordinator.consumer_groups
    cc.schedule_session(group.group_id, member.member_id)
    names = {topic_id: n for n, (topic_id, _) in cc.image.items()}
    metadata = member.classic.protocols[0][1] if member.classic.protocols else b""
    return SyncResult(E.none, PROTOCOL_TYPE, name,
                      _assignment_bytes(member.assigned, names, metadata))


def heartbeat(coordinator: GroupCoordinator, group: ConsumerGroup, generation: int,
              member_id: str, instance_id: str | None) -> ErrorCode:
    """M7."""
    error, member = _member(group, member_id, instance_id)
    if error is not None:
        return error
    if generation != member.member_epoch:
        return E.illegal_generation
    cc = coordinator.consumer_groups
    cc.schedule_session(group.group_id, member.member_id)
    if member.member_epoch < group.group_epoch or \
            member.state == cg.MemberState.UNREVOKED_PARTITIONS or (
            member.state == cg.MemberState.UNRELEASED_PARTITIONS and not _waiting(group, member)):
        # Kafka's join timeout: a member told to rejoin that does not is removed.
        cc.start_join_timer(group.group_id, member)
        return E.rebalance_in_progress
    return E.none


def _waiting(group: ConsumerGroup, member: cg.ConsumerMember) -> bool:
    """Kafka's waitingOnUnreleasedPartition: a partition of its target another still owns."""
    for topic_id, partitions in group.target.get(member.member_id, {}).items():
        have = member.assigned.get(topic_id, frozenset())
        for p in partitions - have:
            if group.owners.get((topic_id, p)) not in (None, member.member_id):
                return True
    return False


def leave(coordinator: GroupCoordinator, group: ConsumerGroup,
          leaving: list[tuple[str, str | None]]) -> list[ErrorCode]:
    """M8, one error per member."""
    errors = []
    for member_id, instance_id in leaving:
        error, member = _member(group, member_id, instance_id)
        if error is not None:
            errors.append(error)
            continue
        errors.append(coordinator.consumer_groups._remove(
            group.group_id, member.member_id, "it left the group (LeaveGroup)"))
    return errors
