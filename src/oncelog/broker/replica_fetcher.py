"""A follower's fetcher: one asyncio task per followed partition, speaking Kafka's protocol
to the leader as any Kafka follower does.

1. Truncate: OffsetForLeaderEpoch (v3, replica id = ours, the current leader epoch) asking
   for the end of our latest epoch; the answer and our own leader epoch cache give the
   truncation point (cluster/isr.py's T rows); a T3 answer asks again with the epoch we cut
   back to. ``Partition.truncate_to`` cuts the log and rebuilds producer state.
2. Fetch (v11, replica id = ours, the current leader epoch) from our log end offset; the
   batches are appended as they are (``Partition.append_as_follower``); our high watermark
   is the leader's, never past our log end; our log start follows the leader's (DeleteRecords
   replicated).

A FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH or NOT_LEADER_OR_FOLLOWER answer means one of us
has not yet read the newest state: the fetcher waits replica.fetch.backoff.ms (at most a
second) and asks again; the replica manager replaces it when the state moves on.
OFFSET_OUT_OF_RANGE (our log end is past the leader's) truncates again. A lost connection
is made again after the backoff. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import struct

from kio.schema.errors import ErrorCode

from ..cluster import isr as rules
from ..protocol.api_versions import FETCH, OFFSET_FOR_LEADER_EPOCH
from ..protocol.messages import decode_response, encode_request
from ..protocol.record_batch import InvalidBatch
from ..protocol.schema import build, request_module

log = logging.getLogger(__name__)

FETCH_VERSION = 11
EPOCH_VERSION = 3
_SIZE = struct.Struct(">i")
_RETRYABLE = (ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch,
              ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition,
              ErrorCode.kafka_storage_error, ErrorCode.leader_not_available)
MAX_FRAME = 1 << 30


class FetchFailed(Exception):
    pass


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 client_id: str, timeout_s: float) -> None:
        self.reader, self.writer = reader, writer
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.correlation = 0

    async def call(self, api_key: int, version: int, body):
        self.correlation += 1
        self.writer.write(encode_request(api_key, version, self.correlation, self.client_id,
                                         body))
        async with asyncio.timeout(self.timeout_s):
            await self.writer.drain()
            (size,) = _SIZE.unpack(await self.reader.readexactly(4))
            if not 4 <= size <= MAX_FRAME:
                raise FetchFailed(f"the leader sent a frame of {size} bytes")
            frame = await self.reader.readexactly(size)
        correlation, answer = decode_response(api_key, version, frame)
        if correlation != self.correlation:
            raise FetchFailed(f"correlation id {correlation} answered {self.correlation}")
        return answer

    def close(self) -> None:
        self.writer.close()


class PartitionFetcher:
    def __init__(self, manager, partition, leader: int, leader_epoch: int) -> None:
        self.manager = manager
        self.partition = partition
        self.leader = leader
        self.leader_epoch = leader_epoch
        config = manager.config
        self.wait_ms: int = config.get("replica.fetch.wait.max.ms")
        self.max_bytes: int = config.get("replica.fetch.max.bytes")
        self.backoff_s = min(config.get("replica.fetch.backoff.ms"), 1000) / 1000
        self.truncated = False
        self._task: asyncio.Task | None = None
        self._conn: _Connection | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self.run(), name=f"fetcher-{self.partition.name}")

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._drop()

    async def stop(self) -> None:
        self.cancel()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def run(self) -> None:
        while True:
            try:
                if self._conn is None:
                    self._conn = await self._connect()
                if not self.truncated:
                    self.truncated = await self._truncate()
                    continue
                if not await self._fetch():
                    await asyncio.sleep(self.backoff_s)
            except asyncio.CancelledError:
                self._drop()
                raise
            except (OSError, EOFError, TimeoutError, FetchFailed, InvalidBatch,
                    asyncio.IncompleteReadError) as exc:
                log.info("%s: fetching from broker %d: %r; again in %.1fs",
                         self.partition.name, self.leader, exc, self.backoff_s)
                self._drop()
                await asyncio.sleep(self.backoff_s)
            except Exception:
                log.exception("%s: fetcher failed; again in %.1fs", self.partition.name,
                              self.backoff_s)
                self._drop()
                await asyncio.sleep(self.backoff_s)

    async def _connect(self) -> _Connection:
        endpoint = self.manager.endpoint(self.leader)
        if endpoint is None:
            raise FetchFailed(f"broker {self.leader} is not registered")
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*endpoint),
                                                timeout=10)
        return _Connection(reader, writer, f"replica-{self.manager.broker_id}",
                           self.wait_ms / 1000 + 30)

    async def _truncate(self) -> bool:
        """One OffsetForLeaderEpoch round; True once truncation is complete."""
        partition = self.partition
        epochs = partition.leader_epochs
        asked = epochs.latest_epoch
        mod = request_module(OFFSET_FOR_LEADER_EPOCH, EPOCH_VERSION)
        body = build(mod.OffsetForLeaderEpochRequest, replica_id=self.manager.broker_id,
                     topics=(build(mod.OffsetForLeaderTopic, topic=partition.topic,
                                   partitions=(build(mod.OffsetForLeaderPartition,
                                                     partition=partition.index,
                                                     current_leader_epoch=self.leader_epoch,
                                                     leader_epoch=asked),)),))
        assert self._conn is not None
        answer = await self._conn.call(OFFSET_FOR_LEADER_EPOCH, EPOCH_VERSION, body)
        result = answer.topics[0].partitions[0]
        if result.error_code != ErrorCode.none:
            if result.error_code not in _RETRYABLE:
                log.warning("%s: OffsetForLeaderEpoch answered %s", partition.name,
                            result.error_code.name)
            await asyncio.sleep(self.backoff_s)
            return False
        end = partition.log.log_end_offset
        ours = epochs.end_offset_for(result.leader_epoch, end) if result.leader_epoch >= 0 \
            else (rules.NO_EPOCH, -1)
        point, done = rules.truncation_point(result.leader_epoch, result.end_offset, ours,
                                             end, partition.high_watermark)
        if point < end:
            log.info("%s: truncating from %d to %d (leader epoch %d ends at %d there)",
                     partition.name, end, point, result.leader_epoch, result.end_offset)
            partition.truncate_to(point)
        return done

    async def _fetch(self) -> bool:
        """One Fetch; False when the leader refused it (back off before the next)."""
        partition = self.partition
        mod = request_module(FETCH, FETCH_VERSION)
        offset = partition.log.log_end_offset
        body = build(mod.FetchRequest, replica_id=self.manager.broker_id,
                     max_wait=datetime.timedelta(milliseconds=self.wait_ms), min_bytes=1,
                     max_bytes=self.max_bytes, isolation_level=0, session_id=0,
                     session_epoch=-1, rack_id="", forgotten_topics_data=(),
                     topics=(build(mod.FetchTopic, topic=partition.topic, partitions=(
                         build(mod.FetchPartition, partition=partition.index,
                               current_leader_epoch=self.leader_epoch, fetch_offset=offset,
                               log_start_offset=-1, partition_max_bytes=self.max_bytes),)),))
        assert self._conn is not None
        answer = await self._conn.call(FETCH, FETCH_VERSION, body)
        if answer.error_code != ErrorCode.none:
            raise FetchFailed(f"Fetch answered {answer.error_code.name}")
        result = answer.responses[0].partitions[0]
        if result.error_code == ErrorCode.offset_out_of_range:
            log.warning("%s: our log end %d is out of the leader's range; truncating again",
                        partition.name, offset)
            self.truncated = False
            return False
        if result.error_code != ErrorCode.none:
            return False
        if partition.log.log_end_offset != offset or partition.replication is None:
            return True  # truncated or replaced meanwhile: this answer is not ours to use
        records = result.records or b""
        if records:
            partition.append_as_follower(records)
        replication = partition.replication
        end = partition.log.log_end_offset
        new_hw = min(result.high_watermark, end)
        if new_hw > replication.high_watermark:
            replication.high_watermark = new_hw
            partition._wake_waiters()
        if result.log_start_offset > partition.log.log_start_offset:
            # DeleteRecords on the leader (or its retention): the log start follows it
            partition.delete_records(min(result.log_start_offset, end))
        return True
