"""Helpers for driving ``oncelog cluster up`` as a subprocess: its test
(tests/cluster/test_cluster_up_cli.py) and bench/cluster_stop.py share them."""

from __future__ import annotations

import os
import socket
import subprocess
import time


def free_ports(n: int) -> list[int]:
    """n consecutive free loopback ports, bound and released for the brokers to bind next.

    Taken below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768 on): a port
    from that range, once released, may be handed to any other process's connect() before
    ZooKeeper binds it (seen once: ZooKeeper exited at start). Below it only an explicit bind
    can take the port, and the tests bind port 0."""
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    start = 10_000 + (os.getpid() * 7919) % max(1, low - 10_000 - 1000)
    for base in range(start, start + 50 * n, n):
        sockets = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return list(range(base, base + n))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise AssertionError("no run of free ports")


def read_until(proc: subprocess.Popen, marker: str, timeout: float) -> str:
    os.set_blocking(proc.stdout.fileno(), False)
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        chunk = proc.stdout.read()
        if chunk:
            text += chunk.decode(errors="replace")
            if marker in text:
                return text
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"no {marker!r} from oncelog cluster up; got:\n{text}")
