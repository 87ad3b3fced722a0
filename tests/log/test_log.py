"""The partition log on real files: append, read, roll, indexes, recovery, retention."""

import errno
import os

from hypothesis import given, settings
from hypothesis import strategies as st
from support.log_helpers import NOW, append, read_values

from oncelog.log.log import Log, LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.protocol.record_batch import read_header
from oncelog.protocol.records import encode_batch


def test_append_assigns_consecutive_offsets(tmp_path):
    log = Log(str(tmp_path), LogConfig())
    assert append(log, [b"a", b"b", b"c"]) == (0, 2)
    assert append(log, [b"d"]) == (3, 3)
    assert log.log_end_offset == 4
    assert read_values(log) == [b"a", b"b", b"c", b"d"]
    assert read_values(log, 2) == [b"c", b"d"]


def test_segments_roll_by_size_and_reads_cross_them(tmp_path):
    log = Log(str(tmp_path), LogConfig(segment_bytes=1000, index_interval_bytes=100))
    for i in range(100):
        append(log, [b"value-%03d" % i] * 3)
    assert len(log.segments) > 10
    assert all(s.size <= 1000 for s in log.segments)
    assert read_values(log) == [b"value-%03d" % (i // 3) for i in range(300)]
    assert read_values(log, 151) == [b"value-%03d" % (i // 3) for i in range(151, 300)]


def test_read_returns_whole_batches_within_max_bytes(tmp_path):
    log = Log(str(tmp_path), LogConfig())
    for _ in range(10):
        append(log, [b"x" * 100])
    one = len(log.read(0, 1 << 20).records) // 10
    assert len(log.read(0, one * 3 + one // 2).records) == one * 3
    # a batch larger than max_bytes still comes whole when it is the first (KIP-74)
    assert len(log.read(0, 10).records) == one
    assert log.read(0, 10, min_one_batch=False).records == b""


def test_segment_rolls_by_the_age_of_its_records(tmp_path):
    """KAFKA-4099: the incoming batch's timestamp against the segment's first batch's."""
    log = Log(str(tmp_path), LogConfig(segment_ms=60_000))
    append(log, [b"old"], timestamp=NOW - 120_000)
    append(log, [b"new"])
    assert [s.base_offset for s in log.segments] == [0, 1]


def test_backfilled_old_records_do_not_roll_a_segment_per_batch(tmp_path):
    """Records from 2023 arriving today: one segment, not one per batch."""
    log = Log(str(tmp_path), LogConfig(segment_ms=60_000))
    old = 1_690_000_000_000  # July 2023
    for i in range(50):
        append(log, [b"backfill-%d" % i], timestamp=old + i * 100)
    assert len(log.segments) == 1
    append(log, [b"later"], timestamp=old + 61_000 + 50 * 100)  # a minute of record time
    assert len(log.segments) == 2


def test_segment_without_timestamps_rolls_by_the_broker_clock(tmp_path):
    log = Log(str(tmp_path), LogConfig(segment_ms=60_000))
    append(log, [b"a"], timestamp=-1)
    log.active.created_at_ms -= 120_000  # created two minutes ago
    append(log, [b"b"], timestamp=-1)
    assert [s.base_offset for s in log.segments] == [0, 1]


def test_clean_reopen_trusts_indexes(tmp_path):
    log = Log(str(tmp_path), LogConfig(segment_bytes=2000, index_interval_bytes=200))
    for i in range(50):
        append(log, [b"v%d" % i] * 5)
    before = [(s.base_offset, s.next_offset, list(s.offset_index.positions)) for s in log.segments]
    log.close()
    assert os.path.exists(tmp_path / ".clean_shutdown")
    reopened = Log(str(tmp_path), LogConfig(segment_bytes=2000, index_interval_bytes=200))
    after = [(s.base_offset, s.next_offset, list(s.offset_index.positions))
             for s in reopened.segments]
    assert after == before
    assert read_values(reopened) == [b"v%d" % (i // 5) for i in range(250)]


def test_unclean_reopen_truncates_torn_tail(tmp_path):
    log = Log(str(tmp_path), LogConfig())
    append(log, [b"a"])
    append(log, [b"b"])
    size = log.active.size
    with open(log.active.path, "ab") as f:
        f.write(encode_batch([(None, b"torn", (), NOW)])[:40])
    reopened = Log(str(tmp_path), LogConfig())  # no clean-shutdown marker
    assert reopened.active.size == size
    assert reopened.log_end_offset == 2
    assert append(reopened, [b"c"]) == (2, 2)
    assert read_values(reopened) == [b"a", b"b", b"c"]


def test_a_segment_takes_on_disk_what_its_data_takes(tmp_path):
    """Issue 28 #6: nothing is reserved past the data (fallocate reserved 8x each append of
    128 KiB or more until the roll, invisible to DescribeLogDirs and retention.bytes, so
    43 MB of records filled a 365 MB volume). As Kafka (no preallocation on Linux), the
    blocks a segment holds are its data's, so the sizes reported are the space used."""
    config = LogConfig(segment_bytes=3 << 20)
    log = Log(str(tmp_path), config)
    values = [bytes([i % 256]) * 1000 for i in range(300)]  # batches of about 300 KB
    for _ in range(12):
        append(log, values)
    assert len(log.segments) > 1
    for segment in log.segments:
        stat = os.stat(segment.path)
        assert stat.st_size == segment.size
        assert stat.st_blocks * 512 < stat.st_size + 64 * 1024, segment.path
    log.close()
    assert read_values(Log(str(tmp_path), config)) == values * 12


def test_corrupt_batch_is_cut_with_everything_after_it(tmp_path):
    log = Log(str(tmp_path), LogConfig())
    for v in (b"a", b"b", b"c"):
        append(log, [v])
    flip_byte(log.active.path, log.active.position_of(1) + 65)  # inside the record: bad CRC
    reopened = Log(str(tmp_path), LogConfig())
    assert reopened.log_end_offset == 1
    assert read_values(reopened) == [b"a"]


def test_damaged_base_offset_is_cut_although_the_crc_does_not_cover_it(tmp_path):
    log = Log(str(tmp_path), LogConfig())
    for v in (b"a", b"b", b"c"):
        append(log, [v])
    flip_byte(log.active.path, log.active.position_of(2))  # high byte of the base offset
    reopened = Log(str(tmp_path), LogConfig())
    assert reopened.log_end_offset == 2
    assert read_values(reopened) == [b"a", b"b"]


def test_gaps_a_follower_took_from_a_compacted_leader_survive_an_unclean_restart(tmp_path):
    """A follower appends a compacted leader's batches with the gaps between them, in the
    segment it appends to; recovery after an unclean stop used to take that segment for a
    contiguous one and cut it at the first gap, with every batch after it (found by a
    review of the segment seal: log end 7 became 1)."""
    from oncelog.protocol.record_batch import assign_offsets, split_batches

    log = Log(str(tmp_path), LogConfig())
    for base, value in ((0, b"a"), (3, b"b"), (6, b"c")):  # 1-2 and 4-5 compacted away
        batch = encode_batch([(None, value, (), NOW)])
        headers, parts = assign_offsets(batch, split_batches(batch, 1 << 30), base, 0)
        log.append(parts, headers)
    log.flush()
    assert log.log_end_offset == 7
    reopened = Log(str(tmp_path), LogConfig())  # not closed: the last segment is recovered
    assert reopened.log_end_offset == 7
    assert read_values(reopened) == [b"a", b"b", b"c"]


def flip_byte(path: str, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_bad_index_is_rebuilt(tmp_path):
    config = LogConfig(segment_bytes=1500, index_interval_bytes=100)
    log = Log(str(tmp_path), config)
    for i in range(40):
        append(log, [b"v%d" % i])
    log.close()
    first = Log(str(tmp_path), config).segments[0]
    with open(first.offset_index.path, "wb") as f:
        f.write(b"\x00\x00\x00\x05\x7f\xff\xff\xff")  # a position beyond the segment
    reopened = Log(str(tmp_path), config)
    assert read_values(reopened) == [b"v%d" % i for i in range(40)]
    assert len(reopened.segments[0].offset_index) > 1


def test_retention_by_time_deletes_old_segments_and_rolls_idle_active(tmp_path):
    log = Log(str(tmp_path), LogConfig(segment_bytes=500, retention_ms=60_000))
    for i in range(20):
        append(log, [b"old-%d" % i] * 3, timestamp=NOW - 3_600_000)
    assert len(log.segments) > 3
    deleted = log.delete_old_segments(NOW)
    assert deleted >= 3
    assert len(log.segments) == 1 and log.active_expired(NOW)
    log.roll()  # the partition rolls an expired active segment (with a snapshot), then
    assert log.delete_old_segments(NOW) == 1
    assert log.log_start_offset == log.log_end_offset == 60
    assert append(log, [b"fresh"]) == (60, 60)
    assert read_values(log, 60) == [b"fresh"]


def test_retention_by_size_keeps_the_newest(tmp_path):
    log = Log(str(tmp_path), LogConfig(segment_bytes=500, retention_ms=-1, retention_bytes=1000))
    for i in range(30):
        append(log, [b"v%02d" % i] * 3)
    log.delete_old_segments(NOW)
    assert log.size - log.segments[0].size < 1000
    assert log.log_start_offset > 0
    start = log.log_start_offset
    assert read_values(log, start) == [b"v%02d" % (i // 3) for i in range(start, 90)]


def test_offset_for_timestamp(tmp_path):
    log = Log(str(tmp_path), LogConfig(segment_bytes=400, index_interval_bytes=50))
    for i in range(30):
        append(log, [b"t%d" % i], timestamp=1_000 + i * 10)
    for target, expected in ((0, 0), (1_000, 0), (1_001, 1), (1_150, 15), (1_290, 29)):
        base, ts = log.offset_for_timestamp(target)
        assert base == expected and ts == 1_000 + expected * 10
    assert log.offset_for_timestamp(1_291) is None


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(1, 5), st.integers(1, 300)),
            st.tuples(st.just("reopen"), st.booleans(), st.just(0)),
            # the next write fails after taking this many bytes (ENOSPC, EIO), or is short
            st.tuples(st.sampled_from(["enospc", "eio", "short"]), st.integers(0, 400),
                      st.just(0)),
        ),
        min_size=1, max_size=40,
    )
)
def test_log_matches_a_list_through_appends_faults_and_reopens(ops):
    """On a MemoryDisk: a write that fails anywhere (a batch, an index or snapshot written
    by a roll) leaves the log exactly as it was; a short write is finished."""
    disk = MemoryDisk()
    directory = "/data/t-0"
    disk.makedirs("/data")
    config = LogConfig(segment_bytes=2000, index_interval_bytes=150)
    log = Log(directory, config, disk)
    expected: list[bytes] = []
    for op, a, b in ops:
        if op == "append":
            values = [bytes([len(expected) % 251]) * b + b"-%d" % (len(expected) + i)
                      for i in range(a)]
            try:
                append(log, values)
            except OSError:
                pass  # refused, and nothing of it stayed
            else:
                expected += values
        elif op == "reopen":
            disk.clear_faults()
            if a:
                log.close()
            else:
                log.abandon()
                disk.crash()
            log = Log(directory, config, disk)
        else:
            error = {"enospc": errno.ENOSPC, "eio": errno.EIO, "short": 0}[op]
            disk.fail("write", error, partial=a)
        assert log.log_end_offset == len(expected)
        assert read_values(log) == expected
    for offset in range(0, len(expected), max(1, len(expected) // 7)):
        data = log.read(offset, 1).records
        assert read_header(data).base_offset <= offset <= read_header(data).last_offset
