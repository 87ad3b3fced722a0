"""A listing of every key a coordinator serves (ListTransactions, ListGroups) is refused while
a partition this broker leads is not loaded (ownership.py ``Ownership.incomplete``): Kafka
answers COORDINATOR_LOAD_IN_PROGRESS then, and a client taking the partial list for all would
miss the keys still being read (the Spark sink's recovery: an open transaction never ended).
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from oncelog.coordinator.ownership import Ownership

PARTITIONS = 3


def test_a_partition_loading_makes_the_listing_wait():
    ownership = Ownership()
    assert ownership.incomplete(PARTITIONS) is None  # holds nothing, named for nothing
    load = ownership.elect(1, 0)
    assert ownership.incomplete(PARTITIONS) == ErrorCode.coordinator_load_in_progress
    assert ownership.loaded(load)
    assert ownership.incomplete(PARTITIONS) is None


def test_a_partition_named_this_brokers_but_not_elected_yet_makes_the_listing_wait():
    named = {2: 5}
    ownership = Ownership(named=named.get)
    assert ownership.incomplete(PARTITIONS) == ErrorCode.coordinator_load_in_progress  # A1
    assert ownership.loaded(ownership.elect(2, 5))
    assert ownership.incomplete(PARTITIONS) is None
    # resigned before the metadata moved on: named at 5, no longer held
    ownership.resign(2, 6)
    assert ownership.incomplete(PARTITIONS) == ErrorCode.not_coordinator
    named.clear()  # the metadata names another broker now: not this broker's to list
    assert ownership.incomplete(PARTITIONS) is None


def test_a_failed_partition_makes_the_listing_fail_retriably():
    ownership = Ownership()
    load = ownership.elect(0, 0)
    ownership.failed(load, io=False)
    error = ownership.incomplete(PARTITIONS)
    assert error == ErrorCode.not_coordinator and error.retriable
