"""A leadership moved off a live leader is handed over: no acks=1 record is lost
(leader_election.py's H rows, isr.py's K6 and H7-H9).

Three brokers on a real ZooKeeper, librdkafka producing acks=1 (not idempotent) as fast as
it can to a partition of three replicas, while the leadership is moved off its live leader:
by a preferred election (ElectLeaders), and by a reassignment whose target leaves the leader
out (A1). Before, the controller wrote the new leader at once; the old one acknowledged
acks=1 until its replica watch read the move, then truncated what the new leader lacked:
hundreds to thousands of acknowledged records were gone (bench/preferred_election_acks1.py).
Now the controller asks the old leader first; it answers acks=1 only once its ISR has the
batch, says ready once its ISR holds everything it acknowledged before, and only then is the
leadership moved. Every acknowledged record must be at its offset afterwards.
"""

from __future__ import annotations

import json
import threading

import pytest
from support.brokers import acknowledged_lost
from support.three_brokers import TIMEOUT, ThreeBrokers
from support.waits import wait_for

from oncelog.cluster import znodes as zn

pytestmark = pytest.mark.xdist_group("zookeeper")

BEFORE = AFTER = 5_000  # acknowledged records before the move is asked, and after it


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    running = ThreeBrokers(zookeeper, tmp_path_factory.mktemp("handover"), "handover",
                           {"default.replication.factor": "3",
                            "auto.leader.rebalance.enable": "false"})
    yield running
    running.close()


def _bootstrap(cluster) -> str:
    return ",".join(b.bootstrap for b in cluster.brokers.values())


def _state(cluster, topic: str) -> dict:
    return json.loads(cluster.zk.get(zn.partition_state_path(topic, 0))[0])


class AcksOneWriter:
    """librdkafka writing acks=1 without pause; ``acked``: value -> offset acknowledged."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Producer

        self.acked: dict[bytes, int] = {}
        self.failed = 0
        self._producer = Producer({"bootstrap.servers": bootstrap, "acks": 1,
                                   "linger.ms": 1, "enable.idempotence": False,
                                   "message.timeout.ms": int(TIMEOUT * 1000)})
        self._topic = topic
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _delivered(self, err, msg) -> None:
        if err is None:
            self.acked[msg.value()] = msg.offset()
        else:
            self.failed += 1

    def _run(self) -> None:
        i = 0
        while not self._done.is_set():
            try:
                self._producer.produce(self._topic, b"%d" % i, partition=0,
                                       on_delivery=self._delivered)
                i += 1
            except BufferError:
                self._producer.poll(0.01)
            self._producer.poll(0)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(TIMEOUT)
        assert self._producer.flush(TIMEOUT) == 0


def _created(cluster, topic: str) -> int:
    """``topic``-0 with three replicas in sync: its leader."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": _bootstrap(cluster)})
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(TIMEOUT)
    wait_for(lambda: cluster.zk.exists(zn.partition_state_path(topic, 0))
             and len(_state(cluster, topic)["isr"]) == 3, TIMEOUT, "an ISR of three")
    return _state(cluster, topic)["leader"]


def _moved_under_acks_one(cluster, topic: str, move) -> None:
    """``move()`` the leadership of ``topic``-0 while acks=1 records pour in: every record
    acknowledged is at its offset afterwards, and the old leader handed over (H7, H2)."""
    old = _state(cluster, topic)["leader"]
    writer = AcksOneWriter(_bootstrap(cluster), topic)
    try:
        wait_for(lambda: len(writer.acked) > BEFORE, TIMEOUT, f"{BEFORE} acknowledged")
        move()
        moved = len(writer.acked)
        wait_for(lambda: len(writer.acked) > moved + AFTER, TIMEOUT, f"{AFTER} more")
    finally:
        writer.stop()
    assert _state(cluster, topic)["leader"] != old
    assert acknowledged_lost(_bootstrap(cluster), topic, writer.acked) == []
    logs = "".join(b.log_text() for b in cluster.brokers.values())
    assert f"{topic}-0: ready to hand its leadership over" in cluster.brokers[old].log_text()
    assert f"partition {topic}-0: H2 broker {old} handed its leadership over" in logs


def test_a_preferred_election_loses_no_acks_one_record(cluster):
    """ElectLeaders moves the leadership back to the preferred replica while acks=1 records
    pour in: the old leader hands over (H4, H7, H2), none of them is lost; ElectLeaders
    answers once the preferred replica leads."""
    from confluent_kafka import ElectionType, KafkaError, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient

    preferred = _created(cluster, "preferred")
    cluster.brokers[preferred].stop()  # its leadership moves; back, it only follows
    cluster.brokers[preferred].start()
    wait_for(lambda: len(_state(cluster, "preferred")["isr"]) == 3
             and _state(cluster, "preferred")["leader"] != preferred, TIMEOUT,
             "the preferred replica back in the ISR, not leading")

    def elect() -> bool:
        # a fresh admin: librdkafka keeps asking the controller it last knew
        admin = AdminClient({"bootstrap.servers": _bootstrap(cluster)})
        try:
            admin.elect_leaders(ElectionType.PREFERRED,
                                [TopicPartition("preferred", 0)]).result(TIMEOUT)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.NOT_CONTROLLER:
                raise
            return False
        return True

    def move() -> None:
        wait_for(elect, TIMEOUT, "a preferred election by the controller")
        assert _state(cluster, "preferred")["leader"] == preferred

    _moved_under_acks_one(cluster, "preferred", move)


def test_a_reassignment_away_from_the_leader_loses_no_acks_one_record(cluster):
    """A reassignment whose target leaves the live leader out completes (A1) through its
    handover while acks=1 records pour in, right after the topic's creation (its followers
    in the ISR by creation, perhaps before their first fetch): none is lost."""
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    old = _created(cluster, "moving")
    target = [b for b in sorted(cluster.brokers) if b != old]

    def move() -> None:
        admin = KafkaAdminClient(bootstrap_servers=_bootstrap(cluster))
        try:
            admin.alter_partition_reassignments({TopicPartition("moving", 0): target})
        finally:
            admin.close()
        wait_for(lambda: _state(cluster, "moving")["leader"] in target, TIMEOUT,
                 "the leadership moved to the target")

    _moved_under_acks_one(cluster, "moving", move)
