"""A partition on this broker: its Log, its ProducerStateManager, and long-poll waiters.

The produce path in one place: split and check the batches, let producer_state judge an
idempotent batch, recompress it if the topic's compression.type asks for another codec, roll
the log if it must, patch offsets, append, then apply the judged update. Kafka's split
(ProducerAppendInfo, then the log append, then the state update): a batch the log did not
take leaves no trace in producer state, because an append is all or nothing (log/segment.py)
and nothing is applied before it returned.

The partition owns the roll, as Kafka's UnifiedLog does: producer state is snapshotted at the
new segment's base offset, then the log rolls. Snapshots are also written at clean shutdown;
on open, state comes from the newest good snapshot plus the log after it.

Durability (``flush.messages``): a batch that the flush policy says must be on disk before it
is acknowledged gets a future from ``durable`` that the produce handler awaits. fsync runs in a
worker thread, never on the event loop, and one fsync covers every batch written before it
started (group commit). A retry answered from the producer cache waits for the same fsync as
its original, so no answer gets ahead of the disk. A roll does not wait for the old segment's
fsync: its seal runs in a worker thread (log/sealing.py), and a flush round that starts
while it runs waits for it too (and for the seal of a segment deleted meanwhile, until its
deletion is durable), so flushed_offset never passes bytes not on disk; a seal whose fsync
failed takes the log directory offline, as a failed flush does. A seal whose index files
failed is run again when the cleaner or retention next looks at the partition.

Transactions: a transactional batch that would begin a transaction here is appended only
after ``verify`` (the coordinator, KIP-890 part 1) said the producer's transaction includes
this partition. ``append_marker`` writes a COMMIT or ABORT control batch the same
all-or-nothing way as an append, then ends the producer's transaction in producer state and,
for an abort, records it in the active segment's aborted transaction index. The last stable
offset is the first offset of the earliest transaction still open here. On open, the indexes
of aborted transactions the log cannot vouch for (a recovered segment) are rebuilt by the
replay of producer state, which starts at a snapshot no later than the first such segment.

Opening: the log is opened on first use. The request paths have it opened (created, or
recovered after a restart) in a worker thread first (partition_opening.py); ``_build`` makes
the log and producer state from the files wherever it runs, ``_install`` makes them the
partition's on the loop, and ``_open`` does both at once where no loop waits (tools, tests).

Failures: an OSError from an append leaves everything as before (KAFKA_STORAGE_ERROR for that
request); LogDirFailure (an fsync or an undo that failed) takes the log directory offline, and
every use of the partition then raises LogDirOffline until a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import time
import uuid
from collections.abc import Callable, Generator
from typing import Any, NamedTuple, Protocol

from kio.schema.errors import ErrorCode

from ..log import cleaning, partition_metadata
from ..log.compaction import Cleanable
from ..log.disk import OS_DISK, LogDirFailure, OsDisk, out_of_descriptors
from ..log.leader_epoch import LeaderEpochCache
from ..log.log import ABSENT_LOG, Log, LogConfig
from ..log.open_files import OPEN_FILES, OpenFiles
from ..log.sealing import Seal, seal_here, wait_synced
from ..log.snapshots import SnapshotFiles
from ..log.txn_index import AbortedTxn
from ..producer_state import snapshot
from ..producer_state.manager import ProducerStateManager, StateLimits
from ..producer_state.rules import (
    Append,
    BatchIdentity,
    CompletedTxn,
    Duplicate,
    MarkerIdentity,
    Refuse,
)
from ..protocol.control import marker_batch, read_marker
from ..protocol.recompression import needs_recompression, recompress
from ..protocol.record_batch import (
    BatchHeader,
    InvalidBatch,
    assign_offsets,
    crc_of,
    read_header,
    scan_batches,
    split_batches,
)
from ..protocol.validation import DEFAULT_RULES, Inflation, RecordRules, validate_batches
from . import log_opening
from .log_dirs import LogDir
from .partition_opening import Built, OpensOffLoop, on_loop

log = logging.getLogger(__name__)

SNAPSHOTS_KEPT = 3
# Asked before a transactional batch begins a transaction here: (producer id, epoch) -> NONE
# to go on, or the error to answer (the coordinator's word, KIP-890 part 1).
Verify = Callable[[int, int], ErrorCode]


class IssuedProducerIds(Protocol):
    """What a partition asks the cluster's producer id allocator (ProducerIdManager)."""

    def is_issued(self, producer_id: int) -> bool: ...

    def highest_claimed(self) -> int: ...


class AppendResult(NamedTuple):
    # A NamedTuple: one per append, and a frozen dataclass's __init__ cost a one-record
    # append (a coordinator's commit) more than its offsets' arithmetic.
    base_offset: int
    last_offset: int
    log_start_offset: int
    duplicate: bool = False
    log_append_time: int = -1  # the time the broker stamped, with LogAppendTime
    must_flush: bool = False  # the flush policy wants it on disk before it is acknowledged


def _identity(header: BatchHeader) -> BatchIdentity:
    return BatchIdentity(header.producer_id, header.producer_epoch, header.base_sequence,
                         header.last_sequence, header.is_transactional)


def _now_ms() -> int:
    return int(time.time() * 1000)


class Partition(OpensOffLoop):
    def __init__(self, topic: str, index: int, directory: str, config: LogConfig,
                 max_message_bytes: int, limits: StateLimits,
                 producer_ids: IssuedProducerIds, record_rules: RecordRules = DEFAULT_RULES,
                 *, log_dir: LogDir | None = None, disk: OsDisk = OS_DISK,
                 topic_id: uuid.UUID | None = None) -> None:
        self.topic = topic
        self.index = index
        self.dir = directory
        self.config = config
        self.max_message_bytes = max_message_bytes
        self.limits = limits
        self.record_rules = record_rules
        self.disk = disk
        self.log_dir = log_dir or LogDir(os.path.dirname(directory))
        self.topic_id = topic_id
        self._producer_ids = producer_ids
        self._log: Log | None = None
        self._state: ProducerStateManager | None = None
        self._snapshots = SnapshotFiles(directory, disk)
        self._waiters: list[asyncio.Future[None]] = []
        self._deleted = False
        # Group commit: everything below flushed_offset is on disk; the fsync running covers
        # up to _flushing_to; futures in _next_flush wait for the one after it.
        self.flushed_offset = 0
        self._flushing_to = -1
        self._this_flush: asyncio.Future[None] | None = None
        self._next_flush: asyncio.Future[None] | None = None
        # Cluster mode only (broker/replica_manager.py): this replica's role, leader epoch,
        # ISR and high watermark; None: one broker alone, the partition its own leader.
        self.replication: Any = None
        self.leader_epoch = 0  # stamped on every batch appended as leader
        self._epochs: LeaderEpochCache | None = None
        self._init_opening()

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.index}"

    def reconfigure(self, config: LogConfig, max_message_bytes: int, limits: StateLimits,
                    record_rules: RecordRules) -> None:
        """Configs changed with AlterConfigs take effect at once: the next batch is checked
        against them, and the log rolls, flushes and retains by them."""
        self.config, self.max_message_bytes = config, max_message_bytes
        self.limits, self.record_rules = limits, record_rules
        if self._log is not None:
            self._log.config = config
        if self._state is not None:
            self._state.set_limits(limits)

    # --- opening ---------------------------------------------------------------------------

    @property
    def log(self) -> Log:
        """The log, for reading: a partition never appended to (no directory) is not
        created for a read, it reads as empty (ABSENT_LOG)."""
        # Opened on first use: a broker with 10,000 idle partitions holds no files for them.
        if self._log is None:
            if self._absent():
                return ABSENT_LOG  # type: ignore[return-value]
            self._open()
        assert self._log is not None
        return self._log

    def _writable(self) -> tuple[Log, ProducerStateManager]:
        """The log and producer state, opened (and the directory created) if need be."""
        if self._log is None:
            self._open()
        assert self._log is not None and self._state is not None
        return self._log, self._state

    def _absent(self) -> bool:
        # A stat, no descriptor: answered even when none is left.
        return self._log is None and not self._deleted and not self.log_dir.offline and \
            not self.disk.isdir(self.dir)

    @property
    def state(self) -> ProducerStateManager:
        if self._state is None:
            self._open()
        assert self._state is not None
        return self._state

    @property
    def is_open(self) -> bool:
        return self._log is not None

    def holds_data(self) -> bool:
        """Whether the partition has segments, without opening it for that."""
        if self._log is not None:
            return True
        try:
            return any(name.endswith(".log") for name in self.disk.listdir(self.dir))
        except FileNotFoundError:
            return False

    def _open(self) -> None:
        """Open the log on the calling thread (tools, tests, and the loop's paths not taught
        to wait for ``open_async``). Refused while a worker opens the same directory, and
        after a worker's opening failed: the loop never repeats a failed opening's file
        work itself; with a loop running, the refusal starts the next try in a worker."""
        if self._deleted:  # a request that still holds it must not bring its files back
            raise FileNotFoundError(errno.ENOENT, f"partition {self.name} was deleted")
        if self.log_dir.offline:
            raise self.log_dir.error()
        self._refuse_if_shut()
        if self._opening is not None or log_opening.busy(self.dir):
            raise log_opening.OpenInProgress(self.dir)
        if self._open_error is not None:
            failed = self._open_error
            if not isinstance(failed, OSError):  # a bug, logged: not retried quietly
                raise failed.with_traceback(None)
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                raise failed from None
            # A use that never opens (a coordinator's load retrying through source.log)
            # would meet the failure forever: it starts the next try, in a worker, and is
            # answered retriable meanwhile; before the failure's backoff is over it starts
            # nothing (start_opening refuses, EAGAIN).
            self.start_opening()
            raise log_opening.OpenInProgress(self.dir) from failed
        try:
            built = self._build(OPEN_FILES, self.dir, self._snapshots)
        except LogDirFailure as exc:
            raise self.log_dir.fail(exc) from exc
        self._install(built)
        with contextlib.suppress(RuntimeError):  # no loop: a tool, nothing to say
            asyncio.get_running_loop()
            # A stall of every connection (its file work, fsyncs): a path to teach to
            # open in a worker (partition_opening.open_all), said so that tests can see it.
            on_loop.log(logging.INFO, "opened on the loop",
                        "%s: log opened on the event loop", self.name)

    def _build(self, files: OpenFiles, directory: str, snapshots: SnapshotFiles,
               make_dir: Callable[[str], None] | None = None) -> Built:
        """The log and producer state as the files say, without touching the partition:
        run on the loop by ``_open`` or in a worker by ``open_async``. Raises (the files
        closed) when anything failed; LogDirFailure for the caller to declare."""
        plog = Log(directory, self.config, self.disk, files, make_dir)
        try:
            if self.topic_id is not None and \
                    partition_metadata.read(self.disk, directory) is None:
                partition_metadata.write(self.disk, directory, self.topic_id)
            state = ProducerStateManager(self.limits)
            untrusted = plog.txn_index_untrusted_from()
            start, forget = self._load_snapshot(
                plog, state, snapshots, plog.log_end_offset if untrusted is None else untrusted)
            if forget:
                # Batches are gone: anyone who wrote only there is forgotten. The bound may
                # come from the metadata store (ZooKeeper: up to its session timeout), read
                # here, in the worker, never on the loop.
                state.forget_everyone(self._producer_ids.highest_claimed())
            plog.forget_aborted_from(start)
            replayed = 0
            now = _now_ms()
            for header in plog.headers_from(start):
                if header.has_producer_id and header.base_offset >= start:
                    self._replay(plog, state, header, now)
                    replayed += 1
            plog.rebuilt_txn_indexes()
            plog.seal_recovered()  # the segments recovered from their marker: indexes whole
            # What recovery kept is what the next start will find: make it durable now, so
            # that every answer from here on speaks of bytes on disk (a kill -9 keeps the
            # page cache; a power cut after it does not).
            plog.flush()
        except BaseException:
            plog.abandon()
            raise
        return Built(plog, state, start, replayed)

    def _install(self, built: Built) -> None:
        """On the loop: the log opened by ``_build`` becomes the partition's."""
        # Never over a published log: a second Log over the same files would be installed
        # over the one appended to meanwhile (producer state and segment sizes behind the
        # files). Loud here (the opening's waiters fail) rather than silent corruption.
        if self._log is not None:  # not an assert: python -O would strip it
            raise RuntimeError(f"{self.name}: a second log opened over the published one")
        plog, state = built.plog, built.state
        plog.adopt(OPEN_FILES)
        plog.config = self.config  # reconfigured while a worker opened it
        state.set_limits(self.limits)
        if built.replayed:
            log.info("%s: producer state rebuilt from %d batches after offset %d", self.name,
                     built.replayed, built.start)
        self.flushed_offset = plog.log_end_offset
        # A round running still covers the log replaced (cut), none of this one's batches:
        # an append here waits for the next round (durable).
        self._flushing_to = -1
        self._log, self._state = plog, state
        if self._next_flush is not None and self._this_flush is None:
            asyncio.get_running_loop().call_soon(self._start_flush)  # held by _start_flush

    @staticmethod
    def _replay(plog: Log, state: ProducerStateManager, header: BatchHeader, now: int) -> None:
        if not header.is_control:
            state.replay(_identity(header), header.last_offset, header.max_timestamp, now,
                         header.base_offset)
            return
        marker = read_marker(plog.batch_at(header.base_offset))
        if marker is None:
            return  # emptied by the cleaner: its transaction's data went before it
        completed = state.replay_marker(
            MarkerIdentity(header.producer_id, header.producer_epoch,
                           marker.coordinator_epoch, marker.commit),
            header.base_offset, header.max_timestamp, now)
        if completed is not None and completed.aborted:
            plog.add_aborted(_aborted_entry(completed))

    def _load_snapshot(self, plog: Log, state: ProducerStateManager, snapshots: SnapshotFiles,
                       at_most: int) -> tuple[int, bool]:
        """Load the newest good snapshot at or before ``at_most``; returns the offset the log
        must be replayed from, and whether every producer issued so far is to be forgotten
        (``_build`` does it)."""
        end = plog.log_end_offset
        for offset in snapshots.offsets():
            if offset > end:
                # Taken before a crash cut the log back: it describes batches that are gone.
                log.warning("%s: snapshot at %d is past the log end %d; deleting it", self.name,
                            offset, end)
                snapshots.delete(offset)
                continue
            if offset > at_most:
                continue  # the replay must cover a segment whose index is to be rebuilt
            try:
                snap = snapshot.decode(snapshots.read(offset))
                if snap.offset != offset:
                    raise snapshot.BadSnapshot(f"it says it covers offsets up to {snap.offset}")
            except (snapshot.BadSnapshot, OSError) as exc:
                log.warning("%s: snapshot at %d unusable (%s); trying an older one", self.name,
                            offset, exc)
                continue
            state.load(snap.entries, snap.tombstones, snap.forgotten_up_to)
            # The replay goes by the files, not the log start: batches DeleteRecords put
            # below it but still in the first segment are replayed, as retention keeps the
            # state of producers whose batches it deleted until they expire.
            if offset < plog.base_offset:
                # Batches between the snapshot and the first segment are gone: anyone who
                # wrote only there is forgotten.
                return plog.base_offset, True
            return max(offset, plog.base_offset), False
        if plog.base_offset > 0 or plog.first_dirty_offset is not None:
            # Batches are gone (deleted by retention, or compacted away: the cleaner keeps
            # the last batch only of producers the partition still remembered).
            return plog.base_offset, True
        return plog.base_offset, False

    # --- the produce path ------------------------------------------------------------------

    def validate_off_loop(self, records: bytes | memoryview, inflation: Inflation
                          ) -> tuple[bytes | memoryview, list[BatchHeader]]:
        """append_records' validation, and its recompression when the topic's
        compression.type asks for it, for a worker thread (it reads only the topic's rules):
        the records and headers to give append_records as ``records`` and ``validated``.
        (A retry is recompressed before it is found to be one: work lost, nothing wrong.)"""
        headers = split_batches(records, self.max_message_bytes)
        headers = validate_batches(records, headers, self.record_rules, _now_ms(), inflation,
                                   off_loop=True)
        codec = self.record_rules.compression
        if codec is not None and needs_recompression(headers, codec):
            records, headers = recompress(records, headers, codec,
                                          self.record_rules.compression_level,
                                          self.max_message_bytes)
        return records, headers

    def append_records(self, records: bytes | memoryview,
                       verify: Verify | None = None, inflation: Inflation | None = None,
                       validated: list[BatchHeader] | None = None) -> AppendResult:
        """Validate and append a produce request's records.

        ``verify`` is asked before a transactional batch begins a transaction here (the
        produce path always gives one; None: the broker itself writes, and vouches for it).
        Raises InvalidBatch with the Kafka error for anything refused, OSError when the disk
        failed; nothing is stored then. ``inflation``: what the request may still
        decompress (InflateOffLoop: validate_off_loop first, then come back with its
        headers as ``validated``).
        """
        now = _now_ms()
        if validated is None:
            headers = split_batches(records, self.max_message_bytes)
            headers = validate_batches(records, headers, self.record_rules, now, inflation)
        else:
            headers = validated
        plog, state = self._writable()
        decision = None
        if headers[0].producer_id >= 0 if len(headers) == 1 else \
                any(h.has_producer_id for h in headers):
            header = self._single_idempotent_batch(headers, verify is None)
            if header.base_sequence < 0:  # the broker's own transactional write
                decision = state.validate_unsequenced(_identity(header))
            else:
                decision = state.validate(_identity(header), self._producer_ids.is_issued)
            if isinstance(decision, Refuse):
                raise InvalidBatch(decision.error, decision.message)
            if isinstance(decision, Duplicate):
                return AppendResult(decision.base_offset, decision.last_offset,
                                    plog.log_start_offset, duplicate=True)
            if decision.begins_txn and verify is not None:
                error = verify(header.producer_id, header.producer_epoch)
                if error != ErrorCode.none:
                    raise InvalidBatch(error, f"Record was not part of an ongoing transaction: "
                                              f"the transaction coordinator did not verify "
                                              f"producer {header.producer_id} epoch "
                                              f"{header.producer_epoch} for {self.name}")
        codec = self.record_rules.compression
        if codec is not None and needs_recompression(headers, codec):
            # after the duplicate check: a retry is answered without the work
            records, headers = recompress(records, headers, codec,
                                          self.record_rules.compression_level,
                                          self.max_message_bytes)
        try:
            if plog.should_roll(headers, now):
                self._roll()
            headers, parts = assign_offsets(records, headers, plog.log_end_offset,
                                            self.leader_epoch)
            plog.append(parts, headers)
        except LogDirFailure as exc:
            raise self.log_dir.fail(exc) from exc
        if isinstance(decision, Append):
            last = headers[-1]
            state.apply(decision, last.last_offset, last.max_timestamp, now,
                        headers[0].base_offset)
        self._leader_appended()
        stamped = headers[0].max_timestamp if self.record_rules.log_append_time else -1
        return AppendResult(headers[0].base_offset, headers[-1].last_offset,
                            plog.log_start_offset, log_append_time=stamped,
                            must_flush=plog.unflushed_messages >= self.config.flush_messages)

    def append_marker(self, marker: MarkerIdentity) -> AppendResult:
        """Write a COMMIT or ABORT marker for ``marker.producer_id`` (WriteTxnMarkers).

        Raises InvalidBatch (INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED) for a
        marker the rules refuse, OSError when the disk failed; nothing is stored then. A
        marker for a producer with no transaction ongoing here (a retry) is written, and
        changes nothing else.
        """
        plog, state = self._writable()
        decision = state.validate_marker(marker)
        if isinstance(decision, Refuse):
            raise InvalidBatch(decision.error, decision.message)
        now = _now_ms()
        batch = marker_batch(marker.producer_id, marker.epoch, marker.commit,
                             marker.coordinator_epoch, now)
        headers = [read_header(batch)]
        try:
            if plog.should_roll(headers, now):
                self._roll()
            headers, parts = assign_offsets(batch, headers, plog.log_end_offset,
                                            self.leader_epoch)
            plog.append(parts, headers)
        except LogDirFailure as exc:
            raise self.log_dir.fail(exc) from exc
        offset = headers[0].base_offset
        completed = state.apply_marker(decision, offset, now, now)
        if completed is not None and completed.aborted:
            plog.add_aborted(_aborted_entry(completed))
        self._leader_appended()  # the last stable offset may have moved
        return AppendResult(offset, offset, plog.log_start_offset,
                            must_flush=plog.unflushed_messages >= self.config.flush_messages)

    @staticmethod
    def _single_idempotent_batch(headers: list[BatchHeader], internal: bool) -> BatchHeader:
        # One judgement per request keeps a batch all-or-nothing; Kafka's clients send one
        # batch per partition per request anyway.
        if len(headers) != 1:
            raise InvalidBatch(ErrorCode.invalid_record,
                               "an idempotent produce carries exactly one batch per partition")
        header = headers[0]
        # Only the broker itself writes a transactional batch without sequences (the
        # offsets of TxnOffsetCommit, as Kafka's group coordinator writes them).
        unsequenced_ok = internal and header.is_transactional
        if (header.base_sequence < 0 and not unsequenced_ok) or header.producer_epoch < 0:
            raise InvalidBatch(ErrorCode.invalid_record,
                               "a batch with a producer id needs a sequence and an epoch")
        return header

    def _roll(self) -> None:
        """Snapshot producer state at the log end, then roll: the snapshot names the new
        segment's base offset. A failure leaves the log appending where it was (a snapshot
        written for a roll that then failed still describes the state at its offset)."""
        plog, state = self.log, self.state
        offset = plog.log_end_offset
        self._snapshots.write(offset, snapshot.of_state(offset, state))
        # flushed_offset stays: the old segment is on disk once its seal's fsync is done,
        # which the next flush round waits for.
        plog.roll(self._start_seal)
        try:
            self._snapshots.keep_newest(SNAPSHOTS_KEPT)
        except OSError as exc:  # only old fallbacks stay behind
            log.warning("%s: removing old snapshots failed: %s", self.name, exc)

    def _start_seal(self, seal: Seal) -> None:
        """Run a rolled segment's seal in a worker thread, off the event loop (in place
        where no loop runs: tools, tests)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            seal_here(seal)
            return
        running = loop.run_in_executor(self.log_dir.seal_pool, seal.run)
        running.add_done_callback(functools.partial(self._sealed, seal))

    def _sealed(self, seal: Seal, running: asyncio.Future) -> None:
        """On the loop: a seal whose fsync failed takes the log directory offline, as a
        failed flush does (the flushes waiting for it fail by themselves)."""
        if seal.error is not None:
            self.log_dir.fail(seal.error)

    def _retry_seals(self) -> None:
        """Run again, as a roll runs them, the seals whose index files failed (a full disk,
        EIO): until one succeeds the cleaner stops before that segment, so a failure is
        retried at each look of the cleaner's or retention's, never left for a restart."""
        plog = self._log
        if plog is None:
            return
        for seal in plog.seals_to_retry():
            log.info("%s: writing the index files of segment %d again", self.name,
                     seal.segment.base_offset)
            seal.rearm()
            self._start_seal(seal)

    @property
    def seal_running(self) -> bool:
        plog = self._log
        return plog is not None and any(not s.done for s in plog.pending_seals())

    @property
    def high_watermark(self) -> int:
        # Single node: everything appended is committed.
        replication = self.replication
        if replication is None:
            return self.log.log_end_offset
        return min(replication.high_watermark, self.log.log_end_offset)

    # --- replication (cluster mode) --------------------------------------------------------

    @property
    def leader_epochs(self) -> LeaderEpochCache:
        """Kafka's leader-epoch-checkpoint of this partition (read on first use: a broker
        alone never reads it)."""
        if self._epochs is None:
            self._writable()
            self._epochs = LeaderEpochCache(self.dir, self.disk)
            self._epochs.truncate_from_end(self.log.log_end_offset)  # a crash cut the log
        return self._epochs

    def append_as_follower(self, records: bytes | memoryview) -> int:
        """Append the leader's batches with their offsets and leader epochs unchanged (none
        below our log end), each then fed to producer state by the replay that
        rebuilds it at start (``_replay``): a follower's state is what the leader's was, so
        that as leader it answers a retry with the original offset. Returns how many bytes
        were whole batches (a trailing partial batch is left for the next fetch). Raises
        InvalidBatch for a batch out of place or corrupt (it and those after it are not
        stored; those before it are)."""
        plog, state = self._writable()
        epochs = self.leader_epochs
        now = _now_ms()
        taken = 0
        for position, header in scan_batches(records):
            # Above the log end only where the leader's log was compacted (offsets rise,
            # with gaps, as Kafka's followers take them); below it, never.
            if header.base_offset < plog.log_end_offset:
                raise InvalidBatch(ErrorCode.corrupt_message,
                                   f"{self.name}: the leader sent offset {header.base_offset}"
                                   f" where the log ends at {plog.log_end_offset}")
            batch = records[position:position + header.size]
            if crc_of(batch, 0, header.size) != header.crc:
                raise InvalidBatch(ErrorCode.corrupt_message,
                                   f"{self.name}: a replicated batch fails its CRC")
            try:
                if plog.should_roll([header], now):
                    self._roll()
                plog.append([batch], [header])
            except LogDirFailure as exc:
                raise self.log_dir.fail(exc) from exc
            self._assign_epoch(epochs, header.partition_leader_epoch, header.base_offset)
            if header.has_producer_id:
                self._replay(plog, state, header, now)
            taken = position + header.size
        if taken:
            self._wake_waiters()
        return taken

    def become_leader(self, epoch: int) -> int:
        """Record that ``epoch`` starts at the log end (a replica made leader); returns that
        log end. Raises LogDirOffline, the directory taken offline, when the checkpoint
        cannot be written (``_assign_epoch``)."""
        end = self.log.log_end_offset
        self._assign_epoch(self.leader_epochs, epoch, end)
        return end

    def _assign_epoch(self, epochs: LeaderEpochCache, epoch: int, start_offset: int) -> None:
        """The one place a replica writes where an epoch starts, as follower and as leader.
        A checkpoint that cannot be written takes the log directory offline: the log and
        the epochs on disk would no longer agree, and a restart truncates by the epochs
        (Kafka's LogDirFailureChannel does the same)."""
        try:
            epochs.assign(epoch, start_offset)
        except OSError as exc:
            raise self.log_dir.fail(exc) from exc

    def truncate_to(self, offset: int) -> None:
        """Cut the log back to ``offset`` (a follower diverged from its leader), then rebuild
        producer state the one way it is rebuilt after a crash: the newest snapshot at or
        below the new end, and the log after it (``_open``)."""
        plog, _ = self._writable()
        if offset >= plog.log_end_offset:
            return
        for snap in self._snapshots.offsets():
            if snap > offset:
                self._snapshots.delete(snap)
        try:
            plog.truncate_to(offset)
        except LogDirFailure as exc:
            raise self.log_dir.fail(exc) from exc
        finally:
            plog.abandon()
            self._log = self._state = None
        self.leader_epochs.truncate_from_end(self.log.log_end_offset)
        self.flushed_offset = min(self.flushed_offset, self.log.log_end_offset)
        self._wake_waiters()

    @property
    def last_stable_offset(self) -> int:
        """Where read_committed readers stop: the first offset of the earliest transaction
        open here, else the high watermark; never below the log start (as Kafka's: a
        transaction whose beginning DeleteRecords removed holds readers at the log start)."""
        if self._absent():
            return 0
        return max(self.state.last_stable_offset(self.high_watermark),
                   self.log.log_start_offset)

    def aborted_transactions(self, start: int, upper: int) -> list[AbortedTxn]:
        """Aborted transactions with data in [start, upper), for a read_committed Fetch."""
        return self.log.aborted_transactions(start, upper)

    # --- durability ------------------------------------------------------------------------

    def durable(self, result: AppendResult) -> asyncio.Future[None] | None:
        """A future done once ``result``'s batch is on disk, or None when the answer need not
        wait: it is on disk already, or neither the flush policy nor a flush under way makes
        a promise about it. The caller's own: the flush is shared by every write of the
        pass, and a task awaiting a future cancels that future when it is cancelled (a
        request's at a stop, a coordinator's step at its close, a gather around it); this
        one's cancelling cancels no other write's wait."""
        if result.last_offset < self.flushed_offset:
            return None
        if self._this_flush is not None and result.last_offset < self._flushing_to:
            return _own(self._this_flush)
        if result.must_flush or self._this_flush is not None or self._next_flush is not None:
            return _own(self._request_flush())
        return None

    def _request_flush(self) -> asyncio.Future[None]:
        if self._next_flush is None or self._next_flush.done():  # done: answered by a close
            loop = asyncio.get_running_loop()
            self._next_flush = loop.create_future()
            if self._this_flush is None:
                # Started once the current pass of requests is done, so that one fsync
                # covers every batch of a pipelined burst.
                loop.call_soon(self._start_flush)
        return self._next_flush

    def _start_flush(self) -> None:
        """One round: fsync in a worker thread, covering everything written before it
        started; the futures asked for meanwhile wait for the next round."""
        done, self._next_flush = self._next_flush, None
        if done is None or self._this_flush is not None:
            return
        self._this_flush = done
        plog = self._log
        try:
            if self.log_dir.offline:
                raise self.log_dir.error()
            if plog is None and self._opening is not None:
                # Taken from the loop to be cut (truncate_async): the round waits for it,
                # started by _install (not running meanwhile, so that it is).
                self._this_flush, self._next_flush = None, done
                return
            if plog is None:  # closed meanwhile: sealing it fsynced everything
                self._flush_done(done, None)
                return
            segment = plog.active
            fd = segment.dup_fd()
            # The rolled segments still being sealed are covered by their seal's fsync,
            # which the round waits for (log/sealing.py says why not by one of its own).
            seals = plog.pending_seals()
            self._flushing_to = plog.log_end_offset
            segment.unflushed_messages = 0
        except OSError as exc:
            self._flush_failed(done, exc)
            return
        running = asyncio.get_running_loop().run_in_executor(None, self._sync, fd, seals)
        running.add_done_callback(functools.partial(self._synced, done, plog))

    def _sync(self, fd: int, seals: list[Seal]) -> None:
        try:
            self.disk.fdatasync(fd)
        finally:
            self.disk.close(fd)
        wait_synced(seals)

    def _synced(self, done: asyncio.Future[None], plog: Log, running: asyncio.Future) -> None:
        if running.cancelled():  # the event loop is shutting down
            return
        error = running.exception()
        if error is None:
            self._flush_done(done, plog)
        else:
            self._flush_failed(done, error)

    def _flush_done(self, done: asyncio.Future[None], plog: Log | None) -> None:
        self._this_flush = None
        if plog is not None and plog is self._log:  # not cut back (truncate_to) meanwhile
            self.flushed_offset = max(self.flushed_offset, self._flushing_to)
            plog.last_flush_ms = _now_ms()
        if not done.done():
            done.set_result(None)
        if self._next_flush is not None:
            self._start_flush()

    def _flush_failed(self, done: asyncio.Future[None], exc: BaseException) -> None:
        if isinstance(exc, OSError) and (self.log_dir.offline or out_of_descriptors(exc)):
            error = exc  # no descriptor to fsync with: this round's produces fail, no more
        else:
            error = self.log_dir.fail(LogDirFailure(f"{self.name}: fsync failed: {exc}"))
        self._fail_flushes(done, error)

    def _fail_flushes(self, running: asyncio.Future[None] | None, error: OSError) -> None:
        for fut in (running, self._next_flush):
            if fut is not None and not fut.done():
                fut.set_exception(error)
                fut.exception()  # retrieved: nobody may be left to await it
        self._this_flush = self._next_flush = None

    def flush_now(self) -> None:
        """fsync on the calling thread (no event loop: tools and tests)."""
        if self._absent():
            return
        try:
            self.log.flush()
        except LogDirFailure as exc:
            raise self.log_dir.fail(exc) from exc
        self.flushed_offset = self.log.log_end_offset

    def flush_if_due(self, now_ms: int) -> None:
        """``flush.ms``: start a flush of data older than that (the broker's timer)."""
        plog = self._log
        if plog is not None and plog.unflushed_messages and \
                now_ms - plog.last_flush_ms >= self.config.flush_ms:
            self._request_flush()

    # --- duties ----------------------------------------------------------------------------

    def apply_retention(self, now_ms: int) -> None:
        if self._absent() or self.opened_for_a_duty():  # the next pass, once it is open
            return
        plog = self.log
        self._retry_seals()
        try:
            if plog.active_expired(now_ms):
                self._roll()
            if plog.delete_old_segments(now_ms):
                self._snapshots.delete_older_than(plog.base_offset)
        except LogDirFailure as exc:
            raise self.log_dir.fail(exc) from exc

    async def delete_records_async(self, offset: int) -> int:
        """``delete_records`` for the event loop: what must be on disk first is made so by
        a flush round (in a worker, waiting for the seals under way), never on the loop.
        OSError (EAGAIN) when the log was replaced meanwhile (a truncation) and the round
        covered nothing of the new one: the client retries."""
        if offset > self.log.log_start_offset and offset > self.flushed_offset:
            await _own(self._request_flush())
            if offset > self.flushed_offset:
                raise OSError(errno.EAGAIN, f"{self.name}: the log changed while the records "
                                            f"before {offset} were made durable")
        return self.delete_records(offset)

    def follow_log_start(self, offset: int) -> None:
        """A follower's log start follows its leader's: moved now when the records before
        ``offset`` are on disk, else a flush round is started and the next fetch answer
        (which carries the leader's log start again) moves it."""
        if offset <= self.log.log_start_offset:
            return
        if offset > self.flushed_offset:
            self._request_flush()
            return
        self.delete_records(offset)

    def delete_records(self, offset: int) -> int:
        """DeleteRecords: move the log start forward to ``offset`` (the caller checked it is
        at most the high watermark); returns the log start after it. Producer state is left
        as retention leaves it. OSError: nothing changed (a failed fsync or the directory's
        failure takes the directory offline, as for an append). Flushes on the calling
        thread when ``offset`` is not on disk yet: the event loop's callers use
        ``delete_records_async`` or ``follow_log_start``, which never get here then."""
        plog = self.log
        if offset <= plog.log_start_offset:
            return plog.log_start_offset  # it only moves forward
        # What the checkpoint names must be on disk first: a power cut may cut back only
        # what is past the log start, never leave the log start past the log end.
        if offset > self.flushed_offset:
            self.flush_now()
        try:
            plog.advance_log_start(offset)
        except LogDirFailure as exc:
            raise self.log_dir.fail(exc) from exc
        try:
            self._snapshots.delete_older_than(plog.base_offset)
        except OSError as exc:  # only fallbacks stay behind
            log.warning("%s: removing old snapshots failed: %s", self.name, exc)
        log.info("%s: log start moved to %d by DeleteRecords", self.name, offset)
        return plog.log_start_offset

    def cleanable(self, now_ms: int) -> Cleanable | None:
        """Where the log cleaner stands with this partition (None: it is not compacted)."""
        if self.config.compaction is None or self._absent() or self.opened_for_a_duty():
            return None
        self._retry_seals()
        return cleaning.plan(self.log, now_ms, self.last_stable_offset)

    def clean_steps(self, now_ms: int, map_capacity: int
                    ) -> Generator[cleaning.Step, Any, cleaning.CleanResult | None]:
        """One clean of the log, as steps for the broker's driver (log/cleaning.py).

        Joins the log cleaner with producer state: the last batch of every producer this
        partition remembers (in memory or as a compact record) stays in the log, so that
        state rebuilt from the log after a restart finds each one's epoch and last
        sequence. The state in memory is not touched: a cleaned batch was stored, so a
        retry of it is still a duplicate (its cached offsets, or DUPLICATE_SEQUENCE_NUMBER
        once older than the cache), never stored again. Appends go on meanwhile: the
        cleaner reads only sealed segments and swaps between two turns of the event loop.
        """
        if self._absent():
            return None  # never written: nothing to clean, and nothing is created for it
        plog, state = self.log, self.state
        last_offsets = {entry.producer_id: entry.last_offset for entry in state.entries()}
        for tombstone in state.tombstones():
            last_offsets[tombstone.producer_id] = tombstone.last_offset
        try:
            return (yield from cleaning.clean(
                plog, last_offsets, now_ms, map_capacity,
                still_current=lambda: self._log is plog and not self.log_dir.offline,
                last_stable_offset=self.last_stable_offset))
        except LogDirFailure as exc:
            raise self.log_dir.fail(exc) from exc

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

    def _leader_appended(self) -> None:
        # Kafka's leader moves its high watermark after every append: with the ISR down to
        # the leader alone no follower fetch ever would.
        replication = self.replication
        if replication is not None and replication.is_leader:
            replication.advance_high_watermark(self.log.log_end_offset)
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    # --- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Clean shutdown: a snapshot at the log end, the log sealed and marked clean. Not
        for a partition whose directory failed: that one must be recovered (``abandon``)."""
        self._let_go_of_opening()
        if self._log is None:
            waiting, self._next_flush = self._next_flush, None  # asked while it was cut
            if waiting is not None and not waiting.done():
                waiting.set_exception(self._gone())
                waiting.exception()
            return
        if self.log_dir.offline:
            self.abandon()
            return
        plog, state = self._log, self._state
        assert state is not None
        try:
            self._snapshots.write(plog.log_end_offset,
                                  snapshot.of_state(plog.log_end_offset, state))
            plog.close()
        except (OSError, LogDirFailure) as exc:
            log.error("%s: clean shutdown failed (%s); it will be recovered at the next start",
                      self.name, exc)
            plog.abandon()
            self._log = self._state = None
            if isinstance(exc, LogDirFailure):
                # A failed fsync (a seal's, whose own report may still be on its way to the
                # loop): declared now, so that a caller going on after the close (a move
                # between log directories) sees the directory offline.
                self.log_dir.fail(exc)
            self._fail_flushes(self._this_flush, OSError(errno.EIO, str(exc)))
            return
        self._log = self._state = None
        self.flushed_offset = plog.log_end_offset  # sealing fsynced it all
        # Answered and forgotten: left here done, a write after a reopening within this
        # turn (before the queued round start clears it) would be handed it, acknowledged
        # before its own fsync.
        waiting, self._next_flush = self._next_flush, None
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    @property
    def flush_running(self) -> bool:
        return self._this_flush is not None

    def relocate(self, directory: str, log_dir: LogDir) -> None:
        """Use the partition's files at ``directory`` from now on (a move between log
        directories, see log_dir_moves.py); the partition must be closed."""
        assert self._log is None, "relocating an open partition"
        self._let_go_of_opening()
        self.dir = directory
        self.log_dir = log_dir
        self._snapshots = SnapshotFiles(directory, self.disk)

    def abandon(self) -> None:
        """Let go of the files as a crash would: no snapshot, no clean-shutdown marker."""
        self._let_go_of_opening()
        if self._log is not None:
            self._log.abandon()
            self._log = self._state = None
        self._wake_waiters()
        running = self._this_flush
        if running is not None or self._next_flush is not None:
            self._fail_flushes(running, self.log_dir.error())

    def delete(self) -> None:
        """Let go of the files for good (the caller moves the directory aside)."""
        with self._dir_lock:  # no worker creates the directory from here on
            self._deleted = True
        self._let_go_of_opening()
        if self._log is not None:
            self._log.abandon()
            self._log = self._state = None
        self._wake_waiters()
        if self._this_flush is not None or self._next_flush is not None:
            self._fail_flushes(self._this_flush, FileNotFoundError(
                errno.ENOENT, f"partition {self.name} was deleted"))


def _aborted_entry(completed: CompletedTxn) -> AbortedTxn:
    return AbortedTxn(completed.producer_id, completed.first_offset, completed.last_offset,
                      completed.last_stable_offset)


def _own(flush: asyncio.Future[None]) -> asyncio.Future[None]:
    """A future of one caller's that follows the shared ``flush`` (Partition.durable). A
    failure nobody awaits (a commit whose connection went, acks=0) is not reported as
    never retrieved."""
    own = asyncio.shield(flush)
    own.add_done_callback(mark_retrieved)
    return own


def mark_retrieved(future: asyncio.Future) -> None:
    """A done callback: the future's exception counts as retrieved (some writes are not
    awaited), without hiding it from whoever does await it."""
    if not future.cancelled():
        future.exception()
