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
from kio.schema.errors import ErrorCode
from support.three_brokers import TIMEOUT, ThreeBrokers
from support.waits import wait_for

from oncelog.client.admin.admin import Admin
from oncelog.client.network.connection import KafkaError as OncelogError

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
    assert cluster.metric(victim, 'kafka_server_sessionexpirelistener_sessionstate'
                                  '{state="CONNECTED"}') == 1

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


def test_new_topics_avoid_a_broker_whose_log_directories_all_failed(cluster):
    """A broker's only log directory fails (an injected EIO on an fsync, see log/disk.py):
    it reports it with its offline replicas; replicas of new topics go to the other two, and
    a replication factor of 3 is refused with Kafka's INVALID_REPLICATION_FACTOR answer for
    too few brokers. Restarted without the fault, it is placed on again."""
    from confluent_kafka import Producer

    victim = next(b for b in (1, 2, 3) if b != cluster.controller())
    broker = cluster.brokers[victim]
    broker.stop()
    broker.env = {"ONCELOG_DISK_FAULTS": "fsync:doomed-0/00000000000000000000.log:0:EIO"}
    broker.settings["log.flush.interval.messages"] = "1"
    broker.start()
    try:
        cluster.create("doomed", 1, 1, assignments={0: [victim]})
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": 1,
                             "message.timeout.ms": 5000})
        producer.produce("doomed", b"x", partition=0)  # its fsync fails: EIO
        producer.flush(10)
        del producer  # not left to reach for the broker once it is killed below
        path = f"/oncelog/offline_replicas/{victim}"
        wait_for(lambda: cluster.zk.exists(path) and json.loads(
            cluster.zk.get(path)[0]).get("all_log_dirs_offline"), TIMEOUT,
            "the broker reports every log directory failed")
        cluster.create("placed", 6, 2)
        with Admin({"bootstrap.servers": cluster.bootstrap()}) as admin:
            replicas = [p.replicas for p in admin.metadata(["placed"]).topics["placed"]
                        .partitions]
            assert len(replicas) == 6 and all(victim not in r for r in replicas), replicas
            with pytest.raises(OncelogError) as refused:
                admin.create_topic("too-wide", 1, 3)
        assert refused.value.error == ErrorCode.invalid_replication_factor, refused.value
        assert "larger than available brokers: 2" in str(refused.value)
    finally:
        broker.kill()
        broker.env = {}
        broker.settings.pop("log.flush.interval.messages")
        broker.start()
    wait_for(lambda: not cluster.zk.exists(f"/oncelog/offline_replicas/{victim}"), TIMEOUT,
             "the restarted broker's directory is back")
    cluster.create("wide", 1, 3)
