"""One partition's log: an ordered list of segments, append at the end, read anywhere.

The log knows nothing of producers. It takes validated batches whose offsets are already
patched and writes them to the active segment; it says when a segment should roll and rolls
it when told (the partition owns the roll, because a producer-state snapshot goes with it);
it applies retention, and on start validates what an unclean shutdown may have torn.

Every file operation goes through a Disk (disk.py), so tests can break the disk under it.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..protocol.record_batch import HEADER_SIZE, BatchHeader, read_header, scan_batches
from . import swap
from .compaction import LONG_MAX, CompactionConfig, SegmentSummary
from .disk import (
    OS_DISK,
    LogDirFailure,
    OsDisk,
    out_of_descriptors,
    read_file,
    replace_file,
    write_atomically,
)
from .open_files import OPEN_FILES, OpenFiles
from .sealing import (
    UNSEALED_SUFFIX,
    Seal,
    marker_path,
    seal_here,
    wait_done,
    wait_synced,
)
from .segment import LogSegment, segment_files
from .txn_index import AbortedTxn

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".clean_shutdown"
# Kafka keeps one such file per log directory; one per partition here: the first offset the
# log cleaner has not compacted yet (the end of its last clean).
CLEANER_CHECKPOINT_FILE = "cleaner-offset-checkpoint"
# Kafka's log-start-offset-checkpoint, one per partition here too: where DeleteRecords moved
# the log start to (it may lie inside a segment, so the segments alone cannot say).
LOG_START_CHECKPOINT_FILE = "log-start-offset-checkpoint"
# Files that belong to a segment's log, removed when it is not there.
_SIDE_SUFFIXES = (".index", ".timeindex", ".txnindex", UNSEALED_SUFFIX)


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    flush_messages: int = (1 << 63) - 1
    flush_ms: int = (1 << 63) - 1
    index_interval_bytes: int = 4096
    compaction: CompactionConfig | None = None  # set for cleanup.policy with compact


@dataclass(frozen=True, slots=True)
class ReadResult:
    records: bytes
    first_offset: int  # base offset of the first batch returned, -1 when empty


def _now_ms() -> int:
    return int(time.time() * 1000)


class AbsentLog:
    """What a read sees of a partition whose directory does not exist yet (nothing was ever
    appended to it): no segments, every offset 0. A Fetch or ListOffsets creates nothing
    on disk and holds no descriptor (only an append creates the directory)."""

    segments: tuple = ()
    log_start_offset = log_end_offset = base_offset = 0

    @staticmethod
    def read(offset: int, max_bytes: int, min_one_batch: bool = True) -> ReadResult:
        return ReadResult(b"", -1)

    @staticmethod
    def offset_for_timestamp(timestamp: int) -> None:
        return None

    @staticmethod
    def headers_from(offset: int):
        return iter(())

    @staticmethod
    def batch_at(offset: int) -> bytes:
        return b""

    @staticmethod
    def aborted_transactions(start: int, upper: int) -> list[AbortedTxn]:
        return []


ABSENT_LOG = AbsentLog()


class Log:
    def __init__(self, directory: str, config: LogConfig, disk: OsDisk = OS_DISK,
                 files: OpenFiles = OPEN_FILES,
                 make_dir: Callable[[str], None] | None = None) -> None:
        """``files``: the bound its segments' descriptors count against; a log opened in a
        worker thread has one of its own until ``adopt`` (OpenFiles has no lock: the
        process's one is the event loop's alone). ``make_dir`` creates the directory when
        it is missing (its owner may forbid that, see broker/log_opening.py)."""
        self.dir = directory
        self.config = config
        self.disk = disk
        self.files = files
        self._make_dir = make_dir or disk.makedirs
        self.segments: list[LogSegment] = []
        self._base_offsets: list[int] = []
        self.last_flush_ms = _now_ms()
        self.first_dirty_offset: int | None = None  # the cleaner's checkpoint, if it has one
        # The earliest delete horizon of a tombstone the last clean kept (in memory only: after
        # a restart, such tombstones go at the next clean due for another reason).
        self.next_delete_horizon_ms = LONG_MAX
        self._log_start_checkpoint = 0  # DeleteRecords' log start; at most the log end
        # The rolled segments whose seal is under way, or ended with their marker still
        # there (sealing.py), oldest first; and those a start recovered from their marker,
        # sealed once producer state rebuilt their aborted transactions (seal_recovered).
        self._seals: dict[LogSegment, Seal] = {}
        self._recovered: list[LogSegment] = []
        # The seals of segments deleted before their fsync was done, whose deletion no
        # directory fsync has made durable yet: a power cut may bring such a segment back,
        # cut short, so flushes wait for them too (pending_seals; _sync_dir drops them).
        self._unlinked: list[Seal] = []
        self._open()

    # --- opening -------------------------------------------------------------------------

    def _open(self) -> None:
        try:
            self._open_segments()
        except BaseException:
            self.abandon()
            raise

    def _open_segments(self) -> None:
        disk = self.disk
        if not disk.isdir(self.dir):
            # The parent's descriptor first: out of descriptors (EMFILE) once the directory
            # is made, the retry would find it there and never fsync its name.
            above = os.path.dirname(os.path.abspath(self.dir))
            if not disk.isdir(above):  # a log directory made on first use (a tool, a test)
                disk.makedirs(above)
            parent = disk.open_dir(above)
            try:
                self._make_dir(self.dir)
                disk.fsync_open_dir(parent)
            finally:
                disk.close(parent)
        marker = os.path.join(self.dir, CLEAN_SHUTDOWN_FILE)
        clean = disk.exists(marker)
        names = disk.listdir(self.dir)
        swaps = swap.pending(disk, self.dir, names)
        for base, end in swaps:
            log.warning("%s: finishing the swap of a cleaned segment at %d (segments up to %d)",
                        self.dir, base, end)
            swap.complete(disk, self.dir, base, end)
        if swaps:
            names = disk.listdir(self.dir)
        bases = sorted(int(name[:-4]) for name in names
                       if name.endswith(".log") and name[:-4].isdigit())
        marked = set()
        for name in names:
            stem, ext = os.path.splitext(name)
            # Leftovers of an interrupted atomic write, of a clean that was not committed,
            # or of a segment whose deletion was cut short after its log went
            # (segment.delete removes the log first).
            if name.endswith((".tmp", swap.CLEANED)) or (
                    ext in _SIDE_SUFFIXES and stem.isdigit() and int(stem) not in bases):
                disk.unlink(os.path.join(self.dir, name))
            elif ext == UNSEALED_SUFFIX and stem.isdigit():
                marked.add(int(stem))
        self.first_dirty_offset = self._read_cleaner_checkpoint()
        recovered = 0
        for i, base in enumerate(bases):
            segment = LogSegment(self.dir, base, self.config.index_interval_bytes, disk,
                                 files=self.files)
            last = i == len(bases) - 1
            self.segments.append(segment)
            if base not in marked and (clean or not last):
                recovered += not segment.load()
                continue
            # The active segment after an unclean shutdown, or one whose seal was cut
            # short: every batch checked, the torn or corrupt tail cut away.
            cut = segment.recover()
            recovered += 1
            if base not in marked:
                continue
            if last:
                # The active one, recovered at any start anyway: its marker goes once what
                # the scan kept of it is on disk (never a marker before its bytes).
                segment.flush()
                disk.unlink(marker_path(self.dir, base))
            elif cut or segment.next_offset != bases[i + 1]:
                self._drop_after_hole(segment, bases[i + 1:])
                break
            else:
                self._recovered.append(segment)
        self._log_start_checkpoint = self._read_log_start_checkpoint()
        if self.segments and self._log_start_checkpoint > self.segments[-1].next_offset:
            # Cannot come from advance_log_start (it makes the log durable up to its offset
            # before the checkpoint names it): the disk lost what it had synced. Kafka's
            # answer: nothing below the log start may be served, so start over at it.
            log.warning("%s: the log start %d is past the log end %d; the log starts over "
                        "empty at %d", self.dir, self._log_start_checkpoint,
                        self.segments[-1].next_offset, self._log_start_checkpoint)
            for segment in self.segments:
                segment.delete()
            self.segments.clear()
            self._recovered.clear()
        if not self.segments:
            self.segments.append(self._new_segment(self._log_start_checkpoint))
        self._base_offsets = [s.base_offset for s in self.segments]
        if self._delete_segments_below_start():  # a deletion cut short by a crash
            disk.fsync_dir(self.dir)
        if clean:
            # Removed only now: had opening failed, the next start may still trust the indexes.
            disk.unlink(marker)
        log.debug("%s: opened %d segments (%d recovered), offsets %d to %d", self.dir,
                  len(self.segments), recovered, self.log_start_offset, self.log_end_offset)

    def _drop_after_hole(self, segment: LogSegment, later: list[int]) -> None:
        """``segment``, recovered from its marker, ends before the next one begins: what
        followed it was lost to a power cut, and records after a hole must not be served
        (Kafka's LogLoader deletes them too). Every later segment goes, durably: appends
        will take their offsets again."""
        log.warning("%s: segment %d ends at offset %d after its recovery, where %d segments "
                    "follow from offset %d: deleting them (records after a hole)", self.dir,
                    segment.base_offset, segment.next_offset, len(later), later[0])
        for base in later:
            for path in (*segment_files(self.dir, base), marker_path(self.dir, base)):
                with contextlib.suppress(FileNotFoundError):
                    self.disk.unlink(path)
        segment.flush()  # the active one now: its marker goes once its bytes are on disk
        self.disk.unlink(marker_path(self.dir, segment.base_offset))
        try:
            self.disk.fsync_dir(self.dir)
        except OSError as exc:
            # Not an opening to try again: the retry would find the deletions done in
            # memory and go on without their ever being made durable.
            raise LogDirFailure(f"{self.dir}: fsync of the directory after deleting the "
                                f"segments after a hole failed: {exc}") from exc

    def seal_recovered(self) -> None:
        """Seal the segments a start recovered from their marker, once producer state was
        replayed over them (their aborted transaction indexes whole again): fsync, index
        files, the marker removed, on the calling thread, as a roll's seal does in a worker.
        Until then (a log opened without a partition) the markers stay, and the next start
        recovers those segments again."""
        recovered, self._recovered = self._recovered, []
        for segment in recovered:
            segment.end_time_index()
            seal = Seal(segment, marker_path(self.dir, segment.base_offset),
                        self.disk.open(segment.path, os.O_RDONLY))
            self._seals[segment] = seal
            seal_here(seal)

    def _new_segment(self, base_offset: int) -> LogSegment:
        segment = LogSegment(self.dir, base_offset, self.config.index_interval_bytes, self.disk,
                             files=self.files)
        try:
            # The new file's name must be durable before anything acknowledged is in it.
            self._sync_dir()
        except OSError as exc:
            segment.close()
            if out_of_descriptors(exc):
                # The fsync never ran: the roll did not happen. The empty file goes, or a
                # start would take it for the active segment, below offsets appended since.
                with contextlib.suppress(OSError):
                    self.disk.unlink(segment.path)
                raise
            raise LogDirFailure(f"{self.dir}: fsync of the directory failed: {exc}") from exc
        return segment

    def adopt(self, files: OpenFiles) -> None:
        """Count the segments' descriptors against ``files`` from now on (a log opened in a
        worker thread, handed to the event loop's bound; called on the loop)."""
        for segment in self.segments:
            segment.adopt(files)
        self.files = files

    # --- state ---------------------------------------------------------------------------

    @property
    def active(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_start_offset(self) -> int:
        """The first offset readers may see: the first segment's base offset, or where
        DeleteRecords moved it within that segment."""
        return max(self._log_start_checkpoint, self.segments[0].base_offset)

    @property
    def base_offset(self) -> int:
        """The first offset still in the files (batches below the log start may be, in the
        first segment: never served, still replayed into producer state)."""
        return self.segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        return self.active.next_offset

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)

    # --- writing -------------------------------------------------------------------------

    def should_roll(self, headers: list[BatchHeader], now_ms: int) -> bool:
        """Whether batches ``headers`` (offsets assigned or not) need a new segment first.

        Kafka's rules: the segment would pass segment.bytes; its age passed segment.ms, where
        age is the incoming batch's timestamp against the segment's first batch's (KAFKA-4099,
        so back-filled old records do not roll a segment per batch), or the broker's clock
        against the segment's creation when the first batch has no timestamp; or an offset
        would not fit the segment's 32-bit relative offsets.
        """
        active = self.segments[-1]
        if active.size == 0:
            return False
        if len(headers) == 1:  # what a produce and a coordinator's record bring: no loops
            header = headers[0]
            size, newest, count = header.size, header.max_timestamp, header.last_offset_delta + 1
        else:
            size = sum(h.size for h in headers)
            newest = max(h.max_timestamp for h in headers)
            count = sum(h.last_offset_delta + 1 for h in headers)
        if active.size + size > self.config.segment_bytes:
            return True
        first = active.first_batch_timestamp
        waited = newest - first if first >= 0 else now_ms - active.created_at_ms
        if waited > self.config.segment_ms:
            return True
        return not active.fits(active.next_offset + count - 1)

    def append(self, parts: list, headers: list[BatchHeader]) -> None:
        """Append batches whose offsets start at log_end_offset (see assign_offsets).

        ``parts`` are the buffers holding the batches, in order, written with one writev. All
        or nothing: an OSError leaves the log as it was; LogDirFailure means it cannot say.
        """
        self.active.append(parts, headers)

    def roll(self, start_seal: Callable[[Seal], None] = seal_here) -> None:
        """Start a new segment at the log end (the caller snapshots producer state first),
        without waiting for the old one's fsync: its seal (sealing.py) is handed to
        ``start_seal``, which runs it in a worker thread, or here by default (then a failed
        fsync raises LogDirFailure, the roll done). Any other failure leaves the active
        segment where it was."""
        old = self.active
        marker = marker_path(self.dir, old.base_offset)
        # The seal's own descriptor, and the marker, before anything changes: out of
        # descriptors (EMFILE), the roll fails having done nothing.
        fd = self.disk.open(old.path, os.O_RDONLY)
        try:
            self.disk.close(self.disk.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                                           0o644))
            # Its directory fsync makes the marker durable with the new segment's name.
            segment = self._new_segment(old.next_offset)
        except BaseException as exc:
            self.disk.close(fd)
            if isinstance(exc, OSError):  # the new segment is not there: neither is a roll
                with contextlib.suppress(OSError):
                    self.disk.unlink(marker)
            raise
        old.end_time_index()
        # What flush.messages counts goes on: the old segment's messages are not on disk
        # before its seal's fsync, which the next flush round waits for (Kafka counts the
        # log end less the recovery point, which a roll does not move).
        segment.unflushed_messages, old.unflushed_messages = old.unflushed_messages, 0
        self.segments.append(segment)
        self._base_offsets.append(segment.base_offset)
        seal = self._seals[old] = Seal(old, marker, fd)
        log.debug("%s: rolled new segment at offset %d", self.dir, segment.base_offset)
        start_seal(seal)

    def pending_seals(self) -> list[Seal]:
        """What a flush waits for (the fsync of each): the seals of deleted segments that a
        power cut could still bring back cut short (``_unlinked``), then the seals not done
        with their marker, oldest first. Forgets those done with."""
        if any(seal.unmarked for seal in self._seals.values()):
            self._seals = {s: seal for s, seal in self._seals.items() if not seal.unmarked}
        if self._unlinked:
            # Its bytes on disk, a deleted segment that comes back is whole: no hole.
            self._unlinked = [seal for seal in self._unlinked if not seal.synced]
        return [*self._unlinked, *self._seals.values()]

    @property
    def sealed_end(self) -> int:
        """The base offset of the first segment not sealed for good (the active one's when
        every other is): the cleaner stops there (sealing.py)."""
        self.pending_seals()
        first = next(iter(self._seals.values()), None)
        return first.segment.base_offset if first is not None else self.active.base_offset

    def seals_to_retry(self) -> list[Seal]:
        """The seals whose index files (or the marker's removal) failed: each ``rearm``-ed
        and run again by the caller (sealing.py)."""
        return [seal for seal in self._seals.values() if seal.needs_retry]

    def _cancel_seal(self, segment: LogSegment) -> Seal | None:
        """``segment`` is deleted or cut: its seal, if under way, renames or removes no file
        from now (nor does seal_recovered). Returns it."""
        if segment in self._recovered:
            self._recovered.remove(segment)
        seal = self._seals.pop(segment, None)
        if seal is not None:
            seal.cancel()
        return seal

    def _delete_segment(self, segment: LogSegment) -> None:
        """Delete ``segment``'s files, its marker last (at a start, a marker without its
        log is removed). A seal under way stays among those flushes wait for until a
        directory fsync after the deletion (``_sync_dir``): until then a power cut brings
        the segment back, with its marker, and had its fsync not been waited for, the
        start would find it cut short and drop every segment after it (Log._open)."""
        seal = self._cancel_seal(segment)
        if seal is not None and not seal.unmarked:
            self._unlinked.append(seal)
        segment.delete()
        with contextlib.suppress(FileNotFoundError):
            self.disk.unlink(marker_path(self.dir, segment.base_offset))

    def _sync_dir(self, dir_fd: int | None = None) -> None:
        """fsync the log's directory (through ``dir_fd``, its descriptor taken ahead, when
        given): the deletions before it are durable from its success on, and their seals no
        longer held for flushes."""
        deleted = len(self._unlinked)
        if dir_fd is None:
            self.disk.fsync_dir(self.dir)
        else:
            self.disk.fsync_open_dir(dir_fd)
        del self._unlinked[:deleted]

    @property
    def unflushed_messages(self) -> int:
        return self.active.unflushed_messages

    def flush(self) -> None:
        """fsync the active segment, and wait for the fsync of the rolled ones still being
        sealed: everything appended is on disk when it returns; LogDirFailure when a fsync
        failed."""
        seals = self.pending_seals()
        self.active.flush()
        wait_synced(seals)
        self.last_flush_ms = _now_ms()

    # --- reading -------------------------------------------------------------------------

    def _segment_for(self, offset: int) -> int:
        return max(0, bisect.bisect_right(self._base_offsets, offset) - 1)

    def read(self, offset: int, max_bytes: int, min_one_batch: bool = True) -> ReadResult:
        """Whole batches from the one holding ``offset``, at most ``max_bytes`` of them.

        With ``min_one_batch`` the first batch is returned even when it is larger than
        ``max_bytes`` (KIP-74), so a consumer can always make progress.
        """
        i = self._segment_for(offset)
        while i < len(self.segments):
            segment = self.segments[i]
            position = segment.position_of(offset)
            if position is not None:
                return self._read_from(segment, position, max_bytes, min_one_batch)
            i += 1
        return ReadResult(b"", -1)

    def _read_from(self, segment: LogSegment, position: int, max_bytes: int,
                   min_one_batch: bool) -> ReadResult:
        available = segment.size - position
        data = segment.read_at(position, min(max_bytes, available))
        end = 0
        first = -1
        for pos, header in scan_batches(data):
            if first < 0:
                first = header.base_offset
            end = pos + header.size
        if end == 0:
            if not min_one_batch or available <= 0:
                return ReadResult(b"", -1)
            header = read_header(segment.read_at(position, HEADER_SIZE))
            return ReadResult(segment.read_at(position, header.size), header.base_offset)
        if end < len(data):
            data = data[:end]
        return ReadResult(data, first)

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(base offset, max timestamp) of the first batch with max timestamp >= ``timestamp``."""
        for segment in self.segments:
            if segment.max_timestamp < timestamp:
                continue
            relative = segment.time_index.lookup(timestamp)
            start = segment.offset_index.lookup(relative)
            for _, header in segment.headers_from(start):
                if header.max_timestamp >= timestamp:
                    return header.base_offset, header.max_timestamp
        return None

    def headers_from(self, offset: int):
        """Headers of every batch whose last offset is at or after ``offset``, in order."""
        i = self._segment_for(offset)
        for segment in self.segments[i:]:
            position = segment.position_of(max(offset, segment.base_offset))
            if position is None:
                continue
            for _, header in segment.headers_from(position):
                yield header

    def batch_at(self, offset: int) -> bytes:
        """The whole batch holding ``offset`` (b"" when there is none)."""
        return self.read(offset, 1, min_one_batch=True).records

    # --- aborted transactions ------------------------------------------------------------

    def txn_index_untrusted_from(self) -> int | None:
        """Base offset of the first segment whose aborted transaction index must be rebuilt
        from the log (None: every one is good)."""
        return next((s.base_offset for s in self.segments if not s.txn_index_trusted), None)

    def forget_aborted_from(self, offset: int) -> None:
        """Before producer state is replayed from ``offset``: the entries of transactions
        ended from there on are about to be written again."""
        for segment in self.segments[self._segment_for(offset):]:
            segment.txn_index.drop_from(offset)

    def rebuilt_txn_indexes(self) -> None:
        for segment in self.segments:
            segment.txn_index_trusted = True

    def add_aborted(self, entry: AbortedTxn) -> None:
        """Record an aborted transaction in the segment holding its marker."""
        self.segments[self._segment_for(entry.last_offset)].txn_index.append(entry)

    def aborted_transactions(self, start: int, upper: int) -> list[AbortedTxn]:
        """The aborted transactions with data in [start, upper), in the order they ended.

        A transaction's entry is in its marker's segment, at or after the one holding
        ``start``. Once an entry says the last stable offset reached ``upper`` when it
        ended, every transaction ended later began at or after ``upper`` (Kafka's stop)."""
        found: list[AbortedTxn] = []
        for segment in self.segments[self._segment_for(start):]:
            for entry in segment.txn_index.entries:
                if entry.last_offset >= start and entry.first_offset < upper:
                    found.append(entry)
                if entry.last_stable_offset >= upper:
                    return found
        return found

    # --- compaction ----------------------------------------------------------------------

    def summaries(self) -> list[SegmentSummary]:
        """What the cleaner plans by, one per segment, the active one last."""
        result = []
        for segment in self.segments:
            largest = segment.max_timestamp
            if largest < 0 and segment is not self.active and segment.size:
                largest = segment.modified_ms
            result.append(SegmentSummary(segment.base_offset, segment.next_offset,
                                         segment.size, largest,
                                         segment.first_batch_timestamp))
        return result

    def _read_cleaner_checkpoint(self) -> int | None:
        path = os.path.join(self.dir, CLEANER_CHECKPOINT_FILE)
        try:
            return int(read_file(self.disk, path).decode("ascii").strip())
        except FileNotFoundError:
            return None
        except (UnicodeDecodeError, ValueError):
            log.warning("%s: unreadable cleaner checkpoint; the next clean starts from the "
                        "log start", self.dir)
            return None

    def write_cleaner_checkpoint(self, first_dirty_offset: int) -> None:
        write_atomically(self.disk, os.path.join(self.dir, CLEANER_CHECKPOINT_FILE),
                         b"%d\n" % first_dirty_offset)
        self.first_dirty_offset = first_dirty_offset

    def replace_segments(self, old: list[LogSegment], cleaned: LogSegment) -> None:
        """Put ``cleaned`` (written and fsynced as ``.cleaned`` files by the cleaner, with
        the first old segment's base offset) in place of the consecutive segments ``old``,
        none of them the active one. Raises ValueError, having changed nothing, when ``old``
        are no longer segments of this log (retention or a close got there first); OSError
        when the commit fails (nothing changed); LogDirFailure when a step after the commit
        fails (the next start completes the swap). See swap.py."""
        start = next((i for i, s in enumerate(self.segments) if s is old[0]), -1)
        if start < 0 or self.segments[start:start + len(old)] != old or \
                start + len(old) >= len(self.segments) or \
                not all(s.is_open for s in old) or cleaned.base_offset != old[0].base_offset \
                or any(s in self._seals for s in old):
            raise ValueError("the segments cleaned are no longer those of the log")
        end_offset = self.segments[start + len(old)].base_offset
        # Every descriptor the swap needs from its commit on is taken first: out of
        # descriptors (EMFILE), the clean fails undecided, never the directory.
        dir_fd = self.disk.open_dir(self.dir)
        try:
            swap.commit(self.disk, self.dir, cleaned.base_offset, end_offset, dir_fd)
            try:
                swap.complete(self.disk, self.dir, cleaned.base_offset, end_offset, dir_fd,
                              [os.path.basename(s.path) for s in old])
            except OSError as exc:
                raise LogDirFailure(f"{self.dir}: swapping in the cleaned segment at "
                                    f"{cleaned.base_offset} failed after its commit: "
                                    f"{exc}") from exc
            finally:
                for segment in old:
                    segment.close()
        finally:
            self.disk.close(dir_fd)
        cleaned.renamed(segment_files(self.dir, cleaned.base_offset))
        self.segments[start:start + len(old)] = [cleaned]
        self._base_offsets = [s.base_offset for s in self.segments]

    # --- retention -----------------------------------------------------------------------

    def active_expired(self, now_ms: int) -> bool:
        """All of the log is past retention.ms: the active segment must roll to go too (the
        caller rolls it, as for any roll), so an idle topic's data does ultimately go."""
        return (len(self.segments) == 1 and self.config.retention_ms >= 0
                and self._expired(self.active, now_ms, self.config.retention_ms))

    def delete_old_segments(self, now_ms: int) -> int:
        """Apply retention by time and size to the sealed segments; returns how many were
        deleted. The active segment is never deleted (see ``active_expired``)."""
        retention_ms, retention_bytes = self.config.retention_ms, self.config.retention_bytes
        deleted = self._delete_segments_below_start()
        if retention_ms >= 0:
            # An empty segment (all of it compacted away) goes as soon as it is first.
            while len(self.segments) > 1 and (self.segments[0].size == 0 or self._expired(
                    self.segments[0], now_ms, retention_ms)):
                self._delete_first("retention.ms")
                deleted += 1
        if retention_bytes >= 0:
            total = self.size
            while len(self.segments) > 1 and total - self.segments[0].size >= retention_bytes:
                total -= self.segments[0].size
                self._delete_first("retention.bytes")
                deleted += 1
        if deleted:
            # A deletion lost to a power cut would bring the segment back below the log
            # start (harmless once its bytes are on disk: _delete_segment), but the
            # directory is synced so that it stays gone. A failure is the caller's OSError:
            # the deleted segments' seals are waited for until a later fsync succeeds.
            self._sync_dir()
        return deleted

    @staticmethod
    def _expired(segment: LogSegment, now_ms: int, retention_ms: int) -> bool:
        if segment.size == 0:
            return False
        newest = segment.max_timestamp
        if newest < 0:
            # No record in it has a timestamp: its age is the file's, as Kafka takes it.
            newest = segment.modified_ms
        return now_ms - newest > retention_ms

    def _delete_segments_below_start(self) -> int:
        """Delete the segments whose every offset is below the log start (never the active
        one); returns how many."""
        deleted = 0
        while len(self.segments) > 1 and self.segments[1].base_offset <= \
                self._log_start_checkpoint:
            self._delete_first("the log start offset")
            deleted += 1
        return deleted

    # --- the log start (DeleteRecords) ---------------------------------------------------

    def _read_log_start_checkpoint(self) -> int:
        path = os.path.join(self.dir, LOG_START_CHECKPOINT_FILE)
        try:
            return int(read_file(self.disk, path).decode("ascii").strip())
        except FileNotFoundError:
            return 0
        except (UnicodeDecodeError, ValueError) as exc:
            # Written atomically, so only outside damage gets here: the log cannot say where
            # it starts, and must not serve what DeleteRecords removed; an operator decides.
            raise LogDirFailure(f"{path}: unreadable log start checkpoint ({exc})") from exc

    def advance_log_start(self, offset: int) -> None:
        """Move the log start forward to ``offset`` (at most the log end, and made durable
        up to it by the caller), then delete the segments wholly below it.

        All or nothing: the checkpoint file is written to a temporary file, fsynced and
        renamed over the old one. An OSError up to the rename leaves the log as it was;
        LogDirFailure when the directory's fsync failed after the rename (the checkpoint
        may or may not survive a power cut). Segments that fail to go are left to the next
        retention check or start."""
        if offset <= self.log_start_offset:
            return
        if offset > self.log_end_offset:
            raise ValueError(f"log start {offset} past the log end {self.log_end_offset}")
        # write_atomically's steps apart: a failure before the rename changed nothing, one
        # after it is undecided, and the two must be told apart.
        disk = self.disk
        replace_file(disk, os.path.join(self.dir, LOG_START_CHECKPOINT_FILE),
                     b"%d\n" % offset)
        self._log_start_checkpoint = offset  # the file says so now, whatever follows
        try:
            self._sync_dir()
        except OSError as exc:
            if out_of_descriptors(exc):
                raise  # not synced yet: the next fsync of the directory makes it durable
            raise LogDirFailure(f"{self.dir}: fsync of the directory failed after the log "
                                f"start checkpoint moved to {offset}: {exc}") from exc
        try:
            if self._delete_segments_below_start():
                self._sync_dir()
        except OSError as exc:
            log.error("%s: deleting segments below the log start %d failed (%s); retention "
                      "or the next start retries", self.dir, offset, exc)

    # --- truncation (a follower cut back to its leader) ----------------------------------

    def truncate_to(self, offset: int) -> None:
        """Cut the log back to end at ``offset`` (a batch boundary; a batch holding it goes
        whole), durably. The caller abandons the log and opens it again: the cut segment is
        recovered then, its indexes rebuilt by the path every unclean start takes. Below the
        first segment, the log starts over empty at ``offset`` (Kafka's
        truncateFullyAndStartAt). LogDirFailure when a step fails: the cut is then half
        done, and segments deleted but not durably so could come back after a power cut
        beside what is appended after the cut. Out of descriptors (EMFILE) before anything
        changed, an OSError: the directory's descriptor is taken first, so that running
        out never stops a cut between its deletions and their fsync (after a change, the
        half-done cut is the directory's failure, as any other)."""
        if offset >= self.log_end_offset:
            return
        dir_fd = self.disk.open_dir(self.dir)  # EMFILE here: nothing done
        changed = False
        try:
            while len(self.segments) > 1 and self.segments[-1].base_offset >= offset:
                changed = True
                self._delete_segment(self.segments.pop())
                self._base_offsets.pop()
            if changed:
                # The later segments gone durably before the cut: a power cut between the
                # cut's fsync and the directory's would bring them back after a hole, the
                # old leader's records served after offsets that exist nowhere.
                self._sync_dir(dir_fd)
            segment = self.active
            if offset <= segment.base_offset:
                changed = True
                self._delete_segment(segment)
                self.segments[-1] = self._new_segment(offset)
                self._base_offsets[-1] = offset
                self._log_start_checkpoint = min(self._log_start_checkpoint, offset)
            else:
                position = segment.position_of(offset)
                if position is not None:
                    # Its seal must not write its indexes after the cut: its marker stays
                    # (the cut's fsync makes what is left of it durable), and the reopening
                    # that follows a truncation recovers the segment.
                    self._cancel_seal(segment)
                    changed = True
                    segment.truncate_at(position)
            self._sync_dir(dir_fd)
        except OSError as exc:
            if out_of_descriptors(exc) and not changed:
                raise
            raise LogDirFailure(f"{self.dir}: truncating to offset {offset} failed: "
                                f"{exc}") from exc
        finally:
            self.disk.close(dir_fd)
        log.info("%s: truncated to offset %d", self.dir, offset)

    def _delete_first(self, reason: str) -> None:
        segment = self.segments.pop(0)
        self._base_offsets.pop(0)
        log.info("%s: deleting segment %d by %s", self.dir, segment.base_offset, reason)
        self._delete_segment(segment)

    # --- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Clean shutdown: wait for the seals under way (LogDirFailure when a fsync failed;
        OSError when they took more than SEAL_WAIT_S: the next start recovers them), seal
        the active segment, and leave the marker that skips recovery. A seal whose index
        files failed keeps its marker: the next start recovers that segment."""
        self.pending_seals()
        wait_done(list(self._seals.values()))
        self.active.seal()
        for segment in self.segments:
            segment.close()
        marker = os.path.join(self.dir, CLEAN_SHUTDOWN_FILE)
        self.disk.close(self.disk.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        self._sync_dir()

    def abandon(self) -> None:
        """Close the files without sealing anything: the directory failed, and the next start
        must recover from what is on disk. A seal under way writes no file after it."""
        self._cancel_seals()
        for segment in self.segments:
            try:
                segment.close()
            except OSError:
                pass

    def _cancel_seals(self) -> None:
        for segment in list(self._seals):
            self._cancel_seal(segment)
        unlinked, self._unlinked = self._unlinked, []
        for seal in unlinked:
            seal.cancel()

    def delete(self) -> None:
        self._cancel_seals()
        for segment in self.segments:
            self._delete_segment(segment)
        self.segments.clear()
        self._base_offsets.clear()
