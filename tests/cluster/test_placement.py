"""Replica placement (cluster/placement.py), as properties over any brokers, racks, partition
counts and replication factors: every partition gets ``replication_factor`` distinct
registered brokers; leaders go round the brokers (no broker leads two more than another);
with racks, each partition spans as many racks as it can; CreatePartitions continues the
walk; too large a replication factor is Kafka's INVALID_REPLICATION_FACTOR message."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.cluster.placement import (
    Candidate,
    PlacementError,
    assign,
    rack_alternated,
    usable,
)

BROKERS = st.lists(st.integers(0, 20), min_size=1, max_size=8, unique=True)


@settings(max_examples=100, deadline=None)
@given(ids=BROKERS, racks=st.integers(0, 3), partitions=st.integers(1, 30),
       data=st.data())
def test_placement_properties(ids, racks, partitions, data):
    rf = data.draw(st.integers(1, len(ids)))
    start = data.draw(st.one_of(st.none(), st.integers(0, 50)))
    brokers = [Candidate(b, None if racks == 0 else f"r{i % racks}")
               for i, b in enumerate(ids)]
    placed = assign(brokers, partitions, rf, start=start)
    assert len(placed) == partitions
    for replicas in placed:
        assert len(replicas) == rf and len(set(replicas)) == rf
        assert set(replicas) <= set(ids)
    leaders = Counter(r[0] for r in placed)
    if partitions >= len(ids):
        assert set(leaders) == set(ids)
    assert max(leaders.values()) - min(leaders.get(b, 0) for b in ids) <= 1
    rack_of = {b.broker_id: b.rack for b in brokers}
    distinct_racks = len(set(rack_of.values()))
    if racks > 1 and distinct_racks > 1:
        for replicas in placed:
            assert len({rack_of[b] for b in replicas}) == min(rf, distinct_racks)


def test_rack_alternated_order():
    brokers = [Candidate(0, "a"), Candidate(1, "a"), Candidate(2, "a"), Candidate(3, "b"),
               Candidate(4, "c"), Candidate(5, "c")]
    assert rack_alternated(brokers) == [0, 3, 4, 1, 5, 2]


def test_new_partitions_continue_the_round():
    brokers = [Candidate(b) for b in (1, 2, 3)]
    whole = assign(brokers, 6, 2, start=1)
    assert assign(brokers, 3, 2, start=1, first_partition=3) == whole[3:]


def test_replication_factor_above_the_brokers():
    with pytest.raises(PlacementError, match=r"Replication factor: 4 larger than available "
                                             r"brokers: 3\."):
        assign([Candidate(b) for b in (1, 2, 3)], 1, 4)
    with pytest.raises(PlacementError, match="must be larger than 0"):
        assign([Candidate(1)], 1, 0)


@settings(max_examples=50, deadline=None)
@given(ids=st.sets(st.integers(0, 20), min_size=1, max_size=8), data=st.data(),
       partitions=st.integers(1, 12), factor=st.integers(1, 4))
def test_no_replica_goes_to_a_broker_without_log_directories(ids, data, partitions, factor):
    """A broker whose log directories all failed gets no new replica; with too few left,
    Kafka's INVALID_REPLICATION_FACTOR message counts only the others."""
    failed = data.draw(st.sets(st.sampled_from(sorted(ids))))
    brokers = usable([Candidate(b) for b in sorted(ids)], failed)
    assert [b.broker_id for b in brokers] == sorted(ids - failed)
    if factor > len(brokers):
        with pytest.raises(PlacementError, match=f"available brokers: {len(brokers)}"):
            assign(brokers, partitions, factor)
        return
    placed = assign(brokers, partitions, factor)
    assert all(not set(replicas) & failed for replicas in placed)
