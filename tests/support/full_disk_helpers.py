"""What tests besides tests/broker/test_full_disk.py use of it."""
from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str):
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill_up(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while os.write(fd, bytes(4096)) > 0:
            pass
    except OSError:  # ENOSPC: full
        pass
    finally:
        os.close(fd)
