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
from support.cluster_up import free_ports, read_until

TIMEOUT = 60.0


def test_cluster_up_status_and_ctrl_c(tmp_path):
    zk_port, *broker_ports = free_ports(3)
    up = subprocess.Popen(
        [sys.executable, "-m", "oncelog", "cluster", "up", "--brokers", "2",
         "--data-dir", str(tmp_path / "cluster"), "--base-port", str(broker_ports[0]),
         "--zookeeper-port", str(zk_port), "--set", "zookeeper.session.timeout.ms=2000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        # started as a shell script's background job is: SIGINT inherited ignored (it
        # went unheard then, and `cluster up` ran on until killed)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        text = read_until(up, "Ctrl-C stops them all", TIMEOUT)
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
