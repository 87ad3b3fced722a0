"""The line ``oncelog broker`` prints once it listens, and reading it back from the broker's
process: how tests, benchmarks and scripts learn the port of a broker started on port 0."""

from __future__ import annotations

import os
import re
import subprocess
import time

_LINE = "oncelog broker listening on {host}:{port}"
_PATTERN = re.compile(r"listening on ([0-9.]+):(\d+)")


def listening_line(host: str, port: int) -> str:
    return _LINE.format(host=host, port=port)


def wait_for_port(proc: subprocess.Popen, timeout: float) -> int | None:
    """The port the broker announces on ``proc``'s stdout (a pipe), or None when the
    process exits or ``timeout`` seconds pass first."""
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        chunk = proc.stdout.read()
        if chunk:
            buf += chunk
            match = _PATTERN.search(buf.decode(errors="replace"))
            if match:
                return int(match.group(2))
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    return None
