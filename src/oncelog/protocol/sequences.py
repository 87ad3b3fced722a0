"""Producer sequence numbers as RecordBatch v2 defines them: one place for their arithmetic.

A batch carries the sequence of its first record; record i has base + i. Sequences live on a
circle of 2^31: after 2^31 - 1 comes 0 (Kafka's DefaultRecordBatch.incrementSequence). -1 is
a batch without one (a producer without idempotence). "Ahead" is taken within half the
circle, so comparisons survive the wrap.
"""

from __future__ import annotations

NO_SEQUENCE = -1
SEQUENCE_SPACE = 1 << 31
HALF = SEQUENCE_SPACE // 2


def record_sequence(base_sequence: int, delta: int) -> int:
    """The sequence of the record ``delta`` after the batch's first (NO_SEQUENCE stays)."""
    if base_sequence < 0:
        return NO_SEQUENCE
    return (base_sequence + delta) % SEQUENCE_SPACE


def next_sequence(seq: int) -> int:
    return (seq + 1) % SEQUENCE_SPACE


def advance(seq: int, count: int) -> int:
    return (seq + count) % SEQUENCE_SPACE


def sequence_distance(start: int, end: int) -> int:
    """How far ``end`` is ahead of ``start``, going forward round the circle."""
    return (end - start) % SEQUENCE_SPACE


def is_ahead(seq: int, of: int) -> bool:
    """``seq`` comes after ``of`` (within half the circle)."""
    return 0 < sequence_distance(of, seq) < HALF
