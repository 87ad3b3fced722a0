"""oncelog.Consumer's side of a classic consumer group: the I/O around group_membership.

group_membership decides; this module sends and receives, on the connections group_io.py
shares with the consumer protocol's sibling (consumer_group.py): JoinGroup, SyncGroup and
LeaveGroup on the consumer's connection (pipelined, so a JoinGroup that the coordinator holds
until every member has rejoined, up to max.poll.interval.ms, does not hold poll() beyond its
timeout), Heartbeat on the heartbeat thread's. poll() sends a heartbeat itself when one is
due.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol.api_versions import HEARTBEAT, JOIN_GROUP, LEAVE_GROUP, SYNC_GROUP
from ..network.connection import KafkaError
from . import group_calls
from .assignors import parse_strategy
from .group_io import GroupIO, GroupListener, as_kafka_error
from .group_membership import (
    AssignmentChange,
    ClassicMembership,
    Heartbeat,
    JoinResult,
    LeaveGroup,
    Step,
    SyncGroup,
    SyncResult,
)

log = logging.getLogger(__name__)


class ClassicGroup(GroupIO):
    def __init__(self, config: Mapping[str, Any], listener: GroupListener) -> None:
        super().__init__(config, listener)
        self.membership = ClassicMembership(
            self.group_id, parse_strategy(config["partition.assignment.strategy"]),
            instance_id=config["group.instance.id"] or None,
            session_timeout_ms=int(config["session.timeout.ms"]),
            rebalance_timeout_ms=int(config["max.poll.interval.ms"]),
            heartbeat_interval_ms=int(config["heartbeat.interval.ms"]),
            retry_backoff_ms=int(config["retry.backoff.ms"]))
        self._change: AssignmentChange | None = None

    # --- joining and staying in the group --------------------------------------------------

    STEPS = Step
    WAITING_STEPS = (Step.BACKOFF, Step.AWAIT)

    def _before_step(self) -> None:
        self._apply_change()

    def _stable(self) -> bool:
        return True

    def _take_step(self, step: Step, left: float) -> bool:
        if step == Step.AWAIT:
            if left <= 0:
                return False
            self._pump(left)
        elif step == Step.JOIN:
            self._join()
        elif step == Step.ASSIGN:
            self._assign_and_sync()
        elif step == Step.SYNC:
            with self.lock:
                sync = self.membership.sync_request()
            self._send_sync(sync)
        return True

    def _join(self) -> None:
        with self.lock:
            handoff = self.membership.prepare_join()
        if handoff.revoked or handoff.lost:
            self.listener.group_handoff(handoff)
        with self.lock:
            if self.membership.next_step(time.monotonic()) != Step.JOIN:
                return  # the handoff's commit changed things (e.g. the coordinator moved)
            join = self.membership.join_request()
        # The coordinator answers once every member has joined: up to the rebalance timeout.
        deadline = time.monotonic() + join.rebalance_timeout_ms / 1000 + 5

        def answered(response, error: KafkaError | None) -> None:
            now = time.monotonic()
            with self.lock:
                if error is not None:
                    self.membership.on_join(JoinResult(error.error), now)
                else:
                    self.membership.on_join(group_calls.join_group_result(response), now)

        self._send(JOIN_GROUP, group_calls.join_group_request(join), deadline, answered)

    def _assign_and_sync(self) -> None:
        with self.lock:
            topics = self.membership.leader_topics()
        counts = self.listener.group_partition_counts(topics)
        with self.lock:
            assignments = self.membership.assign(counts)
            sync = self.membership.sync_request(assignments)
        log.info("group %s: generation %d assigned by %s: %s", self.group_id, sync.generation,
                 sync.protocol_name, {m: len(p) for m, p in assignments.items()})
        self._send_sync(sync)

    def _send_sync(self, sync: SyncGroup) -> None:
        def answered(response, error: KafkaError | None) -> None:
            now = time.monotonic()
            with self.lock:
                result = (SyncResult(error.error) if error is not None
                          else group_calls.sync_group_result(response))
                change = self.membership.on_sync(result, now)
            if change is not None:
                self._change = change

        # Members wait for the leader's assignment: up to the rebalance timeout too.
        deadline = time.monotonic() + self.membership.rebalance_timeout_ms / 1000 + 5
        self._send(SYNC_GROUP, group_calls.sync_group_request(sync), deadline, answered)

    def _apply_change(self) -> None:
        change, self._change = self._change, None
        if change is not None:
            self.listener.group_assigned(change)

    # --- heartbeats and the poll timeout ------------------------------------------------------

    def _check_poll_timeout(self) -> None:
        with self.lock:
            if not self.membership.poll_timed_out(time.monotonic()):
                return
            leave = self.membership.leave_request("consumer poll timeout has expired")
        if leave is not None:
            self._send_leave_on_heartbeat_connection(leave)

    def _heartbeat(self, beat: Heartbeat, coordinator) -> ErrorCode:
        try:
            return self._heartbeat_connection(coordinator).call(
                HEARTBEAT, group_calls.heartbeat_request(beat)).error_code
        except Exception as exc:  # an answer we cannot read, of any kind
            if self._heartbeat_conn is not None:
                self._heartbeat_conn.close()
                self._heartbeat_conn = None
            return as_kafka_error(exc).error

    def _send_leave_on_heartbeat_connection(self, leave: LeaveGroup) -> None:
        with self._heartbeat_lock:
            with self.lock:
                coordinator = self.membership.coordinator
            if coordinator is None:
                return
            try:
                response = self._heartbeat_connection(coordinator).call(
                    LEAVE_GROUP, group_calls.leave_group_request(leave))
                log.info("group %s: left (%s): %s", self.group_id, leave.reason,
                         group_calls.leave_group_error(response).name)
            except Exception as exc:  # best effort: the session ends anyway
                log.info("group %s: LeaveGroup failed: %s", self.group_id, exc)
                if self._heartbeat_conn is not None:
                    self._heartbeat_conn.close()
                    self._heartbeat_conn = None

    # --- leaving ---------------------------------------------------------------------------

    def leave(self, reason: str) -> None:
        """LeaveGroup (dynamic members only) and forget the membership."""
        with self.lock:
            coordinator = self.membership.coordinator
            leave = self.membership.leave_request(reason)
        if any(e.api_key in (JOIN_GROUP, SYNC_GROUP) for e in self._inflight):
            # Its answer would come only once the rebalance completes: give it up, and say
            # goodbye on a new connection to the same coordinator.
            self._connection_failed(KafkaError(ErrorCode.network_exception, "leaving"))
            if coordinator is not None:
                with self.lock:
                    self.membership.on_coordinator(*coordinator)
        if leave is None:
            return
        try:
            response = self._call(LEAVE_GROUP, group_calls.leave_group_request(leave))
            log.info("group %s: left (%s): %s", self.group_id, reason,
                     group_calls.leave_group_error(response).name)
        except KafkaError as exc:
            log.info("group %s: LeaveGroup failed: %s", self.group_id, exc)
