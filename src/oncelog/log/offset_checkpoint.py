"""Kafka's offset checkpoint file: one file per log directory holding one offset for each
partition in it (Kafka's OffsetCheckpointFile, the format of `replication-offset-checkpoint`).

    0                    <- version
    2                    <- number of entries
    orders 0 1041        <- topic, partition, offset
    orders 1 977

One file per directory, not per partition, because a broker writes it every few seconds for
every partition whose offset moved: with a file per partition, 1,000 partitions cost 1,000
fsyncs per interval. The file is replaced atomically (`disk.write_atomically`), so it is
durably either the old entries or the new ones.

A file that does not parse is read as empty (every offset falls back to its default, which for
a high watermark is the safe 0) and logged; the next write replaces it.
"""

from __future__ import annotations

import logging

from .disk import OsDisk, read_file, write_atomically

log = logging.getLogger(__name__)

VERSION = 0

Entries = dict[tuple[str, int], int]


def encode(entries: Entries) -> bytes:
    lines = [str(VERSION), str(len(entries))]
    lines += [f"{topic} {partition} {offset}"
              for (topic, partition), offset in sorted(entries.items())]
    return ("\n".join(lines) + "\n").encode()


def decode(data: bytes) -> Entries:
    """The entries, or ValueError for anything but a whole, well-formed file."""
    lines = data.decode().split("\n")
    if len(lines) < 3 or lines[-1] != "" or int(lines[0]) != VERSION:
        raise ValueError("not an offset checkpoint of version 0")
    count = int(lines[1])
    body = lines[2:-1]
    if count != len(body):
        raise ValueError(f"{count} entries announced, {len(body)} present")
    entries: Entries = {}
    for line in body:
        topic, partition, offset = line.split(" ")
        entries[(topic, int(partition))] = int(offset)
    return entries


def read(disk: OsDisk, path: str) -> Entries:
    try:
        return decode(read_file(disk, path))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        log.error("the offset checkpoint %s cannot be read (%s): read as empty", path, exc)
        return {}


def write(disk: OsDisk, path: str, entries: Entries) -> None:
    write_atomically(disk, path, encode(entries))
