"""Real network partitions for the cluster tests: network namespaces the test makes.

A ``Topology`` is one namespace per node (``zk``, ``b1``, ``b2``, ..., ``client``), every
two nodes joined by a veth pair of their own (a full mesh: cutting one pair cuts exactly
those two nodes, nothing else). Each node's address is a /32 on its loopback, reached by
a /32 route over the link to that node, so no node forwards for another: with a link down
the two ends simply do not reach each other (the routes over it go with it; ``heal``
brings the link up and puts them back). Addresses are 10.23.0.<n>, visible only inside the
namespaces; nothing is added to the machine's own namespace and nothing leaves it.

Processes run in a node by ``preexec(node)`` (``setns`` in the child before it execs, e.g.
a BrokerProcess's ``preexec``: a netns broker is exec'd, never forked from the zygote,
which lives in the machine's namespace). The test itself talks to the nodes from inside
one (``with topology.inside("client"):``): ``setns`` moves only the calling thread, and the
threads it starts meanwhile (librdkafka's, kazoo's) stay in that namespace for good, and so
would a process it starts: the broker zygote (support/broker_forks.py) must not be started
from inside one.

``close`` always removes everything: it kills what still runs in the namespaces (only
processes a test started there can be in them) and deletes them, which deletes their
veths. A namespace of a test process that died without closing (its pid is in the name) is
deleted by the next Topology.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from support.brokers import BrokerProcess
from support.zookeepers import ZooKeeperServer

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
PREFIX = "onl"
IP_TIMEOUT = 10.0
_serial = itertools.count()
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> None:
    """Delete the namespaces of test processes that died without closing theirs."""
    for line in ip("netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        found = re.fullmatch(rf"{PREFIX}(\d+)x\d+-\w+", name)
        if found and not _pid_alive(int(found.group(1))):
            _delete_namespace(name)


def _delete_namespace(name: str) -> None:
    with contextlib.suppress(RuntimeError):
        for pid in ip("netns", "pids", name).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    with contextlib.suppress(RuntimeError):
        ip("netns", "delete", name)


class Topology:
    """Namespaces ``nodes`` joined pairwise; ``close`` (or the ``with`` block's end) removes
    them whatever happened."""

    def __init__(self, nodes: list[str]) -> None:
        sweep_stale()
        self.nodes = list(nodes)
        self.tag = f"{PREFIX}{os.getpid()}x{next(_serial)}"
        self.addresses = {node: f"10.23.0.{i + 1}" for i, node in enumerate(self.nodes)}
        self._made: list[str] = []
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def namespace(self, node: str) -> str:
        return f"{self.tag}-{node}"

    def address(self, node: str) -> str:
        return self.addresses[node]

    @staticmethod
    def _link(toward: str) -> str:
        return f"to-{toward}"

    def _build(self) -> None:
        for node in self.nodes:
            ip("netns", "add", self.namespace(node))
            self._made.append(self.namespace(node))
            ip("-n", self.namespace(node), "link", "set", "lo", "up")
            ip("-n", self.namespace(node), "addr", "add", f"{self.address(node)}/32",
               "dev", "lo")
        for a, b in itertools.combinations(self.nodes, 2):
            ip("link", "add", self._link(b), "netns", self.namespace(a), "type", "veth",
               "peer", "name", self._link(a), "netns", self.namespace(b))
            self.heal(a, b)

    def _ends(self, a: str, b: str) -> list[tuple[str, str, str]]:
        """(namespace, device, peer node) of both ends of the a-b link."""
        return [(self.namespace(a), self._link(b), b), (self.namespace(b), self._link(a), a)]

    def cut(self, a: str, b: str) -> None:
        """Both ends down: neither reaches the other (ENETUNREACH at once, their routes gone);
        an established connection's segments are lost."""
        for ns, dev, _ in self._ends(a, b):
            ip("-n", ns, "link", "set", dev, "down")

    def heal(self, a: str, b: str) -> None:
        for ns, dev, _ in self._ends(a, b):
            ip("-n", ns, "link", "set", dev, "up")
        for ns, dev, peer in self._ends(a, b):
            ip("-n", ns, "route", "replace", f"{self.address(peer)}/32", "dev", dev,
               "src", self.address(a if peer == b else b))

    def isolate(self, node: str, from_nodes: list[str]) -> Callable[[], None]:
        """Cut ``node`` from each of ``from_nodes``; returns what heals exactly those."""
        for other in from_nodes:
            self.cut(node, other)

        def heal() -> None:
            for other in from_nodes:
                self.heal(node, other)

        return heal

    def preexec(self, node: str) -> Callable[[], None]:
        """For ``subprocess.Popen(preexec_fn=...)``: the child enters ``node``'s namespace."""
        path = str(NETNS_DIR / self.namespace(node))
        return lambda: _setns(path)

    @contextlib.contextmanager
    def inside(self, node: str) -> Iterator[None]:
        """The calling thread in ``node``'s namespace for the block (threads it starts stay
        there); back where it was after, whatever happens."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _setns(NETNS_DIR / self.namespace(node))
            try:
                yield
            finally:
                if _libc.setns(home, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back to the thread's namespace")
        finally:
            os.close(home)

    def close(self) -> None:
        while self._made:
            _delete_namespace(self._made.pop())
        atexit.unregister(self.close)

    def __enter__(self) -> Topology:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NetnsBroker(BrokerProcess):
    """A BrokerProcess in a node of a Topology, listening (and registered) on the node's
    address; exec'd with the namespace entered before the interpreter starts."""

    def __init__(self, topology: Topology, node: str, data_dir: Path,
                 settings: dict[str, str]) -> None:
        self.host = topology.address(node)
        super().__init__(data_dir, {**settings, "listeners": f"PLAINTEXT://{self.host}:0"},
                         preexec=topology.preexec(node))

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> NetnsBroker:
        super().start()
        # BrokerProcess keeps the port for a restart, on loopback: here on the node's address
        self.settings["listeners"] = f"PLAINTEXT://{self.host}:{self.port}"
        return self


class NetnsZooKeeper(ZooKeeperServer):
    """A ZooKeeperServer in a node of a Topology, on the node's address: started (and
    restarted) from inside that namespace, so the JVM and the ruok probe are there."""

    def __init__(self, topology: Topology, node: str) -> None:
        super().__init__()
        self.topology, self.node = topology, node
        self.host = topology.address(node)

    def _start_once(self) -> bool:
        with self.topology.inside(self.node):
            return super()._start_once()
