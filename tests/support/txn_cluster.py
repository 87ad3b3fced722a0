"""A three-broker cluster on the session ZooKeeper for the transaction tests across brokers
(tests/cluster/test_cluster_transactions.py): topics with chosen leaders, leaders killed and
brought back, and read_committed reads of every partition to its end."""

from __future__ import annotations

import json
import time

from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as CTopicPartition

from support.three_brokers import TIMEOUT, ThreeBrokers
from support.waits import wait_for


class TxnCluster(ThreeBrokers):
    def __init__(self, zookeeper, root, name: str, **settings: str) -> None:
        super().__init__(zookeeper, root, name, {
            "default.replication.factor": "3", "num.partitions": "3",
            "offsets.topic.num.partitions": "2",
            "transaction.state.log.num.partitions": "2", **settings})

    def bootstrap(self, *ids: int) -> str:
        return ",".join(self.brokers[i].bootstrap for i in (ids or sorted(self.brokers))
                        if self.brokers[i].alive)

    def create(self, topic: str, assignment: list[list[int]]) -> None:
        """A topic whose partition p has the replicas ``assignment[p]`` (the first leads)."""
        from oncelog.client.admin.admin import Admin

        # (confluent-kafka 2.16's NewTopic refuses a replica assignment without a count)
        with Admin({"bootstrap.servers": self.bootstrap()}) as admin:
            admin.create_topic(topic, assignments=dict(enumerate(assignment)))
        wait_for(lambda: self.leaders(topic) == [r[0] for r in assignment], TIMEOUT,
                 f"the leaders of {topic}")

    def state(self, topic: str, p: int) -> dict:
        return json.loads(self.zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")[0])

    def leaders(self, topic: str) -> list[int]:
        count = len(self.zk.get_children(f"/brokers/topics/{topic}/partitions"))
        return [self.state(topic, p)["leader"] for p in range(count)]

    def kill(self, broker_id: int, topic: str, p: int) -> int:
        """SIGKILL ``broker_id`` (leading ``topic``-``p``); the new leader, once elected."""
        self.brokers[broker_id].kill()
        wait_for(lambda: self.state(topic, p)["leader"] not in (broker_id, -1), TIMEOUT,
                 f"a new leader of {topic}-{p}")
        return self.state(topic, p)["leader"]

    def bring_back(self, broker_id: int, topics: list[str]) -> None:
        """Start a killed broker again, and wait until it is in every ISR of ``topics``."""
        self.brokers[broker_id].start()

        def in_sync() -> bool:
            for topic in topics:
                count = len(self.zk.get_children(f"/brokers/topics/{topic}/partitions"))
                for p in range(count):
                    state = self.state(topic, p)
                    replicas = json.loads(self.zk.get(f"/brokers/topics/{topic}")[0])[
                        "partitions"][str(p)]
                    if sorted(state["isr"]) != sorted(replicas):
                        return False
            return True

        wait_for(in_sync, TIMEOUT, f"broker {broker_id} back in sync")


def read_committed(bootstrap: str, topic: str, partitions: int,
                   timeout: float = TIMEOUT) -> dict[int, list[bytes]]:
    """Every value a read_committed confluent-kafka reader returns, per partition, until it
    reports the end of each (the last stable offset: a transaction left open stops it)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "checker",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed"})
    consumer.assign([CTopicPartition(topic, p, 0) for p in range(partitions)])
    found: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(at_end) < partitions and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                if msg.error():
                    assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                    at_end.add(msg.partition())
                else:
                    found[msg.partition()].append(msg.value())
    finally:
        consumer.close()
    assert len(at_end) == partitions, f"did not reach the end of {topic}"
    return found


def end_offsets(bootstrap: str, topic: str, partitions: int, committed: bool) -> list[int]:
    """Each partition's high watermark, or with ``committed`` its last stable offset
    (ListOffsets with read_committed), as its leader answers."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "offsets",
                         "isolation.level": "read_committed" if committed
                         else "read_uncommitted"})
    try:
        return [consumer.get_watermark_offsets(CTopicPartition(topic, p), TIMEOUT,
                                               cached=False)[1] for p in range(partitions)]
    finally:
        consumer.close()
