"""What an operator of a three-broker cluster sees and relies on (issue 23): Kafka's
replication metrics on ``/metrics`` (broker/replication_metrics.py) and ``oncelog cluster
status`` follow a follower killed and restarted, and new topics are not placed on a broker
whose log directories have all failed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request

import pytest
from support.three_brokers import TIMEOUT, ThreeBrokers
from support.waits import wait_for

from oncelog.client.admin.admin import Admin

pytestmark = pytest.mark.xdist_group("zookeeper")


class Cluster(ThreeBrokers):
    def __init__(self, zookeeper, root) -> None:
        super().__init__(zookeeper, root, "ops", {})

    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values() if b.alive)

    def state(self, topic: str, p: int = 0) -> dict:
        return json.loads(self.zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")[0])

    def controller(self) -> int:
        return json.loads(self.zk.get("/controller")[0])["brokerid"]

    def create(self, topic: str, partitions: int, rf: int,
               assignments: dict[int, list[int]] | None = None) -> None:
        with Admin({"bootstrap.servers": self.bootstrap()}) as admin:
            if assignments:  # Kafka asks for -1, -1 with a manual assignment
                partitions, rf = -1, -1
            admin.create_topic(topic, partitions, rf, assignments=assignments)

    def metric(self, broker: int, name: str) -> float:
        with urllib.request.urlopen(self.brokers[broker].metrics_url, timeout=10) as answer:
            text = answer.read().decode()
        found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
        assert found, f"{name} not in broker {broker}'s /metrics"
        return float(found.group(1))


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    running = Cluster(zookeeper, tmp_path_factory.mktemp("ops"))
    yield running
    running.close()


def _status(cluster: Cluster) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "oncelog", "cluster", "status",
                           "--bootstrap-server", cluster.bootstrap()],
                          capture_output=True, text=True, timeout=TIMEOUT)
    return done.returncode, done.stdout


def test_replication_metrics_and_status_follow_a_follower_killed_and_restarted(cluster):
    """A follower (not the controller) is killed: its leader counts the ISR shrink the
    controller writes and reports the partition under-replicated, the
    controller reports the partition only the follower held offline, and ``cluster status``
    lists both; restarted, it catches up, the leader counts the expansion it writes, and
    every gauge is back to 0."""
    cluster.create("rep", 1, 3)
    wait_for(lambda: len(cluster.state("rep")["isr"]) == 3, TIMEOUT, "rep in sync")
    leader = cluster.state("rep")["leader"]
    victim = next(b for b in (1, 2, 3) if b not in (leader, cluster.controller()))
    cluster.create("solo", 1, 1, assignments={0: [victim]})
    wait_for(lambda: cluster.state("solo")["leader"] == victim, TIMEOUT, "solo led")
    m = "kafka_server_replicamanager_"
    shrinks = cluster.metric(leader, m + "isrshrinks_total")
    expands = cluster.metric(leader, m + "isrexpands_total")
    assert cluster.metric(leader, m + "underreplicatedpartitions") == 0
    assert cluster.metric(leader, m + "leadercount") >= 1
    assert cluster.metric(leader, m + "partitioncount") >= 1
    controller = cluster.controller()
    assert cluster.metric(controller, "kafka_controller_kafkacontroller_activecontrollercount") == 1
    assert cluster.metric(victim, "kafka_controller_kafkacontroller_activecontrollercount") == 0

    cluster.brokers[victim].kill()
    wait_for(lambda: cluster.metric(leader, m + "underreplicatedpartitions") >= 1, TIMEOUT,
             "the leader reports rep under-replicated")
    assert cluster.metric(leader, m + "isrshrinks_total") > shrinks
    wait_for(lambda: cluster.metric(
        controller, "kafka_controller_kafkacontroller_offlinepartitionscount") >= 1, TIMEOUT,
        "the controller reports solo offline")
    code, status = _status(cluster)
    assert code == 1, status  # an offline partition
    assert "Under-replicated partitions: 1\n\trep-0" in status, status
    assert "Offline partitions: 1\n\tsolo-0" in status, status

    cluster.brokers[victim].start()
    wait_for(lambda: cluster.metric(leader, m + "underreplicatedpartitions") == 0, TIMEOUT,
             "rep in sync again")
    assert cluster.metric(leader, m + "isrexpands_total") > expands
    wait_for(lambda: cluster.metric(
        controller, "kafka_controller_kafkacontroller_offlinepartitionscount") == 0, TIMEOUT,
        "solo led again")
    assert cluster.metric(victim, "kafka_server_replicafetchermanager_maxlag") == 0
    code, status = _status(cluster)
    assert code == 0 and "Under-replicated partitions: 0" in status, status

