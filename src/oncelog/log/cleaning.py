"""One clean of one compacted log: read the dirty section into an offset map, rewrite the
segments up to the map's end group by group, swap each group's cleaned segment in.

What survives is decided in compaction.py; how a cleaned segment takes the old ones' place
without a crash ever losing anything, in swap.py. This module does the file work between
them, and hands the caller a generator of steps so that a large log never holds the broker's
event loop for long:

* ``PAUSE`` (None): a slice of work is done (about ``SLICE_BYTES`` of batches read, decoded
  and written); the broker's driver lets the event loop serve produce and fetch requests,
  then resumes. The CPU work (decompressing, parsing records, rebuilding batches) runs on the
  event loop in these slices rather than in a thread: it is Python, so a thread would hold
  the GIL just as long and, worse, at moments the loop cannot choose; and the segments are
  read and swapped by the loop's own rules (no other thread may see a segment closed by
  retention half-way through a read).
* ``Offload(call)``: blocking I/O with no Python work in it (the fsync of a cleaned segment,
  which may take seconds for a large one); the driver runs ``call`` in a worker thread and
  sends back its result or throws its exception.

Between steps the log may change under the clean: appends and rolls (harmless: only sealed
segments are cleaned), retention deleting segments, the partition closed or its directory
taken offline. A segment is read only after checking it is still open, and the swap checks
the log still holds exactly the segments cleaned; otherwise the group is given up (its
``.cleaned`` files deleted) and the clean ends.

Failures: an OSError (ENOSPC, EIO, a short write) before a group's commit leaves the old
segments as they were and in use, its ``.cleaned`` files removed, and ends the clean (the
broker retries after log.cleaner.backoff.ms); so does a failure inside the atomic write of
an index file (disk.write_atomically, as when a roll saves indexes). A failed fsync of the
cleaned segment or of the directory raises LogDirFailure, as a failed fsync does anywhere in
log/; after a commit, any failure is LogDirFailure (the next start completes the swap).
Groups swapped before a failure stay swapped: each one is a complete clean of its segments.
A batch that fails its CRC or does not parse is CorruptSegment: the cleaner never rewrites
(and so launders) damaged data.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..protocol.record_batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    crc_of,
    read_header,
    scan_batches,
)
from .compaction import (
    LONG_MAX,
    BadRecords,
    Cleanable,
    OffsetMap,
    Rules,
    SegmentSummary,
    TxnCleaning,
    batch_payload,
    clean_batch,
    cleanable,
    joins_group,
    marker_of,
    record_facts,
)
from .disk import LogDirFailure, OsDisk, out_of_descriptors, write_atomically
from .log import Log
from .segment import MAX_RELATIVE_OFFSET, LogSegment, segment_files
from .swap import CLEANED

log = logging.getLogger(__name__)

PAUSE = None
SLICE_BYTES = 256 * 1024  # work between pauses: a few milliseconds of Python
_READ_CHUNK = 1 << 20
_WRITE_CHUNK = 1 << 20
_WRITE_PARTS = 256  # batches per writev, well under IOV_MAX


class Offload(NamedTuple):
    call: Callable[[], Any]


Step = Offload | None


class CorruptSegment(ValueError):
    """A sealed segment whose batches do not read back: the cleaner leaves the log alone."""


class GivenUp(Exception):
    """The log changed under the clean (retention, a close): nothing was swapped."""


@dataclass
class CleanResult:
    first_dirty: int  # the checkpoint after this clean: the map's end
    next_horizon_ms: int  # earliest delete horizon of a tombstone kept, LONG_MAX if none
    bytes_read: int = 0
    bytes_written: int = 0
    records_removed: int = 0
    batches_removed: int = 0
    segments_before: int = 0
    segments_after: int = 0


def plan(plog: Log, now_ms: int, last_stable_offset: int = LONG_MAX) -> Cleanable:
    """Where the dirty section of ``plog`` is, and whether it is due (see compaction.py)."""
    assert plog.config.compaction is not None
    first_dirty = plog.first_dirty_offset
    if first_dirty is None:
        first_dirty = plog.log_start_offset
    # Nothing from a segment not sealed for good on (its marker's removal not durable yet):
    # a start scans a marked segment as contiguous, and would take a compacted one's offset
    # gaps for damage and drop every segment after it (sealing.py).
    return cleanable(plog.summaries(), first_dirty, now_ms, plog.config.compaction,
                     plog.next_delete_horizon_ms, min(last_stable_offset, plog.sealed_end))


def clean(plog: Log, producer_last_offsets: Mapping[int, int], now_ms: int,
          map_capacity: int, still_current: Callable[[], bool] = lambda: True,
          last_stable_offset: int = LONG_MAX) -> Generator[Step, Any, CleanResult | None]:
    """Clean ``plog`` once if it is due (None when it is not). ``producer_last_offsets``:
    producer id -> last offset of the last batch of every producer the partition remembers
    (those batches stay); ``still_current``: whether the caller still serves ``plog``;
    ``last_stable_offset``: nothing from there on is cleaned (open transactions)."""
    config = plog.config.compaction
    if config is None:
        return None
    cleanable_now = plan(plog, now_ms, last_stable_offset)
    if not cleanable_now.due(config):
        return None
    offsets = OffsetMap(cleanable_now.first_dirty, map_capacity)
    sealed = plog.segments[:-1]
    map_txns = TxnCleaning(plog.aborted_transactions(cleanable_now.first_dirty,
                                                     cleanable_now.first_uncleanable))
    yield from _build_map(sealed, offsets, cleanable_now.first_uncleanable, map_txns)
    end = offsets.end
    to_clean = [s for s in sealed if s.base_offset < end]
    result = CleanResult(end, LONG_MAX, segments_before=len(to_clean))
    if not to_clean:
        return result
    rules = Rules(now_ms, config.delete_retention_ms, producer_last_offsets)
    # Every segment is rewritten whole, so the aborted transactions are those of all of
    # them, not only those before the map's end (which may lie inside the last one): a
    # transaction unknown here would be taken for committed, its ABORT marker and index
    # entry dropped, and its data shown to read_committed readers.
    txns = TxnCleaning(plog.aborted_transactions(to_clean[0].base_offset,
                                                 to_clean[-1].next_offset))
    first = 0
    while first < len(to_clean):
        if not still_current():
            raise GivenUp("the partition was closed")
        first = yield from _clean_group(plog, to_clean, first, offsets, rules, result,
                                        still_current, txns)
        result.segments_after += 1
    plog.next_delete_horizon_ms = result.next_horizon_ms
    try:
        plog.write_cleaner_checkpoint(end)
    except OSError as exc:  # the swaps stand; the next clean goes over this part again
        log.warning("%s: writing the cleaner checkpoint failed: %s", plog.dir, exc)
    return result


# --- reading -----------------------------------------------------------------------------

def _batches(segment: LogSegment, position: int = 0
             ) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Each batch of a sealed segment from ``position``, checked against its CRC, read in
    chunks; GivenUp when the segment was closed (deleted by retention) meanwhile."""
    end = segment.size
    while position < end:
        if not segment.is_open:
            raise GivenUp(f"{segment.path} was closed during the clean")
        chunk = memoryview(segment.read_at(position, min(_READ_CHUNK, end - position)))
        taken = 0
        for pos, header in scan_batches(chunk):
            yield _checked(segment, position + pos, header, chunk[pos:pos + header.size])
            taken = pos + header.size
        if taken == 0:  # one batch larger than a chunk
            header = read_header(segment.read_at(position, HEADER_SIZE))
            if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or \
                    position + header.size > end:
                raise CorruptSegment(f"{segment.path}: no whole batch at byte {position}")
            whole = memoryview(segment.read_at(position, header.size))
            yield _checked(segment, position, header, whole)
            taken = header.size
        position += taken


def _checked(segment: LogSegment, position: int, header: BatchHeader,
             batch: memoryview) -> tuple[BatchHeader, memoryview]:
    # The cleaner rewrites batches with fresh CRCs: it must not launder a damaged one.
    if len(batch) != header.size or crc_of(batch, 0, header.size) != header.crc:
        raise CorruptSegment(f"{segment.path}: the batch at byte {position} (offset "
                             f"{header.base_offset}) fails its CRC32C check")
    return header, batch


def _build_map(sealed: list[LogSegment], offsets: OffsetMap, first_uncleanable: int,
               txns: TxnCleaning) -> Generator[Step, Any, None]:
    """The offset map over the dirty section, until it ends or the map is full."""
    work = 0
    for segment in sealed:
        if segment.base_offset >= first_uncleanable:
            return
        if segment.next_offset <= offsets.end:
            continue
        if not segment.is_open:
            raise GivenUp(f"{segment.path} was closed during the clean")
        start = segment.position_of(max(offsets.end, segment.base_offset))
        if start is None:
            continue
        for header, batch in _batches(segment, start):
            if header.base_offset >= first_uncleanable:
                return
            try:
                if header.is_control:
                    txns.on_marker(header, marker_of(batch, header))
                    facts = []
                elif txns.on_data(header):
                    facts = []  # aborted: it must not hide an older value
                else:
                    facts = record_facts(batch_payload(batch, header), header.records_count)
            except BadRecords as exc:
                raise CorruptSegment(f"{segment.path}: batch at offset {header.base_offset} "
                                     f"does not parse: {exc}") from None
            if not offsets.add(header, facts):
                return  # full: this clean ends before this batch
            work += header.size + 16 * len(facts)
            if work >= SLICE_BYTES:
                work = 0
                yield PAUSE


# --- writing -----------------------------------------------------------------------------

def _clean_group(plog: Log, to_clean: list[LogSegment], first: int, offsets: OffsetMap,
                 rules: Rules, result: CleanResult, still_current: Callable[[], bool],
                 txns: TxnCleaning) -> Generator[Step, Any, int]:
    """Clean ``to_clean[first]`` and as many segments after it as ``joins_group`` allows
    into one new segment, and swap it in; returns the index of the next segment to clean."""
    disk = plog.disk
    base = to_clean[first].base_offset
    group: list[LogSegment] = []
    paths = segment_files(plog.dir, base, CLEANED)
    _remove(disk, paths)  # from a clean given up without its clean-up (a crash)
    cleaned = LogSegment(plog.dir, base, plog.config.index_interval_bytes, disk, CLEANED)
    committed = False
    try:
        parts: list = []
        headers: list[BatchHeader] = []
        pending = work = 0
        for segment in to_clean[first:]:
            if group and not joins_group(cleaned.size + pending, _summary(segment), base,
                                         plog.config.segment_bytes, MAX_RELATIVE_OFFSET):
                break
            group.append(segment)
            result.bytes_read += segment.size
            for header, batch in _batches(segment):
                try:
                    outcome = clean_batch(batch, header, offsets, rules, txns)
                except BadRecords as exc:
                    raise CorruptSegment(f"{segment.path}: batch at offset "
                                         f"{header.base_offset} does not parse: {exc}") from None
                result.records_removed += outcome.removed
                result.next_horizon_ms = min(result.next_horizon_ms, outcome.pending_horizon)
                work += header.size + 64 * header.records_count
                if outcome.data is None:
                    result.batches_removed += 1
                else:
                    data = outcome.data
                    parts.append(data)
                    headers.append(header if data is batch else read_header(data))
                    pending += len(data)
                    if pending >= _WRITE_CHUNK or len(parts) >= _WRITE_PARTS:
                        cleaned.append(parts, headers)
                        parts, headers, pending = [], [], 0
                if work >= SLICE_BYTES:
                    work = 0
                    yield PAUSE
        if parts:
            cleaned.append(parts, headers)
        for entry in txns.kept_entries:  # ABORT markers kept in this group
            cleaned.txn_index.append(entry)
        txns.kept_entries.clear()
        fd = cleaned.dup_fd()
        try:
            yield Offload(functools.partial(_sync_and_close, disk, fd))
        except OSError as exc:
            raise LogDirFailure(f"{cleaned.path}: fsync failed: {exc}") from exc
        cleaned.save_indexes()
        if not cleaned.txn_index.entries:
            # Written even empty: swap.py takes a missing one for one renamed already.
            write_atomically(disk, cleaned.txn_index.path, b"")
        try:
            disk.fsync_dir(plog.dir)
        except OSError as exc:
            if out_of_descriptors(exc):
                raise  # before the commit: the clean ends, the old segments stay
            raise LogDirFailure(f"{plog.dir}: fsync of the directory failed: {exc}") from exc
        if not still_current():
            raise GivenUp("the partition was closed")
        try:
            plog.replace_segments(group, cleaned)
        except ValueError as exc:
            raise GivenUp(str(exc)) from None
        except LogDirFailure:
            committed = True  # perhaps: so nothing may be undone; the next start decides
            raise
        committed = True
        result.bytes_written += cleaned.size
        return first + len(group)
    finally:
        if not committed:
            cleaned.close()
            _remove(disk, (*paths, *(p + ".tmp" for p in paths[1:])))


def _summary(segment: LogSegment) -> SegmentSummary:
    return SegmentSummary(segment.base_offset, segment.next_offset, segment.size,
                          segment.max_timestamp, segment.first_batch_timestamp)


def _sync_and_close(disk: OsDisk, fd: int) -> None:
    try:
        disk.fdatasync(fd)
    finally:
        disk.close(fd)


def _remove(disk: OsDisk, paths) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            disk.unlink(path)


def run(steps: Generator[Step, Any, Any]) -> Any:
    """Drive a clean to its end on the calling thread (tools and tests)."""
    reply: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                step = steps.throw(error) if error is not None else steps.send(reply)
            except StopIteration as done:
                return done.value
            reply, error = None, None
            if step is not None:
                try:
                    reply = step.call()
                except Exception as exc:
                    error = exc
    finally:
        steps.close()
