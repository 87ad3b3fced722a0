"""A Fetch's records as a region of a segment file, found without reading them (zero-copy).

``Log.read`` reads the bytes it returns and walks them to cut at whole batches; a Fetch that
sends them with ``sendfile`` needs only where they lie. ``fetch_records`` finds the same
batches from the segment's offset index and a few batch headers (``_last_end`` reads the
headers between the index entries around the cut, never the records), and returns them as a
``FileRegion`` holding its own descriptor of the file: retention, compaction or a descriptor
released by ``open_files.py`` can close or delete the segment while the answer waits for a
slow reader, and the region still reads the bytes it was cut from. Below ``SPLICE_MIN`` bytes
the records are read as before (a pread and a copy cost less than a descriptor and a
sendfile).

tests/log/test_fetch_regions.py holds it to ``Log.read`` (and the read_committed cut) by a
property test.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os

from ..protocol.record_batch import HEADER_SIZE, read_header
from .disk import OsDisk, out_of_descriptors

log = logging.getLogger(__name__)

SPLICE_MIN = 32 * 1024


class TruncatedRegion(OSError):
    """The file holds fewer bytes than a region promised (cut back under it)."""

    def __init__(self, path: str) -> None:
        super().__init__(errno.EIO, "a segment was truncated under a pending fetch answer",
                         path)


class FileRegion:
    """``length`` bytes of a file from ``offset``, through a descriptor of its own (closed
    once sent, or by ``close``). ``offset`` and ``length`` move on as it is sent."""

    __slots__ = ("fd", "length", "offset", "path")

    def __init__(self, fd: int, offset: int, length: int, path: str) -> None:
        self.fd = fd
        self.offset = offset
        self.length = length
        self.path = path

    def __len__(self) -> int:
        return self.length

    def read(self) -> bytes:
        """The bytes, for a connection that cannot sendfile (TLS); closes the region."""
        try:
            data = os.pread(self.fd, self.length, self.offset)
            if len(data) != self.length:
                raise TruncatedRegion(self.path)
            return data
        finally:
            self.close()

    def truncated(self) -> bool:
        return os.fstat(self.fd).st_size < self.offset + self.length

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:  # an answer dropped unsent (a connection lost) keeps no fd
        self.close()


def fetch_records(plog, offset: int, max_bytes: int, min_one_batch: bool,
                  end_offset: int) -> tuple[bytes | FileRegion, int]:
    """What ``plog.read(offset, max_bytes, min_one_batch)`` returns, cut before the first
    batch at or after ``end_offset`` (the high watermark, or the last stable offset for
    read_committed), as bytes or a FileRegion; and the offset after the last batch (-1 when
    none)."""
    segments = plog.segments
    if not segments:
        return b"", -1
    i = plog._segment_for(offset)
    while i < len(segments):
        segment = segments[i]
        position = segment.position_of(offset)
        if position is not None:
            return _records(segment, position, max_bytes, min_one_batch, end_offset)
        i += 1
    return b"", -1


def _records(segment, position: int, max_bytes: int, min_one_batch: bool,
             end_offset: int) -> tuple[bytes | FileRegion, int]:
    size = segment.size
    limit = min(size, position + max(0, max_bytes))
    if limit == size:
        end, upper = size, segment.next_offset
    else:
        end, upper = _last_end(segment, position, limit)
    if end == position:
        if not min_one_batch or size <= position:
            return b"", -1
        header = read_header(segment.read_at(position, HEADER_SIZE))
        end, upper = position + header.size, header.last_offset + 1
    if upper > end_offset:  # batches from end_offset on are not readable (yet)
        cut = segment.position_of(end_offset)
        header = read_header(segment.read_at(cut, HEADER_SIZE))
        if header.base_offset < end_offset:  # not a batch boundary: that batch goes too
            end, upper = cut + header.size, header.last_offset + 1
        else:
            end, upper = _last_end(segment, position, cut)
        if end == position:
            return b"", -1
    length = end - position
    if length < SPLICE_MIN or not isinstance(segment._disk, OsDisk):
        return segment.read_at(position, length), upper
    try:
        fd = segment.dup_fd()
    except OSError as exc:
        if not out_of_descriptors(exc):
            raise
        return segment.read_at(position, length), upper  # no descriptor to spare: copy
    return FileRegion(fd, position, length, segment.path), upper


def _last_end(segment, start: int, limit: int) -> tuple[int, int]:
    """The end of the last whole batch from ``start`` (a batch's position) that ends at or
    before ``limit``, and the offset after it; (start, -1) when none does. The headers read
    are those from the index entry before the last one at or before ``limit``: at most two
    index intervals' worth of batches."""
    positions = segment.offset_index.positions
    j = bisect.bisect_right(positions, limit) - 1
    pos = max(start, positions[j - 1]) if j >= 1 else start
    end, upper = start, -1
    while pos + HEADER_SIZE <= limit:
        header = read_header(segment.read_at(pos, HEADER_SIZE))
        if pos + header.size > limit:
            break
        pos += header.size
        end, upper = pos, header.last_offset + 1
    return end, upper
