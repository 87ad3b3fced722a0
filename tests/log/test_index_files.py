"""The index files' bytes (log/index.py): written column by column, they are what packing
each entry with Kafka's layout gives (.index: relative offset and position, uint32 each;
.timeindex: timestamp int64 and relative offset uint32; big-endian), and they load back."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.log.disk import OS_DISK
from oncelog.log.index import OffsetIndex, TimeIndex

UINT32 = st.integers(0, 2**32 - 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(UINT32, UINT32), max_size=300))
def test_offset_index_bytes_are_kafkas(tmp_path_factory, entries):
    index = OffsetIndex(str(tmp_path_factory.mktemp("i") / "0.index"), OS_DISK)
    for offset, position in entries:
        index.append(offset, position)
    index.save()
    with open(index.path, "rb") as f:
        assert f.read() == b"".join(struct.pack(">II", o, p) for o, p in entries)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-2**63, 2**63 - 1), UINT32), max_size=300))
def test_time_index_bytes_are_kafkas(tmp_path_factory, entries):
    index = TimeIndex(str(tmp_path_factory.mktemp("t") / "0.timeindex"), OS_DISK)
    for timestamp, offset in entries:
        index.timestamps.append(timestamp)
        index.relative_offsets.append(offset)
    index.save()
    with open(index.path, "rb") as f:
        assert f.read() == b"".join(struct.pack(">qI", t, o) for t, o in entries)


def test_a_full_segments_indexes_load_back(tmp_path):
    entries = (1 << 30) // 4096  # a 1 GiB segment, an entry each 4 KiB
    offsets = OffsetIndex(str(tmp_path / "0.index"), OS_DISK)
    times = TimeIndex(str(tmp_path / "0.timeindex"), OS_DISK)
    for i in range(entries):
        offsets.append(4 * i, 4096 * i)
        times.maybe_append(1_700_000_000_000 + i, 4 * i)
    offsets.save()
    times.save()
    loaded = OffsetIndex(offsets.path, OS_DISK)
    assert loaded.load(1 << 30) and loaded.positions == offsets.positions
    assert loaded.relative_offsets == offsets.relative_offsets
    loaded_times = TimeIndex(times.path, OS_DISK)
    assert loaded_times.load(4 * entries) and loaded_times.timestamps == times.timestamps
