"""A roll does not wait for the old segment's fsync (log/sealing.py); power lost at any file
operation of rolls whose seals run late loses nothing acknowledged and keeps nothing after a
hole, and what a start keeps is what the next start finds.

The history: batches acknowledged (each flushed), two more left unflushed in segment 0, a
roll whose seal is held, batches in segment 1, a second roll with its seal held, batches in
segment 2, the second seal run before the first, a flush (its batches acknowledged), then
more. The power is cut at each file operation in turn, with a few seeds for what survives of
what was not synced (memory_disk.py), and the partition is opened again as a start opens it.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import errno
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from kio.schema.errors import ErrorCode
from support.power_cuts import CuttingDisk, IssuedBelow, PowerCut

from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.log import cleaning
from oncelog.log.compaction import CompactionConfig
from oncelog.log.disk import LogDirFailure
from oncelog.log.log import Log, LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.producer_state.manager import StateLimits
from oncelog.producer_state.rules import MarkerIdentity
from oncelog.protocol.record_batch import assign_offsets, split_batches
from oncelog.protocol.records import decode_batch, encode_batch

if TYPE_CHECKING:  # (the tests import on main too, where they fail, not at collection)
    from oncelog.log.sealing import Seal

LOG_DIR = "/data"
DIRECTORY = "/data/t-0"
SEEDS = (20261129, 1, 2, 3)
CONFIG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=100)
TIMESTAMP = 1_700_000_000_000
UNSEALED_SUFFIX = ".unsealed"


def append(log: Log, i: int) -> int:
    """Batch ``i`` (one record naming it), at offset ``i``."""
    batch = encode_batch([(None, b"record-%d" % i + b"." * 200, (), TIMESTAMP + i)])
    headers = split_batches(batch, 1 << 20)
    headers, parts = assign_offsets(batch, headers, log.log_end_offset, 0)
    log.append(parts, headers)
    assert headers[0].base_offset == i
    return i


def history(disk: MemoryDisk, acked: list[int]) -> None:
    held: list[Seal] = []
    log = Log(DIRECTORY, CONFIG, disk)
    for i in range(3):
        append(log, i)
        log.flush()
        acked.append(i)
    for i in range(3, 5):
        append(log, i)  # never flushed by itself: the seal makes it durable
    log.roll(held.append)
    for i in range(5, 8):
        append(log, i)
    log.roll(held.append)
    for i in range(8, 10):
        append(log, i)
    assert [s.segment.base_offset for s in held] == [0, 5]
    held.pop().run()  # the later seal ends first
    held.pop().run()
    log.flush()
    acked.extend(range(3, 10))
    append(log, 10)
    log.flush()
    acked.append(10)
    log.close()


def open_partition(disk: MemoryDisk) -> Partition:
    partition = Partition("t", 0, DIRECTORY, CONFIG, 1 << 20, StateLimits(), IssuedBelow(),
                          log_dir=LogDir(LOG_DIR), disk=disk)
    assert partition.state is not None  # opened as a start opens it
    return partition


def batches(partition: Partition) -> list[int]:
    """The batch each offset holds, from 0 to the log end: whatever is read must be batch i
    at offset i, with nothing missing before the end (no hole)."""
    plog = partition.log
    found = []
    while len(found) < plog.log_end_offset:
        data = plog.read(len(found), 1 << 20).records
        assert data, f"nothing readable at {len(found)} below the log end {plog.log_end_offset}"
        pos = 0
        while pos < len(data):
            header, records = decode_batch(data, pos)
            assert header.base_offset == len(found), "offsets are not contiguous"
            found.append(int(records[0].value.split(b".")[0][len(b"record-"):]))
            pos += header.size
    return found


def test_power_lost_at_any_step_of_rolls_with_seals_in_flight(caplog):
    caplog.set_level(logging.WARNING, logger="oncelog.log.log")
    whole = CuttingDisk()
    whole.makedirs(LOG_DIR)
    history(whole, [])
    steps = whole.done[:]
    assert any(s.startswith("fdatasync 00000000000000000000.log") for s in steps)
    assert any(s.startswith("unlink 00000000000000000005.unsealed") for s in steps)
    first = next(i for i, s in enumerate(steps) if UNSEALED_SUFFIX in s)
    print(f"{len(steps)} file operations, the power cut at each from #{first} "
          f"({steps[first]}), seeds {SEEDS}")
    outcomes: collections.Counter[str] = collections.Counter()
    for cut_at in range(first, len(steps) + 1):
        for seed in SEEDS:
            disk = CuttingDisk()
            disk.makedirs(LOG_DIR)
            disk.cut_at = cut_at
            acked: list[int] = []
            if cut_at < len(steps):
                with pytest.raises(PowerCut):
                    history(disk, acked)
            else:
                history(disk, acked)
            disk.restore()
            disk.power_loss(random.Random(seed))
            caplog.clear()
            partition = open_partition(disk)
            kept = batches(partition)
            where = f"the power cut at #{cut_at} ({steps[cut_at - 1]} done), seed {seed}"
            assert kept == list(range(len(kept))), where
            assert len(kept) > max(acked), f"acknowledged batches lost: {where}"
            assert not [n for n in disk.listdir(DIRECTORY) if n.endswith(UNSEALED_SUFFIX)], \
                where
            if "records after a hole" in caplog.text:
                outcomes["segments after a hole dropped"] += 1
            outcomes[f"{len(kept)} batches kept"] += 1
            # What the start kept is on disk, indexes included: the power lost again, and a
            # clean restart, find it all.
            partition.abandon()
            disk.power_loss(random.Random(seed + 1))
            again = open_partition(disk)
            assert batches(again) == kept, where
            again.close()
            assert batches(open_partition(disk)) == kept, where
    print(dict(outcomes))
    assert outcomes["segments after a hole dropped"] > 0


def test_a_seal_is_cancelled_by_a_deletion_and_the_cleaner_stops_before_it():
    """Retention deletes a segment whose seal has not run: the seal writes no file after
    (no index of a deleted segment, no marker removed behind it); the cleaner's bound stops
    at the first segment not sealed for good."""
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    log = Log(DIRECTORY, LogConfig(retention_bytes=0, index_interval_bytes=100), disk)
    held: list[Seal] = []
    append(log, 0)
    log.roll(held.append)
    append(log, 1)
    assert log.sealed_end == 0
    assert log.delete_old_segments(TIMESTAMP) == 1
    assert log.sealed_end == 1
    held[0].run()
    held[0].check()
    names = disk.listdir(DIRECTORY)
    assert not any(n.startswith("00000000000000000000") for n in names), names


def test_a_failed_fsync_of_a_seal_fails_the_flush_and_the_close():
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    log = Log(DIRECTORY, CONFIG, disk)
    held: list[Seal] = []
    append(log, 0)
    log.roll(held.append)
    append(log, 1)
    disk.fail("fsync", path_suffix="00000000000000000000.log")
    held[0].run()
    with pytest.raises(LogDirFailure):
        log.flush()
    with pytest.raises(LogDirFailure):
        log.close()
    assert "00000000000000000000.unsealed" in disk.listdir(DIRECTORY)


@pytest.mark.parametrize("op,suffix", [
    ("open", ".unsealed"),  # the marker not made (ENOSPC)
    ("open", "00000000000000000001.log"),  # the new segment not made (ENOSPC)
])
def test_a_roll_that_fails_leaves_the_log_as_it_was(op, suffix):
    """A step of a roll before the new segment is in place fails: the roll raises, the old
    segment stays the one appended to, no marker is left behind, and the log opens again
    with everything appended."""
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    log = Log(DIRECTORY, CONFIG, disk)
    held: list[Seal] = []
    append(log, 0)
    disk.fail(op, errno.ENOSPC, path_suffix=suffix)
    with pytest.raises(OSError):
        log.roll(held.append)
    assert not held and len(log.segments) == 1
    assert "00000000000000000000.unsealed" not in disk.listdir(DIRECTORY)
    append(log, 1)
    log.flush()
    log.close()
    reopened = Log(DIRECTORY, CONFIG, disk)
    assert reopened.log_end_offset == 2 and len(reopened.segments) == 1


def test_a_roll_whose_directory_fsync_fails_fails_the_directory_and_keeps_what_was_on_disk():
    """The directory fsync that makes the marker and the new segment's name durable fails:
    LogDirFailure (the directory goes offline), and after a power cut the next start keeps
    every batch that was on disk, the old segment recovered from its marker if it came
    back."""
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    log = Log(DIRECTORY, CONFIG, disk)
    for i in range(3):
        append(log, i)
    log.flush()
    disk.fail("fsync_dir", errno.EIO, path_suffix="t-0")
    with pytest.raises(LogDirFailure):
        log.roll(lambda seal: None)
    log.abandon()
    for seed in range(8):
        cut = copy.deepcopy(disk)
        cut.power_loss(random.Random(seed))
        reopened = Log(DIRECTORY, CONFIG, cut)
        assert reopened.log_end_offset == 3, seed
        reopened.close()


def test_a_segment_recovered_from_its_marker_keeps_its_aborted_transactions():
    """An abort in a segment whose seal the power cut short (at each of its steps): the start
    recovers the segment, producer state's replay rebuilds its aborted transaction index,
    and only then is the segment sealed, so that a clean restart still finds the abort."""
    config = LogConfig(segment_bytes=400, index_interval_bytes=100, flush_messages=1)

    def partition(disk: MemoryDisk) -> Partition:
        p = Partition("t", 0, DIRECTORY, config, 1 << 20, StateLimits(), IssuedBelow(),
                      log_dir=LogDir(LOG_DIR), disk=disk)
        assert p.state is not None
        return p

    def aborted(p: Partition) -> list[tuple[int, int, int]]:
        end = p.log.log_end_offset
        return [(a.producer_id, a.first_offset, a.last_offset)
                for a in p.aborted_transactions(0, end)]

    def history(disk: MemoryDisk) -> Partition:
        p = partition(disk)
        now = int(time.time() * 1000)  # markers carry the clock's time: no roll by age
        p.append_records(encode_batch([(None, b"aborted", (), now)], producer_id=1,
                                      producer_epoch=0, base_sequence=0, transactional=True),
                         lambda pid, epoch: ErrorCode.none)
        p.flush_now()
        p.append_marker(MarkerIdentity(1, 0, 0, False))
        p.flush_now()
        for i in range(4):  # the roll comes among these
            p.append_records(encode_batch([(None, b"v" * 150, (), now + i)]))
            p.flush_now()
        return p

    whole = CuttingDisk()
    whole.makedirs(LOG_DIR)
    assert aborted(history(whole)) == [(1, 0, 1)]
    steps = whole.done[:]
    seal = [i for i, s in enumerate(steps)
            if s == "fdatasync 00000000000000000000.log" and
            "open 00000000000000000000.unsealed" in steps[:i]]
    unmarked = steps.index("unlink 00000000000000000000.unsealed")
    for cut_at in range(seal[0], unmarked + 1):
        disk = CuttingDisk()
        disk.makedirs(LOG_DIR)
        disk.cut_at = cut_at
        with pytest.raises(PowerCut):
            history(disk)
        disk.restore()
        disk.power_loss(random.Random(cut_at))
        where = f"the power cut before #{cut_at} ({steps[cut_at]})"
        assert aborted(partition(disk)) == [(1, 0, 1)], where
        partition(disk).close()  # clean: the next start trusts the index files
        assert aborted(partition(disk)) == [(1, 0, 1)], where


# --- the seal's failures, and its cancelling --------------------------------------------

def test_a_failed_index_write_of_a_seal_is_retried_and_never_holds_the_cleaner(caplog):
    """The offset index of a rolled segment cannot be written (a full disk): its marker
    stays (a start would recover the segment), and the cleaner, which stops before a marked
    segment, looks at the partition: the seal's files are written again then, and the
    clean goes on."""
    config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=100,
                       compaction=CompactionConfig(min_cleanable_dirty_ratio=0.0))
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    p = Partition("t", 0, DIRECTORY, config, 1 << 20, StateLimits(), IssuedBelow(),
                  log_dir=LogDir(LOG_DIR), disk=disk)
    for i in range(6):
        p.append_records(encode_batch([(b"k%d" % (i % 2), b"v%d" % i, (), TIMESTAMP + i)]))
    disk.fail("write", errno.ENOSPC, path_suffix=".index.tmp")
    p._roll()  # no event loop: the seal runs in place, and its offset index fails
    p.append_records(encode_batch([(b"k9", b"active", (), TIMESTAMP + 9)]))
    names = disk.listdir(DIRECTORY)
    assert "00000000000000000000.unsealed" in names and \
        "00000000000000000000.index" not in names, names
    assert "writing its index" in caplog.text
    now = TIMESTAMP + 1000
    where = p.cleanable(now)
    assert where is not None and where.first_uncleanable == 6, where
    names = disk.listdir(DIRECTORY)
    assert "00000000000000000000.unsealed" not in names and \
        "00000000000000000000.index" in names, names
    assert not [n for n in names if n.endswith(".tmp")], names
    result = cleaning.run(p.clean_steps(now, 1 << 20))
    assert result is not None and result.records_removed == 4
    p.close()
    assert not p.log_dir.offline


def test_a_sealed_segments_marker_never_comes_back_for_damage_to_drop_what_follows():
    """A seal removes its marker after the segment's fsync, and makes the removal durable:
    a power cut later never brings the marker back. (Were it back, the start would scan the
    whole segment as one whose seal was cut short, and media damage found inside it would
    drop every later segment: acknowledged batches, undamaged.)"""
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    log = Log(DIRECTORY, CONFIG, disk)
    held: list[Seal] = []
    for i in range(5):
        append(log, i)
    log.roll(held.append)
    held[0].run()
    held[0].check()
    for i in range(5, 10):
        append(log, i)
    log.flush()  # all ten on disk: acknowledged
    # A bit rots inside batch 2's record (no header field: only its CRC can tell).
    inode = disk._files[os.path.join(DIRECTORY, "00000000000000000000.log")]
    position = log.segments[0].position_of(2) + 100
    inode.data[position] ^= 0xFF
    inode.durable = bytes(inode.data)
    log.abandon()
    disk.power_loss(random.Random(SEEDS[0]))
    reopened = Log(DIRECTORY, CONFIG, disk)
    assert reopened.log_end_offset == 10
    data = reopened.read(5, 1 << 20).records
    kept, pos = [], 0
    while pos < len(data):
        header, records = decode_batch(data, pos)
        kept.append(int(records[0].value.split(b".")[0][len(b"record-"):]))
        pos += header.size
    assert kept == list(range(5, 10))


class IndexWriteGate(MemoryDisk):
    """The first write, by a thread other than the test's, to a file whose name ends in
    ``.index.tmp`` (a seal's offset index) signals ``reached`` and waits for ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.reached = threading.Event()
        self.release = threading.Event()

    def write(self, fd: int, data) -> int:  # type: ignore[override]
        opened = self._fds.get(fd)
        if opened is not None and opened.path.endswith(".index.tmp") and \
                threading.current_thread() is not threading.main_thread() and \
                not self.reached.is_set():
            self.reached.set()
            assert self.release.wait(10), "the test never opened the gate"
        return MemoryDisk.write(self, fd, data)


def test_cancelling_a_seal_waits_for_none_of_its_index_writes(monkeypatch):
    """Retention deletes a segment whose seal is writing its index files (held at its first
    write): the deletion cancels the seal without waiting for that write (on the event
    loop, it would stall every connection; the branch's cancel gave up after the bound),
    and the seal then leaves no file behind."""
    from oncelog.log import sealing  # (imported here: the tests run against main too)

    monkeypatch.setattr(sealing, "SEAL_WAIT_S", 1.0)
    disk = IndexWriteGate()
    disk.makedirs(LOG_DIR)
    log = Log(DIRECTORY, LogConfig(retention_bytes=0, index_interval_bytes=100), disk)
    held: list[Seal] = []
    append(log, 0)
    log.roll(held.append)
    append(log, 1)
    worker = threading.Thread(target=held[0].run)
    worker.start()
    try:
        assert disk.reached.wait(10)
        assert log.delete_old_segments(TIMESTAMP) == 1
    finally:
        disk.release.set()
        worker.join(10)
    assert held[0].done and held[0].error is None and not held[0].unmarked
    names = disk.listdir(DIRECTORY)
    assert not [n for n in names if n.startswith("00000000000000000000")], names
    log.close()


# --- a power cut at every step of retention, DeleteRecords, a truncation and a clean, with a
# seal in flight -------------------------------------------------------------------------

def put(log: Log, i: int, tag: bytes = b"a", key: bytes | None = None) -> bytes:
    """Batch ``i`` of generation ``tag`` at offset ``i``; returns its value's name."""
    name = b"%d:%s" % (i, tag)
    batch = encode_batch([(key, name + b"|" + b"." * 200, (), TIMESTAMP + i)])
    headers = split_batches(batch, 1 << 20)
    headers, parts = assign_offsets(batch, headers, log.log_end_offset, 0)
    log.append(parts, headers)
    assert headers[0].base_offset == i
    return name


def kept_values(partition: Partition) -> list[bytes]:
    """The batches from the log start to the log end: one at each offset (no hole, none
    twice), each the batch put there."""
    plog, found = partition.log, []
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        data = plog.read(offset, 1 << 20).records
        assert data, f"nothing readable at {offset} below the log end {plog.log_end_offset}"
        pos = 0
        while pos < len(data):
            header, records = decode_batch(data, pos)
            assert header.base_offset == offset, "offsets are not contiguous"
            name = records[0].value.split(b"|")[0]
            assert int(name.split(b":")[0]) == offset, (name, offset)
            found.append(name)
            offset = header.last_offset + 1
            pos += header.size
    return found


class Acks:
    """What a history put, what of it was acknowledged (a flush returned after it), and
    below which offset retention or DeleteRecords may have taken it away."""

    def __init__(self) -> None:
        self.appended: dict[int, bytes] = {}
        self.acked: dict[int, bytes] = {}
        self.floor = 0

    def put(self, log: Log, i: int, tag: bytes = b"a", key: bool = False) -> None:
        self.appended[i] = put(log, i, tag, b"k%d" % i if key else None)

    def flush(self, log: Log) -> None:
        log.flush()
        self.acked.update((o, v) for o, v in self.appended.items() if o < log.log_end_offset)

    def truncating_to(self, offset: int) -> None:
        assert all(o < offset for o in self.acked), "a history never cuts what it acknowledged"
        self.appended = {o: v for o, v in self.appended.items() if o < offset}

    def required(self) -> set[bytes]:
        return {v for o, v in self.acked.items() if o >= self.floor}


def two_segments(disk: MemoryDisk, acks: Acks) -> tuple[Log, list[Seal]]:
    """Values 0-4 acknowledged in segment 0, rolled (its seal held), 5-7 put in segment 5."""
    log = Log(DIRECTORY, CONFIG, disk)
    held: list[Seal] = []
    for i in range(5):
        acks.put(log, i)
    acks.flush(log)
    log.roll(held.append)
    for i in range(5, 8):
        acks.put(log, i)
    return log, held


def retention_history(seal_first: bool) -> Callable[[MemoryDisk, Acks], None]:
    """Retention deletes segment 0 (two batches on disk only by its seal), then segment 5,
    each while its seal is held (or, ``seal_first``, just after the first seal ran)."""
    def history(disk: MemoryDisk, acks: Acks) -> None:
        log = Log(DIRECTORY, CONFIG, disk)
        held: list[Seal] = []
        for i in range(3):
            acks.put(log, i)
        acks.flush(log)
        for i in range(3, 5):
            acks.put(log, i)
        log.roll(held.append)
        for i in range(5, 8):
            acks.put(log, i)
        if seal_first:
            held.pop().run()
        log.config = dataclasses.replace(CONFIG, retention_bytes=0)
        acks.floor = 5
        assert log.delete_old_segments(TIMESTAMP) == 1
        for seal in held:  # cancelled by the deletion: its fsync only
            seal.run()
        held.clear()
        acks.flush(log)
        log.roll(held.append)
        for i in range(8, 10):
            acks.put(log, i)
        acks.floor = 8
        assert log.delete_old_segments(TIMESTAMP) == 1
        acks.flush(log)
        held.pop().run()
        acks.put(log, 10)
        acks.flush(log)
        log.close()
    return history


def delete_records_history(disk: MemoryDisk, acks: Acks) -> None:
    """DeleteRecords to offset 8 deletes segments 0 and 5, the seal of 5 held."""
    log, held = two_segments(disk, acks)
    held.pop().run()
    acks.flush(log)
    log.roll(held.append)
    for i in range(8, 10):
        acks.put(log, i)
    acks.floor = 8
    log.advance_log_start(8)  # what precedes it is on disk (the caller's promise)
    held.pop().run()
    acks.flush(log)
    acks.put(log, 10)
    acks.flush(log)
    log.close()


def truncation_history(seal_first: bool) -> Callable[[MemoryDisk, Acks], None]:
    """A follower's cut to offset 6 with the seals of segments 0 and 5 held (or,
    ``seal_first``, the first one run), then the log opened again as the partition opens
    it after a cut, and written to."""
    def history(disk: MemoryDisk, acks: Acks) -> None:
        log, held = two_segments(disk, acks)
        if seal_first:
            held.pop().run()
        log.roll(held.append)
        for i in range(8, 10):
            acks.put(log, i)
        acks.truncating_to(6)
        log.truncate_to(6)
        log.abandon()
        for seal in held:  # cancelled: their fsync only
            seal.run()
        reopened = Log(DIRECTORY, CONFIG, disk)
        reopened.seal_recovered()
        acks.flush(reopened)
        for i in range(6, 8):
            acks.put(reopened, i, b"b")
        acks.flush(reopened)
        reopened.close()
    return history


def clean_history(disk: MemoryDisk, acks: Acks) -> None:
    """A compacted log of unique keys: the clean rewrites segments 0 and 4 and swaps them
    in while the seal of segment 8 is held."""
    config = dataclasses.replace(CONFIG, compaction=CompactionConfig(
        min_cleanable_dirty_ratio=0.0))
    log = Log(DIRECTORY, config, disk)
    held: list[Seal] = []
    for first in (0, 4):
        for i in range(first, first + 4):
            acks.put(log, i, key=True)
        acks.flush(log)
        log.roll(held.append)
        held.pop().run()
    for i in range(8, 10):
        acks.put(log, i, key=True)
    log.roll(held.append)
    for i in range(10, 12):
        acks.put(log, i, key=True)
    result = cleaning.run(cleaning.clean(log, {}, TIMESTAMP + 100, 1 << 20))
    assert result is not None and result.segments_before == 2
    held.pop().run()
    acks.flush(log)
    log.close()


@pytest.mark.parametrize("history", [
    pytest.param(retention_history(False), id="retention-seal-held"),
    pytest.param(retention_history(True), id="retention-seal-run-first"),
    pytest.param(delete_records_history, id="delete-records"),
    pytest.param(truncation_history(False), id="truncation-seals-held"),
    pytest.param(truncation_history(True), id="truncation-first-seal-run"),
    pytest.param(clean_history, id="clean"),
])
def test_power_lost_at_any_step_with_a_seal_in_flight_keeps_every_acknowledged_batch(
        history):
    """Every acknowledged batch (not deleted by retention or DeleteRecords before the cut)
    is there after a power cut at each file operation, once, at its offset, with nothing
    after a hole; and what the start kept is what the next starts find."""
    whole = CuttingDisk()
    whole.makedirs(LOG_DIR)
    history(whole, Acks())
    steps = whole.done[:]
    for cut_at in range(len(steps) + 1):
        for seed in SEEDS[:2]:
            disk = CuttingDisk()
            disk.makedirs(LOG_DIR)
            disk.cut_at = cut_at
            acks = Acks()
            try:
                history(disk, acks)
            except PowerCut:
                pass
            disk.restore()
            disk.power_loss(random.Random(seed))
            where = f"the power cut at #{cut_at} ({steps[cut_at - 1] if cut_at else '-'} " \
                    f"done), seed {seed}"
            partition = open_partition(disk)
            kept = kept_values(partition)
            assert acks.required() <= set(kept), f"acknowledged batches lost: {where}"
            assert not [n for n in disk.listdir(DIRECTORY) if n.endswith(UNSEALED_SUFFIX)], \
                where
            partition.abandon()
            disk.power_loss(random.Random(seed + 1))
            again = open_partition(disk)
            assert kept_values(again) == kept, where
            again.close()
            assert kept_values(open_partition(disk)) == kept, where
