"""Repeated keys or values (``--by``), found with bounded memory: hashes on disk in buckets
(see the package's docstring)."""

from __future__ import annotations

import heapq
import os
import struct
import tempfile
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import blake2b

FIELDS = ("key", "value")
NO_LOCATION = (1 << 64) - 1
_PARTITION_SHIFT = 48  # a record's location: partition << 48 | offset, in 64 bits
_LOC = struct.Struct("=Q")
_FLUSH_BYTES = 1 << 16  # a bucket's buffer is written out from this size
_FLUSH_RECORDS = 1 << 14  # checked every this many records
MAX_LOCATIONS = 5  # locations kept per repeated value, for the examples
# Bucket files: enough that each holds about BUCKET_RECORDS records (finish() holds one bucket
# at a time, about 100 bytes a record), up to MAX_BUCKETS; past 8.4 million records the
# buckets grow instead (10 million records: about 4 MB at a time).
BUCKET_RECORDS = 32_768
MAX_BUCKETS = 256


@dataclass
class RepeatExample:
    count: int  # how many records carry this value
    locations: list[tuple[int, int]]  # (partition, offset) of the first MAX_LOCATIONS of them
    data: bytes | None = None  # the value, read back from the broker (None: not read)
    same: bool | None = None  # whether every listed location holds the same bytes


@dataclass
class RepeatReport:
    field: str
    records: int  # records hashed (non-null)
    nulls: int
    repeated: int  # distinct values occurring more than once
    extra: int  # records beyond the first of each value: what a clean topic would not hold
    by_partition: dict[int, int]  # extra records per partition (counted where the copy is)
    examples: list[RepeatExample]


class RepeatFinder:
    """Counts repeated values of one field with bounded memory (see the module docstring)."""

    def __init__(self, field_name: str, expected_records: int = 0, directory: str | None = None,
                 examples: int = 5) -> None:
        if field_name not in FIELDS:
            raise ValueError(f"can only look for repeated {' or '.join(FIELDS)}")
        self.field = field_name
        self.examples = examples
        buckets = 1
        while buckets < MAX_BUCKETS and buckets * BUCKET_RECORDS < expected_records:
            buckets *= 2
        self._shift = 8 - (buckets.bit_length() - 1)  # bucket = first digest byte >> shift
        self._dir = tempfile.TemporaryDirectory(prefix=f"oncelog-audit-{field_name}-",
                                                dir=directory)
        self._paths = [os.path.join(self._dir.name, f"{i:03d}") for i in range(buckets)]
        self._buffers = [bytearray() for _ in range(buckets)]
        self.records = 0
        self.nulls = 0
        self._pending = 0  # records hashed since the buffers were last looked at

    def add(self, partition: int, offsets: Sequence[int],
            datas: Sequence[bytes | None]) -> None:
        """Records of one partition, in log order: their offsets and keys (or values)."""
        buffers, shift = self._buffers, self._shift
        pack = _LOC.pack
        nulls = 0
        for location, data in zip(pack_locations(partition, offsets), datas, strict=True):
            if data is None:
                nulls += 1
                continue
            d = digest(data)
            buf = buffers[d[0] >> shift]
            buf += d
            buf += pack(location)
        self.nulls += nulls
        self._hashed(len(datas) - nulls)

    def add_digest(self, d: bytes, location: int) -> None:
        """One record already hashed (``digest``) at a ``pack_locations`` location: the Spark
        audit hashes in its reading tasks and feeds each hash's records in location order."""
        buf = self._buffers[d[0] >> self._shift]
        buf += d
        buf += _LOC.pack(location)
        self._hashed(1)

    def _hashed(self, hashed: int) -> None:
        self.records += hashed
        self._pending += hashed
        if self._pending >= _FLUSH_RECORDS:
            self._pending = 0
            for index, buf in enumerate(self._buffers):
                if len(buf) >= _FLUSH_BYTES:
                    self._write(index)

    def _write(self, index: int) -> None:
        # Opened for each write: no file handles held (256 buckets per field would exceed
        # some systems' default limit of open files).
        buf = self._buffers[index]
        with open(self._paths[index], "ab") as f:
            f.write(buf)
        buf.clear()

    def finish(self) -> RepeatReport:
        for index in range(len(self._buffers)):
            self._write(index)
        self._buffers = []
        repeated = extra = 0
        by_partition: dict[int, int] = {}
        best: list[tuple[int, int, list[int]]] = []  # (second location, count, locations)
        try:
            for path in self._paths:
                entries = array("Q")
                if os.path.exists(path):
                    with open(path, "rb") as f:
                        entries.frombytes(f.read())
                    os.unlink(path)
                hashes = entries[0::2]
                if len(set(hashes)) == len(hashes):
                    continue
                locations = entries[1::2]
                del entries
                # The first copy of a value is the one with the lowest location, whatever
                # order the records came in (a partition's transactional records come after
                # its others: audit.topic.add_fields).
                order = sorted(range(len(hashes)), key=lambda i: (hashes[i], locations[i]))
                first: dict[int, int] = {}
                groups: dict[int, list[int]] = {}  # hash -> [count, location, location, ...]
                for i in order:
                    h = hashes[i]
                    j = first.get(h)
                    if j is None:
                        first[h] = i
                        continue
                    loc = locations[i]
                    if loc != NO_LOCATION:
                        p = loc >> _PARTITION_SHIFT
                        by_partition[p] = by_partition.get(p, 0) + 1
                    group = groups.get(h)
                    if group is None:
                        groups[h] = [2, locations[j], loc]
                    else:
                        group[0] += 1
                        if len(group) <= MAX_LOCATIONS:
                            group.append(loc)
                del first
                repeated += len(groups)
                for group in groups.values():
                    extra += group[0] - 1
                best = heapq.nsmallest(self.examples, best + [
                    (g[2], g[0], g[1:]) for g in groups.values()])
        finally:
            self._dir.cleanup()
        examples = [RepeatExample(count, [_unpack_location(loc) for loc in locs
                                          if loc != NO_LOCATION])
                    for _, count, locs in best]
        return RepeatReport(self.field, self.records, self.nulls, repeated, extra,
                            dict(sorted(by_partition.items())), examples)

    def close(self) -> None:
        self._buffers = []
        self._dir.cleanup()


def digest(data: bytes) -> bytes:
    """What a key or value is compared by."""
    return blake2b(data, digest_size=8).digest()


def pack_locations(partition: int, offsets: Sequence[int]) -> Sequence[int]:
    """Each record's location in 64 bits (NO_LOCATION when they cannot be packed: no
    examples then)."""
    if not (0 <= partition < (1 << 16) and offsets and 0 <= min(offsets)
            and max(offsets) < (1 << _PARTITION_SHIFT)):
        return [NO_LOCATION] * len(offsets)
    base = partition << _PARTITION_SHIFT
    return [base | offset for offset in offsets]


def merge_repeats(field_name: str, parts: Sequence[RepeatReport], records: int, nulls: int,
                  examples: int) -> RepeatReport:
    """One field's reports over disjoint sets of values (the Spark audit's tasks) as one, as a
    single RepeatFinder would have made it."""
    by_partition: dict[int, int] = {}
    for part in parts:
        for p, n in part.by_partition.items():
            by_partition[p] = by_partition.get(p, 0) + n
    best = heapq.nsmallest(examples, (e for part in parts for e in part.examples),
                           key=lambda e: (e.locations[1:2], e.count, e.locations))
    return RepeatReport(field_name, records, nulls, sum(p.repeated for p in parts),
                        sum(p.extra for p in parts), dict(sorted(by_partition.items())), best)


def _unpack_location(loc: int) -> tuple[int, int]:
    return loc >> _PARTITION_SHIFT, loc & ((1 << _PARTITION_SHIFT) - 1)

