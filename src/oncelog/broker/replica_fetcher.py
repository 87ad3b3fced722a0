"""A follower's fetchers: one asyncio task per leader broker, for every partition followed
there, speaking Kafka's protocol to the leader as any Kafka follower does.

1. Truncate: OffsetForLeaderEpoch (v3, replica id = ours, the current leader epoch) asking
   for the end of our latest epoch; the answer and our own leader epoch cache give the
   truncation point (cluster/isr.py's T rows); a T3 answer asks again with the epoch we cut
   back to. ``Partition.truncate_to`` cuts the log and rebuilds producer state.
2. Fetch (v11, replica id = ours, the current leader epoch) from our log end offset; the
   batches are appended as they are (``Partition.append_as_follower``); our high watermark
   is the leader's, never past our log end; our log start follows the leader's (DeleteRecords
   replicated).

A FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH or NOT_LEADER_OR_FOLLOWER answer means one of us
has not yet read the newest state: that partition waits replica.fetch.backoff.ms (at most a
second) and is asked again; the replica manager moves it when the state moves on.
OFFSET_OUT_OF_RANGE (our log end is past the leader's) truncates again. A lost connection
is made again after the backoff. Every wait is bounded. An answer for a partition no longer
followed at the epoch it was asked for is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time

from kio.schema.errors import ErrorCode

from ..cluster import isr as rules
from ..protocol import fetch_response
from ..protocol.api_versions import FETCH, OFFSET_FOR_LEADER_EPOCH
from ..protocol.record_batch import InvalidBatch
from ..protocol.schema import build, request_module
from .inter_broker import BrokerConnection, InterBrokerError, connect, opener
from .partition_opening import open_all

log = logging.getLogger(__name__)

FETCH_VERSION = 11
EPOCH_VERSION = 3
_RETRYABLE = (ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch,
              ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition,
              ErrorCode.kafka_storage_error, ErrorCode.leader_not_available)
STOP_TIMEOUT_S = 5.0


class FetchFailed(Exception):
    pass


def _decode_fetch(frame: memoryview) -> tuple[int, int, list[fetch_response.FetchedPartition]]:
    """The answer with each partition's records left in its frame (no copy of a megabyte
    per answer; kio's entity would copy them)."""
    return fetch_response.decode(frame, FETCH_VERSION)


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"


class _Followed:
    """One partition a LeaderFetcher follows at one leader epoch (a new epoch is a new one)."""

    __slots__ = ("epoch", "lag", "partition", "resume_at", "truncated")

    def __init__(self, partition, epoch: int) -> None:
        self.partition = partition
        self.epoch = epoch
        self.truncated = False
        self.resume_at = 0.0  # after a refusal: not asked again before this (monotonic)
        self.lag = 0  # the leader's high watermark at its last answer - our log end


class LeaderFetcher:
    """Every partition this broker follows on one leader, over one connection: one
    OffsetForLeaderEpoch for those still to truncate, then one Fetch for all (Kafka's
    ReplicaFetcherThread, one per leader)."""

    def __init__(self, manager, leader: int) -> None:
        self.manager = manager
        self.leader = leader
        config = manager.config
        self.wait_ms: int = config.get("replica.fetch.wait.max.ms")
        self.max_bytes: int = config.get("replica.fetch.max.bytes")
        self.response_max_bytes: int = config.get("replica.fetch.response.max.bytes")
        # the largest answer: the limit, exceeded by at most one batch (KIP-74), and headers
        self.answer_max_bytes = (self.response_max_bytes + config.get("message.max.bytes")
                                 + (64 << 10))
        self.backoff_s = min(config.get("replica.fetch.backoff.ms"), 1000) / 1000
        self.followed: dict[tuple[str, int], _Followed] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._conn: BrokerConnection | None = None

    # --- what it follows (the replica manager, on the event loop) --------------------------

    def add(self, partition, epoch: int) -> None:
        self.followed[(partition.topic, partition.index)] = _Followed(partition, epoch)
        self._changed.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self.run(), name=f"fetcher-{self.leader}")

    def remove(self, partition) -> None:
        """From now on nothing fetched for it is applied (an answer on its way included)."""
        self.followed.pop((partition.topic, partition.index), None)

    async def stop(self) -> None:
        task, self._task = self._task, None
        # Cancelled again until it ends: on Python 3.11 a cancellation arriving as an awaited
        # step completes can be lost (asyncio.wait_for returns the result instead), and a
        # fetcher that lived on would hold the broker's shutdown forever.
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while task is not None and not task.done() and time.monotonic() < deadline:
            task.cancel()
            await asyncio.wait({task}, timeout=0.1)
        if task is not None and not task.done():
            log.error("the fetcher of broker %d did not stop", self.leader)
        self._drop()

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _current(self, followed: _Followed) -> bool:
        key = (followed.partition.topic, followed.partition.index)
        return self.followed.get(key) is followed

    # --- the work ----------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                if not self.followed:
                    self._drop()
                    self._changed.clear()
                    await self._changed.wait()
                    continue
                if self._conn is None:
                    self._conn = await self._connect()
                now = time.monotonic()
                ready = [f for f in self.followed.values() if f.resume_at <= now
                         and not f.partition.log_dir.offline]  # it fetches no more
                if not ready:
                    self._changed.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.backoff_s):
                            await self._changed.wait()
                    continue
                to_truncate = [f for f in ready if not f.truncated]
                if to_truncate:
                    await self._truncate(to_truncate)
                else:
                    await self._fetch(ready)
            except asyncio.CancelledError:
                self._drop()
                raise
            except (OSError, EOFError, TimeoutError, FetchFailed, InterBrokerError,
                    asyncio.IncompleteReadError) as exc:
                log.info("fetching from broker %d: %r; again in %.1fs", self.leader, exc,
                         self.backoff_s)
                self._drop()
                await asyncio.sleep(self.backoff_s)
            except Exception:
                log.exception("fetcher of broker %d failed; again in %.1fs", self.leader,
                              self.backoff_s)
                self._drop()
                await asyncio.sleep(self.backoff_s)

    async def _connect(self) -> BrokerConnection:
        # on the inter-broker listener, secured and authenticated as it asks
        return await connect(opener(self.manager.broker), self.leader,
                             f"replica-{self.manager.broker_id}", self.wait_ms / 1000 + 30,
                             self.answer_max_bytes)

    def _back_off(self, followed: _Followed) -> None:
        followed.resume_at = time.monotonic() + self.backoff_s

    async def _truncate(self, todo: list[_Followed]) -> None:
        """One OffsetForLeaderEpoch round for ``todo``, each asking for the end of its own
        latest epoch."""
        # A replica's log not open (its first, or its first since a restart) is opened in
        # worker threads, not on the loop.
        await open_all((f.partition for f in todo), writing=True)
        mod = request_module(OFFSET_FOR_LEADER_EPOCH, EPOCH_VERSION)
        asked = {}
        topics: dict[str, list] = {}
        for f in todo:
            p = f.partition
            if self._not_open(f):
                continue
            asked[(p.topic, p.index)] = f
            topics.setdefault(p.topic, []).append(build(
                mod.OffsetForLeaderPartition, partition=p.index, current_leader_epoch=f.epoch,
                leader_epoch=p.leader_epochs.latest_epoch))
        if not asked:
            return
        body = build(mod.OffsetForLeaderEpochRequest, replica_id=self.manager.broker_id,
                     topics=tuple(build(mod.OffsetForLeaderTopic, topic=t,
                                        partitions=tuple(ps)) for t, ps in topics.items()))
        assert self._conn is not None
        answer = await self._conn.call(OFFSET_FOR_LEADER_EPOCH, EPOCH_VERSION, body)
        for topic in answer.topics:
            for result in topic.partitions:
                f = asked.get((topic.topic, result.partition))
                if f is None or not self._current(f):
                    continue  # not asked, or no longer followed at that epoch
                if result.error_code != ErrorCode.none:
                    if result.error_code not in _RETRYABLE:
                        log.warning("%s: OffsetForLeaderEpoch answered %s", f.partition.name,
                                    result.error_code.name)
                    self._back_off(f)
                    continue
                if self._not_open(f):  # closed during the call, or an earlier one's cut
                    continue
                f.truncated = await self._truncate_one(f.partition, result)

    def _not_open(self, f: _Followed) -> bool:
        """Its log is not open: its opening failed (or it was closed since, or is being
        cut). Its log end and epochs are not known on the loop (partition.log would raise
        OpenInProgress and fail the round of every partition of this leader): backed off,
        its opening started, asked again once open."""
        if f.partition.is_open:
            return False
        f.partition.opened_for_a_duty()
        self._back_off(f)
        return True

    @staticmethod
    async def _truncate_one(partition, result) -> bool:
        end = partition.log.log_end_offset
        ours = partition.leader_epochs.end_offset_for(result.leader_epoch, end) \
            if result.leader_epoch >= 0 else (rules.NO_EPOCH, -1)
        point, done = rules.truncation_point(result.leader_epoch, result.end_offset, ours,
                                             end, partition.high_watermark)
        if point < end:
            log.info("%s: truncating from %d to %d (leader epoch %d ends at %d there)",
                     partition.name, end, point, result.leader_epoch, result.end_offset)
            await partition.truncate_async(point)  # its file work in a worker thread
        return done

    async def _fetch(self, ready: list[_Followed]) -> None:
        """One Fetch for every partition ready, each from its log end."""
        mod = request_module(FETCH, FETCH_VERSION)
        asked = {}
        topics: dict[str, list] = {}
        for f in ready:
            p = f.partition
            if self._not_open(f):
                continue
            offset = p.log.log_end_offset
            asked[(p.topic, p.index)] = (f, offset)
            topics.setdefault(p.topic, []).append(build(
                mod.FetchPartition, partition=p.index, current_leader_epoch=f.epoch,
                fetch_offset=offset, log_start_offset=-1, partition_max_bytes=self.max_bytes))
        if not asked:
            return
        body = build(mod.FetchRequest, replica_id=self.manager.broker_id,
                     max_wait=datetime.timedelta(milliseconds=self.wait_ms), min_bytes=1,
                     max_bytes=self.response_max_bytes, isolation_level=0, session_id=0,
                     session_epoch=-1, rack_id="", forgotten_topics_data=(),
                     topics=tuple(build(mod.FetchTopic, topic=t, partitions=tuple(ps))
                                  for t, ps in topics.items()))
        assert self._conn is not None
        _, error, results = await self._conn.call(FETCH, FETCH_VERSION, body,
                                                  decode=_decode_fetch)
        if error != ErrorCode.none:
            raise FetchFailed(f"Fetch answered {_error_name(error)}")
        for result in results:
            entry = asked.get((result.topic, result.partition))
            if entry is None or not self._current(entry[0]):
                continue
            f, offset = entry
            try:
                self._apply(f, offset, result)
            except InvalidBatch as exc:
                log.warning("%s: %s; fetching again", f.partition.name, exc)
                self._back_off(f)

    def _apply(self, f: _Followed, offset: int, result: fetch_response.FetchedPartition
               ) -> None:
        partition = f.partition
        if result.error_code == ErrorCode.offset_out_of_range:
            log.warning("%s: our log end %d is out of the leader's range; truncating again",
                        partition.name, offset)
            f.truncated = False
            return
        if result.error_code != ErrorCode.none:
            self._back_off(f)
            return
        if not partition.is_open or partition.log.log_end_offset != offset or \
                partition.replication is None:
            return  # truncated (or being opened) meanwhile: this answer is not ours to use
        records = result.records  # a view into the answer's frame: appended as it came
        if records:
            partition.append_as_follower(records)
        replication = partition.replication
        end = partition.log.log_end_offset
        f.lag = max(0, result.high_watermark - end)
        new_hw = min(result.high_watermark, end)
        if new_hw > replication.high_watermark:
            replication.high_watermark = new_hw
            partition._wake_waiters()
        if result.log_start_offset > partition.log.log_start_offset:
            # DeleteRecords on the leader (or its retention): the log start follows it,
            # once what is before it is on disk (a flush round started, else)
            partition.follow_log_start(min(result.log_start_offset, end))
