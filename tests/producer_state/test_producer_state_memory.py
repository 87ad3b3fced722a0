"""What one producer's state is in memory (issue 26: 227 bytes a producer with 5 cached
batches, Kafka's is 180): one packed ``bytes`` value per producer id, no per-producer
objects beside it. Structure, not bytes: the bytes are bench/producer_state.py's, and what
bounds them is in docs/benchmarks.md."""

from __future__ import annotations

from oncelog.producer_state.manager import ProducerStateManager, StateLimits
from oncelog.producer_state.rules import Append, BatchIdentity


def test_a_producer_is_one_packed_value_of_head_and_batches():
    state = ProducerStateManager(StateLimits(batches_to_retain=5))
    for pid in (1000, 1001):
        for i in range(7):
            batch = BatchIdentity(pid, 0, i * 10, i * 10 + 9)
            state.apply(Append(batch, reset=i == 0), 100 * pid + i * 10 + 9, 1, 1)
    packed = dict(state.packed_entries())
    assert sorted(packed) == [1000, 1001]
    for value in packed.values():
        assert type(value) is bytes
        assert len(value) == ProducerStateManager.PACKED_HEAD.size + \
            5 * ProducerStateManager.PACKED_BATCH.size
    assert state.ongoing_transactions() == {} and state.tombstone_count == 0
