"""``partition.metadata``: which topic a partition directory belongs to (Kafka's KIP-516 file).

A topic deleted and re-created under the same name has another topic id, so a directory of
the old one that a crash left behind is told apart from the new topic's and removed instead
of read. Kafka's format: ``version: 0`` and ``topic_id: <base64 of the 16 bytes>``.
"""

from __future__ import annotations

import base64
import os
import uuid

from .disk import OsDisk, read_file, write_atomically

FILE_NAME = "partition.metadata"


def write(disk: OsDisk, directory: str, topic_id: uuid.UUID) -> None:
    encoded = base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()
    write_atomically(disk, os.path.join(directory, FILE_NAME),
                     f"version: 0\ntopic_id: {encoded}\n".encode())


def read(disk: OsDisk, directory: str) -> uuid.UUID | None:
    """The topic id the directory names; None when it names none (or none readably)."""
    try:
        text = read_file(disk, os.path.join(directory, FILE_NAME)).decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    try:
        return uuid.UUID(bytes=base64.urlsafe_b64decode(fields["topic_id"] + "=="))
    except (KeyError, ValueError):
        return None
