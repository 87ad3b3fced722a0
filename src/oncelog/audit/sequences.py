"""What the sequence audit remembers per partition, producer id and epoch: the ranges of
sequence numbers seen, packed while a producer's batches form one run (see the package's
docstring for the rules)."""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right

from ..protocol.sequences import SEQUENCE_SPACE


class SeenSequences:
    """Sorted, disjoint, non-adjacent ranges [start, end] of (unwrapped) sequence numbers."""

    __slots__ = ("count", "ends", "starts")

    def __init__(self) -> None:
        self.starts = array("q")
        self.ends = array("q")
        self.count = 0

    def add(self, first: int, last: int) -> int:
        """Mark first..last seen; return how many of them were seen already."""
        starts, ends = self.starts, self.ends
        n = len(ends)
        if n and first == ends[-1] + 1:  # the usual case: the next batch of the stream
            ends[-1] = last
            self.count += last - first + 1
            return 0
        if not n or first > ends[-1] + 1:
            starts.append(first)
            ends.append(last)
            self.count += last - first + 1
            return 0
        hi = bisect_right(starts, last)  # ranges before hi start at or before `last`
        lo = bisect_left(ends, first)  # ranges from lo end at or after `first`
        overlap = 0
        for k in range(lo, hi):
            overlap += min(last, ends[k]) - max(first, starts[k]) + 1
        if lo > 0 and ends[lo - 1] == first - 1:
            lo -= 1
        if hi < n and starts[hi] == last + 1:
            hi += 1
        new_start = min(first, starts[lo]) if lo < hi else first
        new_end = max(last, ends[hi - 1]) if lo < hi else last
        starts[lo:hi] = array("q", (new_start,))
        ends[lo:hi] = array("q", (new_end,))
        self.count += last - first + 1 - overlap
        return overlap

    @property
    def holes(self) -> int:
        return max(0, len(self.starts) - 1)

    @property
    def missing(self) -> int:
        if not self.starts:
            return 0
        return self.ends[-1] - self.starts[0] + 1 - self.count

    @property
    def high(self) -> int:
        return self.ends[-1]


class EpochSeen:
    __slots__ = ("batches", "duplicates", "first_sequence", "last_sequence", "records",
                 "regressions", "seen")

    def __init__(self) -> None:
        self.seen = SeenSequences()
        self.records = 0
        self.batches = 0
        self.duplicates = 0
        self.regressions = 0
        self.first_sequence = -1
        self.last_sequence = -1


# A producer id on a partition whose batches so far are one epoch and one run of sequences,
# each batch following the one before (nearly all of them): epoch, first and last (unwrapped)
# sequence, records, batches, packed in 72 bytes, not the 700 of a ProducerSeen. Anything else
# turns it into a ProducerSeen.
PACKED = struct.Struct("<hqqqq")


class ProducerSeen:
    __slots__ = ("epoch_regressions", "epochs", "max_epoch", "records", "unsequenced")

    def __init__(self) -> None:
        self.epochs: dict[int, EpochSeen] = {}
        self.max_epoch = -1
        self.records = 0
        self.unsequenced = 0  # records with a producer id but no sequence
        self.epoch_regressions = 0  # records under an epoch older than one seen before


def expand(packed: bytes) -> ProducerSeen:
    """A producer kept PACKED, as a ProducerSeen."""
    epoch_no, first, last, records, batches = PACKED.unpack(packed)
    producer = ProducerSeen()
    producer.max_epoch = epoch_no
    producer.records = records
    epoch = producer.epochs[epoch_no] = EpochSeen()
    epoch.seen.add(first, last)
    epoch.records, epoch.batches = records, batches
    epoch.first_sequence = first % SEQUENCE_SPACE
    epoch.last_sequence = last % SEQUENCE_SPACE
    return producer

