"""One partition's replication state on this broker (cluster mode): its role at a leader
epoch, and as leader what it knows of each follower, the ISR, the high watermark and what
waits for it: produces with acks=all, acks=1 ones once a controlled shutdown began (row K6),
and that shutdown's own wait before it asks for its leaderships to move (rows L1-L3).

Every decision is a row of cluster/isr.py's tables; this module only keeps the facts and
resolves the waiting answers. A partition without it (``Partition.replication is None``) is
one broker alone: its own leader, ISR {itself}, high watermark = log end offset.

The high watermark is kept in Kafka's ``replication-offset-checkpoint`` (one file per
partition here, as the log start and cleaner checkpoints are): a replica that restarts and
leads again serves only what the ISR had, never what only it had.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from ..cluster import isr as rules

log = logging.getLogger(__name__)

HW_CHECKPOINT_FILE = "replication-offset-checkpoint"


class ReplicationError(Exception):
    """An acks=all answer that is an error: the Kafka error it is answered with."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass
class _Waiter:
    needed: int  # the high watermark that acknowledges it: the batch's last offset + 1
    future: asyncio.Future[None]
    min_insync: int | None  # None: the partition's min.insync.replicas (acks=all)
    timer: asyncio.TimerHandle | None = None


@dataclass
class ReplicaState:
    broker_id: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    high_watermark: int
    zk_version: int = -1  # of the state znode the role came from (the ISR write's condition)
    epoch_start_offset: int = 0  # our log end when we became leader at this epoch
    min_insync: int = 1
    controller_epoch: int = 0  # of the state read: an ISR write keeps it
    followers: dict[int, rules.FollowerView] = field(default_factory=dict)
    # follower -> (the leader's log end, the time) at its last fetch
    last_fetch: dict[int, tuple[int, int]] = field(default_factory=dict)
    waiters: list[_Waiter] = field(default_factory=list)
    isr_write_pending: bool = False
    # The ISR a write to ZooKeeper asked for, until ZooKeeper's answer or its state read
    # says what the ISR is: a write whose answer was lost may have landed, and the
    # controller may then elect a follower it added. Until then the high watermark counts
    # the maximal ISR (ours and the one asked for), as Kafka's leader does.
    pending_isr: tuple[int, ...] = ()
    # A handover of this leadership the controller asked for, as the state read says
    # (leader_election.py's H rows; isr.py's H7-H13): how many times an ask appeared since
    # this role began, and which of them a wait was started for (-1: none running).
    handover_for: str = ""
    handover_ready: bool = False
    handover_asks: int = 0
    handover_waiting: int = -1

    @property
    def is_leader(self) -> bool:
        return self.leader == self.broker_id

    # --- as leader -----------------------------------------------------------------------

    def follower_fetched(self, replica: int, fetch_offset: int, leader_end: int,
                         now_ms: int) -> None:
        old = self.followers.get(replica, rules.FollowerView(-1, 0))
        last_end, last_fetch_ms = self.last_fetch.get(replica, (leader_end + 1, 0))
        caught = rules.caught_up_at(fetch_offset, leader_end, last_end, now_ms, last_fetch_ms,
                                    old.last_caught_up_ms)
        self.followers[replica] = rules.FollowerView(fetch_offset, caught)
        self.last_fetch[replica] = (leader_end, now_ms)

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        return self.isr + tuple(b for b in self.pending_isr if b not in self.isr)

    def isr_write_started(self, wanted: tuple[int, ...]) -> None:
        # An earlier write whose outcome is unknown may have landed: its ISR stays counted
        # too until ZooKeeper's answer or state read says which one holds.
        self.isr_write_pending = True
        self.pending_isr = self.pending_isr + tuple(
            b for b in wanted if b not in self.pending_isr)

    def isr_write_ended(self, wanted: tuple[int, ...], version: int | None) -> bool:
        """The write answered at ``version``, or None: refused or its outcome unknown, the
        asked ISR stays counted until a state read from ZooKeeper (``isr_read``). True: that
        read is owed now, and must begin after this call: one that began while the write
        was in flight (a reconnection's, or the refusal's own) kept the ISR asked for, and
        nothing else would read before the watch's periodic pass, acks=all waiting meanwhile
        for a follower that may not be in the ISR at all."""
        self.isr_write_pending = False
        if version is not None:
            self.isr, self.zk_version, self.pending_isr = wanted, version, ()
            return False
        return bool(self.pending_isr)

    def isr_read(self, isr: tuple[int, ...], version: int) -> None:
        """The ISR ZooKeeper holds at ``version``: what a write in flight asked for stays
        counted until it answers."""
        self.isr, self.zk_version = isr, version
        if not self.isr_write_pending:
            self.pending_isr = ()

    def advance_high_watermark(self, leader_end: int) -> bool:
        """The maximal ISR's least log end (isr.high_watermark); True when it moved."""
        ends = [self.followers.get(b, rules.FollowerView(-1, 0)).log_end_offset
                for b in self.maximal_isr if b != self.broker_id]
        new = rules.high_watermark(self.high_watermark, leader_end, ends)
        moved = new != self.high_watermark
        self.high_watermark = new
        if moved:
            self.resolve_waiters()
        return moved

    def isr_changes(self, now_ms: int, lag_max_ms: int, fetching: int | None = None,
                    registered: Collection[int] | None = None) -> tuple[int, ...] | None:
        """The ISR the rules want (isr.isr_change per follower), None when it is as is;
        ``fetching``: the follower whose fetch asks (None: the periodic check);
        ``registered``: the brokers in /brokers/ids (None: every one, as on one broker)."""
        wanted = [self.broker_id]
        for broker in self.replicas:
            if broker == self.broker_id:
                continue
            view = self.followers.get(broker, rules.FollowerView(-1, now_ms))
            change = rules.isr_change(broker in self.isr, view, now_ms, lag_max_ms,
                                      self.high_watermark, self.epoch_start_offset,
                                      broker == fetching,
                                      registered is None or broker in registered)
            if change is rules.IsrChange.EXPAND or \
                    (change is rules.IsrChange.KEEP and broker in self.isr):
                wanted.append(broker)
        ordered = tuple(b for b in self.replicas if b in wanted)
        return None if set(ordered) == set(self.isr) else ordered

    def wait_for(self, needed: int, timeout_s: float,
                 min_insync: int | None = None) -> asyncio.Future[None] | None:
        """acks=all: a future done once the high watermark reaches ``needed`` with enough
        replicas in sync (isr.acks_all_step); None when that is so already. ``min_insync``:
        in place of the partition's (1: an acks=1 answer in controlled shutdown, row K6)."""
        step = rules.acks_all_step(self.high_watermark, needed, len(self.isr),
                                   self.min_insync if min_insync is None else min_insync)
        if step is rules.Acks.DONE:
            return None
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if step is rules.Acks.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
            fut.set_exception(self._not_enough_after())
            return fut
        waiter = _Waiter(needed, fut, min_insync)
        waiter.timer = loop.call_later(timeout_s, self._timed_out, waiter)
        self.waiters.append(waiter)
        return fut

    def _not_enough_after(self) -> ReplicationError:
        return ReplicationError(ErrorCode.not_enough_replicas_after_append,
                                f"the ISR {list(self.isr)} shrank below min.insync.replicas "
                                f"{self.min_insync} while the batch waited")

    def _timed_out(self, waiter: _Waiter) -> None:
        if waiter in self.waiters:
            self.waiters.remove(waiter)
        if not waiter.future.done():
            waiter.future.set_exception(ReplicationError(
                ErrorCode.request_timed_out, "the ISR did not have the batch in time"))

    def resolve_waiters(self) -> None:
        keep = []
        for waiter in self.waiters:
            step = rules.acks_all_step(self.high_watermark, waiter.needed, len(self.isr),
                                       self.min_insync if waiter.min_insync is None
                                       else waiter.min_insync)
            if step is rules.Acks.WAIT:
                keep.append(waiter)
                continue
            _settle(waiter, None if step is rules.Acks.DONE else self._not_enough_after())
        self.waiters = keep

    def fail_waiters(self, error: ErrorCode, message: str) -> None:
        for waiter in self.waiters:
            _settle(waiter, ReplicationError(error, message))
        self.waiters = []


def _settle(waiter: _Waiter, error: BaseException | None) -> None:
    if waiter.timer is not None:
        waiter.timer.cancel()
    if waiter.future.done():
        return
    if error is None:
        waiter.future.set_result(None)
    else:
        waiter.future.set_exception(error)
        waiter.future.exception()  # retrieved: its request may be gone


async def until_replicated(partitions, timeout_s: float) -> int:
    """Waits until the ISR of each partition led here holds what its log holds now (the
    high watermark at the log end offset of this call), at most ``timeout_s``: a leader
    about to hand its leaderships over (controlled shutdown) makes sure the new one, elected
    from the ISR, has every record it acknowledged. A leadership that moves meanwhile ends
    its wait. How many partitions ended lacking (isr.py's rows L1-L3)."""
    waits = []
    for partition in partitions:
        r = partition.replication
        if r is not None and r.is_leader and partition.is_open and \
                not partition.log_dir.offline:
            waiting = r.wait_for(partition.log.log_end_offset, timeout_s, 1)
            if waiting is not None:
                waits.append(waiting)
    if not waits:
        return 0
    done, pending = await asyncio.wait(waits, timeout=timeout_s)
    for fut in pending:  # each times out on its own timer next
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
    return sum(rules.leave_lacks(False, None) for _ in pending) + \
        sum(rules.leave_lacks(True, _error(fut)) for fut in done)


def _error(fut: asyncio.Future) -> ErrorCode | None:
    exc = fut.exception()
    if exc is None:
        return None
    return exc.error_code if isinstance(exc, ReplicationError) else ErrorCode.unknown_server_error
