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
# Printed before it for every listener (the line above names the first).
_LISTENER_LINE = "oncelog listener {name} on {host}:{port}"
_LISTENER_PATTERN = re.compile(r"oncelog listener (\w+) on ([0-9.]+):(\d+)")


def listening_line(host: str, port: int) -> str:
    return _LINE.format(host=host, port=port)


def metrics_line(host: str, port: int) -> str:
    return _METRICS_LINE.format(host=host, port=port)


def listener_line(name: str, host: str, port: int) -> str:
    return _LISTENER_LINE.format(name=name, host=host, port=port)


def listener_ports(text: str) -> dict[str, int]:
    """Listener name -> port, from the lines a broker printed (``wait_for_ports``'s text)."""
    return {m.group(1): int(m.group(3)) for m in _LISTENER_PATTERN.finditer(text)}


def wait_for_port(proc: subprocess.Popen, timeout: float) -> int | None:
    """The port the broker announces on ``proc``'s stdout (a pipe), or None when the
    process exits or ``timeout`` seconds pass first."""
    ports = wait_for_ports(proc, timeout)
    return None if ports is None else ports[0]


def wait_for_ports(proc: subprocess.Popen, timeout: float) -> tuple[int, int | None] | None:
    """(Kafka port, metrics port or None) as the broker announces them on ``proc``'s
    stdout, or None when the process exits or ``timeout`` seconds pass first."""
    found = wait_for_announcement(proc, timeout)
    return None if found is None else found[:2]


def wait_for_announcement(proc: subprocess.Popen, timeout: float
                          ) -> tuple[int, int | None, dict[str, int]] | None:
    """``wait_for_ports``' answer and every listener's port by name."""
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
                return (int(match.group(2)), int(metrics.group(2)) if metrics else None,
                        listener_ports(text))
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    return None
