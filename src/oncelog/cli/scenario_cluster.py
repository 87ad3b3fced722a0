"""``oncelog scenario failover``'s own cluster: ZooKeeper and three brokers on loopback, started
as ``oncelog cluster up`` starts them (its helpers), on free ports, with data in a temporary
directory (or ``--data-dir``, kept); the scenario may kill, pause, resume and start each
broker (chaos/failover.py's ``Cluster``). Everything is stopped when it ends, however it ends.
bench/replication.py measures on it too.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

from ..broker.announce import wait_for_ports
from .cluster_up import CHROOT, START_TIMEOUT_S, _start_broker, _start_zookeeper, _stop

SETTINGS = ["zookeeper.session.timeout.ms=3000", "replica.fetch.wait.max.ms=100",
            "replica.fetch.backoff.ms=100", "replica.lag.time.max.ms=10000"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    def __init__(self, data_dir: str | None, brokers: int = 3,
                 settings: list[str] | None = None) -> None:
        self.keep = data_dir is not None
        self.settings = SETTINGS if settings is None else settings
        self.data = Path(data_dir or tempfile.mkdtemp(prefix="oncelog-failover-")).resolve()
        self.data.mkdir(parents=True, exist_ok=True)
        self.ids = list(range(1, brokers + 1))
        self.ports: dict[int, int] = {}
        self.procs: dict[int, subprocess.Popen] = {}
        self.zookeeper: subprocess.Popen | None = None
        self.connect = ""

    def __enter__(self) -> LocalCluster:
        try:
            port = _free_port()
            self.zookeeper = _start_zookeeper(self.data / "zookeeper", port)
            self.connect = f"127.0.0.1:{port}{CHROOT}"
            for i in self.ids:  # all at once: each takes a second or two to import
                self.procs[i] = self._spawn(i, 0)
            for i in self.ids:
                self._announced(i)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _spawn(self, broker_id: int, port: int) -> subprocess.Popen:
        return _start_broker(broker_id, port, self.data, self.connect, self.settings)

    def _announced(self, broker_id: int) -> None:
        found = wait_for_ports(self.procs[broker_id], START_TIMEOUT_S)
        if found is None:
            raise SystemExit(f"oncelog scenario: broker {broker_id} did not start; see "
                             f"{self.data / f'broker-{broker_id}.log'}")
        self.ports[broker_id] = found[0]

    def bootstrap(self, broker_id: int) -> str:
        return f"127.0.0.1:{self.ports[broker_id]}"

    def kill(self, broker_id: int) -> None:
        proc = self.procs[broker_id]
        proc.kill()
        proc.wait(START_TIMEOUT_S)

    def stop(self, broker_id: int) -> None:
        """SIGTERM: a controlled shutdown (its leaderships handed over first)."""
        _stop([(f"broker {broker_id}", self.procs[broker_id])])

    def pause(self, broker_id: int) -> None:
        os.kill(self.procs[broker_id].pid, signal.SIGSTOP)

    def resume(self, broker_id: int) -> None:
        os.kill(self.procs[broker_id].pid, signal.SIGCONT)

    def start(self, broker_id: int) -> None:
        """Again on its port and data."""
        self.procs[broker_id] = self._spawn(broker_id, self.ports[broker_id])
        self._announced(broker_id)

    def log_text(self, broker_id: int) -> str:
        try:
            return (self.data / f"broker-{broker_id}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __exit__(self, *exc) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)  # a paused broker cannot stop
        _stop([(f"broker {i}", p) for i, p in self.procs.items()])
        if self.zookeeper is not None:
            _stop([("ZooKeeper", self.zookeeper)])
        if not self.keep:
            shutil.rmtree(self.data, ignore_errors=True)


def run_failover_locally(data_dir: str | None, topic: str | None):
    from ..chaos.failover import run_failover

    with LocalCluster(data_dir) as cluster:
        print(f"ZooKeeper at {cluster.connect}, brokers at "
              f"{', '.join(cluster.bootstrap(i) for i in cluster.ids)}", flush=True)
        return run_failover(cluster, topic)
