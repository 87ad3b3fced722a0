"""The line ``oncelog broker`` prints once it listens, and reading it back from the broker's
process: how tests, benchmarks and scripts learn the port of a broker started on port 0."""

from __future__ import annotations

import os
import re
import subprocess
import time

_LINE = "oncelog broker listening on {host}:{port}"
_PATTERN = re.compile(r"listening on ([0-9.]+):(\d+)")
# Printed before the line above when metrics.listener is set.
_METRICS_LINE = "oncelog metrics served at http://{host}:{port}/metrics"
_METRICS_PATTERN = re.compile(r"metrics served at http://([0-9.]+):(\d+)/metrics")


def listening_line(host: str, port: int) -> str:
    return _LINE.format(host=host, port=port)


def metrics_line(host: str, port: int) -> str:
    return _METRICS_LINE.format(host=host, port=port)


def wait_for_port(proc: subprocess.Popen, timeout: float) -> int | None:
    """The port the broker announces on ``proc``'s stdout (a pipe), or None when the
    process exits or ``timeout`` seconds pass first."""
    ports = wait_for_ports(proc, timeout)
    return None if ports is None else ports[0]


def wait_for_ports(proc: subprocess.Popen, timeout: float) -> tuple[int, int | None] | None:
    """(Kafka port, metrics port or None) as the broker announces them on ``proc``'s
    stdout, or None when the process exits or ``timeout`` seconds pass first."""
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        chunk = proc.stdout.read()
        if chunk:
            buf += chunk
            text = buf.decode(errors="replace")
            match = _PATTERN.search(text)
            if match:
                metrics = _METRICS_PATTERN.search(text)
                return int(match.group(2)), int(metrics.group(2)) if metrics else None
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    return None
