"""``oncelog cluster up`` starts Debian's ZooKeeper and N brokers on loopback, prints the
bootstrap list, and stops them all on Ctrl-C; ``oncelog cluster status`` shows the brokers,
the controller, and the under-replicated and offline partitions."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

TIMEOUT = 60.0


def _free_ports(n: int) -> list[int]:
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


def _read_until(proc: subprocess.Popen, marker: str, timeout: float) -> str:
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


def test_cluster_up_status_and_ctrl_c(tmp_path):
    zk_port, *broker_ports = _free_ports(3)
    up = subprocess.Popen(
        [sys.executable, "-m", "oncelog", "cluster", "up", "--brokers", "2",
         "--data-dir", str(tmp_path / "cluster"), "--base-port", str(broker_ports[0]),
         "--zookeeper-port", str(zk_port), "--set", "zookeeper.session.timeout.ms=2000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        text = _read_until(up, "Ctrl-C stops them all", TIMEOUT)
        bootstrap = f"127.0.0.1:{broker_ports[0]},127.0.0.1:{broker_ports[1]}"
        assert f"bootstrap servers: {bootstrap}" in text
        status = ""
        deadline = time.monotonic() + TIMEOUT
        while "Broker: 2" not in status and time.monotonic() < deadline:
            status = subprocess.run(
                [sys.executable, "-m", "oncelog", "cluster", "status", "--bootstrap-server",
                 f"127.0.0.1:{broker_ports[1]}"], capture_output=True, text=True,
                timeout=TIMEOUT).stdout
        assert "Broker: 1\tEndpoint: 127.0.0.1:" in status and "Broker: 2" in status, status
        assert "Controller: 1" in status or "Controller: 2" in status
        assert "Under-replicated partitions: 0" in status
        assert "Offline partitions: 0" in status
        up.send_signal(signal.SIGINT)
        assert up.wait(TIMEOUT) == 0
        rest = up.stdout.read().decode(errors="replace")
        assert "stopping the brokers, then ZooKeeper" in text + rest
        for port in [zk_port, *broker_ports]:
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
        assert "stopped cleanly" in (tmp_path / "cluster" / "broker-1.log").read_text()
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
