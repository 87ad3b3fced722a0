"""Compaction joined with producer state through a real partition: after a clean, and after
a restart following one (clean, crash, or with no snapshot left), an idempotent producer goes
on with its sequences, and a retry of a batch the cleaner removed is never stored twice."""

from __future__ import annotations

import os
import time

import pytest
from kio.schema.errors import ErrorCode

from oncelog.broker.partition import Partition
from oncelog.log import cleaning
from oncelog.log.compaction import CompactionConfig
from oncelog.log.log import LogConfig
from oncelog.producer_state.manager import StateLimits
from oncelog.protocol.record_batch import InvalidBatch
from oncelog.protocol.records import decode_batch, encode_batch
from oncelog.protocol.validation import RecordRules

NOW = int(time.time() * 1000)
PID = 7


class IssuedBelow:
    def __init__(self, limit: int) -> None:
        self.limit = limit

    def is_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < self.limit

    def highest_claimed(self) -> int:
        return self.limit - 1


def open_partition(directory) -> Partition:
    config = LogConfig(segment_bytes=400,
                       compaction=CompactionConfig(min_cleanable_dirty_ratio=0.0))
    return Partition("c", 0, str(directory), config, 1 << 20, StateLimits(), IssuedBelow(1000),
                     RecordRules(keys_required=True))


def batch(first_seq: int, key: bytes = b"k", pid: int = PID, count: int = 1) -> bytes:
    return encode_batch([(key, b"v%d" % (first_seq + i), (), NOW) for i in range(count)],
                        producer_id=pid, producer_epoch=0, base_sequence=first_seq)


def clean(p: Partition) -> cleaning.CleanResult | None:
    return cleaning.run(p.clean_steps(int(time.time() * 1000), 1 << 20))


def values(p: Partition) -> list[tuple[int, bytes]]:
    found, offset = [], 0
    while offset < p.log.log_end_offset:
        data = p.log.read(offset, 1 << 20).records
        pos = 0
        while pos < len(data):
            header, records = decode_batch(data, pos)
            found += [(r.offset, r.value) for r in records if r.offset >= offset]
            offset = max(offset, header.last_offset + 1)
            pos += header.size
    return found


def written(p: Partition, count: int) -> None:
    for seq in range(count):
        result = p.append_records(batch(seq))
        assert result.base_offset == seq and not result.duplicate


def goes_on(p: Partition, seq: int) -> None:
    end = p.log.log_end_offset
    result = p.append_records(batch(seq))
    assert (result.base_offset, result.duplicate) == (end, False)


def refused_or_duplicate(p: Partition, seq: int) -> None:
    """A retry of an old batch: answered from the cache, or refused; never stored."""
    end = p.log.log_end_offset
    try:
        result = p.append_records(batch(seq))
    except InvalidBatch as exc:
        assert exc.error in (ErrorCode.duplicate_sequence_number,
                             ErrorCode.out_of_order_sequence_number)
    else:
        assert result.duplicate and result.base_offset == seq
    assert p.log.log_end_offset == end


def test_after_a_clean_the_producer_goes_on_and_retries_are_not_stored(tmp_path):
    p = open_partition(tmp_path)
    written(p, 30)
    assert clean(p) is not None
    assert values(p)[0][0] > 0  # superseded values are gone
    # the last 5 batches are still answered from the cache, with their offsets
    assert p.append_records(batch(28)).duplicate
    # a batch the cleaner removed, older than the cache: already stored, so a duplicate
    with pytest.raises(InvalidBatch) as refused:
        p.append_records(batch(3))
    assert refused.value.error == ErrorCode.duplicate_sequence_number
    goes_on(p, 30)
    assert values(p)[-1] == (30, b"v30")


@pytest.mark.parametrize("restart", ["clean", "crash", "no-snapshots"])
def test_after_a_restart_following_a_clean_the_producer_goes_on(tmp_path, restart):
    p = open_partition(tmp_path)
    written(p, 30)
    assert clean(p) is not None
    kept = values(p)
    if restart == "clean":
        p.close()
    else:
        for segment in p.log.segments:
            segment.close()
        if restart == "no-snapshots":  # state rebuilt from the cleaned log alone
            for name in os.listdir(tmp_path):
                if name.endswith(".snapshot"):
                    os.unlink(tmp_path / name)
    p = open_partition(tmp_path)
    assert values(p) == kept
    entry = p.state.entry(PID)
    assert entry is not None and entry.last_seq == 29 and entry.epoch == 0
    refused_or_duplicate(p, 3)
    refused_or_duplicate(p, 29)
    goes_on(p, 30)


def test_a_producer_whose_records_are_all_superseded_keeps_its_last_batch(tmp_path):
    p = open_partition(tmp_path)
    for seq in range(3):
        p.append_records(batch(seq, key=b"shared", pid=8))
    for seq in range(20):
        p.append_records(batch(seq, key=b"shared"))
    assert clean(p) is not None
    assert all(offset >= 3 for offset, _ in values(p))  # none of producer 8's records left
    for segment in p.log.segments:
        segment.close()
    for name in os.listdir(tmp_path):
        if name.endswith(".snapshot"):
            os.unlink(tmp_path / name)
    p = open_partition(tmp_path)
    entry = p.state.entry(8)
    assert entry is not None and entry.last_seq == 2  # from its emptied last batch
    result = p.append_records(batch(3, key=b"shared", pid=8))
    assert not result.duplicate
