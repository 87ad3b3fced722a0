"""A partition on this broker: its Log, its ProducerStateManager, and long-poll waiters.

The produce path in one place: split and check the batches, let producer_state judge an
idempotent batch, patch offsets, append, then apply the judged update. Producer state is
snapshotted at every segment roll and at clean shutdown, and restored on open from the newest
good snapshot plus the log after it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Protocol

from kio.schema.errors import ErrorCode

from ..log.log import Log, LogConfig
from ..log.snapshots import SnapshotFiles
from ..producer_state import snapshot
from ..producer_state.manager import ProducerStateManager, StateLimits
from ..producer_state.rules import Append, BatchIdentity, Duplicate, Refuse
from ..protocol.record_batch import BatchHeader, InvalidBatch, assign_offsets, split_batches
from ..protocol.validation import DEFAULT_RULES, RecordRules, validate_batches

log = logging.getLogger(__name__)

SNAPSHOTS_KEPT = 3


class IssuedProducerIds(Protocol):
    """What a partition asks the cluster's producer id allocator (ProducerIdManager)."""

    def is_issued(self, producer_id: int) -> bool: ...

    def highest_claimed(self) -> int: ...


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_start_offset: int
    duplicate: bool = False
    log_append_time: int = -1  # the time the broker stamped, with LogAppendTime


def _identity(header: BatchHeader) -> BatchIdentity:
    return BatchIdentity(header.producer_id, header.producer_epoch, header.base_sequence,
                         header.last_sequence)


def _now_ms() -> int:
    return int(time.time() * 1000)


class Partition:
    def __init__(self, topic: str, index: int, directory: str, config: LogConfig,
                 max_message_bytes: int, limits: StateLimits,
                 producer_ids: IssuedProducerIds, record_rules: RecordRules = DEFAULT_RULES
                 ) -> None:
        self.topic = topic
        self.index = index
        self.dir = directory
        self.config = config
        self.max_message_bytes = max_message_bytes
        self.limits = limits
        self.record_rules = record_rules
        self._producer_ids = producer_ids
        self._log: Log | None = None
        self._state: ProducerStateManager | None = None
        self._snapshots = SnapshotFiles(directory)
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.index}"

    # --- opening ---------------------------------------------------------------------------

    @property
    def log(self) -> Log:
        # Opened on first use: a broker with 10,000 idle partitions holds no files for them.
        if self._log is None:
            self._open()
        assert self._log is not None
        return self._log

    @property
    def state(self) -> ProducerStateManager:
        if self._state is None:
            self._open()
        assert self._state is not None
        return self._state

    @property
    def is_open(self) -> bool:
        return self._log is not None

    def _open(self) -> None:
        plog = Log(self.dir, self.config, on_roll=self._snapshot_at)
        state = ProducerStateManager(self.limits)
        start = self._load_snapshot(plog, state)
        replayed = 0
        now = _now_ms()
        for header in plog.headers_from(start):
            if header.has_producer_id and header.base_offset >= start:
                state.replay(_identity(header), header.last_offset, header.max_timestamp, now)
                replayed += 1
        if replayed:
            log.info("%s: producer state rebuilt from %d batches after offset %d", self.name,
                     replayed, start)
        self._log, self._state = plog, state

    def _load_snapshot(self, plog: Log, state: ProducerStateManager) -> int:
        """Load the newest good snapshot; returns the offset the log must be replayed from."""
        end = plog.log_end_offset
        for offset in self._snapshots.offsets():
            if offset > end:
                # Taken before a crash cut the log back: it describes batches that are gone.
                log.warning("%s: snapshot at %d is past the log end %d; deleting it", self.name,
                            offset, end)
                self._snapshots.delete(offset)
                continue
            try:
                snap = snapshot.decode(self._snapshots.read(offset))
            except (snapshot.BadSnapshot, OSError) as exc:
                log.warning("%s: snapshot at %d unusable (%s); trying an older one", self.name,
                            offset, exc)
                continue
            state.load(snap.entries, snap.tombstones, snap.forgotten_up_to)
            if offset < plog.log_start_offset:
                # Batches between the snapshot and the log start are gone: anyone who wrote
                # only there is forgotten.
                state.forget_everyone(self._producer_ids.highest_claimed())
            return max(offset, plog.log_start_offset)
        if plog.log_start_offset > 0:
            state.forget_everyone(self._producer_ids.highest_claimed())
        return plog.log_start_offset

    def _snapshot_at(self, offset: int) -> None:
        state = self._state
        if state is None:  # the log rolled while opening: nothing to save yet
            return
        self._snapshots.write(offset, snapshot.of_state(offset, state))
        self._snapshots.keep_newest(SNAPSHOTS_KEPT)

    # --- the produce path ------------------------------------------------------------------

    def append_records(self, records: bytes | memoryview) -> AppendResult:
        """Validate and append a produce request's records.

        Raises InvalidBatch with the Kafka error for anything refused; nothing is stored then.
        """
        headers = split_batches(records, self.max_message_bytes)
        headers = validate_batches(records, headers, self.record_rules, _now_ms())
        plog, state = self.log, self.state
        decision = None
        if any(h.has_producer_id for h in headers):
            header = self._single_idempotent_batch(headers)
            decision = state.validate(_identity(header), self._producer_ids.is_issued)
            if isinstance(decision, Refuse):
                raise InvalidBatch(decision.error, decision.message)
            if isinstance(decision, Duplicate):
                return AppendResult(decision.base_offset, decision.last_offset,
                                    plog.log_start_offset, duplicate=True)
        headers, parts = assign_offsets(records, headers, plog.log_end_offset, 0)
        plog.append(parts, headers)
        if isinstance(decision, Append):
            last = headers[-1]
            state.apply(decision, last.last_offset, last.max_timestamp, _now_ms())
        self._wake_waiters()
        stamped = headers[0].max_timestamp if self.record_rules.log_append_time else -1
        return AppendResult(headers[0].base_offset, headers[-1].last_offset,
                            plog.log_start_offset, log_append_time=stamped)

    @staticmethod
    def _single_idempotent_batch(headers: list[BatchHeader]) -> BatchHeader:
        # One judgement per request keeps a batch all-or-nothing; Kafka's clients send one
        # batch per partition per request anyway.
        if len(headers) != 1:
            raise InvalidBatch(ErrorCode.invalid_record,
                               "an idempotent produce carries exactly one batch per partition")
        header = headers[0]
        if header.base_sequence < 0 or header.producer_epoch < 0:
            raise InvalidBatch(ErrorCode.invalid_record,
                               "a batch with a producer id needs a sequence and an epoch")
        return header

    @property
    def high_watermark(self) -> int:
        # Single node: everything appended is committed.
        return self.log.log_end_offset

    # --- duties ----------------------------------------------------------------------------

    def apply_retention(self, now_ms: int) -> None:
        plog = self.log
        cfg = plog.config
        if plog.delete_old_segments(now_ms, cfg.retention_ms, cfg.retention_bytes):
            self._snapshots.delete_older_than(plog.log_start_offset)

    def expire_producers(self, now_ms: int) -> None:
        if self._state is not None:
            retired, dropped = self._state.expire(now_ms)
            if retired or dropped:
                log.info("%s: %d idle producers moved to compact records, %d records dropped",
                         self.name, retired, dropped)

    # --- long polling ----------------------------------------------------------------------

    def waiter(self) -> asyncio.Future[None]:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return fut

    def _wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    # --- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        if self._log is not None:
            self._snapshot_at(self._log.log_end_offset)
            self._log.close()
            self._log = self._state = None

    def delete(self) -> None:
        if self._log is not None:
            self._log.delete()
            self._log = self._state = None
        if os.path.isdir(self.dir):
            for name in os.listdir(self.dir):
                os.unlink(os.path.join(self.dir, name))
            os.rmdir(self.dir)
