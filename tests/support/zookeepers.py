"""A real ZooKeeper server for the cluster tests: Debian's package run from its jar.

One standalone server per test session (it costs a JVM start, about a second), on a free
loopback port with its own data directory; each test works under its own chroot so tests
sharing the server never see each other's znodes. Debian's ``zookeeper`` package puts the
server in /usr/share/java/zookeeper.jar, whose manifest names its dependencies' jars, so the
jar alone is the classpath (``make test`` installs the package when it is missing).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
# The server's tick: sessions may be as short as two ticks, so a test can let a session
# expire in about a second instead of Kafka's 18.
TICK_MS = 250
_START_ATTEMPTS = 3  # a free port taken by someone else between our probe and the bind


def _die_with_parent() -> None:
    """In the child: SIGKILL when the test process dies, however it dies (a JVM left behind
    holds 100 MB and a port on a shared machine)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the socket listening on ``port`` (in its own network
    namespace). The port was free when probed, but another worker's ZooKeeper may have bound it
    first: then "imok" came from that server while ours was failing to bind, and a test took it
    for its own (one connected to a server its test had SIGSTOPped, and timed out)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def four_letter_word(port: int, word: bytes, timeout: float = 1.0,
                     host: str = "127.0.0.1") -> bytes:
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(word)
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


def observer(connect: str, chroot: str | None = None):
    """A started KazooClient through which a test reads (or writes) what the brokers keep in
    ZooKeeper. It reconnects as a broker does, backing off to at most a second: kazoo's
    default backoff grows towards an hour, and a client still asleep when a restarted server
    has been up a session timeout has lost its session. ``observer.retry(read, ...)`` runs a
    read again through a lost connection or an expired session (kazoo opens a new one), for
    at most START_TIMEOUT seconds."""
    from kazoo.client import KazooClient
    from kazoo.retry import KazooRetry

    client = KazooClient(
        hosts=connect, timeout=10,
        connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0),
        command_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0,
                       "deadline": START_TIMEOUT})
    client.start(timeout=START_TIMEOUT)
    if chroot:
        client.ensure_path(chroot)
        client.chroot = chroot
    return client


class ZooKeeperServer:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="oncelog-zk-"))
        self.port = 0
        self.host = "127.0.0.1"  # another for a server in a test's network namespace
        self.proc: subprocess.Popen | None = None
        self._chroots = itertools.count()

    @property
    def connect(self) -> str:
        return f"{self.host}:{self.port}"

    def chroot(self, name: str = "t") -> str:
        """A fresh connect string of its own: ``127.0.0.1:port/<unique chroot>``."""
        return f"{self.connect}/{name}-{next(self._chroots)}-{uuid.uuid4().hex[:8]}"

    def start(self) -> ZooKeeperServer:
        if not ZOOKEEPER_JAR.exists():
            raise RuntimeError(f"{ZOOKEEPER_JAR} is missing: install Debian's zookeeper "
                               f"package (make system-deps)")
        for _ in range(_START_ATTEMPTS):
            self.port = _free_port()
            if self._start_once():
                return self
        raise RuntimeError(f"ZooKeeper did not start; its log:\n{self.log_text()}")

    def _start_once(self) -> bool:
        data = self.dir / "data"
        data.mkdir(exist_ok=True)
        cfg = self.dir / "zoo.cfg"
        cfg.write_text(
            f"tickTime={TICK_MS}\n"
            f"dataDir={data}\n"
            f"clientPort={self.port}\n"
            f"clientPortAddress={self.host}\n"
            f"minSessionTimeout={2 * TICK_MS}\n"
            "maxSessionTimeout=60000\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr\n"
            "forceSync=no\n"  # a test server: its data dies with the session
        )
        java = shutil.which("java") or "java"
        log = open(self.dir / "zookeeper.log", "ab")
        self.proc = subprocess.Popen(
            [java, "-Xmx96m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             "-Dzookeeper.admin.enableServer=false", "-cp", str(ZOOKEEPER_JAR),
             "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_die_with_parent)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                return False
            try:
                if four_letter_word(self.port, b"ruok", host=self.host) == b"imok" \
                        and _listens(self.proc.pid, self.port):
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"ZooKeeper did not answer ruok in {START_TIMEOUT}s; its log:\n"
                           f"{self.log_text()}")

    def restart(self) -> None:
        """Killed and started again on the same port and data: sessions the server held
        come back with it, those that timed out meanwhile are expired."""
        self.stop()
        deadline = time.monotonic() + START_TIMEOUT
        while not self._start_once():  # the port may linger a moment after the kill
            if time.monotonic() >= deadline:
                raise RuntimeError(f"ZooKeeper did not restart; its log:\n{self.log_text()}")
            time.sleep(0.1)

    def log_text(self) -> str:
        try:
            return (self.dir / "zookeeper.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(STOP_TIMEOUT)
            self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def count_requests(client) -> list[int]:
    """A counter (``[n]``) of the requests a kazoo ``client`` sends from now on."""
    sent = [0]
    call = client._call

    def counted(request, async_object):
        sent[0] += 1
        return call(request, async_object)

    client._call = counted
    return sent


def store_fixture(name: str):
    """A module's ``store`` fixture: ``store = store_fixture("topic_reads")`` gives each test
    a ZooKeeperStore (5 s sessions) on a chroot of its own in the session's ZooKeeper
    (the ``zookeeper`` fixture), closed after it."""
    import pytest

    from oncelog.metadata.zookeeper import ZooKeeperStore

    @pytest.fixture
    def store(zookeeper):
        opened = ZooKeeperStore(zookeeper.chroot(name), 5000)
        yield opened
        opened.close()

    return store


def registered_member(connect: str, broker_id: int, session_ms: int = 4000):
    """Broker ``broker_id``'s ClusterMember on a session of its own, registered (and, when
    first, controller) by one pass on the caller's thread; the caller closes it."""
    from oncelog.cluster.membership import ClusterMember
    from oncelog.metadata.zookeeper import ZooKeeperStore

    member = ClusterMember(ZooKeeperStore(connect, session_ms), broker_id, None)
    member.start("127.0.0.1", 9000 + broker_id, background=False)
    return member
