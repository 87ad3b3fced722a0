"""The replica manager (cluster mode only): this broker's part in replicating partitions.

It follows ZooKeeper (cluster/replica_watch.py hands it every topic with a partition assigned
here, with each partition's state) and, on the event loop:

- creates the local log of every partition assigned here with the topic's configs from
  /config/topics (and takes their changes), and deletes the local topic once no partition
  of it is assigned here;
- makes each partition leader or follower as its state says (cluster/isr.py's role table,
  the leader epoch fencing stale states): a leader stamps its epoch on the batches it
  appends and records the epoch's start in the leader epoch cache; a follower fetches from
  the leader (broker/replica_fetcher.py), after truncating to where it and the leader agree;
- as leader, keeps what each follower fetched, the high watermark, and the ISR: shrinks it
  after replica.lag.time.max.ms and grows it when a follower caught up, by a conditional
  write of the state znode (the controller's writes win); the changes of many partitions go
  together (one write in flight at a time, ZooKeeper transactions of many);
- writes each partition's high watermark to its replication-offset-checkpoint every
  replica.high.watermark.checkpoint.interval.ms and at shutdown;
- reports its replicas on failed log directories (broker/log_dirs.py) to the controller
  (cluster/replica_watch.py's report_offline), which moves their leaderships and takes them
  out of the ISRs; reported again whenever the set changes or a report failed, and at start
  (a restart recovers the directories: the report empties).

Before the first view, every replicated partition here has no leader: nothing is produced
to or read from a partition this broker has not been told it leads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from kio.schema.errors import ErrorCode

from ..cluster import isr as rules
from ..cluster import znodes as zn
from ..cluster.replica_watch import IsrWrite, ReplicaWatch, TopicView
from ..log import offset_checkpoint
from ..log.disk import OsDisk
from .log_dirs import LogDirOffline
from .partition import Partition
from .replica_fetcher import LeaderFetcher
from .replication import HW_CHECKPOINT_FILE, ReplicaState, until_replicated
from .topics import INTERNAL_TOPICS, REPLICA_MARK, TopicError

log = logging.getLogger(__name__)

# How long a controlled shutdown waits for the ISRs of its leaderships to have what it
# appended (an ISR member that stopped fetching holds them until the ISR shrinks)
LEAVE_TIMEOUT_S = 10.0


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _now_ms() -> int:
    return int(time.time() * 1000)


def _advance(partition: Partition, current: ReplicaState) -> None:
    """The high watermark moved to what the ISR read allows, its acks=-1 waiters answered,
    when the role read is still the partition's and its log open."""
    if partition.replication is current and partition.is_open and \
            not partition.log_dir.offline:
        current.advance_high_watermark(partition.log.log_end_offset)
        current.resolve_waiters()


class ReplicaManager:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.broker_id: int = broker.broker_id
        self.topics = broker.topics
        self.config = broker.config
        self.lag_max_ms: int = self.config.get("replica.lag.time.max.ms")
        member = broker.cluster
        self.watch = ReplicaWatch(member.store, self.broker_id, self._on_view,
                                  lambda: member.vouches)
        member.on_registered = self.watch.refresh  # registered again: B7 on a fresh read
        member.store.add_session_listener(self._on_session)
        self._last_view: dict[str, TopicView | None] | None = None
        # Since this broker stopped vouching for its session until a view read once it
        # vouches again is applied: its leaderships fenced (B0), its Metadata refused.
        self.fenced = False
        # (replicas offline, every log directory failed) as last reported; None: unknown
        self._offline_reported: tuple[tuple[tuple[str, int], ...], bool] | None = None
        self._offline_pending = False
        for log_dir in self.topics.log_dirs.values():
            log_dir.when_offline(self._log_dir_failed)
        self.fetchers: dict[int, LeaderFetcher] = {}  # by leader broker
        self._following: dict[str, int] = {}  # partition name -> the leader it fetches from
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []
        self._handing_over: set[asyncio.Task] = set()
        # the high watermarks as last written, one checkpoint file per log directory
        self._hw_written: dict[str, offset_checkpoint.Entries] = {}
        self._hw_writing: asyncio.Future | None = None
        # as the files were at start: each entry is taken once, by its partition's first
        # replication state (a topic deleted and made again starts from 0)
        self._hw_at_start: dict[str, offset_checkpoint.Entries] = {}
        self._closed = False
        self._leaving = False  # in controlled shutdown: following nothing
        self._moved_away = False  # in controlled shutdown: told its leaderships moved
        # ISR changes waiting for the write in flight: (partition, its replication, ISR
        # before, ISR wanted, state to write, version read)
        self._isr_queue: list[tuple] = []
        self._isr_writing = False
        # A role that needs the log, for a partition whose log is being opened in a worker
        # thread: the newest arguments of apply_state, applied once it is open.
        self._awaiting_log: dict[Partition, tuple] = {}
        self._unopened: set[Partition] = set()  # applied after a failed opening
        # Kafka's IsrShrinksPerSec / IsrExpandsPerSec counts (broker/replication_metrics.py)
        self.isr_shrinks = 0
        self.isr_expands = 0
        # (topic, partition, leader?, leader epoch or None: deleted): the coordinators of
        # the internal topics follow their partitions' leadership (broker/internal_topics.py)
        self.on_leadership = None
        # The local topics that are replicas of ZooKeeper's (ensure_replica_topic marks
        # them): only those follow the view, and only those go when it drops them. A topic
        # this broker kept alone before it joined a cluster is never deleted for that.
        self._replicas: set[str] = set()
        for topic in list(self.topics.topics.values()):
            stored, _ = self.topics.store.get(f"topics/{topic.name}")
            if stored and stored.get(REPLICA_MARK):
                self._replicas.add(topic.name)
                for partition in topic.partitions:
                    self._no_leader_yet(partition)

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks = [
            asyncio.create_task(self._every(max(10, self.lag_max_ms // 2), self.check_isr)),
            asyncio.create_task(self._every(max(10, self.lag_max_ms // 2),
                                            self.report_offline)),
            asyncio.create_task(self._every(
                self.config.get("replica.high.watermark.checkpoint.interval.ms"),
                self.checkpoint_high_watermarks)),
            asyncio.create_task(self._follow_standing()),
        ]
        self.watch.start()
        self.report_offline()

    @property
    def leaving(self) -> bool:
        """In controlled shutdown: its leaderships are about to move (isr.py's row K6)."""
        return self._leaving

    async def leave(self, timeout_s: float = LEAVE_TIMEOUT_S) -> None:
        """Controlled shutdown begins: from now on an acks=1 answer waits for the ISR (row
        K6) and no fetcher starts; before the controller is asked to move anything, wait
        (bounded, isr.py's row L1) until the ISR of every partition led here has what was
        appended before: acks=1 answers already sent named it, and the new leader will be
        one of the ISR. Only then stop fetching (Kafka's controller sends the broker
        StopReplica), so no leader puts it back in an ISR the controller shrinks: while
        it waits it still follows, as the other leaders stopping with it (a whole cluster
        stopped at once) need it to advance their high watermarks."""
        self._leaving = True
        lacking = await until_replicated(self._replicated(), timeout_s)
        if lacking:
            log.warning("controlled shutdown: %d partitions led here still have records "
                        "their ISR lacks after %.0fs; moving them anyway", lacking, timeout_s)
        for fetcher in list(self.fetchers.values()):
            await fetcher.stop()
        self.fetchers.clear()
        self._following.clear()

    def step_down(self) -> None:
        """Controlled shutdown: the controller wrote that this broker's leaderships moved,
        which its view may not show yet; from now on it leads nothing (B0's fence, for
        good), so no acks=0/1 produce is acknowledged into a log the new leader will have
        this broker truncate."""
        if self._moved_away:
            return
        self._moved_away = True
        log.info("broker %d leads nothing from now on: its leaderships moved (controlled "
                 "shutdown)", self.broker_id)
        if self._last_view is not None and not self._closed:
            self.apply_view(self._last_view, False)
        self._fence_leaderships()

    async def close(self) -> None:
        self._closed = True  # a view already on its way to the loop changes nothing now
        self.watch.close()
        for task in [*self._tasks, *self._handing_over]:
            task.cancel()
        for fetcher in list(self.fetchers.values()):
            await fetcher.stop()
        self.fetchers.clear()
        self._following.clear()
        for partition in self._replicated():
            if partition.replication is not None:
                partition.replication.fail_waiters(ErrorCode.not_leader_or_follower,
                                                   "the broker is shutting down")
        # the write in flight first (two writers would share the temporary file), then the
        # last one; each bounded, so a hung disk does not keep the broker from stopping
        for _ in range(2):
            if self._hw_writing is not None:
                await asyncio.wait({self._hw_writing}, timeout=10)
                if not self._hw_writing.done():
                    log.error("the high watermark checkpoint did not finish in 10 s")
                    return
            self._hw_writing = None
            self.checkpoint_high_watermarks()

    async def _every(self, interval_ms: int, duty) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                duty()
            except Exception:
                log.exception("replica duty %s failed", duty.__name__)

    def _on_view(self, view: dict[str, TopicView | None], vouched: bool) -> None:
        """On the watch's thread: the view goes to the event loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.apply_view, view, vouched)

    def _on_session(self, state: str) -> None:
        """On kazoo's thread: an expired session ("LOST") fences at once (V4)."""
        loop = self._loop
        if loop is not None and not loop.is_closed() and state == "LOST":
            loop.call_soon_threadsafe(self._fence_if_unvouched)

    async def _follow_standing(self) -> None:
        """Fences this broker's leaderships the moment ZooKeeper has been silent too long
        (the standing table's V3: kazoo may still believe it is connected), and, fenced,
        asks for a fresh view once it vouches again (B7 leads on it)."""
        member = self.broker.cluster
        recheck_s = member.heartbeat.interval_s
        while True:
            wait_s = recheck_s
            try:
                left_s = member.vouch_left_s()
                if left_s <= 0:
                    self._fence_if_unvouched()
                else:
                    if self.fenced:
                        self.watch.refresh()
                    wait_s = min(recheck_s, left_s + 0.001)  # wake as the standing turns
            except Exception:
                log.exception("following the ZooKeeper standing failed")
            await asyncio.sleep(wait_s)

    def _fence_if_unvouched(self) -> None:
        if self._closed or self._last_view is None or self.fenced or \
                self.broker.cluster.vouches:
            return
        log.warning("broker %d cannot vouch for its ZooKeeper session (%s): it leads "
                    "nothing until it has registered again and read the partition states",
                    self.broker_id, self.broker.cluster.standing().value)
        self.fenced = True
        self.apply_view(self._last_view, False)
        self._fence_leaderships()

    def _fence_leaderships(self) -> None:
        """Every replica this broker leads now is fenced (B0), whether or not the last view
        holds its state: one whose state znode could not be read (cluster/unreadable.py) is
        led all the same, and must stop acknowledging as the others do."""
        if self._closed:
            return
        for partition in list(self._replicated()):
            r = partition.replication
            if r is not None and r.is_leader:
                self.apply_state(partition, zn.PartitionState(
                    self.broker_id, r.leader_epoch, r.isr, r.controller_epoch),
                    r.zk_version, r.replicas, r.min_insync, False)

    def _replicated(self):
        for name in list(self._replicas):
            topic = self.topics.get(name)
            if topic is not None:
                yield from topic.partitions

    # --- following ZooKeeper -------------------------------------------------------------

    def apply_view(self, view: dict[str, TopicView | None], vouched: bool = True) -> None:
        """``vouched``: the broker vouched for its session when the view was read (and
        still does: the standing table)."""
        if self._closed:
            return
        vouched = vouched and self.broker.cluster.vouches and not self._moved_away
        self._last_view = view
        if vouched and self.fenced:
            log.info("broker %d vouches for its ZooKeeper session again", self.broker_id)
            self.fenced = False
        for name, tv in view.items():
            if tv is None:  # unreadable in ZooKeeper (cluster/unreadable.py): kept as it is
                continue
            try:
                self._apply_topic(tv, vouched)
            except TopicError as exc:  # e.g. every log directory offline: no place for it
                log.error("the replica assignment of topic %s cannot be applied: %s", name,
                          exc)
            except Exception:
                log.exception("applying the replica assignment of topic %s failed", name)
        for name in [n for n in self._replicas if n not in view]:
            self._delete_local(name)

    def _apply_topic(self, tv: TopicView, vouched: bool) -> None:
        count = max(tv.assignment.partitions) + 1
        topic = self.topics.get(tv.name)
        fresh = topic is None or topic.topic_id != zn.decode_topic_id(tv.assignment.topic_id)
        if fresh:
            if topic is not None:  # the deletion was not seen (it may have happened while
                # this broker was down; it may also be a controller's mistake): the old
                # replica is set aside, not removed, as Kafka keeps its stray replicas
                self._delete_local(tv.name, keep=True)
            topic = self.topics.ensure_replica_topic(
                tv.name, zn.decode_topic_id(tv.assignment.topic_id), count, tv.configs)
            self._replicas.add(tv.name)
            for partition in topic.partitions:
                self._no_leader_yet(partition)
        elif tv.configs != self.topics.override_texts(topic):  # /config/topics changed
            self.topics.alter_configs(tv.name, tv.configs)
        if count > len(topic.partitions):  # CreatePartitions: the assignment grew
            known = len(topic.partitions)
            self.topics.add_partitions(tv.name, count)
            for partition in topic.partitions[known:]:
                self._no_leader_yet(partition)
        min_insync = self.topics.topic_config(topic, "min.insync.replicas")
        for index, (state, version) in sorted(tv.states.items()):
            if index < len(topic.partitions):
                replicas = tv.assignment.partitions.get(index, ())
                self.apply_state(topic.partitions[index], state, version, replicas, min_insync,
                                 vouched)

    def _delete_local(self, name: str, keep: bool = False) -> None:
        topic = self.topics.get(name)
        if topic is None:
            return
        for partition in topic.partitions:
            self._stop_fetcher(partition)
            if partition.replication is not None:
                partition.replication.fail_waiters(ErrorCode.unknown_topic_or_partition,
                                                   f"topic {name} was deleted")
            self._leadership(partition, False, None)
        self._replicas.discard(name)
        try:
            self.topics.delete(name, internal=name in INTERNAL_TOPICS, keep=keep)
        except Exception:
            log.exception("deleting the local replica of topic %s failed", name)

    def holds_copy(self, name: str) -> bool:
        """Whether the local topic ``name`` is this broker's copy of a cluster topic."""
        return name in self._replicas

    def _no_leader_yet(self, partition: Partition) -> None:
        if partition.replication is None:
            hw = self._hw_checkpointed(partition)
            partition.replication = ReplicaState(self.broker_id, rules.NO_LEADER, -1, (), (),
                                                 hw)

    def apply_state(self, partition: Partition, state: zn.PartitionState, version: int,
                    replicas: tuple[int, ...], min_insync: int,
                    vouched: bool = True) -> rules.Role:
        """One row of the role table for one partition."""
        current: ReplicaState = partition.replication
        our_epoch = None if current is None or current.leader_epoch < 0 \
            else current.leader_epoch
        leading = current is not None and current.is_leader
        older = current is not None and version < current.zk_version
        role = rules.role_step(our_epoch, leading, state.leader, state.leader_epoch,
                               self.broker_id, vouched, older)
        if role is rules.Role.IGNORE:
            if current is not None and state.leader_epoch == current.leader_epoch \
                    and not older:
                current.isr, current.zk_version = state.isr, version  # shown by Metadata
            return role
        if role is rules.Role.ADOPT_ISR:
            self._adopt_isr(partition, current, state, version, tuple(replicas), min_insync)
            self._handover_read(partition, current, state)
            return role
        if self._open_first(partition, role, (state, version, replicas, min_insync, vouched)):
            return role
        hw = current.high_watermark if current is not None else \
            self._hw_checkpointed(partition)
        leader = rules.NO_LEADER if role is rules.Role.FENCE else state.leader
        if current is not None:
            current.fail_waiters(ErrorCode.not_leader_or_follower,
                                 f"{partition.name}: broker {self.broker_id} cannot vouch "
                                 f"for its ZooKeeper session" if role is rules.Role.FENCE
                                 else f"{partition.name}: leader epoch {state.leader_epoch} "
                                 f"went to broker {state.leader}")
        self._stop_fetcher(partition)
        new = ReplicaState(self.broker_id, leader, state.leader_epoch, state.isr,
                           tuple(replicas), hw, version, min_insync=min_insync,
                           controller_epoch=state.controller_epoch)
        partition.leader_epoch = state.leader_epoch
        if role is rules.Role.BECOME_LEADER:
            try:
                end = partition.become_leader(state.leader_epoch)
            except LogDirOffline as exc:
                # Its directory is offline (now, or before): the controller moves the
                # leadership away; until then it leads nothing.
                new.leader = rules.NO_LEADER
                partition.replication = new
                log.error("%s: cannot lead at epoch %d: %s", partition.name,
                          state.leader_epoch, exc)
                partition._wake_waiters()
                self._leadership(partition, False, state.leader_epoch)
                return role
            new.epoch_start_offset = end
            now = _now_ms()
            new.followers = {b: rules.FollowerView(-1, now) for b in state.isr}
            partition.replication = new
            new.advance_high_watermark(partition.log.log_end_offset)
            log.info("%s: leader at epoch %d, ISR %s, high watermark %d", partition.name,
                     state.leader_epoch, list(state.isr), new.high_watermark)
            self._handover_read(partition, new, state)
        elif role is rules.Role.BECOME_FOLLOWER:
            partition.replication = new
            # B5: a broker in controlled shutdown fetches no more, nor a replica whose log
            # directory failed
            if not self._leaving and not partition.log_dir.offline:
                self._start_fetcher(partition, state.leader, state.leader_epoch)
            log.info("%s: follower of broker %d at epoch %d", partition.name, state.leader,
                     state.leader_epoch)
        elif role is rules.Role.FENCE:
            partition.replication = new
            log.log(logging.INFO if self._moved_away else logging.WARNING,
                    "%s: fenced at leader epoch %d (%s)", partition.name, state.leader_epoch,
                    "moved in controlled shutdown" if self._moved_away
                    else "ZooKeeper session not vouched for")
        else:
            partition.replication = new
            log.warning("%s: no leader at epoch %d", partition.name, state.leader_epoch)
        partition._wake_waiters()  # long polls answer the new role's error
        # A fence resigns without an epoch (ownership.py O8: the partition starts over), since
        # B7 makes this broker leader again at the same epoch, which O1 would ignore.
        self._leadership(partition, role is rules.Role.BECOME_LEADER,
                         None if role is rules.Role.FENCE else state.leader_epoch)
        return role

    def _open_first(self, partition: Partition, role: rules.Role, args: tuple) -> bool:
        """True when ``role`` is leading and needs a log not open yet: it is opened
        (created, or recovered after a restart) in a worker thread, and the newest state
        asked meanwhile is applied once it is (``_log_opened``); until then the replica
        stays as it was (no leader yet, at start). False: apply the role now. Any other
        role (following: its fetcher opens the log in a worker) is applied at once: a
        demotion held while the log reopened left requests queued behind the reopening to
        append as the stale leader."""
        held = self._awaiting_log.get(partition)
        if role is not rules.Role.BECOME_LEADER:
            self._awaiting_log.pop(partition, None)  # a later state overrides the one held
            return False
        if partition.is_open or partition.log_dir.offline or partition in self._unopened \
                or not _loop_running():  # no event loop (tools, tests): opened in place
            return False
        if held is not None and (args[0].leader_epoch, args[1]) < \
                (held[0].leader_epoch, held[1]):
            return True  # older than the state held: that one is still the newest
        first = held is None
        self._awaiting_log[partition] = args
        if first:
            try:
                # A new role is no retry: not held back by a failed opening's backoff (its
                # use of the log would otherwise fail the topic's pass).
                opening = partition.start_opening(now=True)
            except OSError:  # deleted: nothing to apply; offline: handled by the role
                del self._awaiting_log[partition]
                return False
            opening.add_done_callback(lambda _: self._log_opened(partition))
        return True

    def _log_opened(self, partition: Partition) -> None:
        """On the loop, the opening over (published or not): the newest state asked for
        the partition is applied, if it is still this broker's replica."""
        args = self._awaiting_log.pop(partition, None)
        if args is None or self._closed or partition.deleted:
            return
        if not partition.is_open:
            # The opening failed: the role is applied as before this module opened logs in
            # workers, its own use of the log meeting the failure (not opened again here).
            log.error("%s: its log could not be opened for its new role", partition.name)
            self._unopened.add(partition)
        try:
            self.apply_state(partition, *args)
        except Exception:
            log.exception("%s: applying its state once its log was open failed",
                          partition.name)
        finally:
            self._unopened.discard(partition)

    def _leadership(self, partition: Partition, leader: bool, epoch: int | None) -> None:
        if self.on_leadership is not None and partition.topic in INTERNAL_TOPICS:
            try:
                self.on_leadership(partition.topic, partition.index, leader, epoch)
            except Exception:
                log.exception("%s: the coordinator did not take the change of leadership",
                              partition.name)

    def _adopt_isr(self, partition: Partition, current: ReplicaState,
                   state: zn.PartitionState, version: int, replicas: tuple[int, ...],
                   min_insync: int) -> None:
        now = _now_ms()
        for broker in state.isr:
            current.followers.setdefault(broker, rules.FollowerView(-1, now))
        if version > current.zk_version:  # a newer write (the controller's): counted
            self._count_isr(current.isr, state.isr)
        current.isr_read(state.isr, version)
        current.replicas = replicas  # B2: a reassignment's added replica may join the ISR
        current.controller_epoch = state.controller_epoch  # our next ISR write keeps it
        current.min_insync = min_insync
        # Offline: nothing moves until its leadership goes. Not open (being opened, or cut,
        # in a worker; or closed): moved once its opening, started here, is over;
        # partition.log would raise OpenInProgress here, out of apply_state and past the
        # topic's other partitions. (A leader's ISR shrunk: its acks=-1 waiters answered
        # then, not at their timeout.)
        if partition.log_dir.offline:
            return
        if partition.is_open:
            _advance(partition, current)
            return
        try:
            opening = partition.start_opening()
        except OSError:  # deleted, or backing off after a failed opening: the next read
            return
        opening.add_done_callback(lambda _: _advance(partition, current))

    # --- handing a leadership over (isr.py's H7-H13) --------------------------------------

    def _handover_read(self, partition: Partition, r: ReplicaState,
                       state: zn.PartitionState) -> None:
        """The state just read for a partition led here: whether it asks a handover (K6 for
        it from this moment: an acks=1 answer now waits for the ISR)."""
        if state.handover_for and not r.handover_for:
            r.handover_asks += 1  # asked anew: a wait from before the ask was taken back
            # (H6) saw acks=1 answered on the append meanwhile, so it vouches for nothing
        r.handover_for, r.handover_ready = state.handover_for, state.handover_ready
        if not rules.handover_starts(r.is_leader, bool(r.handover_for), r.handover_ready,
                                     r.handover_waiting == r.handover_asks) \
                or not partition.is_open or not _loop_running():
            return  # H9 (not open: read again once it is, with the next state)
        r.handover_waiting = r.handover_asks
        log.info("%s: handing its leadership over (%s): acks=1 now waits for the ISR",
                 partition.name, r.handover_for)
        task = asyncio.get_running_loop().create_task(
            self._hand_over(partition, r, r.handover_asks))
        self._handing_over.add(task)
        task.add_done_callback(self._handing_over.discard)

    async def _hand_over(self, partition: Partition, r: ReplicaState, ask: int) -> None:
        """H7/H8: once the ISR holds the log end of now (everything acknowledged before
        the ask), the state written ready, at the version read (H10-H13)."""
        lacking = await until_replicated([partition], LEAVE_TIMEOUT_S)
        step = rules.handover_after_wait(
            partition.replication is r and not partition.deleted and r.is_leader,
            r.handover_asks == ask and bool(r.handover_for) and not r.handover_ready,
            bool(lacking), r.isr_write_pending)
        if step is not rules.HandoverStep.WRITE_READY:
            if step is rules.HandoverStep.READ_AGAIN and r.handover_waiting == ask:
                r.handover_waiting = -1  # the next read of the state waits again (H7)
                self.watch.refresh()
            if step is rules.HandoverStep.LACKING:
                log.warning("%s: its ISR still lacks records after %.0fs; the controller "
                            "moves the leadership at its own bound", partition.name,
                            LEAVE_TIMEOUT_S)
            return
        ready = zn.PartitionState(self.broker_id, r.leader_epoch, r.isr, r.controller_epoch,
                                  r.handover_for, True)
        versions = await asyncio.get_running_loop().run_in_executor(
            None, self.watch.write_isrs,
            [IsrWrite(partition.topic, partition.index, ready, r.zk_version)], False)
        if versions[0] is not None:  # (the move may already have been read meanwhile)
            log.info("%s: ready to hand its leadership over at epoch %d", partition.name,
                     r.leader_epoch)
            if partition.replication is r and r.handover_asks == ask:
                r.zk_version, r.handover_ready = versions[0], True
        elif r.handover_waiting == ask:  # lost to a write in between: read, H7 again
            r.handover_waiting = -1
            self.watch.refresh()

    # --- as leader -----------------------------------------------------------------------

    def follower_fetched(self, partition: Partition, replica_id: int,
                         fetch_offset: int) -> None:
        """A follower's Fetch at ``fetch_offset`` (its log end): the high watermark and the
        ISR may move."""
        r: ReplicaState = partition.replication
        end = partition.log.log_end_offset
        r.follower_fetched(replica_id, fetch_offset, end, _now_ms())
        if r.advance_high_watermark(end):
            partition._wake_waiters()  # consumers waiting for the high watermark
        if replica_id not in r.isr:
            self._maybe_write_isr(partition, replica_id)

    def check_isr(self) -> None:
        for partition in self._replicated():
            r = partition.replication
            if r is not None and r.is_leader and not partition.log_dir.offline:
                self._maybe_write_isr(partition)

    def _maybe_write_isr(self, partition: Partition, fetching: int | None = None) -> None:
        r: ReplicaState = partition.replication
        if r.isr_write_pending:
            return
        wanted = r.isr_changes(_now_ms(), self.lag_max_ms, fetching,
                               {b.broker_id for b in self.broker.cluster.brokers})
        if wanted is None:
            return
        r.isr_write_started(wanted)
        state = zn.PartitionState(self.broker_id, r.leader_epoch, wanted, r.controller_epoch,
                                  r.handover_for, r.handover_ready)  # the ask stays
        self._isr_queue.append((partition, r, r.isr, wanted, state, r.zk_version))
        if not self._isr_writing:
            self._write_isrs()

    def _write_isrs(self) -> None:
        """Every ISR change queued, in one call off the loop (ZooKeeper transactions of
        many: cluster/batches.py); those queued meanwhile go in the next call."""
        queued, self._isr_queue = self._isr_queue, []
        self._isr_writing = True
        written = asyncio.get_running_loop().run_in_executor(
            None, self.watch.write_isrs,
            [IsrWrite(p.topic, p.index, state, version,
                      tuple(b for b in wanted if b not in old))
             for p, _, old, wanted, state, version in queued])

        def done(fut: asyncio.Future) -> None:
            self._isr_writing = False
            failed = None if fut.cancelled() else fut.exception()
            if failed is not None:
                log.error("writing %d ISR changes failed: %r", len(queued), failed)
            versions = [None] * len(queued) if fut.cancelled() or failed is not None \
                else fut.result()
            for (partition, r, old, wanted, _, _), version in zip(queued, versions,
                                                                  strict=True):
                try:
                    self._isr_written(partition, r, old, wanted, version)
                except Exception:  # one partition's end does not keep the others' from theirs
                    log.exception("%s: after its ISR write", partition.name)
            if self._isr_queue and not self._closed:
                self._write_isrs()

        written.add_done_callback(done)

    def _isr_written(self, partition: Partition, r: ReplicaState, old: tuple[int, ...],
                     wanted: tuple[int, ...], version: int | None) -> None:
        if version is not None and version > r.zk_version:
            self._count_isr(r.isr, wanted)
        if r.isr_write_ended(wanted, version):
            self.watch.refresh()  # a read from now on: bounded, not the periodic pass
        if version is None or partition.replication is not r:
            return  # the state moved on, or is unknown: the next view decides
        if not partition.is_open:
            return  # deleted (or closed) while the write was out: nothing waits on its log
        log.info("%s: ISR %s -> %s at leader epoch %d", partition.name, list(old),
                 list(wanted), r.leader_epoch)
        if r.advance_high_watermark(partition.log.log_end_offset):
            partition._wake_waiters()
        r.resolve_waiters()

    def _count_isr(self, old: tuple[int, ...], new: tuple[int, ...]) -> None:
        self.isr_shrinks += bool(set(old) - set(new))
        self.isr_expands += bool(set(new) - set(old))

    def max_lag(self) -> int:
        """Kafka's ReplicaFetcherManager MaxLag over every partition followed."""
        return max((f.lag for fetcher in list(self.fetchers.values())
                    for f in list(fetcher.followed.values())), default=0)

    # --- failed log directories ----------------------------------------------------------

    def _log_dir_failed(self) -> None:
        """LogDir.fail's callback, on whatever thread failed it."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.report_offline)

    def report_offline(self) -> None:
        """The replicas on failed log directories to ZooKeeper, when they changed since the
        last report that landed (one report at a time, off the event loop)."""
        partitions = tuple(sorted((p.topic, p.index) for p in self._replicated()
                                  if p.log_dir.offline))
        # every directory failed: no new replica goes here (cluster/placement.py's usable)
        dirs = list(self.topics.log_dirs.values())
        all_dirs = bool(dirs) and all(d.offline for d in dirs)
        offline = (partitions, all_dirs)
        if self._closed or self._offline_pending or offline == self._offline_reported:
            return
        self._offline_pending = True
        if partitions or all_dirs:
            log.error("reporting %d replicas on failed log directories to the controller%s",
                      len(partitions), " (every log directory failed)" if all_dirs else "")
        written = asyncio.get_running_loop().run_in_executor(
            None, self.watch.report_offline, list(partitions), all_dirs)

        def done(fut: asyncio.Future) -> None:
            self._offline_pending = False
            if fut.cancelled() or fut.exception() is not None:
                log.warning("reporting the offline replicas failed (again soon): %r",
                            None if fut.cancelled() else fut.exception())
                return
            self._offline_reported = offline

        written.add_done_callback(done)

    # --- followers -----------------------------------------------------------------------

    def _start_fetcher(self, partition: Partition, leader: int, epoch: int) -> None:
        fetcher = self.fetchers.get(leader)
        if fetcher is None:
            fetcher = self.fetchers[leader] = LeaderFetcher(self, leader)
        fetcher.add(partition, epoch)
        self._following[partition.name] = leader

    def _stop_fetcher(self, partition: Partition) -> None:
        leader = self._following.pop(partition.name, None)
        if leader is not None:
            self.fetchers[leader].remove(partition)

    # --- the high watermark checkpoint ---------------------------------------------------

    def checkpoint_high_watermarks(self) -> None:
        """Every interval: each log directory whose high watermarks moved gets its checkpoint
        file written again, off the event loop (a file and its fsyncs per directory, not per
        partition). One write at a time; a failed one is written again the next interval."""
        if self._hw_writing is not None and not self._hw_writing.done():
            return
        due = self._hw_due()
        if due:
            self._hw_writing = asyncio.get_running_loop().run_in_executor(
                None, self._write_hw_files, due)

    def _hw_due(self) -> dict[str, tuple[OsDisk, offset_checkpoint.Entries]]:
        by_dir: dict[str, tuple[OsDisk, offset_checkpoint.Entries]] = {}
        for partition in self._replicated():
            r = partition.replication
            if r is None or partition.log_dir.offline:
                continue
            # The directory's file is written whole: a partition not open (since the start,
            # or leaderless) keeps the high watermark it was read with, never drops to 0.
            hw = partition.high_watermark if partition.is_open else r.high_watermark
            _, entries = by_dir.setdefault(partition.log_dir.path, (partition.disk, {}))
            entries[(partition.topic, partition.index)] = hw
        return {path: (disk, entries) for path, (disk, entries) in by_dir.items()
                if self._hw_written.get(path) != entries}

    def _write_hw_files(self, due: dict[str, tuple[OsDisk, offset_checkpoint.Entries]]) -> None:
        for path, (disk, entries) in due.items():
            try:
                offset_checkpoint.write(disk, os.path.join(path, HW_CHECKPOINT_FILE), entries)
            except FileNotFoundError:
                continue  # the directory went meanwhile
            except OSError as exc:
                log.error("%s: writing the high watermark checkpoint failed (written again "
                          "next interval): %s", path, exc)
                continue
            self._hw_written[path] = entries

    def _hw_checkpointed(self, partition: Partition) -> int:
        path = partition.log_dir.path
        entries = self._hw_at_start.get(path)
        if entries is None:
            entries = self._hw_at_start[path] = offset_checkpoint.read(
                partition.disk, os.path.join(path, HW_CHECKPOINT_FILE))
        return max(0, entries.pop((partition.topic, partition.index), 0))
