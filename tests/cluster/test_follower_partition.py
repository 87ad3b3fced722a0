"""The follower's side of a partition, on disk, without a cluster: the leader's batches are
appended with their offsets and epochs (Partition.append_as_follower), producer state is
built from them as the leader's was (seed 004: the follower, once leader, answers a retry of
any of the last five batches with its original offset), and a truncation cuts the log and
rebuilds producer state from snapshot and log (Partition.truncate_to)."""

from __future__ import annotations

import time

import pytest
from kio.schema.errors import ErrorCode

from oncelog.broker.partition import Partition
from oncelog.log.leader_epoch import LEADER_EPOCH_CHECKPOINT_FILE, LeaderEpochCache
from oncelog.log.log import LogConfig
from oncelog.producer_state.manager import StateLimits
from oncelog.protocol.record_batch import InvalidBatch, scan_batches
from oncelog.protocol.records import encode_batch
from oncelog.protocol.validation import LONG_MAX, RecordRules

NOW = int(time.time() * 1000)


class IssuedBelow:
    def __init__(self, limit: int) -> None:
        self.limit = limit

    def is_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < self.limit

    def highest_claimed(self) -> int:
        return self.limit - 1


def open_partition(directory, segment_bytes: int = 1 << 30) -> Partition:
    return Partition("t", 0, str(directory), LogConfig(segment_bytes=segment_bytes), 1 << 20,
                     StateLimits(), IssuedBelow(1000),
                     RecordRules(timestamp_after_max_ms=LONG_MAX))


def batch(pid: int, first_seq: int, count: int = 2) -> bytes:
    return encode_batch([(None, b"r%d" % (first_seq + i), (), NOW) for i in range(count)],
                        producer_id=pid, producer_epoch=0, base_sequence=first_seq)


def leader_bytes(leader: Partition, start: int = 0) -> bytes:
    """Everything from ``start``, read as a Fetch reads it: a segment at a time."""
    parts = []
    while start < leader.log.log_end_offset:
        chunk = leader.log.read(start, 1 << 30).records
        parts.append(chunk)
        start = list(scan_batches(chunk))[-1][1].last_offset + 1
    return b"".join(parts)


def test_a_follower_answers_the_last_five_retries_as_the_leader_would(tmp_path):
    leader = open_partition(tmp_path / "leader", segment_bytes=400)
    leader.leader_epoch = 3
    offsets = [leader.append_records(batch(7, seq)).base_offset for seq in range(0, 20, 2)]
    follower = open_partition(tmp_path / "follower", segment_bytes=400)
    records = leader_bytes(leader)
    assert follower.append_as_follower(records) == len(records)
    assert follower.log.log_end_offset == leader.log.log_end_offset
    assert leader_bytes(follower) == records  # same batches, same offsets, same epochs
    assert follower.leader_epochs.entries == [(3, 0)]
    for seq, offset in zip(range(10, 20, 2), offsets[5:], strict=True):
        retry = follower.append_records(batch(7, seq))
        assert (retry.duplicate, retry.base_offset) == (True, offset)
    # older than the five: stored, and said so (DUPLICATE_SEQUENCE_NUMBER), never again
    with pytest.raises(InvalidBatch) as older:
        follower.append_records(batch(7, 8))
    assert older.value.error == ErrorCode.duplicate_sequence_number
    assert follower.append_records(batch(7, 20)).base_offset == 20


def test_a_batch_out_of_place_is_refused_and_nothing_stored(tmp_path):
    leader = open_partition(tmp_path / "leader")
    leader.append_records(batch(7, 0))
    leader.append_records(batch(7, 2))
    follower = open_partition(tmp_path / "follower")
    first = leader.log.read(0, 1).records
    follower.append_as_follower(first)
    with pytest.raises(InvalidBatch):
        follower.append_as_follower(first)  # offset 0 where the log ends at 2
    assert follower.log.log_end_offset == 2
    follower.truncate_to(0)
    corrupt = bytearray(leader_bytes(leader))
    corrupt[-1] ^= 0xFF
    with pytest.raises(InvalidBatch):
        follower.append_as_follower(bytes(corrupt))
    assert follower.log.log_end_offset == 2  # the first batch was whole, the second not


def test_truncation_rebuilds_producer_state_from_snapshot_and_log(tmp_path):
    """The old leader had batches 0..9 of producer 7 at epoch 0 (rolls made snapshots); the
    new leader had only 0..5. Cut back to 6, the old leader's state is as if 6..9 never
    came: their retry is new (stored), the retry of 4..5 a duplicate at its offset."""
    old = open_partition(tmp_path / "old", segment_bytes=200)
    old.leader_epochs.assign(0, 0)
    offsets = [old.append_records(batch(7, seq)).base_offset for seq in range(0, 10, 2)]
    assert len(old.log.segments) > 2
    old.truncate_to(6)
    assert old.log.log_end_offset == 6
    assert old.state.entry(7).last_seq == 5
    assert old.append_records(batch(7, 4)).base_offset == offsets[2]  # a duplicate
    assert old.append_records(batch(7, 6)).base_offset == 6  # stored again, not a dup
    old.close()
    again = open_partition(tmp_path / "old", segment_bytes=200)
    assert again.log.log_end_offset == 8
    assert again.state.entry(7).last_seq == 7


def test_truncation_below_the_first_segment_starts_over(tmp_path):
    p = open_partition(tmp_path, segment_bytes=200)
    for seq in range(0, 10, 2):
        p.append_records(batch(7, seq))
    p.truncate_to(0)
    assert (p.log.log_start_offset, p.log.log_end_offset) == (0, 0)
    assert p.state.entry(7) is None
    assert p.append_records(batch(8, 0)).base_offset == 0


def test_leader_epoch_checkpoint_is_kafkas_file(tmp_path):
    p = open_partition(tmp_path)
    p.leader_epochs.assign(0, 0)
    p.append_records(batch(7, 0))
    p.leader_epochs.assign(4, 2)
    text = (tmp_path / LEADER_EPOCH_CHECKPOINT_FILE).read_text()
    assert text == "0\n2\n0 0\n4 2\n"
    assert LeaderEpochCache(str(tmp_path), p.disk).entries == [(0, 0), (4, 2)]
    p.append_records(batch(7, 2))
    p.truncate_to(2)  # the epoch 4 batch goes, and the epoch with it
    assert p.leader_epochs.entries == [(0, 0)]
