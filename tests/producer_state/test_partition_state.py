"""Producer state through a real partition on disk: snapshots, restarts, crashes, retention."""

import os
import time

import pytest
from kio.schema.errors import ErrorCode

from oncelog.broker.partition import Partition
from oncelog.log.log import LogConfig
from oncelog.producer_state.manager import StateLimits
from oncelog.protocol.record_batch import InvalidBatch
from oncelog.protocol.records import encode_batch
from oncelog.protocol.validation import LONG_MAX, RecordRules

NOW = int(time.time() * 1000)


class IssuedBelow:
    """Producer ids the cluster has issued: those below ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def is_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < self.limit

    def highest_claimed(self) -> int:
        return self.limit - 1


# Any timestamp, as with Kafka 3's message.timestamp.after.max.ms: these tests are about
# what the clients' clocks do to producer state.
ANY_TIMESTAMP = RecordRules(timestamp_after_max_ms=LONG_MAX)


def open_partition(directory, segment_bytes=1 << 30, ids=None, **limits) -> Partition:
    return Partition("t", 0, str(directory), LogConfig(segment_bytes=segment_bytes),
                     1 << 20, StateLimits(**limits), ids or IssuedBelow(1000), ANY_TIMESTAMP)


def batch(pid: int, first_seq: int, count: int = 2, epoch: int = 0) -> bytes:
    return encode_batch([(None, b"r%d" % (first_seq + i), (), NOW) for i in range(count)],
                        producer_id=pid, producer_epoch=epoch, base_sequence=first_seq)


def crash(partition: Partition) -> None:
    """What kill -9 leaves: files as written, no snapshot at the end, no clean marker."""
    for segment in partition.log.segments:
        segment.close()


def test_snapshot_written_at_every_roll(tmp_path):
    p = open_partition(tmp_path, segment_bytes=300)
    for seq in range(0, 20, 2):
        p.append_records(batch(7, seq))
    snapshots = sorted(f for f in os.listdir(tmp_path) if f.endswith(".snapshot"))
    assert snapshots, "no snapshot at roll"
    assert len(snapshots) <= 3  # only the newest few are kept
    bases = {f[:-4] for f in os.listdir(tmp_path) if f.endswith(".log")}
    assert {f[:-9] for f in snapshots} <= bases


def test_clean_restart_keeps_all_cached_batches(tmp_path):
    p = open_partition(tmp_path)
    offsets = [p.append_records(batch(7, seq)).base_offset for seq in range(0, 10, 2)]
    p.close()
    p = open_partition(tmp_path)
    for seq, offset in zip(range(0, 10, 2), offsets, strict=True):
        result = p.append_records(batch(7, seq))
        assert result.duplicate and result.base_offset == offset
    assert p.log.log_end_offset == 10


@pytest.mark.parametrize("segment_bytes", [1 << 30, 250])
def test_crash_rebuilds_state_from_snapshot_and_log(tmp_path, segment_bytes):
    p = open_partition(tmp_path, segment_bytes=segment_bytes)
    for seq in range(0, 30, 2):
        p.append_records(batch(7, seq))
    crash(p)
    p = open_partition(tmp_path, segment_bytes=segment_bytes)
    assert p.append_records(batch(7, 28)).duplicate
    with pytest.raises(InvalidBatch) as gap:
        p.append_records(batch(7, 40))
    assert gap.value.error == ErrorCode.out_of_order_sequence_number
    assert p.append_records(batch(7, 30)).base_offset == 30


def test_damaged_newest_snapshot_falls_back_to_an_older_one(tmp_path):
    p = open_partition(tmp_path, segment_bytes=250)
    for seq in range(0, 30, 2):
        p.append_records(batch(7, seq))
    p.close()
    newest = max(f for f in os.listdir(tmp_path) if f.endswith(".snapshot"))
    with open(tmp_path / newest, "r+b") as f:
        f.seek(12)
        f.write(b"\xff\xff")
    p = open_partition(tmp_path, segment_bytes=250)
    assert p.append_records(batch(7, 28)).duplicate
    assert p.append_records(batch(7, 30)).base_offset == 30


def test_snapshot_past_the_log_end_is_discarded(tmp_path):
    p = open_partition(tmp_path)
    for seq in range(0, 10, 2):
        p.append_records(batch(7, seq))
    p.close()
    # a crash cut the log back after the snapshot was taken: the snapshot lies about 8..9
    log_file = tmp_path / f"{0:020d}.log"
    size = os.path.getsize(log_file)
    os.truncate(log_file, size - 20)
    os.unlink(tmp_path / ".clean_shutdown")
    p = open_partition(tmp_path)
    assert p.log.log_end_offset == 8
    assert not os.path.exists(tmp_path / f"{10:020d}.snapshot")
    assert p.append_records(batch(7, 8)).base_offset == 8  # not a duplicate: it was lost


def test_retention_deletes_batches_but_not_producer_state(tmp_path):
    p = open_partition(tmp_path, segment_bytes=250)
    for seq in range(0, 30, 2):
        p.append_records(batch(7, seq))
    p.log.roll()
    p.apply_retention(NOW + 10**9)  # everything expired
    assert p.log.log_start_offset == p.log.log_end_offset == 30
    p.close()
    p = open_partition(tmp_path, segment_bytes=250)
    assert p.append_records(batch(7, 28)).duplicate
    with pytest.raises(InvalidBatch) as old:
        p.append_records(batch(7, 0))
    assert old.value.error == ErrorCode.duplicate_sequence_number


def test_idempotent_request_with_two_batches_is_refused(tmp_path):
    p = open_partition(tmp_path)
    with pytest.raises(InvalidBatch) as two:
        p.append_records(batch(7, 0) + batch(7, 2))
    assert two.value.error == ErrorCode.invalid_record
    assert p.log.log_end_offset == 0


@pytest.mark.parametrize("timestamp", [-1, 1_700_000_000_000_000, 1_600_000_000_000])
def test_rebuild_after_crash_counts_producers_active_from_the_rebuild(tmp_path, timestamp):
    """A batch's timestamp is the client's clock: it must not age or break rebuilt state."""
    p = open_partition(tmp_path, expiration_ms=3_600_000)
    p.append_records(encode_batch([(None, b"v", (), timestamp)], producer_id=7,
                                  producer_epoch=0, base_sequence=0))
    crash(p)
    p = open_partition(tmp_path, expiration_ms=3_600_000)
    p.expire_producers(int(time.time() * 1000) + 1000)
    assert p.state.entry(7) is not None
    assert p.state.entry(7).last_timestamp == timestamp
    assert p.append_records(encode_batch([(None, b"v", (), timestamp)], producer_id=7,
                                         producer_epoch=0, base_sequence=0)).duplicate


def test_rebuild_from_a_truncated_log_forgets_only_ids_issued_so_far(tmp_path):
    """Producers issued after the rebuild never wrote to the deleted part: they start at 0."""
    p = open_partition(tmp_path, segment_bytes=250)
    for seq in range(0, 30, 2):
        p.append_records(batch(7, seq))
    p.log.roll()
    p.apply_retention(NOW + 10**9)
    p.close()
    for name in os.listdir(tmp_path):
        if name.endswith(".snapshot"):
            os.unlink(tmp_path / name)
    ids = IssuedBelow(1000)
    p = open_partition(tmp_path, ids=ids)
    assert p.state.forgotten_up_to == 999
    assert p.append_records(batch(7, 40)).base_offset == 30  # may have been forgotten: row 2
    ids.limit = 2000  # the cluster hands out more ids after the rebuild
    with pytest.raises(InvalidBatch) as early:
        p.append_records(batch(1500, 3))  # never wrote here: must start at 0 (rows 2b-2c)
    assert early.value.error == ErrorCode.out_of_order_sequence_number
