"""Sparse indexes of one segment, named as in Kafka: OffsetIndex and TimeIndex.

Both live in memory as arrays and are written out whole when the segment is sealed (rolled or
the log closed cleanly). A missing or inconsistent index file is never trusted: the segment is
scanned and the index rebuilt (see LogSegment.recover).

File formats (big-endian):
    .index      entries of (relative offset uint32, file position uint32)
    .timeindex  entries of (max timestamp int64, relative offset uint32)
"""

from __future__ import annotations

import bisect
import struct
from array import array

from .disk import OsDisk, read_file, write_atomically

_OFFSET_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")


class OffsetIndex:
    """Maps a relative offset to the file position of the batch that starts there."""

    def __init__(self, path: str, disk: OsDisk) -> None:
        self.path = path
        self._disk = disk
        self.relative_offsets = array("I")
        self.positions = array("I")

    def __len__(self) -> int:
        return len(self.positions)

    def append(self, relative_offset: int, position: int) -> None:
        self.relative_offsets.append(relative_offset)
        self.positions.append(position)

    def lookup(self, relative_offset: int) -> int:
        """Position of the last indexed batch at or before ``relative_offset`` (0 if none)."""
        i = bisect.bisect_right(self.relative_offsets, relative_offset)
        return self.positions[i - 1] if i else 0

    def clear(self) -> None:
        del self.relative_offsets[:]
        del self.positions[:]

    def save(self) -> None:
        data = b"".join(
            _OFFSET_ENTRY.pack(o, p)
            for o, p in zip(self.relative_offsets, self.positions, strict=True)
        )
        write_atomically(self._disk, self.path, data)

    def load(self, segment_size: int) -> bool:
        """Load from disk; False when the file is missing or cannot describe this segment."""
        try:
            data = read_file(self._disk, self.path)
        except FileNotFoundError:
            return False
        if len(data) % _OFFSET_ENTRY.size:
            return False
        self.clear()
        last_offset = last_position = -1
        for o, p in _OFFSET_ENTRY.iter_unpack(data):
            if o <= last_offset or p <= last_position or p >= segment_size:
                self.clear()
                return False
            self.append(o, p)
            last_offset, last_position = o, p
        return True


class TimeIndex:
    """Maps a timestamp to the first relative offset whose batch may hold it or later ones."""

    def __init__(self, path: str, disk: OsDisk) -> None:
        self.path = path
        self._disk = disk
        self.timestamps = array("q")
        self.relative_offsets = array("I")

    def __len__(self) -> int:
        return len(self.timestamps)

    @property
    def last_timestamp(self) -> int:
        return self.timestamps[-1] if self.timestamps else -1

    def maybe_append(self, timestamp: int, relative_offset: int) -> None:
        # Entries stay strictly increasing in timestamp, as Kafka's do.
        if timestamp > self.last_timestamp:
            self.timestamps.append(timestamp)
            self.relative_offsets.append(relative_offset)

    def lookup(self, timestamp: int) -> int:
        """Relative offset to start scanning from for the first batch with max ts >= timestamp."""
        i = bisect.bisect_left(self.timestamps, timestamp)
        return self.relative_offsets[i - 1] if i else 0

    def clear(self) -> None:
        del self.timestamps[:]
        del self.relative_offsets[:]

    def save(self) -> None:
        data = b"".join(
            _TIME_ENTRY.pack(t, o)
            for t, o in zip(self.timestamps, self.relative_offsets, strict=True)
        )
        write_atomically(self._disk, self.path, data)

    def load(self, max_relative_offset: int) -> bool:
        try:
            data = read_file(self._disk, self.path)
        except FileNotFoundError:
            return False
        if len(data) % _TIME_ENTRY.size:
            return False
        self.clear()
        last_ts = last_offset = -1
        for t, o in _TIME_ENTRY.iter_unpack(data):
            if t <= last_ts or o < last_offset or o > max_relative_offset:
                self.clear()
                return False
            self.timestamps.append(t)
            self.relative_offsets.append(o)
            last_ts, last_offset = t, o
        return True
