"""cluster/unreadable.py's table, row by row: what is a znode's own fault (that topic or
partition alone is unreadable) and what is ZooKeeper being away (the whole read raises)."""

from __future__ import annotations

import json

import pytest
from kazoo.exceptions import (
    AuthFailedError,
    ConnectionLoss,
    NoAuthError,
    OperationTimeoutError,
    SessionExpiredError,
)

from oncelog.cluster import znodes as zn
from oncelog.cluster.unreadable import Unreadable, answer, decoded, unreadable
from oncelog.metadata.store import MetadataUnavailable

OWN_FAULT = [NoAuthError()]
AWAY = [ConnectionLoss(), SessionExpiredError(), OperationTimeoutError(), AuthFailedError(),
        MetadataUnavailable("no answer in time"), TimeoutError()]


@pytest.mark.parametrize("error", OWN_FAULT, ids=type)
def test_a_znodes_own_fault_is_unreadable(error):
    assert isinstance(unreadable(error), Unreadable)
    with pytest.raises(Unreadable):
        answer(error)


@pytest.mark.parametrize("error", AWAY, ids=type)
def test_zookeeper_away_raises_as_it_is(error):
    assert unreadable(error) is None
    with pytest.raises(type(error)):
        answer(error)


_ID = "AAAAAAAAAAAAAAAAAAAAAA"


@pytest.mark.parametrize("data", [b"\xff{", b"[]", b"{", b'{"version":1}', b"[" * 100_000,
                                  json.dumps({"version": 1, "partitions": {"x": [1]}}).encode()])
def test_bytes_that_are_not_kafkas_json_are_unreadable(data):
    with pytest.raises(Unreadable):
        decoded(zn.PartitionState.decode, data)
    with pytest.raises(Unreadable):
        decoded(zn.TopicAssignment.decode, data)


@pytest.mark.parametrize("value", [
    {"version": 3, "topic_id": _ID},  # no partitions: every broker would drop the topic
    {"version": 3, "topic_id": _ID, "partitions": {}},
    {"version": 3, "partitions": {"0": [1]}},  # no id: each broker would take it for new
    {"version": 3, "topic_id": "not-an-id", "partitions": {"0": [1]}},
    {"version": 3, "topic_id": 7, "partitions": {"0": [1]}},
    # a partition no broker holds would leave every broker's view: its logs deleted
    {"version": 3, "topic_id": _ID, "partitions": {"0": []}},
    {"version": 3, "topic_id": _ID, "partitions": {"0": [1], "1": []}},
    {"version": 3, "topic_id": _ID, "partitions": {"0": [-1]}},
    {"version": 3, "topic_id": _ID, "partitions": {"0": [1, 2, 1]}}])
def test_an_assignment_that_would_delete_logs_is_unreadable(value):
    """Before, these decoded (to no partitions, or an id made from the topic's name), and
    the replica manager deleted the topic's local log."""
    with pytest.raises(Unreadable):
        decoded(zn.TopicAssignment.decode, json.dumps(value).encode())
    whole = zn.TopicAssignment.decode(json.dumps(
        {"version": 3, "topic_id": _ID, "partitions": {"0": [1]}}).encode())
    assert whole.partitions == {0: (1,)}


def test_an_answer_is_passed_through():
    assert answer((b"x", 1)) == (b"x", 1)
