"""The I/O both group protocols share (classic_group.py, consumer_group.py): the group
coordinator's connections, commits and committed offsets, and the heartbeat thread.

Each protocol's membership state machine (group_membership.ClassicMembership,
consumer_group_membership.ConsumerMembership) decides; this module sends and receives. A
group owns two connections to its coordinator:

- the consumer's, used from the consumer's own thread (inside poll(), commit(), close()):
  requests are pipelined with a deadline each, and answers are read as they arrive, so a
  request the coordinator holds (a classic JoinGroup waits for every member) does not hold
  poll() beyond its timeout, and asynchronous commits are answered in order;
- the heartbeat thread's, so that the membership survives a handler slower than the
  session (up to max.poll.interval.ms, after which the thread leaves the group, as Kafka's
  consumer does).

Callbacks (rebalance and commit) run in the consumer's thread, never in the heartbeat thread.
The membership answers the same questions in both protocols: ``coordinator``,
``on_coordinator``, ``on_coordinator_error``, ``coordinator_lost``, ``fatal``,
``backoff_until``, ``next_heartbeat``, ``commit_identity`` and ``on_commit_error``.
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

from ...protocol.api_versions import FIND_COORDINATOR, OFFSET_COMMIT, OFFSET_FETCH
from ..network import calls
from ..network.connection import BrokerConnection, KafkaError, KafkaTimeout, RequestNotSent, connect
from ..network.security import ClientSecurity
from ..topic_partition import OffsetAndMetadata, TopicPartition
from .group_membership import SIMPLE_COMMIT, AssignmentChange, CommitIdentity, Handoff

log = logging.getLogger(__name__)

CommitCallback = Callable[[KafkaError | None, dict[TopicPartition, OffsetAndMetadata]], None]
RETRIABLE_FETCH = (ErrorCode.coordinator_load_in_progress, ErrorCode.unstable_offset_commit,
                   ErrorCode.network_exception, ErrorCode.request_timed_out)
COORDINATOR_MOVED = (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available)
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


class GroupIO:
    """Subclasses set ``self.membership`` (with its ``STEPS``, the Step enum of its protocol,
    and ``WAITING_STEPS``) and define _take_step, _stable, _heartbeat, _check_poll_timeout
    and leave."""

    membership: Any
    STEPS: Any
    WAITING_STEPS: tuple = ()

    def __init__(self, config: Mapping[str, Any], listener: GroupListener) -> None:
        self.group_id = str(config["group.id"])
        self.bootstrap = str(config["bootstrap.servers"])
        self.client_id = str(config["client.id"])
        self.timeout = int(config["request.timeout.ms"]) / 1000
        self.retry_backoff = int(config["retry.backoff.ms"]) / 1000
        self.security = ClientSecurity.from_config(config)
        self.listener = listener
        # The membership is shared with the heartbeat thread; every access holds this lock,
        # and no I/O happens while it is held.
        self.lock = threading.Lock()
        self._bootstrap_conn: BrokerConnection | None = None
        self._conn: BrokerConnection | None = None
        self._conn_to: tuple[int, str, int] | None = None
        self._inflight: collections.deque[_InFlight] = collections.deque()
        self._failing = False  # in _connection_failed: its _deliver_kept may call it again
        self._callbacks: list[Callable[[], None]] = []  # async commit callbacks to run
        self._heartbeat_lock = threading.Lock()
        self._heartbeat_conn: BrokerConnection | None = None
        self._heartbeat_to: tuple[int, str, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.closed = False

    def ensure_active(self, deadline: float) -> bool:
        """Advance the membership until it is stable or ``deadline`` (monotonic) passes;
        whether it is stable. Runs the rebalance callbacks (through the listener) and the
        async commit callbacks. Raises the membership's fatal error. The steps both protocols
        share are taken here, the others by ``_take_step``."""
        steps = self.STEPS
        self._start_heartbeat_thread()
        while True:
            self._pump(0)
            self._before_step()
            self.run_callbacks()
            now = time.monotonic()
            with self.lock:
                self.membership.on_poll(now)
                step = self.membership.next_step(now)
            if step == steps.FAILED:
                raise self.membership.fatal
            if step == steps.STABLE:
                self.heartbeat_if_due(wait=False)
                with self.lock:
                    return self._stable()
            left = deadline - now
            if step == steps.BACKOFF:
                if left <= 0:
                    return False
                with self.lock:
                    until = self.membership.backoff_until
                time.sleep(max(0.0, min(left, until - now)))
            elif step == steps.FIND_COORDINATOR:
                self.find_coordinator()
            elif not self._take_step(step, left):
                return False
            if time.monotonic() >= deadline and step in self.WAITING_STEPS:
                return False

    def _before_step(self) -> None:
        """What the protocol does before each step (classic: apply a finished rebalance)."""

    def _take_step(self, step: Any, left: float) -> bool:
        """One step of the protocol's own; False: ensure_active gives up (returns False)."""
        raise NotImplementedError

    def _stable(self) -> bool:
        """At STABLE (the lock held): whether the member is stable."""
        raise NotImplementedError

    def heartbeat_if_due(self, wait: bool = True) -> None:
        """Send the protocol's heartbeat if one is due (from poll(), which does not ``wait``
        for the heartbeat thread's heartbeat in flight, or from that thread)."""
        if not self._heartbeat_lock.acquire(blocking=wait):
            return
        try:
            with self.lock:
                beat = self.membership.heartbeat_request(time.monotonic())
                coordinator = self.membership.coordinator
            if beat is None:
                return
            answer = self._heartbeat(beat, coordinator)
            with self.lock:
                self.membership.on_heartbeat(beat, answer, time.monotonic())
        finally:
            self._heartbeat_lock.release()

    def _heartbeat(self, beat: Any, coordinator: Any) -> Any:
        """Send ``beat`` to ``coordinator`` (no lock held); the answer as the membership's
        on_heartbeat takes it."""
        raise NotImplementedError

    def _check_poll_timeout(self) -> None:
        raise NotImplementedError

    def leave(self, reason: str) -> None:
        raise NotImplementedError

    # --- the coordinator -------------------------------------------------------------------

    def find_coordinator(self) -> None:
        """One FindCoordinator through a bootstrap broker; the membership records the
        answer (or the backoff after a failure)."""
        try:
            if self._bootstrap_conn is None:
                self._bootstrap_conn = connect(self.bootstrap, self.client_id, self.timeout,
                                               self.security)
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
                self._conn = BrokerConnection(host, port, self.client_id, self.timeout,
                                              self.security)
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
        conn = None
        try:
            conn = self._coordinator_connection()
            conn.send_only(api_key, make, deadline)
        except KafkaError as exc:
            # not sent within its deadline behind the answers in flight (row C7): those go on
            if not (isinstance(exc, RequestNotSent) and conn is not None and not conn.closed):
                self._connection_failed(exc)
            handler(None, exc)
            return
        self._inflight.append(_InFlight(api_key, deadline, handler))

    def _pump(self, wait: float) -> None:
        """Read the answers that arrive within ``wait`` seconds, in order, each to its
        handler; an answer late past its deadline fails the connection and all in flight."""
        until = time.monotonic() + wait
        while self._inflight and self._conn is not None:
            if self._conn.has_buffered_answer():  # read during a re-authentication: no select
                self._deliver_kept()
                continue
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
                self._connection_failed(as_kafka_error(exc))
                return
            self._inflight.popleft().handler(response, None)

    def _deliver_kept(self) -> None:
        """The answers the coordinator connection read during a re-authentication, each to
        its handler (the connection may have closed since, or a handler replaced it)."""
        conn = self._conn
        while conn is not None and self._conn is conn and self._inflight and \
                conn.has_buffered_answer():
            try:
                _, response = conn.receive()
            except Exception as exc:  # unreadable: the connection fails, and all in flight
                self._connection_failed(as_kafka_error(exc))
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
        """Close the coordinator connection; what was in flight on it fails with ``error``,
        but for the answers it read already (during a re-authentication): theirs, whatever
        path closes it (a send that failed, the coordinator moved, a timeout)."""
        if not self._failing:
            self._failing = True  # _deliver_kept fails the connection on an unreadable one
            try:
                self._deliver_kept()
            finally:
                self._failing = False
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

    # --- the heartbeat thread ---------------------------------------------------------------

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

    def _heartbeat_connection(self, coordinator) -> BrokerConnection:
        if self._heartbeat_conn is not None and self._heartbeat_to != coordinator:
            self._heartbeat_conn.close()
            self._heartbeat_conn = None
        if self._heartbeat_conn is None:
            _, host, port = coordinator
            self._heartbeat_conn = BrokerConnection(host, port, self.client_id, self.timeout,
                                              self.security)
            self._heartbeat_to = coordinator
        return self._heartbeat_conn

    # --- what differs between the protocols' offset calls -----------------------------------

    def _retry_identity(self, identity: CommitIdentity) -> CommitIdentity:
        """Whom a synchronous commit is retried as."""
        return identity

    def _fetch_identity(self) -> tuple[str | None, int]:
        """The member id and epoch an OffsetFetch names (v9+): none in the classic protocol."""
        return None, -1

    def _fetch_retriable(self, error: ErrorCode) -> bool:
        return error in RETRIABLE_FETCH

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
            identity = self._retry_identity(identity)

    def _commit_once(self, offsets, identity, deadline) -> KafkaError | None:
        try:
            self._ensure_coordinator(deadline)
            response = self._call(OFFSET_COMMIT, calls.offset_commit_request(
                self.group_id, identity, offsets), max(0.0, deadline - time.monotonic()))
        except KafkaError as exc:
            return exc
        return commit_error(response)

    def _commit_async(self, offsets, identity, callback: CommitCallback) -> None:
        def answered(response, error: KafkaError | None) -> None:
            if error is None:
                error = commit_error(response)
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
                member_id, member_epoch = self._fetch_identity()
                response = self._call(OFFSET_FETCH, calls.offset_fetch_request(
                    self.group_id, partitions, member_id=member_id, member_epoch=member_epoch),
                    max(0.0, deadline - time.monotonic()))
                error, found = calls.offset_fetch_result(response)
                if error == ErrorCode.none:
                    error = next((e for e, _ in found.values() if e != ErrorCode.none),
                                 ErrorCode.none)
                if error == ErrorCode.none:
                    return {tp: found.get(tp, (None, None))[1] for tp in partitions}
                failure = KafkaError(error, f"OffsetFetch for group {self.group_id}")
            except KafkaError as exc:
                failure = exc
            if failure.error in COORDINATOR_MOVED:
                with self.lock:
                    self.membership.coordinator_lost(time.monotonic(), failure.error.name)
            elif not self._fetch_retriable(failure.error):
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


def commit_error(response) -> KafkaError | None:
    errors = calls.offset_commit_errors(response)
    failed = {tp: e for tp, e in errors.items() if e != ErrorCode.none}
    if not failed:
        return None
    tp, error = next(iter(sorted(failed.items())))
    return KafkaError(error, f"OffsetCommit of {tp.topic}-{tp.partition}"
                      + (f" and {len(failed) - 1} more" if len(failed) > 1 else ""))


def as_kafka_error(exc: Exception) -> KafkaError:
    """A failure on a coordinator connection as a KafkaError: a broker's answer that cannot
    be decoded is treated as a broken connection (closed, and the call retried elsewhere)."""
    if isinstance(exc, KafkaError):
        return exc
    return KafkaError(ErrorCode.network_exception, f"cannot decode the coordinator's answer: "
                      f"{type(exc).__name__}: {exc}")
