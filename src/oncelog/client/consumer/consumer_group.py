"""oncelog.Consumer's side of a consumer-protocol group (KIP-848, ``group.protocol=consumer``):
the I/O around consumer_group_membership.

consumer_group_membership decides; this module sends and receives, on the connections
group_io.py shares with the classic protocol's sibling (classic_group.py).
ConsumerGroupHeartbeat goes on the heartbeat thread's connection, from that thread (every
heartbeat interval the coordinator gives) or from the consumer's thread when one cannot wait:
the join, and the acknowledgement of a reconciliation. Both take the heartbeat lock, so one
heartbeat is in flight at a time and its answer is applied before the next is built.

Reconciliation runs in the consumer's thread, inside poll(): partitions revoked (after the
auto commit) then added, through the same listener calls as the classic protocol's
(group_assigned, group_handoff), plus group_topic_names to resolve topic ids.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from ...protocol.api_versions import CONSUMER_GROUP_HEARTBEAT
from ..network.connection import KafkaError
from . import group_calls
from .consumer_group_membership import (
    ConsumerHeartbeat,
    ConsumerMembership,
    HeartbeatResult,
    Step,
)
from .group_io import RETRIABLE_FETCH, GroupIO, GroupListener, as_kafka_error
from .group_membership import CommitIdentity

log = logging.getLogger(__name__)


class ConsumerGroupListener(GroupListener, Protocol):
    def group_topic_names(self) -> dict[uuid.UUID, str]: ...


class ConsumerGroup(GroupIO):
    def __init__(self, config: Mapping[str, Any], listener: ConsumerGroupListener) -> None:
        super().__init__(config, listener)
        self.listener: ConsumerGroupListener = listener
        self.membership = ConsumerMembership(
            self.group_id, instance_id=config["group.instance.id"] or None,
            server_assignor=config["group.remote.assignor"] or None,
            rebalance_timeout_ms=int(config["max.poll.interval.ms"]),
            retry_backoff_ms=int(config["retry.backoff.ms"]))

    # --- joining and staying in the group --------------------------------------------------

    STEPS = Step
    WAITING_STEPS = (Step.BACKOFF, Step.HEARTBEAT, Step.RESOLVE)

    def _stable(self) -> bool:
        return self.membership.stable

    def _take_step(self, step: Step, left: float) -> bool:
        if step == Step.IDLE:
            return False
        if step == Step.LOSE:
            with self.lock:
                handoff = self.membership.take_lost()
            if handoff.lost:
                self.listener.group_handoff(handoff)
        elif step == Step.RESOLVE:
            self._resolve_topic_ids()
        elif step == Step.RECONCILE:
            with self.lock:
                change = self.membership.reconcile()
            self.listener.group_assigned(change)
            with self.lock:
                self.membership.on_reconciled(change)
        elif step == Step.HEARTBEAT:
            self.heartbeat_if_due()
        return True

    def _resolve_topic_ids(self) -> None:
        try:
            names = self.listener.group_topic_names()
        except KafkaError as exc:
            log.warning("group %s: metadata for topic ids: %s", self.group_id, exc)
            names = {}
        with self.lock:
            self.membership.on_topic_names(names, time.monotonic())

    # --- heartbeats and the poll timeout ---------------------------------------------------

    def _heartbeat(self, beat: ConsumerHeartbeat, coordinator) -> HeartbeatResult:
        try:
            response = self._heartbeat_connection(coordinator).call(
                CONSUMER_GROUP_HEARTBEAT, group_calls.consumer_group_heartbeat_request(beat))
            return group_calls.consumer_group_heartbeat_result(response)
        except Exception as exc:  # an answer we cannot read, of any kind
            if self._heartbeat_conn is not None:
                self._heartbeat_conn.close()
                self._heartbeat_conn = None
            error = as_kafka_error(exc)
            return HeartbeatResult(error.error, str(error))

    def _check_poll_timeout(self) -> None:
        with self.lock:
            if not self.membership.poll_timed_out(time.monotonic()):
                return
        self._send_leave("consumer poll timeout has expired", stale=True)

    def _send_leave(self, reason: str, stale: bool = False) -> None:
        with self._heartbeat_lock:
            with self.lock:
                coordinator = self.membership.coordinator
                leave = self.membership.leave_request(reason, stale=stale)
            if leave is None or coordinator is None:
                return
            result = self._heartbeat(leave, coordinator)
            log.info("group %s: left (%s): %s", self.group_id, reason, result.error.name)

    def leave(self, reason: str) -> None:
        """The leave heartbeat (epoch -1, or -2 for a static member) and forget the
        membership."""
        self._send_leave(reason)

    # --- offsets ---------------------------------------------------------------------------

    def _retry_identity(self, identity: CommitIdentity) -> CommitIdentity:
        with self.lock:
            try:
                return self.membership.commit_identity()
            except KafkaError:
                return identity

    def _fetch_identity(self) -> tuple[str | None, int]:
        with self.lock:
            return self.membership.fetch_identity()

    def _fetch_retriable(self, error: ErrorCode) -> bool:
        # STALE_MEMBER_EPOCH: asked again with the epoch the heartbeat has since brought.
        return error in RETRIABLE_FETCH or error == ErrorCode.stale_member_epoch
