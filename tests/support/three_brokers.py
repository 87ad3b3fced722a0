"""Three brokers (ids 1-3) in a chroot of the session ZooKeeper, with a kazoo client on that
chroot: the cluster the tests of tests/cluster/ and the Spark-on-a-cluster tests start, each
adding what it asks of it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from support.brokers import BrokerProcess
from support.waits import wait_for
from support.zookeepers import observer

SESSION_MS = 2000
TIMEOUT = 30.0


class ThreeBrokers:
    def __init__(self, zookeeper, root, name: str, settings: dict[str, str]) -> None:
        self.connect = zookeeper.chroot(name)
        chroot = self.connect[len(zookeeper.connect):]
        self.zk = observer(zookeeper.connect, chroot)
        self.brokers = {
            i: BrokerProcess(root / f"b{i}", {
                "broker.id": str(i), "zookeeper.connect": self.connect,
                "zookeeper.session.timeout.ms": str(SESSION_MS), **settings})
            for i in (1, 2, 3)}
        with ThreadPoolExecutor(3) as starting:  # each takes a moment to start: in parallel
            list(starting.map(BrokerProcess.start, self.brokers.values()))
        wait_for(lambda: sorted(self.zk.get_children("/brokers/ids")) == ["1", "2", "3"],
                 TIMEOUT, "three brokers registered")
        self.wait_named_by_all("three brokers")

    def wait_named_by_all(self, what: str) -> None:
        """Until every live broker's DescribeCluster names all three: each answers from its
        own cache of the registrations in ZooKeeper, a moment behind them (a CreateTopics
        with replication factor 3 on a broker counting fewer is INVALID_REPLICATION_FACTOR).
        Not Metadata's list: it names a broker that died without a controlled shutdown for
        a few seconds after (cluster/departed_brokers.py), so a broker killed and started
        again is named there before it has registered."""
        from oncelog.client.admin.admin import Admin

        def whole(b) -> bool:
            admin = Admin({"bootstrap.servers": b.bootstrap})
            try:
                return len(admin.describe_cluster().brokers) == 3
            finally:
                admin.close()
        wait_for(lambda: all(whole(b) for b in self.brokers.values() if b.alive), TIMEOUT,
                 f"{what}, named by every broker")

    def close(self) -> None:
        for broker in self.brokers.values():
            broker.kill()
        self.zk.stop()
        self.zk.close()
