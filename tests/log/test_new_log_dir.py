"""A new log's directory: made, then its name made durable by its parent's fsync, before
anything is written in it; out of descriptors (EMFILE) never separates the two."""

from __future__ import annotations

import errno
import random

from oncelog.log.log import Log, LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.protocol.record_batch import assign_offsets, split_batches
from oncelog.protocol.records import encode_batch

DIRECTORY = "/data/t-0"
CONFIG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=100)


def put(log: Log, value: bytes) -> None:
    batch = encode_batch([(None, value, (), 1_700_000_000_000)])
    headers = split_batches(batch, 1 << 20)
    headers, parts = assign_offsets(batch, headers, log.log_end_offset, 0)
    log.append(parts, headers)


def test_out_of_descriptors_when_a_log_is_first_made_leaves_no_directory_unsynced():
    """A new log's directory is made, then its parent fsynced. Out of descriptors for that
    fsync used to leave the directory made and its name never fsynced: the retry found it
    there and skipped the fsync, and a power cut could lose the directory with what was
    acknowledged in it. Now the parent's descriptor is taken first: nothing is made."""
    disk = MemoryDisk()
    disk.makedirs("/data")
    disk.max_fds = 0
    try:
        Log(DIRECTORY, CONFIG, disk)
    except OSError as exc:
        assert exc.errno == errno.EMFILE
    else:
        raise AssertionError("a log was made without a descriptor")
    disk.max_fds = None
    assert not disk.isdir(DIRECTORY)
    log = Log(DIRECTORY, CONFIG, disk)  # the retry makes it, and fsyncs its name
    put(log, b"acknowledged")
    log.flush()
    disk.power_loss(random.Random(1))
    assert Log(DIRECTORY, CONFIG, disk).log_end_offset == 1
