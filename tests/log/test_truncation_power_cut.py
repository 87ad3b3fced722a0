"""A follower's truncation into segment 0 deletes segment 5 (the data of an old leader that
diverged) and cuts segment 0. It used to fsync the cut segment, then the directory: a power
cut between the two brought segment 5 back, whole, after a gap, and the start served the
old leader's records the truncation removed after offsets that exist nowhere (records after
a hole). The deletions are made durable before the cut now (Log.truncate_to). Found by the
second review of the seal off the event loop; main before it did the same. And running out
of descriptors: before any change, nothing is done; half way, the directory fails."""

from __future__ import annotations

import errno
import os
import random

from oncelog.log.disk import LogDirFailure
from oncelog.log.log import Log, LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.protocol.record_batch import assign_offsets, split_batches
from oncelog.protocol.records import encode_batch

DIRECTORY = "/data/t-0"
CONFIG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=100)


class CutAfter(MemoryDisk):
    """The power goes once the fsync of segment 0's log is done while ``armed``."""

    armed = False

    def fsync(self, fd: int) -> None:  # type: ignore[override]
        MemoryDisk.fsync(self, fd)
        opened = self._fds.get(fd)
        if self.armed and opened is not None and \
                opened.path.endswith("00000000000000000000.log"):
            raise KeyboardInterrupt("power cut")

    fdatasync = fsync


def put(log: Log, i: int) -> None:
    batch = encode_batch([(None, b"%d" % i + b"." * 200, (), 1_700_000_000_000 + i)])
    headers = split_batches(batch, 1 << 20)
    headers, parts = assign_offsets(batch, headers, log.log_end_offset, 0)
    log.append(parts, headers)


def test_a_truncation_cut_short_by_a_power_cut_keeps_no_record_after_a_hole():
    disk = CutAfter()
    disk.makedirs("/data")
    log = Log(DIRECTORY, CONFIG, disk)
    for i in range(5):
        put(log, i)
    log.roll(*([lambda seal: seal.run()] if "start_seal" in Log.roll.__code__.co_varnames
               else []))
    for i in range(5, 8):
        put(log, i)
    log.flush()  # everything on disk
    disk.armed = True
    try:
        log.truncate_to(2)
    except KeyboardInterrupt:
        pass
    disk.armed = False
    disk.power_loss(random.Random(1))
    reopened = Log(DIRECTORY, CONFIG, disk)
    names = sorted(n for n in disk.listdir(DIRECTORY) if n.endswith(".log"))
    assert reopened.log_end_offset == 2, \
        f"the log ends at {reopened.log_end_offset} after a truncation to 2 ({names})"


def _two_segments(disk: MemoryDisk) -> Log:
    disk.makedirs("/data")
    log = Log(DIRECTORY, CONFIG, disk)
    for i in range(5):
        put(log, i)
    log.roll(lambda seal: seal.run())
    for i in range(5, 8):
        put(log, i)
    log.flush()
    return log


def test_out_of_descriptors_before_a_truncation_changes_nothing():
    """EMFILE (what the broker's other connections hold) at a truncation's start: an
    OSError, the directory still online, every segment still there. Before, the later
    segments were deleted first and the directory's own descriptor was taken only for
    their fsync: running out then left deletions a power cut could undo."""
    disk = MemoryDisk()
    log = _two_segments(disk)
    before = sorted(disk.listdir(DIRECTORY))
    # Not one more, even once segment 5's is closed: before, its deletion went first.
    disk.max_fds = len(disk._fds) - 1
    try:
        log.truncate_to(2)
    except LogDirFailure as exc:
        raise AssertionError(f"the directory failed for want of a descriptor: {exc}") \
            from None
    except OSError as exc:
        assert exc.errno == errno.EMFILE
    else:
        raise AssertionError("the truncation went through without a descriptor")
    disk.max_fds = None
    assert sorted(disk.listdir(DIRECTORY)) == before


class NoNewFiles(MemoryDisk):
    """Out of descriptors for any file created while ``armed``."""

    armed = False

    def open(self, path: str, flags: int, mode: int = 0o777) -> int:  # type: ignore[override]
        if self.armed and flags & os.O_CREAT:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), path)
        return MemoryDisk.open(self, path, flags, mode)


def test_out_of_descriptors_half_way_through_a_truncation_fails_the_directory():
    """Once a truncation has deleted a segment, running out (the new segment's files) is
    the directory's failure: its half-done cut is not left for appends to follow."""
    disk = NoNewFiles()
    log = _two_segments(disk)
    disk.armed = True
    try:
        log.truncate_to(0)  # both segments go; a new one at 0 needs its files
    except LogDirFailure:
        pass
    else:
        raise AssertionError("a half-done truncation was not the directory's failure")

