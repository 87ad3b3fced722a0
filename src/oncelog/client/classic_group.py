"""oncelog.Consumer's side of a classic consumer group: the I/O around group_membership.

group_membership decides; this module sends and receives. It owns two connections to the
group's coordinator:

- the consumer's, used from the consumer's own thread (inside poll(), commit(), close()):
  JoinGroup, SyncGroup, OffsetCommit, OffsetFetch, LeaveGroup. Requests are pipelined with a
  deadline each, and answers are read as they arrive, so a JoinGroup that the coordinator
  holds until every member has rejoined (up to max.poll.interval.ms) does not hold poll()
  beyond its timeout, and asynchronous commits are answered in order;
- the heartbeat thread's, so that the membership survives a handler slower than
  session.timeout.ms (up to max.poll.interval.ms, after which the thread leaves the group, as
  Kafka's consumer does). poll() sends a heartbeat itself when one is due.

The rebalance callbacks and commit callbacks run in the consumer's thread, inside poll()
(or commit(), close()), never in the heartbeat thread.

``group.protocol=consumer`` (KIP-848, ConsumerGroupHeartbeat) would be a sibling of this
class with the same methods (ensure_active, commit, committed, close); it is not built yet.
"""

from __future__ import annotations

import collections
import logging
import select
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from ..protocol.api_versions import (
    FIND_COORDINATOR,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    SYNC_GROUP,
)
from . import calls
from .assignors import parse_strategy
from .connection import BrokerConnection, KafkaError, KafkaTimeout, connect
from .group_membership import (
    SIMPLE_COMMIT,
    AssignmentChange,
    ClassicMembership,
    CommitIdentity,
    Handoff,
    Heartbeat,
    JoinResult,
    LeaveGroup,
    Step,
    SyncGroup,
    SyncResult,
)
from .topic_partition import OffsetAndMetadata, TopicPartition

log = logging.getLogger(__name__)

CommitCallback = Callable[[KafkaError | None, dict[TopicPartition, OffsetAndMetadata]], None]
_RETRIABLE_FETCH = (ErrorCode.coordinator_load_in_progress, ErrorCode.unstable_offset_commit,
                    ErrorCode.network_exception, ErrorCode.request_timed_out)
_COORDINATOR_MOVED = (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available)
_HEARTBEAT_TICK = 0.2  # how often the heartbeat thread looks at the clock at most


class GroupListener(Protocol):
    """What the consumer does when the membership changes (called in its own thread)."""

    def group_handoff(self, handoff: Handoff) -> None: ...

    def group_assigned(self, change: AssignmentChange) -> None: ...

    def group_partition_counts(self, topics: frozenset[str]) -> dict[str, int]: ...


@dataclass
class _InFlight:
    api_key: int
    deadline: float
    handler: Callable[[Any, KafkaError | None], None]


class ClassicGroup:
    def __init__(self, config: Mapping[str, Any], listener: GroupListener) -> None:
        self.group_id = str(config["group.id"])
        self.bootstrap = str(config["bootstrap.servers"])
        self.client_id = str(config["client.id"])
        self.timeout = int(config["request.timeout.ms"]) / 1000
        self.retry_backoff = int(config["retry.backoff.ms"]) / 1000
        self.membership = ClassicMembership(
            self.group_id, parse_strategy(config["partition.assignment.strategy"]),
            instance_id=config["group.instance.id"] or None,
            session_timeout_ms=int(config["session.timeout.ms"]),
            rebalance_timeout_ms=int(config["max.poll.interval.ms"]),
            heartbeat_interval_ms=int(config["heartbeat.interval.ms"]),
            retry_backoff_ms=int(config["retry.backoff.ms"]))
        self.listener = listener
        # The membership is shared with the heartbeat thread; every access holds this lock,
        # and no I/O happens while it is held.
        self.lock = threading.Lock()
        self._bootstrap_conn: BrokerConnection | None = None
        self._conn: BrokerConnection | None = None
        self._conn_to: tuple[int, str, int] | None = None
        self._inflight: collections.deque[_InFlight] = collections.deque()
        self._change: AssignmentChange | None = None
        self._callbacks: list[Callable[[], None]] = []  # async commit callbacks to run
        self._heartbeat_lock = threading.Lock()
        self._heartbeat_conn: BrokerConnection | None = None
        self._heartbeat_to: tuple[int, str, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.closed = False

    # --- joining and staying in the group --------------------------------------------------

    def ensure_active(self, deadline: float) -> bool:
        """Advance the membership until it is stable or ``deadline`` (monotonic) passes;
        whether it is stable. Runs the rebalance callbacks (through the listener) and the
        async commit callbacks. Raises the membership's fatal error."""
        self._start_heartbeat_thread()
        while True:
            self._pump(0)
            self._apply_change()
            self.run_callbacks()
            now = time.monotonic()
            with self.lock:
                self.membership.on_poll(now)
                step = self.membership.next_step(now)
            if step == Step.FAILED:
                raise self.membership.fatal
            if step == Step.STABLE:
                self.heartbeat_if_due(wait=False)
                return True
            left = deadline - now
            if step == Step.AWAIT:
                if left <= 0:
                    return False
                self._pump(left)
            elif step == Step.BACKOFF:
                if left <= 0:
                    return False
                time.sleep(max(0.0, min(left, self.membership.backoff_until - now)))
            elif step == Step.FIND_COORDINATOR:
                self.find_coordinator()
            elif step == Step.JOIN:
                self._join()
            elif step == Step.ASSIGN:
                self._assign_and_sync()
            elif step == Step.SYNC:
                with self.lock:
                    sync = self.membership.sync_request()
                self._send_sync(sync)
            if time.monotonic() >= deadline and step in (Step.BACKOFF, Step.AWAIT):
                return False

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
                    self.membership.on_join(calls.join_group_result(response), now)

        self._send(JOIN_GROUP, calls.join_group_request(join), deadline, answered)

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
                          else calls.sync_group_result(response))
                change = self.membership.on_sync(result, now)
            if change is not None:
                self._change = change

        # Members wait for the leader's assignment: up to the rebalance timeout too.
        deadline = time.monotonic() + self.membership.rebalance_timeout_ms / 1000 + 5
        self._send(SYNC_GROUP, calls.sync_group_request(sync), deadline, answered)

    def _apply_change(self) -> None:
        change, self._change = self._change, None
        if change is not None:
            self.listener.group_assigned(change)

    # --- the coordinator -------------------------------------------------------------------

    def find_coordinator(self) -> None:
        """One FindCoordinator through a bootstrap broker; the membership records the
        answer (or the backoff after a failure)."""
        try:
            if self._bootstrap_conn is None:
                self._bootstrap_conn = connect(self.bootstrap, self.client_id, self.timeout)
            found = calls.find_coordinator_result(self._bootstrap_conn.call(
                FIND_COORDINATOR, calls.find_coordinator_request(self.group_id)))
        except KafkaError as exc:
            if self._bootstrap_conn is not None:
                self._bootstrap_conn.close()
                self._bootstrap_conn = None
            found = calls.CoordinatorResult(exc.error, message=str(exc))
        now = time.monotonic()
        with self.lock:
            if found.error == ErrorCode.none:
                self.membership.on_coordinator(found.node_id, found.host, found.port)
            else:
                log.info("group %s: FindCoordinator: %s %s", self.group_id, found.error.name,
                         found.message or "")
                self.membership.on_coordinator_error(found.error, now)

    def _coordinator_connection(self) -> BrokerConnection:
        with self.lock:
            coordinator = self.membership.coordinator
        if coordinator is None:
            raise KafkaError(ErrorCode.coordinator_not_available,
                             f"no coordinator known for group {self.group_id}")
        if self._conn is not None and self._conn_to != coordinator:
            self._connection_failed(KafkaError(ErrorCode.network_exception, "coordinator moved"),
                                    lose_coordinator=False)
        if self._conn is None:
            _, host, port = coordinator
            try:
                self._conn = BrokerConnection(host, port, self.client_id, self.timeout)
            except KafkaError as exc:
                with self.lock:
                    self.membership.coordinator_lost(time.monotonic(), str(exc))
                raise
            self._conn_to = coordinator
        return self._conn

    def _send(self, api_key: int, make, deadline: float,
              handler: Callable[[Any, KafkaError | None], None]) -> None:
        """Pipeline a request on the coordinator connection; ``handler(response, None)`` or
        ``handler(None, error)`` runs when it is answered or fails (in _pump)."""
        try:
            conn = self._coordinator_connection()
            conn.send_only(api_key, make)
        except KafkaError as exc:
            self._connection_failed(exc)
            handler(None, exc)
            return
        self._inflight.append(_InFlight(api_key, deadline, handler))

    def _pump(self, wait: float) -> None:
        """Read the answers that arrive within ``wait`` seconds, in order, each to its
        handler; an answer late past its deadline fails the connection and all in flight."""
        until = time.monotonic() + wait
        while self._inflight and self._conn is not None:
            now = time.monotonic()
            first = self._inflight[0]
            if now >= first.deadline:
                self._connection_failed(KafkaTimeout(
                    f"group {self.group_id}: no answer from the coordinator in time"))
                return
            timeout = max(0.0, min(until, first.deadline) - now)
            try:
                ready, _, _ = select.select([self._conn.sock], [], [], timeout)
            except (OSError, ValueError) as exc:
                self._connection_failed(KafkaError(ErrorCode.network_exception, str(exc)))
                return
            if not ready:
                if time.monotonic() >= until:
                    return
                continue
            try:
                _, response = self._conn.receive()
            except Exception as exc:  # an answer we cannot read, of any kind
                self._connection_failed(_as_kafka_error(exc))
                return
            self._inflight.popleft().handler(response, None)

    def _call(self, api_key: int, make, timeout: float | None = None):
        """A request on the coordinator connection and its answer (after every answer
        pipelined before it)."""
        box: list = []
        self._send(api_key, make, time.monotonic() + (timeout or self.timeout),
                   lambda response, error: box.append((response, error)))
        while not box:
            self._pump(self.timeout)
        response, error = box[0]
        if error is not None:
            raise error
        return response

    def _connection_failed(self, error: KafkaError, lose_coordinator: bool = True) -> None:
        """Close the coordinator connection; what was in flight on it fails with ``error``."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
            log.info("group %s: coordinator connection closed: %s", self.group_id, error)
        if lose_coordinator:
            with self.lock:
                self.membership.coordinator_lost(time.monotonic(), str(error))
        failed, self._inflight = self._inflight, collections.deque()
        for entry in failed:
            entry.handler(None, error)

    # --- heartbeats ------------------------------------------------------------------------

    def _start_heartbeat_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                            name=f"oncelog-heartbeat-{self.group_id}")
            self._thread.start()

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self._heartbeat_wait()):
            try:
                self._check_poll_timeout()
                self.heartbeat_if_due()
            except Exception:  # the thread must outlive any surprise; the log says what
                log.exception("group %s: heartbeat thread", self.group_id)

    def _heartbeat_wait(self) -> float:
        with self.lock:
            due = self.membership.next_heartbeat - time.monotonic()
        return max(0.01, min(due, _HEARTBEAT_TICK))

    def _check_poll_timeout(self) -> None:
        with self.lock:
            if not self.membership.poll_timed_out(time.monotonic()):
                return
            leave = self.membership.leave_request("consumer poll timeout has expired")
        if leave is not None:
            self._send_leave_on_heartbeat_connection(leave)

    def heartbeat_if_due(self, wait: bool = True) -> None:
        """Send a Heartbeat if one is due (from poll(), which does not ``wait`` for the
        heartbeat thread's heartbeat in flight, or from that thread)."""
        if not self._heartbeat_lock.acquire(blocking=wait):
            return
        try:
            now = time.monotonic()
            with self.lock:
                beat = self.membership.heartbeat_request(now)
                coordinator = self.membership.coordinator
            if beat is None:
                return
            error = self._heartbeat(beat, coordinator)
            with self.lock:
                self.membership.on_heartbeat(beat, error, time.monotonic())
        finally:
            self._heartbeat_lock.release()

    def _heartbeat_connection(self, coordinator) -> BrokerConnection:
        if self._heartbeat_conn is not None and self._heartbeat_to != coordinator:
            self._heartbeat_conn.close()
            self._heartbeat_conn = None
        if self._heartbeat_conn is None:
            _, host, port = coordinator
            self._heartbeat_conn = BrokerConnection(host, port, self.client_id, self.timeout)
            self._heartbeat_to = coordinator
        return self._heartbeat_conn

    def _heartbeat(self, beat: Heartbeat, coordinator) -> ErrorCode:
        try:
            return self._heartbeat_connection(coordinator).call(
                HEARTBEAT, calls.heartbeat_request(beat)).error_code
        except Exception as exc:  # an answer we cannot read, of any kind
            if self._heartbeat_conn is not None:
                self._heartbeat_conn.close()
                self._heartbeat_conn = None
            return _as_kafka_error(exc).error

    def _send_leave_on_heartbeat_connection(self, leave: LeaveGroup) -> None:
        with self._heartbeat_lock:
            with self.lock:
                coordinator = self.membership.coordinator
            if coordinator is None:
                return
            try:
                response = self._heartbeat_connection(coordinator).call(
                    LEAVE_GROUP, calls.leave_group_request(leave))
                log.info("group %s: left (%s): %s", self.group_id, leave.reason,
                         calls.leave_group_error(response).name)
            except Exception as exc:  # best effort: the session ends anyway
                log.info("group %s: LeaveGroup failed: %s", self.group_id, exc)
                if self._heartbeat_conn is not None:
                    self._heartbeat_conn.close()
                    self._heartbeat_conn = None

    # --- offsets ---------------------------------------------------------------------------

    def commit_identity(self, subscribed: bool) -> CommitIdentity:
        if not subscribed:
            return SIMPLE_COMMIT
        with self.lock:
            return self.membership.commit_identity()

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata], identity: CommitIdentity,
               callback: CommitCallback | None = None) -> None:
        """Synchronous when ``callback`` is None (retries what may succeed until
        request.timeout.ms, then raises); otherwise sent now and the callback runs from a
        later poll(), commit() or close() with the error (None) and the offsets."""
        if callback is not None:
            self._commit_async(offsets, identity, callback)
            return
        deadline = time.monotonic() + self.timeout
        while True:
            error = self._commit_once(offsets, identity, deadline)
            if error is None:
                return
            with self.lock:
                retry = self.membership.on_commit_error(identity, error.error, time.monotonic())
            if not retry or time.monotonic() + self.retry_backoff >= deadline:
                raise error
            time.sleep(self.retry_backoff)

    def _commit_once(self, offsets, identity, deadline) -> KafkaError | None:
        try:
            self._ensure_coordinator(deadline)
            response = self._call(OFFSET_COMMIT, calls.offset_commit_request(
                self.group_id, identity, offsets), max(0.0, deadline - time.monotonic()))
        except KafkaError as exc:
            return exc
        return _commit_error(response)

    def _commit_async(self, offsets, identity, callback: CommitCallback) -> None:
        def answered(response, error: KafkaError | None) -> None:
            if error is None:
                error = _commit_error(response)
            if error is not None:
                with self.lock:
                    self.membership.on_commit_error(identity, error.error, time.monotonic())
            self._callbacks.append(lambda: callback(error, offsets))

        try:
            self._ensure_coordinator(time.monotonic() + self.timeout)
        except KafkaError as exc:
            answered(None, exc)
            return
        self._send(OFFSET_COMMIT, calls.offset_commit_request(self.group_id, identity, offsets),
                   time.monotonic() + self.timeout, answered)

    def serve(self) -> None:
        """Read the answers already arrived (asynchronous commits), run their callbacks."""
        self._pump(0)
        self.run_callbacks()

    def run_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def flush_commits(self, timeout: float) -> None:
        """Wait (bounded) for the answers to asynchronous commits in flight."""
        until = time.monotonic() + timeout
        while self._inflight and time.monotonic() < until:
            self._pump(until - time.monotonic())
        self.run_callbacks()

    def committed(self, partitions: list[TopicPartition], timeout: float | None = None
                  ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets (OffsetFetch), None where nothing is committed."""
        if not partitions:
            return {}
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            try:
                self._ensure_coordinator(deadline)
                response = self._call(OFFSET_FETCH, calls.offset_fetch_request(
                    self.group_id, partitions), max(0.0, deadline - time.monotonic()))
                error, found = calls.offset_fetch_result(response)
                if error == ErrorCode.none:
                    error = next((e for e, _ in found.values() if e != ErrorCode.none),
                                 ErrorCode.none)
                if error == ErrorCode.none:
                    return {tp: found.get(tp, (None, None))[1] for tp in partitions}
                failure = KafkaError(error, f"OffsetFetch for group {self.group_id}")
            except KafkaError as exc:
                failure = exc
            if failure.error in _COORDINATOR_MOVED:
                with self.lock:
                    self.membership.coordinator_lost(time.monotonic(), failure.error.name)
            elif failure.error not in _RETRIABLE_FETCH:
                raise failure
            if time.monotonic() + self.retry_backoff >= deadline:
                raise failure
            time.sleep(self.retry_backoff)

    def _ensure_coordinator(self, deadline: float) -> None:
        while True:
            with self.lock:
                if self.membership.fatal is not None:
                    raise self.membership.fatal
                if self.membership.coordinator is not None:
                    return
                wait = self.membership.backoff_until - time.monotonic()
            if time.monotonic() + max(wait, 0) >= deadline:
                raise KafkaError(ErrorCode.coordinator_not_available,
                                 f"no coordinator for group {self.group_id} found in time")
            if wait > 0:
                time.sleep(wait)
            self.find_coordinator()

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
            response = self._call(LEAVE_GROUP, calls.leave_group_request(leave))
            log.info("group %s: left (%s): %s", self.group_id, reason,
                     calls.leave_group_error(response).name)
        except KafkaError as exc:
            log.info("group %s: LeaveGroup failed: %s", self.group_id, exc)

    def close(self) -> None:
        self.closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout)
        for conn in (self._conn, self._heartbeat_conn, self._bootstrap_conn):
            if conn is not None:
                conn.close()
        self._conn = self._heartbeat_conn = self._bootstrap_conn = None
        self._inflight.clear()


def _commit_error(response) -> KafkaError | None:
    errors = calls.offset_commit_errors(response)
    failed = {tp: e for tp, e in errors.items() if e != ErrorCode.none}
    if not failed:
        return None
    tp, error = next(iter(sorted(failed.items())))
    return KafkaError(error, f"OffsetCommit of {tp.topic}-{tp.partition}"
                      + (f" and {len(failed) - 1} more" if len(failed) > 1 else ""))


def _as_kafka_error(exc: Exception) -> KafkaError:
    """A failure on a coordinator connection as a KafkaError: a broker's answer that cannot
    be decoded is treated as a broken connection (closed, and the call retried elsewhere)."""
    if isinstance(exc, KafkaError):
        return exc
    return KafkaError(ErrorCode.network_exception, f"cannot decode the coordinator's answer: "
                      f"{type(exc).__name__}: {exc}")
