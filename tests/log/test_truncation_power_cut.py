"""A follower's truncation into segment 0 deletes segment 5 (the data of an old leader that
diverged) and cuts segment 0. It used to fsync the cut segment, then the directory: a power
cut between the two brought segment 5 back, whole, after a gap, and the start served the
old leader's records the truncation removed after offsets that exist nowhere (records after
a hole). The deletions are made durable before the cut now (Log.truncate_to). Found by the
second review of the seal off the event loop; main before it did the same."""

from __future__ import annotations

import random

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
