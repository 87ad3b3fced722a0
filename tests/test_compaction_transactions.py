"""The log cleaner and transactions, through a real Partition (producer state, markers, the
aborted transaction index) on a MemoryDisk: read_committed is the oracle. Whatever the
offset map's capacity, wherever it fills, a clean never changes what a read_committed
consumer reads as each key's latest value, and never lets an aborted transaction's data be
seen (Kafka never counts an aborted transaction's data as live)."""

from __future__ import annotations

import time

from compaction_model import committed_view, latest_committed
from kio.schema.errors import ErrorCode

from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.log import cleaning
from oncelog.log.compaction import MAP_ENTRY_OVERHEAD, CompactionConfig
from oncelog.log.log import LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.producer_state.manager import StateLimits
from oncelog.producer_state.rules import MarkerIdentity
from oncelog.protocol.records import encode_batch

LOG_DIR = "/data"
NOW = int(time.time() * 1000)


class Issued:
    def is_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < 1000

    def highest_claimed(self) -> int:
        return 999


def accept(_pid: int, _epoch: int) -> ErrorCode:
    return ErrorCode.none


def open_partition(disk: MemoryDisk, segment_bytes: int = 1 << 20) -> Partition:
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=100,
                       compaction=CompactionConfig(min_cleanable_dirty_ratio=0.0,
                                                   delete_retention_ms=1000))
    return Partition("c", 0, "/data/c-0", config, 1 << 20, StateLimits(), Issued(),
                     log_dir=LogDir(LOG_DIR), disk=disk)


def keyed(pid: int, seq: int, records: list[tuple[bytes, bytes | None]],
          transactional: bool = True, epoch: int = 0) -> bytes:
    return encode_batch([(k, v, (), NOW) for k, v in records], producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq, transactional=transactional)


def test_a_full_offset_map_mid_segment_never_makes_an_aborted_transaction_visible():
    """Issue 21, defect 1: the map fills before an aborted transaction in the same sealed
    segment; the whole segment is rewritten, and the abort must still be known there."""
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk)
    p.append_records(keyed(1, 0, [(b"K", b"committed")]), accept)
    p.append_marker(MarkerIdentity(1, 0, 0, True))
    for i in range(6):  # enough keys to fill a map of three
        p.append_records(keyed(3, i, [(b"f%d" % i, b"x")], transactional=False), accept)
    p.append_records(keyed(2, 0, [(b"K", b"aborted")]), accept)
    p.append_marker(MarkerIdentity(2, 0, 0, False))
    p._roll()
    p.append_records(keyed(3, 6, [(b"tail", b"x")], transactional=False), accept)
    expected = latest_committed(p)
    assert expected[b"K"] == b"committed"
    capacity = 3 * (2 + MAP_ENTRY_OVERHEAD)
    cleans = 0
    while cleaning.run(p.clean_steps(NOW, capacity)) is not None:
        cleans += 1
        assert cleans < 10
        assert latest_committed(p) == expected
        assert (b"K", b"aborted") not in {(k, v) for _, k, v in committed_view(p)}
    assert cleans >= 2  # the map filled: the first clean stopped inside the segment
    p.close()
    p = open_partition(disk)
    assert latest_committed(p) == expected
