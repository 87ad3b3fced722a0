"""The group and transaction coordinators of a three-broker cluster live with the leaders of
their internal partitions and move when those die (issue 24, broker/internal_topics.py,
coordinator/ownership.py): FindCoordinator names the leader of the key's partition of
``__consumer_offsets`` / ``__transaction_state``, a consumer group keeps consuming through the
SIGKILL of its coordinator's broker, an acknowledged commit (acks=all on the internal topic)
survives that kill, and a transaction whose partitions and coordinator share a broker still
commits."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from support.three_brokers import SESSION_MS, TIMEOUT, ThreeBrokers
from support.waits import wait_for

from oncelog.client.network import calls
from oncelog.client.network.connection import BrokerConnection
from oncelog.coordinator.internal_log import partition_for
from oncelog.protocol import api_versions as apis

PARTITIONS = 3  # of each internal topic: small, so a broker loads little
TRANSACTION_KEY = 1  # FindCoordinator key type


class Cluster(ThreeBrokers):
    def __init__(self, zookeeper, root) -> None:
        super().__init__(zookeeper, root, "coordmove", {
            "default.replication.factor": "3", "num.partitions": "2",
            "offsets.topic.num.partitions": str(PARTITIONS),
            "transaction.state.log.num.partitions": str(PARTITIONS),
            "group.initial.rebalance.delay.ms": "0"})

    def back(self, broker_id: int) -> None:
        """Start a stopped broker again; once every broker's Metadata names all three (a
        CreateTopics with replication factor 3 may follow on any of them)."""
        self.brokers[broker_id].start()
        self.wait_named_by_all(f"broker {broker_id} back")

    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values() if b.alive)

    def alive(self) -> list[int]:
        return [i for i, b in self.brokers.items() if b.alive]

    def state(self, topic: str, p: int) -> dict:
        return json.loads(self.zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")[0])

    def find(self, key: str, key_type: int = calls.COORDINATOR_GROUP, via: int | None = None):
        broker = self.brokers[via if via is not None else self.alive()[0]]
        conn = BrokerConnection("127.0.0.1", broker.port)
        try:
            return calls.find_coordinator_result(conn.call(
                apis.FIND_COORDINATOR, calls.find_coordinator_request(key, key_type)))
        finally:
            conn.close()

    def coordinator(self, key: str, key_type: int = calls.COORDINATOR_GROUP,
                    not_on: int | None = None) -> int:
        """The node FindCoordinator names, once it names one (the topic may be new) other
        than ``not_on`` (a broker killed: named until its ZooKeeper session expires)."""
        def found():
            result = self.find(key, key_type)
            return result.node_id if result.error == ErrorCode.none and \
                result.node_id != not_on else None
        return wait_for(found, TIMEOUT, f"a coordinator for {key!r}")

    def create(self, topic: str, partitions: int, replicas: list[list[int]] | None = None):
        from oncelog.client.admin.admin import Admin

        admin = Admin({"bootstrap.servers": self.bootstrap()})
        try:
            admin.create_topic(topic, -1 if replicas else partitions, -1 if replicas else 3,
                               assignments=dict(enumerate(replicas)) if replicas else None)
        finally:
            admin.close()
        wait_for(lambda: all(self.state(topic, p)["leader"] >= 0
                             for p in range(len(replicas) if replicas else partitions)),
                 TIMEOUT, f"leaders of {topic}")


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    running = Cluster(zookeeper, tmp_path_factory.mktemp("coordmove"))
    yield running
    running.close()


def _produce(cluster: Cluster, topic: str, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": cluster.bootstrap(), "enable.idempotence": True,
                         "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, key=str(i).encode(), value=str(i).encode())
        if i % 500 == 499:
            producer.poll(0)
    assert producer.flush(TIMEOUT) == 0


def _committed(consumer, offsets) -> bool:
    from confluent_kafka import KafkaException

    try:
        return all(tp.error is None for tp in consumer.commit(offsets=offsets,
                                                              asynchronous=False))
    except KafkaException:  # the coordinator still moving
        time.sleep(0.1)
        return False


def _leader_of_group_partition(cluster: Cluster, group: str) -> int:
    return cluster.state("__consumer_offsets", partition_for(group, PARTITIONS))["leader"]


def _consume_through_a_coordinator_kill(cluster: Cluster, topic: str, total: int,
                                        extra: dict[str, str]) -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    group = f"move-{uuid.uuid4().hex[:8]}"
    first = cluster.coordinator(group)
    assert first == _leader_of_group_partition(cluster, group)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap(), "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         **extra})
    consumer.subscribe([topic])
    seen: dict[str, int] = {}
    committed: dict[int, int] = {}  # partition -> last offset acknowledged as committed
    position: dict[int, int] = {}  # partition -> next offset this consumer expects
    killed_at = None
    last_commit_before_kill: dict[int, int] = {}
    deadline = time.monotonic() + 60
    try:
        while len(seen) < total:
            assert time.monotonic() < deadline, f"read {len(seen)} of {total}"
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            p, offset = msg.partition(), msg.offset()
            # Read again only from what was not acknowledged as committed.
            assert offset >= committed.get(p, 0) or offset >= position.get(p, 0), \
                (p, offset, committed, position)
            position[p] = offset + 1
            key = msg.key().decode()
            seen[key] = seen.get(key, 0) + 1
            if len(seen) % 100 == 0:
                try:
                    for tp in consumer.commit(asynchronous=False):
                        if tp.error is None and tp.offset >= 0:
                            assert tp.offset >= committed.get(tp.partition, 0), \
                                "a committed offset went backwards"
                            committed[tp.partition] = tp.offset
                except KafkaException:
                    pass  # the coordinator moving: the next commit goes to the new one
            if killed_at is None and len(seen) >= total // 3 and committed:
                last_commit_before_kill = dict(committed)
                killed_at = time.monotonic()
                cluster.brokers[first].kill()
        took = time.monotonic() - killed_at
        # The new coordinator loaded the offsets the old one acknowledged...
        after = consumer.committed([TopicPartition(topic, p) for p in last_commit_before_kill],
                                   timeout=TIMEOUT)
        for tp in after:
            assert tp.offset >= last_commit_before_kill[tp.partition], (tp, after)
        # ...and takes the final commit.
        final = [TopicPartition(topic, p, offset) for p, offset in position.items()]
        wait_for(lambda: _committed(consumer, final), TIMEOUT, "the final commit taken")
        after = consumer.committed([TopicPartition(topic, p) for p in position],
                                   timeout=TIMEOUT)
        assert {tp.partition: tp.offset for tp in after} == position
    finally:
        consumer.close()
    assert set(seen) == {str(i) for i in range(total)}
    print(f"{extra or 'classic'}: read all {total} through the kill of coordinator {first} "
          f"({took:.2f}s after it); {sum(seen.values()) - total} read twice")
    new = cluster.coordinator(group, not_on=first)
    assert new == _leader_of_group_partition(cluster, group)
    cluster.back(first)


def test_find_coordinator_names_the_leader_of_the_keys_partition(cluster):
    for key in ("g-a", "g-b", "g-c", "g-d"):
        node = cluster.coordinator(key)
        assert node == _leader_of_group_partition(cluster, key)
        for via in (1, 2, 3):  # every broker answers the same
            assert cluster.find(key, via=via).node_id == node
    assignment = json.loads(cluster.zk.get("/brokers/topics/__consumer_offsets")[0])
    assert len(assignment["partitions"]) == PARTITIONS
    assert all(len(r) == 3 for r in assignment["partitions"].values())
    config = json.loads(cluster.zk.get("/config/topics/__consumer_offsets")[0])["config"]
    assert config["cleanup.policy"] == "compact"
    txn = cluster.coordinator("t-a", TRANSACTION_KEY)
    assert txn == cluster.state("__transaction_state", partition_for("t-a", PARTITIONS))["leader"]
    config = json.loads(cluster.zk.get("/config/topics/__transaction_state")[0])["config"]
    assert config["min.insync.replicas"] == "2"


def test_a_committed_offset_survives_the_kill_of_its_coordinator(cluster):
    from confluent_kafka import Consumer, TopicPartition

    cluster.create("kept", 1)
    group = f"kept-{uuid.uuid4().hex[:8]}"
    first = cluster.coordinator(group)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap(), "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition("kept", 0, 42)], asynchronous=False)
    finally:
        consumer.close()
    cluster.brokers[first].kill()  # at once: the commit was answered once replicated
    try:
        moved = time.monotonic()
        cluster.coordinator(group, not_on=first)
        print(f"FindCoordinator named a new coordinator {time.monotonic() - moved:.2f}s "
              f"after the kill (session timeout {SESSION_MS} ms)")
        reader = Consumer({"bootstrap.servers": cluster.bootstrap(), "group.id": group})
        try:
            [tp] = reader.committed([TopicPartition("kept", 0)], timeout=TIMEOUT)
        finally:
            reader.close()
        assert tp.offset == 42
    finally:
        cluster.back(first)


def test_a_consumer_group_keeps_consuming_through_its_coordinators_kill(cluster):
    cluster.create("moving", 2)
    _produce(cluster, "moving", 3000)
    _consume_through_a_coordinator_kill(cluster, "moving", 3000,
                                        {"session.timeout.ms": "6000"})


def test_a_kip848_group_keeps_consuming_through_its_coordinators_kill(cluster):
    cluster.create("moving848", 2)
    _produce(cluster, "moving848", 2000)
    _consume_through_a_coordinator_kill(cluster, "moving848", 2000,
                                        {"group.protocol": "consumer"})


def test_a_transaction_led_by_its_coordinators_broker_commits(cluster):
    from confluent_kafka import Consumer, Producer

    txn_id = f"local-{uuid.uuid4().hex[:8]}"
    node = cluster.coordinator(txn_id, TRANSACTION_KEY)
    others = [b for b in (1, 2, 3) if b != node]
    cluster.create("txn-local", 1, [[node, *others]])
    producer = Producer({"bootstrap.servers": cluster.bootstrap(), "transactional.id": txn_id})
    producer.init_transactions(TIMEOUT)
    for commit in (True, False, True):
        producer.begin_transaction()
        for i in range(10):
            producer.produce("txn-local", value=f"{commit}-{i}".encode())
        if commit:
            producer.commit_transaction(TIMEOUT)
        else:
            producer.abort_transaction(TIMEOUT)
    reader = Consumer({"bootstrap.servers": cluster.bootstrap(), "group.id": txn_id,
                       "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    reader.subscribe(["txn-local"])
    values: list[str] = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while len(values) < 20 and time.monotonic() < deadline:
            msg = reader.poll(0.2)
            if msg is not None and not msg.error():
                values.append(msg.value().decode())
    finally:
        reader.close()
    assert values == [f"True-{i}" for i in range(10)] * 2


def test_oncelogs_own_consumer_finds_the_new_coordinator(cluster):
    """oncelog's consumer moves on by itself (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE:
    find it again; COORDINATOR_LOAD_IN_PROGRESS: retry there)."""
    from oncelog import Consumer, TopicPartition
    from oncelog.client.network.connection import KafkaError

    cluster.create("moving-own", 2)
    _produce(cluster, "moving-own", 1500)
    group = f"own-{uuid.uuid4().hex[:8]}"
    first = cluster.coordinator(group)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap(), "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["moving-own"])
    seen: set[str] = set()
    position: dict[int, int] = {}
    killed = False
    deadline = time.monotonic() + 60
    try:
        while len(seen) < 1500:
            assert time.monotonic() < deadline, f"read {len(seen)} of 1500"
            for record in consumer.poll(0.2, max_records=100):
                seen.add(record.key.decode())
                position[record.partition] = record.offset + 1
            try:
                consumer.commit()
            except KafkaError:
                pass  # retried at the next commit
            if not killed and len(seen) >= 500:
                cluster.brokers[first].kill()
                killed = True
        final = {TopicPartition("moving-own", p): o for p, o in position.items()}
        wait_for(lambda: _own_committed(consumer, final), TIMEOUT, "the final commit taken")
        committed = consumer.committed(list(final), timeout=TIMEOUT)
        assert {tp.partition: c.offset for tp, c in committed.items()} == position
    finally:
        consumer.close()
    assert seen == {str(i) for i in range(1500)}
    assert cluster.coordinator(group, not_on=first) == _leader_of_group_partition(cluster, group)
    cluster.back(first)


def _own_committed(consumer, offsets) -> bool:
    from oncelog.client.network.connection import KafkaError

    try:
        consumer.commit(offsets)
        return True
    except KafkaError:
        time.sleep(0.1)
        return False


def _full_isr(cluster: Cluster, topics: dict[str, int]) -> bool:
    return all(len(cluster.state(t, p)["isr"]) == 3 for t, n in topics.items() for p in range(n))


def test_a_consumer_group_through_a_rolling_restart(cluster):
    """Each broker stopped (SIGTERM: its leaderships, coordinators included, move first) and
    started again in turn while records are produced and a group consumes and commits."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    cluster.create("rolling", 2)
    group = f"rolling-{uuid.uuid4().hex[:8]}"
    cluster.coordinator(group)
    acked: set[str] = set()
    done = threading.Event()

    def produce() -> None:
        producer = Producer({"bootstrap.servers": cluster.bootstrap(), "linger.ms": 5,
                             "enable.idempotence": True})

        def delivered(err, msg) -> None:
            if err is None:
                acked.add(msg.key().decode())
        i = 0
        while not done.is_set():
            producer.produce("rolling", key=str(i).encode(), value=b"v", on_delivery=delivered)
            producer.poll(0.005)
            i += 1
        assert producer.flush(TIMEOUT) == 0

    def roll() -> None:
        for b in (1, 2, 3):
            cluster.brokers[b].stop()
            cluster.back(b)
            wait_for(lambda: _full_isr(cluster, {"rolling": 2, "__consumer_offsets": PARTITIONS}),
                     TIMEOUT, f"broker {b} back in every ISR")

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap(), "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": "6000"})
    consumer.subscribe(["rolling"])
    seen: set[str] = set()
    committed: dict[int, int] = {}
    position: dict[int, int] = {}
    with ThreadPoolExecutor(2) as background:
        producing = background.submit(produce)
        rolling = background.submit(roll)
        deadline = time.monotonic() + 90
        try:
            while not (producing.done() and acked <= seen):
                assert time.monotonic() < deadline, f"read {len(seen)} of {len(acked)}"
                if rolling.done() and not done.is_set():
                    rolling.result()
                    done.set()
                msg = consumer.poll(0.1)
                if msg is None or msg.error():
                    continue
                p, offset = msg.partition(), msg.offset()
                assert offset >= committed.get(p, 0) or offset >= position.get(p, 0)
                position[p] = offset + 1
                seen.add(msg.key().decode())
                if len(seen) % 50 == 0:
                    try:
                        for tp in consumer.commit(asynchronous=False):
                            if tp.error is None and tp.offset >= 0:
                                assert tp.offset >= committed.get(tp.partition, 0)
                                committed[tp.partition] = tp.offset
                    except KafkaException:
                        pass
            producing.result()
            final = [TopicPartition("rolling", p, o) for p, o in position.items()]
            wait_for(lambda: _committed(consumer, final), TIMEOUT, "the final commit taken")
            after = consumer.committed([TopicPartition("rolling", p) for p in position],
                                       timeout=TIMEOUT)
            assert {tp.partition: tp.offset for tp in after} == position
        finally:
            done.set()
            consumer.close()
    assert acked <= seen and len(acked) > 0
    print(f"rolling restart: {len(acked)} acknowledged records read, {len(committed)} "
          f"partitions committed")


def test_a_transactional_id_survives_the_kill_of_its_coordinator(cluster):
    """__transaction_state is replicated: the new coordinator knows the id's producer id and
    epoch, and a new producer of the id gets that producer id at the next epoch (a coordinator
    that had lost the state would hand out a new producer id)."""
    from confluent_kafka import Producer

    from oncelog.client.admin.admin import Admin

    txn_id = f"survive-{uuid.uuid4().hex[:8]}"
    first = cluster.coordinator(txn_id, TRANSACTION_KEY)
    old = Producer({"bootstrap.servers": cluster.bootstrap(), "transactional.id": txn_id})
    old.init_transactions(TIMEOUT)

    def described():
        admin = Admin({"bootstrap.servers": cluster.bootstrap()})
        try:
            found = admin.describe_transactions([txn_id])[txn_id]
        finally:
            admin.close()
        return found if not isinstance(found, Exception) else None
    before = wait_for(described, TIMEOUT, "the id described")
    cluster.brokers[first].kill()
    try:
        cluster.coordinator(txn_id, TRANSACTION_KEY, not_on=first)
        new = Producer({"bootstrap.servers": cluster.bootstrap(), "transactional.id": txn_id})
        new.init_transactions(TIMEOUT)
        after = wait_for(described, TIMEOUT, "the id described by the new coordinator")
        assert after.coordinator_id != first
        assert (after.producer_id, after.producer_epoch) == \
            (before.producer_id, before.producer_epoch + 1)
    finally:
        cluster.back(first)


GROUP_MEMBER = Path(__file__).resolve().parents[1] / "support" / "group_member.py"


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka"])
def test_a_python_clients_group_keeps_consuming_through_its_coordinators_kill(cluster,
                                                                              client):
    """kafka-python's and aiokafka's group consumers (tests/support/group_member.py, which
    commits after every batch) through the SIGKILL of their group coordinator's broker:
    every record is read, the committed offsets never go backwards, and the last commit of
    each partition is its end."""
    topic = f"moving-{client}"
    cluster.create(topic, 2)
    _produce(cluster, topic, 1000)
    group = f"{client}-{uuid.uuid4().hex[:8]}"
    first = cluster.coordinator(group)
    member = subprocess.Popen(
        [sys.executable, str(GROUP_MEMBER), client, cluster.bootstrap(), group, topic, "range",
         "6000", "90"], stdout=subprocess.PIPE, text=True)
    lines: list[list[str]] = []
    reader = threading.Thread(target=lambda: lines.extend(
        line.split() for line in member.stdout), daemon=True)
    reader.start()

    def read() -> set[tuple[int, int]]:
        return {(int(f[1]), int(f[2])) for f in list(lines) if f[0] == "R"}

    def commits() -> dict[int, list[int]]:
        found: dict[int, list[int]] = {}
        for f in list(lines):
            if f[0] == "C":
                found.setdefault(int(f[1]), []).append(int(f[2]))
        return found

    try:
        wait_for(lambda: len(read()) >= 300 and commits(), 60, f"{client} consuming")
        cluster.brokers[first].kill()
        killed = time.monotonic()
        wait_for(lambda: len(read()) >= 1000, 60, f"{client} reading everything")
        ends = {p: max(o for q, o in read() if q == p) + 1 for p in (0, 1)}
        wait_for(lambda: {p: c[-1] for p, c in commits().items()} == ends, 60,
                 f"{client}'s last commits")
        print(f"{client}: read all 1000 through the kill of coordinator {first} "
              f"({time.monotonic() - killed:.2f}s to the last commit)")
    finally:
        member.terminate()
        member.wait(TIMEOUT)
    assert read() == {(p, o) for p, end in ends.items() for o in range(end)}
    for p, offsets in commits().items():
        assert offsets == sorted(offsets), f"a committed offset of {p} went backwards"
    cluster.back(first)
