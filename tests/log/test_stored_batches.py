"""What Partition.append_records stores is the batch it was given, byte for byte, but for its
base offset and leader epoch; segments roll by Kafka's rules (issue 26 cut the append path's
per-batch work: this holds the bytes and the roll decision to what they were).

Random requests (one-record batches as the coordinators write, several records, several
batches, idempotent producers with their sequences) into a partition with small segments, at
random timestamps and leader epochs; every batch read back is compared with the one sent,
and each roll with the rule as it was written before (``_rolls``)."""
from __future__ import annotations

import random
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.log.log import LogConfig
from oncelog.producer_state.manager import StateLimits
from oncelog.protocol.record_batch import (
    HEADER_STRUCT,
    LOG_OVERHEAD,
    BatchHeader,
    read_header,
    scan_batches,
    split_batches,
)
from oncelog.protocol.records import encode_batch


class _Issued:
    def is_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < 100

    def highest_claimed(self) -> int:
        return 99


def _rolls(active, headers: list[BatchHeader], config: LogConfig, now_ms: int) -> bool:
    """Log.should_roll as it was written before issue 26's one-batch path."""
    if active.size == 0:
        return False
    if active.size + sum(h.size for h in headers) > config.segment_bytes:
        return True
    first = active.first_batch_timestamp
    if first >= 0:
        waited = max(h.max_timestamp for h in headers) - first
    else:
        waited = now_ms - active.created_at_ms
    if waited > config.segment_ms:
        return True
    last_offset = active.next_offset + sum(h.last_offset_delta + 1 for h in headers) - 1
    return last_offset - active.base_offset > 2**31 - 1


def _patched(batch: bytes, offset: int, epoch: int) -> bytes:
    header = read_header(batch)
    return HEADER_STRUCT.pack(*header._replace(base_offset=offset,
                                               partition_leader_epoch=epoch)) + batch[61:]


def _request(rng: random.Random, now: int, sequences: dict[int, int]) -> list[bytes]:
    """The batches of one produce request to the partition."""
    def rows(n: int) -> list:
        return [(rng.randbytes(rng.randint(1, 20)), rng.choice((None, rng.randbytes(200))),
                 (), now - rng.choice((0, 0, 0, 5_000, 50_000))) for _ in range(n)]
    kind = rng.choice(("one", "one", "several", "batches", "idempotent"))
    if kind == "one":
        return [encode_batch(rows(1))]
    if kind == "several":
        return [encode_batch(rows(rng.randint(2, 5)))]
    if kind == "batches":
        return [encode_batch(rows(rng.randint(1, 3))) for _ in range(rng.randint(2, 3))]
    producer = rng.randint(0, 3)
    n = rng.randint(1, 4)
    sequence = sequences.get(producer, 0)
    sequences[producer] = sequence + n
    return [encode_batch(rows(n), producer_id=producer, producer_epoch=0,
                         base_sequence=sequence)]


@settings(max_examples=12, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32), segment_bytes=st.sampled_from((600, 2_000, 1 << 20)),
       segment_ms=st.sampled_from((10_000, 7 * 24 * 3600 * 1000)))
def test_the_stored_bytes_are_the_sent_bytes(tmp_path_factory, seed, segment_bytes,
                                             segment_ms):
    rng = random.Random(seed)
    root = tmp_path_factory.mktemp("stored")
    config = LogConfig(segment_bytes=segment_bytes, segment_ms=segment_ms)
    partition = Partition("t", 0, str(root / "t-0"), config, 1 << 20, StateLimits(),
                          _Issued(), log_dir=LogDir(str(root)))
    sent: list[bytes] = []
    sequences: dict[int, int] = {}
    try:
        for _ in range(40):
            partition.leader_epoch = rng.choice((partition.leader_epoch,
                                                 partition.leader_epoch + 1))
            now = int(time.time() * 1000)
            batches = _request(rng, now, sequences)
            records = b"".join(batches)
            log = partition.log if partition.is_open else None
            expected_roll = log is not None and _rolls(
                log.active, split_batches(records, 1 << 20), config, now)
            segments = len(log.segments) if log is not None else 1
            result = partition.append_records(records)
            assert len(partition.log.segments) == segments + expected_roll
            offset = result.base_offset
            for batch in batches:
                sent.append(_patched(batch, offset, partition.leader_epoch))
                offset += read_header(batch).records_count
        stored = []
        plog = partition.log
        offset = 0
        while offset < plog.log_end_offset:
            chunk = plog.read(offset, 1 << 20).records
            for pos, header in scan_batches(chunk):
                if header.base_offset >= offset:
                    stored.append(bytes(chunk[pos:pos + LOG_OVERHEAD + header.batch_length]))
                    offset = header.last_offset + 1
        assert stored == sent
    finally:
        partition.close()
