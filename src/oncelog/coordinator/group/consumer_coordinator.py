"""The consumer groups of the new protocol (KIP-848) inside the group coordinator:
ConsumerGroupHeartbeat and ConsumerGroupDescribe, session and revocation timers, loading.

Consumer groups live in the group coordinator's ``groups`` next to classic groups (a group id
is one or the other) and write to the same ``__consumer_offsets`` partition. Every change
follows one path: ``consumer_group`` plans it as records, they are appended to the log (a
failed append changes nothing), replayed into memory, and the answer waits for them to be
durable. Timers (a member's session, the time it has to revoke partitions) are soft state:
they are set again for every member after a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from ..internal_log import OffsetsLog, WriteFailed, durable_error
from . import consumer_group as cg
from . import consumer_records as cr
from . import group_migration as migration
from . import group_records as rec
from .classic_group import GroupState
from .consumer_group import (
    ConsumerGroup,
    ConsumerGroupConfig,
    HeartbeatPlan,
    HeartbeatRequest,
    Refusal,
    TopicImage,
)

log = logging.getLogger(__name__)
E = ErrorCode


@dataclass
class HeartbeatAnswer:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: cr.Assignment | None = None


@dataclass
class DescribedGroup:
    group_id: str
    error: ErrorCode
    message: str | None = None
    group: ConsumerGroup | None = None
    assignor: str = ""


class GroupHost(Protocol):
    """What this coordinator uses of the GroupCoordinator that owns it (group_coordinator.py):
    the groups of both protocols, their offsets log, and its clock and background tasks."""

    groups: dict[str, Any]  # group id -> ClassicGroup | ConsumerGroup
    log: OffsetsLog

    def now_ms(self) -> int: ...

    def partition_of(self, group_id: str) -> int: ...

    def not_served(self, group_id: str) -> ErrorCode | None: ...

    def _background(self, work) -> None: ...


class ConsumerGroupCoordinator:
    def __init__(self, coordinator: GroupHost, config: ConsumerGroupConfig,
                 image: TopicImage) -> None:
        self.coordinator = coordinator
        self.config = config
        self.image = image
        # Group configs (GROUP resource): group id -> ConsumerGroupConfig fields it changes.
        self.overrides: dict[str, dict[str, int]] = {}
        self._sessions: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._revocations: dict[tuple[str, str], asyncio.TimerHandle] = {}

    def config_for(self, group_id: str) -> ConsumerGroupConfig:
        """The broker's settings with the group's own configs over them."""
        values = self.overrides.get(group_id)
        return replace(self.config, **values) if values else self.config

    def set_overrides(self, group_id: str, values: dict[str, int]) -> None:
        if values:
            self.overrides[group_id] = values
        else:
            self.overrides.pop(group_id, None)

    # --- ConsumerGroupHeartbeat ---------------------------------------------------------------

    async def heartbeat(self, req: HeartbeatRequest) -> HeartbeatAnswer:
        coordinator = self.coordinator
        try:
            cg.validate(req, self.config)
        except Refusal as exc:
            log.info("group %s: heartbeat of %s refused: %s", req.group_id, req.member_id,
                     exc.message)
            return HeartbeatAnswer(exc.error, exc.message)
        unserved = coordinator.not_served(req.group_id)
        if unserved is not None:
            return HeartbeatAnswer(unserved)
        existing = coordinator.groups.get(req.group_id)
        converting = upgrade = None
        if existing is not None and not isinstance(existing, ConsumerGroup):
            if req.member_epoch == 0 and existing.members:  # M1, M2
                upgrade = migration.plan_upgrade(existing, self.config_for(req.group_id),
                                                 self.image, coordinator.now_ms())
            if upgrade is None:
                if req.member_epoch != 0 or not existing.is_in(*_EMPTY_OR_DEAD) or \
                        existing.pending_members:
                    return HeartbeatAnswer(E.group_id_not_found,
                                           f"Group {req.group_id} is not a consumer group.")
                converting = existing  # an empty classic group becomes this one
        return await self._heartbeat(req, existing, converting, upgrade)

    async def classic_heartbeat(self, req: HeartbeatRequest, view: ConsumerGroup
                                ) -> HeartbeatAnswer:
        """A classic member's JoinGroup to a consumer group, as a heartbeat (M5), planned
        on ``view`` (the group, or a copy of it that says how to read it)."""
        return await self._heartbeat(req, view)

    async def _heartbeat(self, req: HeartbeatRequest, existing, converting=None,
                         upgrade: migration.Upgrade | None = None) -> HeartbeatAnswer:
        coordinator = self.coordinator
        group = upgrade.group if upgrade is not None else (
            None if converting is not None else existing)
        cfg = self.config_for(req.group_id)
        try:
            plan = cg.heartbeat(group, req, self.image, cfg, coordinator.now_ms())
        except Refusal as exc:
            log.info("group %s: heartbeat of %s refused: %s", req.group_id, req.member_id,
                     exc.message)
            return HeartbeatAnswer(exc.error, exc.message)
        if req.member_epoch == cg.LEAVE_EPOCH and plan.removed and migration.may_downgrade(
                group, plan.removed[0], cfg, coordinator.config.max_size):  # M9
            try:
                await self._durable(migration.downgrade(self, group, plan.removed[0]))
            except _WriteRefused as exc:
                return HeartbeatAnswer(exc.error, str(exc))
            return HeartbeatAnswer(E.none, None, req.member_id, req.member_epoch)
        extra = upgrade.records if upgrade is not None else (
            [(rec.group_key(req.group_id), None)] if converting is not None else [])
        try:
            durable = self._append(req.group_id, plan.records, extra)
        except _WriteRefused as exc:
            return HeartbeatAnswer(exc.error, str(exc))
        if upgrade is not None:
            migration.install_upgrade(coordinator, existing, upgrade)
        self._apply(req.group_id, plan, converting)
        if converting is not None:
            log.info("group %s: the empty classic group became a consumer group",
                     req.group_id)
        try:
            await self._durable(durable)
        except _WriteRefused as exc:
            return HeartbeatAnswer(exc.error, str(exc))
        return HeartbeatAnswer(E.none, None, plan.member_id, plan.member_epoch,
                               plan.heartbeat_interval_ms, plan.assignment)

    def _append(self, group_id: str, records: list[cr.Record],
                extra: list[tuple[bytes, bytes | None]] = ()):
        if not records and not extra:
            return None
        try:
            encoded = [*extra, *(cr.to_bytes(r) for r in records)]
        except ValueError as exc:
            raise _WriteRefused(E.invalid_request, str(exc)) from None
        try:
            return self.coordinator.log.append(self.coordinator.partition_of(group_id),
                                               encoded)
        except WriteFailed as exc:
            log.warning("group %s: storing its state failed: %s", group_id, exc)
            error = (E.unknown_server_error if exc.error is E.message_too_large
                     else exc.error)
            raise _WriteRefused(error, str(exc)) from None

    @staticmethod
    async def _durable(durable) -> None:
        if durable is not None:
            try:
                await durable
            except OSError as exc:
                raise _WriteRefused(durable_error(exc), str(exc)) from None

    def _apply(self, group_id: str, plan: HeartbeatPlan, converting=None) -> ConsumerGroup:
        groups = self.coordinator.groups
        group = groups.get(group_id)
        now = self.coordinator.now_ms()
        if not isinstance(group, ConsumerGroup):
            group = ConsumerGroup(group_id, state_timestamp=now)
            if converting is not None:
                group.offsets = converting.offsets
            groups[group_id] = group
        had_members = bool(group.members)
        for record in plan.records:
            group.replay(record)
        if plan.resolved_regexes is not None:
            group.resolved_regexes = plan.resolved_regexes
            group.regexes_resolved_at = (now, len(self.image))
        if had_members and not group.members:
            group.state_timestamp = now
        for member_id in plan.removed:
            self._stop_timers(group_id, member_id)
        if plan.stop_revocation is not None:
            self._cancel(self._revocations, (group_id, plan.stop_revocation))
        if plan.revocation is not None:
            member_id, epoch, timeout = plan.revocation
            self._set(self._revocations, (group_id, member_id), timeout,
                      self._revocation_expired, group_id, member_id, epoch, timeout)
        if plan.session is not None:
            self._schedule_session(group_id, plan.session)
        return group

    # --- timers ---------------------------------------------------------------------------------

    def _set(self, timers: dict, key: tuple[str, str], timeout_ms: int, callback, *args) -> None:
        self._cancel(timers, key)
        timers[key] = asyncio.get_running_loop().call_later(timeout_ms / 1000, callback, *args)

    @staticmethod
    def _cancel(timers: dict, key: tuple[str, str]) -> None:
        handle = timers.pop(key, None)
        if handle is not None:
            handle.cancel()

    def _stop_timers(self, group_id: str, member_id: str) -> None:
        self._cancel(self._sessions, (group_id, member_id))
        self._cancel(self._revocations, (group_id, member_id))

    def start_join_timer(self, group_id: str, member: cg.ConsumerMember) -> None:
        """A classic member told to rejoin (group_migration M7) is removed unless it
        rejoins within its rebalance timeout; the revocation timer's rule (its epoch did not
        move) is this one's, so it is that timer."""
        key = (group_id, member.member_id)
        if key in self._revocations:
            return
        timeout = member.rebalance_timeout_ms if member.rebalance_timeout_ms > 0 else \
            self.config_for(group_id).session_timeout_ms
        self._set(self._revocations, key, timeout, self._revocation_expired, group_id,
                  member.member_id, member.member_epoch, timeout)

    def stop_join_timer(self, group_id: str, member_id: str) -> None:
        self._cancel(self._revocations, (group_id, member_id))

    def _schedule_session(self, group_id: str, member_id: str) -> None:
        group = self.coordinator.groups.get(group_id)
        member = group.members.get(member_id) if isinstance(group, ConsumerGroup) else None
        timeout = (member.classic.session_timeout_ms
                   if member is not None and member.classic is not None
                   else self.config_for(group_id).session_timeout_ms)
        self._set(self._sessions, (group_id, member_id), timeout,
                  self._session_expired, group_id, member_id)

    schedule_session = _schedule_session

    def _session_expired(self, group_id: str, member_id: str) -> None:
        self._sessions.pop((group_id, member_id), None)
        self._remove(group_id, member_id, "its session expired")

    def _revocation_expired(self, group_id: str, member_id: str, epoch: int,
                            timeout: int) -> None:
        self._revocations.pop((group_id, member_id), None)
        group = self.coordinator.groups.get(group_id)
        member = group.members.get(member_id) if isinstance(group, ConsumerGroup) else None
        if member is None or member.member_epoch != epoch:
            return
        self._remove(group_id, member_id, f"it did not revoke its partitions within "
                     f"{timeout} ms at epoch {epoch}")

    def _remove(self, group_id: str, member_id: str, reason: str) -> ErrorCode:
        group = self.coordinator.groups.get(group_id)
        if not isinstance(group, ConsumerGroup) or member_id not in group.members:
            return E.unknown_member_id
        plan = HeartbeatPlan(cg.fence_records(group, group.members[member_id], self.image),
                             member_id, cg.LEAVE_EPOCH, 0, removed=(member_id,))
        try:
            if migration.may_downgrade(group, member_id, self.config_for(group_id),
                                       self.coordinator.config.max_size):  # M9
                log.info("group %s: member %s removed: %s", group_id, member_id, reason)
                durable = migration.downgrade(self, group, member_id)
            else:
                durable = self._append(group_id, plan.records)
                log.info("group %s: member %s removed: %s", group_id, member_id, reason)
                self._apply(group_id, plan)
        except _WriteRefused as exc:
            log.warning("group %s: removing member %s failed (%s); trying again later",
                        group_id, member_id, exc)
            self._schedule_session(group_id, member_id)
            return exc.error
        if durable is not None:
            self.coordinator._background(self._await_quietly(group_id, durable))
        return E.none

    async def _await_quietly(self, group_id: str, durable) -> None:
        try:
            await self._durable(durable)
        except _WriteRefused as exc:
            log.error("group %s: state not durable: %s", group_id, exc)

    # --- loading ----------------------------------------------------------------------------------

    @staticmethod
    def rebuild(records: Iterable[tuple[bytes, bytes | None]], now_ms: int,
                partition: int) -> dict[str, ConsumerGroup]:
        """The consumer groups of one partition of ``__consumer_offsets``, from its records
        (oldest first). The latest value of each key is the state; a tombstone removes it."""
        latest: dict[cr.Key, cr.Record] = {}
        for key_bytes, value_bytes in records:
            try:
                record = cr.from_bytes(key_bytes, value_bytes)
            except rec.BadRecord as exc:
                log.warning("__consumer_offsets-%d: skipping a record: %s", partition, exc)
                continue
            latest[record.key] = record
        groups: dict[str, ConsumerGroup] = {}
        for record in latest.values():
            if record.value is None:
                continue
            group = groups.get(record.key.group)
            if group is None:
                group = groups[record.key.group] = ConsumerGroup(record.key.group,
                                                                  state_timestamp=now_ms)
            group.replay(record)
        for group in groups.values():
            group.finish_loading()
        return groups

    def loaded(self, group: ConsumerGroup) -> None:
        """Sessions of a loaded group's members start now (Kafka does the same on load)."""
        for member_id in group.members:
            self._schedule_session(group.group_id, member_id)

    # --- ConsumerGroupDescribe --------------------------------------------------------------------

    def describe(self, group_ids: Iterable[str]) -> list[DescribedGroup]:
        out = []
        for group_id in group_ids:
            if not group_id:
                out.append(DescribedGroup(group_id, E.invalid_group_id))
                continue
            unserved = self.coordinator.not_served(group_id)
            if unserved is not None:
                out.append(DescribedGroup(group_id, unserved))
                continue
            group = self.coordinator.groups.get(group_id)
            if group is None or group.is_in(*_DEAD):
                out.append(DescribedGroup(group_id, E.group_id_not_found,
                                          f"Group {group_id} not found."))
            elif not isinstance(group, ConsumerGroup):
                out.append(DescribedGroup(group_id, E.group_id_not_found,
                                          f"Group {group_id} is not a consumer group."))
            else:
                out.append(DescribedGroup(group_id, E.none, None, group,
                                          group.preferred_assignor(self.config)))
        return out

    def drop(self, group: ConsumerGroup, reason: str):
        """Delete an empty group's records (not its offsets) so that the id can become a
        classic group, at once (the caller puts the new group in its place before anything
        is awaited); returns what to await for them to be durable. Raises WriteFailed when
        the log did not take them."""
        try:
            durable = self._append(group.group_id, group.tombstones())
        except _WriteRefused as exc:
            raise WriteFailed(exc.error, str(exc)) from None
        self.forget(group)
        if self.coordinator.groups.get(group.group_id) is group:
            del self.coordinator.groups[group.group_id]
        log.info("group %s: the empty consumer group is dropped: %s", group.group_id, reason)
        return durable

    def close(self) -> None:
        for timers in (self._sessions, self._revocations):
            for handle in timers.values():
                handle.cancel()
            timers.clear()

    def forget(self, group: ConsumerGroup) -> None:
        """The group was deleted or expired: its timers go with it."""
        for member_id in group.members:
            self._stop_timers(group.group_id, member_id)


class _WriteRefused(Exception):
    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


_EMPTY_OR_DEAD = (GroupState.EMPTY, GroupState.DEAD)
_DEAD = (GroupState.DEAD,)
