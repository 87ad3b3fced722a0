"""Writing a small file so that a crash leaves either the old or the new one, never half."""

from __future__ import annotations

import os


def write_atomically(path: str, data: bytes) -> None:
    """Write a temporary file, fsync it, rename it over ``path``."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
