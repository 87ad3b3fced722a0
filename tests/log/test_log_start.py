"""DeleteRecords in the log: the log start moves inside a segment, is kept in
log-start-offset-checkpoint, and every write of it is all or nothing.

On a MemoryDisk (src/oncelog/log/memory_disk.py) the checkpoint's write meets ENOSPC, EIO, a
short write, a failed fsync, rename or directory fsync, then a crash or a power cut: the log
start after a reopen is the last one acknowledged (or, after a failure that could not say,
the one being written), never lower, never past the log end; reads from it never return a
record below it.
"""

from __future__ import annotations

import errno
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.log_helpers import append, read_values

from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.log.disk import LogDirFailure
from oncelog.log.log import LOG_START_CHECKPOINT_FILE, Log, LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.producer_state.manager import StateLimits
from oncelog.protocol.records import encode_batch

DIRECTORY = "/data/t-0"
CONFIG = LogConfig(segment_bytes=400, index_interval_bytes=100)
CHECKPOINT = f"{DIRECTORY}/{LOG_START_CHECKPOINT_FILE}"


def memory_log(config: LogConfig = CONFIG) -> tuple[MemoryDisk, Log]:
    disk = MemoryDisk()
    disk.makedirs("/data")
    return disk, Log(DIRECTORY, config, disk)


def fill(log: Log, batches: int) -> list[bytes]:
    values = []
    for i in range(batches):
        batch = [b"v%04d-%d" % (i, j) for j in range(3)]
        append(log, batch)
        values += batch
    log.flush()
    return values


def test_log_start_moves_inside_a_segment_and_whole_segments_below_go(tmp_path):
    log = Log(str(tmp_path), CONFIG)
    values = fill(log, 40)
    assert len(log.segments) > 5
    target = log.segments[3].base_offset + 1  # inside the fourth segment
    log.advance_log_start(target)
    assert log.log_start_offset == target
    assert log.base_offset == log.segments[0].base_offset < target  # the fourth stays
    assert len([n for n in tmp_path.iterdir() if n.suffix == ".log"]) == len(log.segments)
    assert read_values(log, log.log_start_offset) == values[target:]
    log.advance_log_start(target - 1)  # never backwards
    assert log.log_start_offset == target
    with pytest.raises(ValueError):
        log.advance_log_start(log.log_end_offset + 1)
    log.advance_log_start(log.log_end_offset)  # everything: the active segment stays, empty
    assert log.log_start_offset == log.log_end_offset == len(values)
    assert len(log.segments) == 1
    log.close()
    reopened = Log(str(tmp_path), CONFIG)
    assert reopened.log_start_offset == len(values)
    append(reopened, [b"after"])
    assert read_values(reopened, reopened.log_start_offset) == [b"after"]
    reopened.close()


def test_segments_left_below_the_log_start_by_a_crash_go_at_the_next_open():
    disk, log = memory_log()
    fill(log, 30)
    target = log.segments[2].base_offset + 2
    # The checkpoint is committed, then the crash comes before any segment is deleted.
    disk.fail("unlink", errno.EIO, path_suffix=".log", times=100)
    log.advance_log_start(target)  # a failed segment deletion is logged, not raised
    disk.clear_faults()
    log.abandon()
    disk.crash()
    reopened = Log(DIRECTORY, CONFIG, disk)
    assert reopened.log_start_offset == target
    assert reopened.segments[0].base_offset <= target < reopened.segments[0].next_offset


def test_a_log_start_past_the_log_end_starts_the_log_over_there():
    """Only a disk that lost synced bytes gets here (the checkpoint is written after the log
    is durable up to it): nothing below the log start is ever served."""
    disk, log = memory_log()
    fill(log, 5)
    log.close()
    fd = disk.open(CHECKPOINT, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    disk.write(fd, b"1000\n")
    disk.close(fd)
    reopened = Log(DIRECTORY, CONFIG, disk)
    assert reopened.log_start_offset == reopened.log_end_offset == 1000
    append(reopened, [b"x"])
    assert read_values(reopened, 1000) == [b"x"]


FAULTS = {
    # name: (op, errno, bytes a write takes before failing, path suffix)
    "enospc": ("write", errno.ENOSPC, 0, ".tmp"),
    "enospc-torn": ("write", errno.ENOSPC, 2, ".tmp"),
    "eio-torn": ("write", errno.EIO, 1, ".tmp"),
    "short": ("write", 0, 1, ".tmp"),  # a short write: the rest goes in after it
    "open": ("open", errno.EMFILE, 0, ".tmp"),
    "fsync": ("fsync", errno.EIO, 0, ".tmp"),
    "rename": ("rename", errno.EIO, 0, ".tmp"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("then", ["crash", "power-loss", "clean"])
def test_a_failed_checkpoint_write_changes_nothing(fault, then):
    disk, log = memory_log()
    values = fill(log, 30)
    first = log.segments[1].base_offset + 1
    log.advance_log_start(first)
    segments = [s.base_offset for s in log.segments]
    op, error, partial, suffix = FAULTS[fault]
    disk.fail(op, error, partial=partial, path_suffix=suffix)
    target = log.segments[3].base_offset + 1
    if fault == "short":
        log.advance_log_start(target)  # finished by the next write
        expected = target
    else:
        with pytest.raises(OSError):
            log.advance_log_start(target)
        expected = first
        assert log.log_start_offset == first
        assert [s.base_offset for s in log.segments] == segments
    if then == "clean":
        log.close()
    else:
        log.abandon()
        if then == "crash":
            disk.crash()
        else:
            disk.power_loss(random.Random(7))
    reopened = Log(DIRECTORY, CONFIG, disk)
    assert reopened.log_start_offset == expected
    assert read_values(reopened, reopened.log_start_offset) == values[expected:]
    assert not any(name.endswith(".tmp") for name in disk.listdir(DIRECTORY))
    reopened.advance_log_start(target + 1)  # and it works again
    assert reopened.log_start_offset == target + 1


@pytest.mark.parametrize("seed", range(4))
def test_a_failed_directory_fsync_is_a_log_dir_failure_and_a_power_cut_keeps_either(seed):
    """After the rename nothing can be undone, and the name is not durable: the log can no
    longer say, so its directory goes offline; a power cut then keeps the old or the new."""
    disk, log = memory_log()
    values = fill(log, 30)
    target = log.segments[2].base_offset + 1
    disk.fail("fsync_dir", errno.EIO, path_suffix="t-0")
    with pytest.raises(LogDirFailure):
        log.advance_log_start(target)
    log.abandon()
    disk.power_loss(random.Random(seed))
    reopened = Log(DIRECTORY, CONFIG, disk)
    assert reopened.log_start_offset in (0, target)
    assert read_values(reopened, reopened.log_start_offset) == \
        values[reopened.log_start_offset:]


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 4)),
        st.tuples(st.just("delete"), st.floats(0, 1)),  # to a fraction of the way to the end
        st.tuples(st.just("retention"), st.integers(0, 1500)),
        st.tuples(st.sampled_from(["crash", "power-loss", "close"]), st.integers(0, 3)),
        st.tuples(st.sampled_from([*sorted(FAULTS), "fsync_dir"]), st.just(0)),
    ),
    min_size=1, max_size=40,
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(ops=OPS)
def test_log_start_only_moves_forward_through_deletes_retention_faults_and_restarts(ops):
    disk, log = memory_log(LogConfig(segment_bytes=300, index_interval_bytes=100))
    expected: list[bytes] = []
    acked = 0  # the log start last acknowledged
    maybe = acked  # what a failure that could not say may have left
    for op, arg in ops:
        if op == "append":
            values = [b"r%d" % (len(expected) + i) for i in range(arg)]
            try:
                append(log, values)
                log.flush()
            except (OSError, LogDirFailure):
                log.abandon()
                disk.clear_faults()
                log = Log(log.dir, log.config, disk)
                assert log.log_end_offset == len(expected)
            else:
                expected += values
        elif op == "delete":
            target = log.log_start_offset + int(arg * (log.log_end_offset -
                                                       log.log_start_offset))
            try:
                log.advance_log_start(target)
                acked = max(acked, target)
            except LogDirFailure:
                maybe = max(acked, target)
                log.abandon()
                disk.clear_faults()
                log = Log(log.dir, log.config, disk)
                assert log.log_start_offset in (acked, maybe)
                acked = log.log_start_offset
            except OSError:
                pass
        elif op == "retention":
            log.config = LogConfig(segment_bytes=300, index_interval_bytes=100,
                                   retention_bytes=arg)
            try:
                log.delete_old_segments(0)
            except OSError:
                pass
            acked = max(acked, log.log_start_offset)
        elif op in ("crash", "power-loss", "close"):
            disk.clear_faults()
            if op == "close":
                log.close()
            else:
                log.abandon()
                if op == "crash":
                    disk.crash()
                else:
                    disk.power_loss(random.Random(arg))
            log = Log(log.dir, log.config, disk)
        else:
            fault_op, error, partial, suffix = FAULTS.get(op, ("fsync_dir", errno.EIO, 0,
                                                               "t-0"))
            disk.fail(fault_op, error, partial=partial, path_suffix=suffix)
        assert log.log_start_offset >= acked, "the log start went back"
        assert log.log_start_offset <= log.log_end_offset == len(expected)
        acked = log.log_start_offset
        assert read_values(log, acked) == expected[acked:]


class IssuedBelow:
    def is_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < 100

    def highest_claimed(self) -> int:
        return 99


def test_producer_state_outlives_delete_records_and_a_restart_as_with_retention():
    """A producer whose batches DeleteRecords put below the log start is still known (its
    retry is a duplicate) in memory and after a crash: the batches are still in the first
    segment's file, and the replay reads them, as retention keeps a producer's state."""
    disk = MemoryDisk()
    disk.makedirs("/data")

    def open_partition() -> Partition:
        return Partition("t", 0, DIRECTORY, CONFIG, 1 << 20, StateLimits(), IssuedBelow(),
                         log_dir=LogDir("/data"), disk=disk)

    partition = open_partition()
    batches = [encode_batch([(None, b"p%d" % i, (), 1)], producer_id=5, producer_epoch=0,
                            base_sequence=i) for i in range(3)]
    for batch in batches:
        partition.append_records(batch)
    assert partition.delete_records(3) == 3
    assert partition.append_records(batches[2]).duplicate
    partition.log.abandon()
    disk.crash()
    partition = open_partition()
    assert partition.log.log_start_offset == 3
    assert partition.append_records(batches[2]).duplicate
    assert partition.last_stable_offset == 3
