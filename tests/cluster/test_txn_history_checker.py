"""support/txn_history.py's checker, on hand-made histories: a clean one passes, and each
anomaly of its table is caught in a history made to have exactly that one."""

from __future__ import annotations

import pytest
from support.txn_history import ABORTED, COMMITTED, UNKNOWN, Txn, check

A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


def history() -> list[Txn]:
    """p1 commits #0 (a0, b0), aborts #1 (a0, a1), its #2 (a1, b0) unknown; p2 commits #0
    (a0, a1)."""
    return [
        Txn("p1", 0, {A0: [b"p1-0-0", b"p1-0-1"], B0: [b"p1-0-2"]}, COMMITTED),
        Txn("p1", 1, {A0: [b"p1-1-0"], A1: [b"p1-1-1"]}, ABORTED),
        Txn("p1", 2, {A1: [b"p1-2-0"], B0: [b"p1-2-1"]}, UNKNOWN),
        Txn("p2", 0, {A0: [b"p2-0-0"], A1: [b"p2-0-1"]}, COMMITTED),
    ]


def clean() -> dict:
    return {A0: [b"p1-0-0", b"p2-0-0", b"p1-0-1"], A1: [b"p2-0-1"], B0: [b"p1-0-2"]}


def kinds(reads: dict, txns: list[Txn] | None = None) -> list[str]:
    return [a.kind for a in check(txns or history(), reads)]


def test_a_clean_history_has_no_anomaly():
    assert kinds(clean()) == []


def test_an_unknown_transaction_may_be_read_whole():
    reads = clean()
    reads[A1].append(b"p1-2-0")
    reads[B0].append(b"p1-2-1")
    assert kinds(reads) == []


def test_a_lost_committed_write():
    reads = clean()
    reads[A1].remove(b"p2-0-1")  # and so p2#0 is torn too
    assert kinds(reads) == ["lost", "torn"]


def test_a_committed_transaction_read_nowhere_is_lost_not_torn():
    reads = clean()
    reads[A0].remove(b"p2-0-0")
    reads[A1].remove(b"p2-0-1")
    assert kinds(reads) == ["lost"]


def test_an_aborted_read():
    reads = clean()
    reads[A1].insert(0, b"p1-1-1")
    assert kinds(reads) == ["aborted-read"]


def test_a_torn_unknown_transaction():
    reads = clean()
    reads[B0].append(b"p1-2-1")  # its a1 value never read
    assert kinds(reads) == ["torn"]


def test_a_duplicate():
    reads = clean()
    reads[B0].append(b"p1-0-2")
    assert kinds(reads) == ["duplicate", "order"]  # a second copy is behind itself too


def test_an_order_across_transactions():
    txns = [*history(), Txn("p2", 1, {A1: [b"p2-1-0"]}, COMMITTED)]
    reads = clean()
    reads[A1] = [b"p2-1-0", b"p2-0-1"]  # p2's #1 before its #0
    assert kinds(reads, txns) == ["order"]


def test_an_order_within_a_transaction():
    reads = clean()
    reads[A0] = [b"p1-0-1", b"p2-0-0", b"p1-0-0"]
    assert kinds(reads) == ["order"]


@pytest.mark.parametrize("where", [("a", 2), ("b", 0)])
def test_an_unexpected_value_or_one_in_another_partition(where):
    reads = clean()
    reads.setdefault(where, []).append(b"p2-0-0" if where == B0 else b"nobody")
    found = kinds(reads)
    assert found == ["unexpected"]


def test_a_history_must_be_complete_and_unique():
    with pytest.raises(ValueError, match="no outcome"):
        check([Txn("p", 0, {A0: [b"x"]})], {})
    with pytest.raises(ValueError, match="twice"):
        check([Txn("p", 0, {A0: [b"x"]}, COMMITTED), Txn("p", 1, {A1: [b"x"]}, ABORTED)], {})
