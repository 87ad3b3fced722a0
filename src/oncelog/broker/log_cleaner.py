"""The broker's log cleaner: one background task that compacts, one log at a time, every
partition of a topic whose cleanup.policy includes compact (Kafka's LogCleaner with
log.cleaner.threads=1).

Each round it picks the log most in need (one past max.compaction.lag.ms first, then the
highest dirty ratio among those at or above min.cleanable.dirty.ratio, or with a tombstone
whose delete horizon passed), cleans it, and looks again; with nothing to clean it sleeps
log.cleaner.backoff.ms. A clean is a generator of steps (log/cleaning.py) driven here: the
CPU work runs on the event loop in slices with a yield to other tasks between them, the long
fsync of a cleaned segment in a worker thread, so the broker keeps serving meanwhile.

A partition whose clean fails on the disk (ENOSPC, EIO) is retried after the backoff; one
whose data does not read back (a CRC that fails) is left alone until a restart, as Kafka
marks a partition uncleanable; a failed fsync takes the log directory offline, as anywhere.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from ..log import cleaning
from ..log.disk import LogDirFailure
from .config import BrokerConfig
from .partition import Partition

log = logging.getLogger(__name__)


@dataclass
class CleanerStats:
    """What /metrics shows of the log cleaner (metrics.py)."""

    runs: int = 0
    failures: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_removed: int = 0
    last_clean_seconds: float = 0.0
    max_dirty_ratio: float = 0.0  # of the logs looked at in the last round
    uncleanable: int = 0


def _now_ms() -> int:
    return int(time.time() * 1000)


class LogCleaner:
    def __init__(self, topics, config: BrokerConfig) -> None:
        self.topics = topics
        self.enabled: bool = config.get("log.cleaner.enable")
        self.backoff_ms: int = config.get("log.cleaner.backoff.ms")
        self.map_capacity: int = config.get("log.cleaner.dedupe.buffer.size")
        self.stats = CleanerStats()
        self._retry_at: dict[Partition, int] = {}
        self._uncleanable: set[Partition] = set()
        self.cleaning_now: Partition | None = None

    async def run(self) -> None:
        while True:
            try:
                partition = self._most_in_need(_now_ms())
            except Exception:
                log.exception("the log cleaner could not choose a log to clean")
                partition = None
            if partition is None:
                # at least 10 ms, so that log.cleaner.backoff.ms=0 does not spin
                await asyncio.sleep(max(self.backoff_ms, 10) / 1000)
                continue
            self.cleaning_now = partition  # a move between log directories waits for it
            try:
                await self.clean(partition)
            finally:
                self.cleaning_now = None
            await asyncio.sleep(0)

    def _compacted_partitions(self):
        for topic in list(self.topics.topics.values()):
            for partition in topic.partitions:
                if partition.config.compaction is not None:
                    yield partition

    def _most_in_need(self, now_ms: int) -> Partition | None:
        best, best_rank = None, None
        max_ratio = 0.0
        for partition in self._compacted_partitions():
            if partition in self._uncleanable or self._retry_at.get(partition, 0) > now_ms \
                    or partition.log_dir.offline or not partition.holds_data():
                continue
            try:
                where = partition.cleanable(now_ms)
            except OSError as exc:
                log.warning("%s: the log cleaner cannot look at it: %s", partition.name, exc)
                continue
            if where is None:
                continue
            max_ratio = max(max_ratio, where.dirty_ratio)
            assert partition.config.compaction is not None
            if not where.due(partition.config.compaction):
                continue
            rank = (where.overdue, where.dirty_ratio)
            if best_rank is None or rank > best_rank:
                best, best_rank = partition, rank
        self.stats.max_dirty_ratio = max_ratio
        return best

    async def clean(self, partition: Partition, now_ms: int | None = None
                    ) -> cleaning.CleanResult | None:
        """Clean one partition now if it is due (None when it is not, or the clean failed)."""
        started = time.monotonic()
        now = _now_ms() if now_ms is None else now_ms
        try:
            result = await drive(partition.clean_steps(now, self.map_capacity))
        except cleaning.GivenUp as exc:
            self._retry_at[partition] = _now_ms() + self.backoff_ms
            log.info("%s: clean given up: %s", partition.name, exc)
            return None
        except cleaning.CorruptSegment as exc:
            self._give_up_on(partition)
            log.error("%s: not cleaned again until a restart: %s", partition.name, exc)
            return None
        except (OSError, LogDirFailure) as exc:
            self.stats.failures += 1
            self._retry_at[partition] = _now_ms() + self.backoff_ms
            log.error("%s: clean failed, the segments it was cleaning are as they were; "
                      "retried in %d ms: %s", partition.name, self.backoff_ms, exc)
            return None
        except Exception:  # a bug: this partition waits for a restart, the others go on
            self._give_up_on(partition)
            log.exception("%s: clean failed unexpectedly; not cleaned again until a restart",
                          partition.name)
            return None
        if result is None:  # no longer due: looked at again after the backoff
            self._retry_at[partition] = _now_ms() + self.backoff_ms
            return None
        self._retry_at.pop(partition, None)
        elapsed = time.monotonic() - started
        stats = self.stats
        stats.runs += 1
        stats.bytes_read += result.bytes_read
        stats.bytes_written += result.bytes_written
        stats.records_removed += result.records_removed
        stats.last_clean_seconds = elapsed
        log.info("%s: cleaned up to offset %d in %.2f s: %d segments of %d bytes into %d of "
                 "%d bytes, %d records and %d batches removed", partition.name,
                 result.first_dirty, elapsed, result.segments_before, result.bytes_read,
                 result.segments_after, result.bytes_written, result.records_removed,
                 result.batches_removed)
        return result


    def _give_up_on(self, partition: Partition) -> None:
        self._uncleanable.add(partition)
        self.stats.failures += 1
        self.stats.uncleanable = len(self._uncleanable)


async def drive(steps: Generator[cleaning.Step, Any, Any]) -> Any:
    """Run a clean's steps on the event loop: a pause yields to other tasks, an offloaded
    call runs in a worker thread (see log/cleaning.py)."""
    loop = asyncio.get_running_loop()
    reply: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                step = steps.throw(error) if error is not None else steps.send(reply)
            except StopIteration as done:
                return done.value
            reply, error = None, None
            if step is None:
                await asyncio.sleep(0)
            else:
                try:
                    reply = await loop.run_in_executor(None, step.call)
                except Exception as exc:
                    error = exc
    finally:
        steps.close()
