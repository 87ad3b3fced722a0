"""The control plane of a three-broker cluster on a real ZooKeeper (issue 23): topics created
through any broker get Kafka's znodes, their leaders spread, and every broker answers
Metadata from its ZooKeeper-fed cache (librdkafka and kafka-python read it); a replication
factor above the broker count and min.insync.replicas above the replication factor are
refused with Kafka's errors; configs set on one broker are seen on another; a leader killed
with SIGKILL is replaced from the ISR with leader_epoch + 1 within the session timeout and a
second; a broker stopped with SIGTERM hands its leaderships over before it exits, losing
no record it acknowledged with acks=1;
preferred-leader election and a reassignment are carried out by the controller; and, the
control plane and the replica managers together, librdkafka's idempotent producer with
acks=all loses nothing and stores nothing twice when the leader is killed mid-stream.

A replica is put back into the ISR by its leader's replica manager once it has caught up
(broker/replica_manager.py); the tests wait for that, they do not write it."""

from __future__ import annotations

import json
import time

import pytest
from support.broker_forks import run_oncelog
from support.three_brokers import SESSION_MS, TIMEOUT, ThreeBrokers
from support.waits import wait_for


class Cluster(ThreeBrokers):
    def __init__(self, zookeeper, root) -> None:
        self._admins = {}
        super().__init__(zookeeper, root, "control",
                         {"default.replication.factor": "3", "num.partitions": "2"})

    def admin(self, broker_id: int):
        """librdkafka's admin client of one broker, kept (a future outlives no client)."""
        from confluent_kafka.admin import AdminClient

        if broker_id not in self._admins:
            self._admins[broker_id] = AdminClient(
                {"bootstrap.servers": self.brokers[broker_id].bootstrap})
        return self._admins[broker_id]

    def controller(self) -> int:
        return json.loads(self.zk.get("/controller")[0])["brokerid"]

    def state(self, topic: str, p: int) -> dict:
        data, _ = self.zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")
        return json.loads(data)

    def assignment(self, topic: str) -> dict:
        return json.loads(self.zk.get(f"/brokers/topics/{topic}")[0])

    def create(self, topic: str, partitions: int, rf: int, via: int = 1, **configs: str):
        from confluent_kafka.admin import NewTopic

        futures = self.admin(via).create_topics(
            [NewTopic(topic, partitions, rf, config=configs)], operation_timeout=10)
        futures[topic].result(TIMEOUT)

    def metadata(self, broker_id: int, topic: str) -> dict[int, tuple[int, list, list]]:
        """{partition: (leader, replicas, isr)} as librdkafka reads this broker's Metadata:
        through a client bootstrapped at it alone, new each time. A kept client may send the
        request to a broker just killed, its connection not yet seen closed, and librdkafka
        then retries it there, reconnecting, until the call's timeout (seen in CI)."""
        from confluent_kafka.admin import AdminClient

        one_shot = AdminClient({"bootstrap.servers": self.brokers[broker_id].bootstrap})
        md = one_shot.list_topics(topic, timeout=TIMEOUT)
        return {p.id: (p.leader, list(p.replicas), list(p.isrs))
                for p in md.topics[topic].partitions.values()}

    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    running = Cluster(zookeeper, tmp_path_factory.mktemp("control"))
    yield running
    running.close()


def test_topic_created_on_one_broker_is_known_to_all(cluster):
    cluster.create("rf3", 3, 3, via=1, **{"retention.ms": "123456"})
    assignment = cluster.assignment("rf3")
    assert assignment["version"] == 3 and assignment["topic_id"]
    replicas = {int(p): r for p, r in assignment["partitions"].items()}
    assert sorted(replicas) == [0, 1, 2]
    assert all(sorted(r) == [1, 2, 3] for r in replicas.values())
    assert {r[0] for r in replicas.values()} == {1, 2, 3}  # leaders spread over the brokers
    epoch = int(cluster.zk.get("/controller_epoch")[0])
    for p, r in replicas.items():
        state = cluster.state("rf3", p)
        assert state == {"controller_epoch": epoch, "leader": r[0], "version": 1,
                         "leader_epoch": 0, "isr": r}
    expected = {p: (r[0], r, r) for p, r in replicas.items()}
    for broker_id in (1, 2, 3):
        wait_for(lambda b=broker_id: cluster.metadata(b, "rf3") == expected, TIMEOUT,
                 f"broker {broker_id}'s Metadata of rf3")

    from kafka.admin import KafkaAdminClient

    kafka_python = KafkaAdminClient(bootstrap_servers=cluster.brokers[3].bootstrap)
    try:
        [described] = kafka_python.describe_topics(["rf3"])
    finally:
        kafka_python.close()
    assert {p["partition_index"]: (p["leader_id"], list(p["replica_nodes"]),
                                   list(p["isr_nodes"]))
            for p in described["partitions"]} == expected

    described = run_oncelog("topics", "describe", "--topic", "rf3", "--bootstrap-server",
                            cluster.brokers[2].bootstrap, timeout=TIMEOUT)
    assert described.returncode == 0, described.stderr
    assert "ReplicationFactor: 3" in described.stdout
    for p, r in replicas.items():
        shown = ",".join(map(str, r))
        assert f"Partition: {p}\tLeader: {r[0]}\tReplicas: {shown}\tIsr: {shown}\t" in \
            described.stdout

    from confluent_kafka.admin import ConfigResource

    def retention(broker_id: int) -> str:
        resource = ConfigResource("TOPIC", "rf3")
        found = cluster.admin(broker_id).describe_configs([resource])[resource].result(TIMEOUT)
        return found["retention.ms"].value

    assert retention(3) == "123456"
    resource = ConfigResource("TOPIC", "rf3", set_config={"retention.ms": "654321"})
    cluster.admin(2).alter_configs([resource])[resource].result(TIMEOUT)
    assert json.loads(cluster.zk.get("/config/topics/rf3")[0])["config"] == {
        "retention.ms": "654321"}
    wait_for(lambda: retention(3) == "654321" and retention(1) == "654321", TIMEOUT,
             "the change seen by brokers 1 and 3")


def test_refused_with_kafkas_errors(cluster):
    from confluent_kafka import KafkaError, KafkaException

    with pytest.raises(KafkaException) as refused:
        cluster.create("rf4", 1, 4)
    assert refused.value.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR
    assert "larger than available brokers: 3" in refused.value.args[0].str()
    with pytest.raises(KafkaException) as refused:
        cluster.create("minisr", 1, 3, **{"min.insync.replicas": "4"})
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert cluster.zk.exists("/brokers/topics/rf4") is None
    assert cluster.zk.exists("/brokers/topics/minisr") is None


def test_partitions_added_and_topic_deleted(cluster):
    from confluent_kafka.admin import NewPartitions

    cluster.create("grow", 2, 2, via=2)
    futures = cluster.admin(3).create_partitions([NewPartitions("grow", 5)])
    futures["grow"].result(TIMEOUT)
    wait_for(lambda: len(cluster.metadata(1, "grow")) == 5
             and all(leader >= 0 for leader, _, _ in cluster.metadata(1, "grow").values()),
             TIMEOUT, "five partitions with leaders")
    assert all(len(set(r)) == 2 for r in cluster.assignment("grow")["partitions"].values())
    cluster.admin(1).delete_topics(["grow"], operation_timeout=10)["grow"].result(TIMEOUT)
    assert cluster.zk.exists("/brokers/topics/grow") is None
    assert cluster.zk.exists("/admin/delete_topics/grow") is None
    for broker_id in (1, 2, 3):
        wait_for(lambda b=broker_id: "grow" not in cluster.admin(b).list_topics(
            timeout=TIMEOUT).topics, TIMEOUT, f"grow gone from broker {broker_id}")


def test_killed_leader_replaced_from_the_isr(cluster, capsys):
    cluster.create("failover", 3, 3)
    controller = cluster.controller()
    # a partition led by a broker that is not the controller: the controller elects at once
    p, state = next((p, s) for p in range(3)
                    if (s := cluster.state("failover", p))["leader"] != controller)
    dead = state["leader"]
    killed_at = time.monotonic()
    cluster.brokers[dead].kill()
    survivor = next(b for b in (1, 2, 3) if b != dead)
    leader, replicas, isr = wait_for(
        lambda: (m := cluster.metadata(survivor, "failover")[p])[0] not in (dead, -1) and m,
        SESSION_MS / 1000 + 1, f"a new leader of failover-{p} in broker {survivor}'s Metadata")
    took = time.monotonic() - killed_at
    print(f"new leader {took:.2f}s after kill -9 (session timeout {SESSION_MS} ms)")
    new = cluster.state("failover", p)
    assert new["leader"] == leader and new["leader_epoch"] == state["leader_epoch"] + 1
    assert leader in state["isr"] and dead not in new["isr"] and sorted(isr) == sorted(
        new["isr"])
    assert len(replicas) == 3
    assert cluster.assignment("failover")["partitions"][str(p)][0] == dead  # preferred
    cluster.brokers[dead].start()  # back: its leader puts it in the ISR once caught up
    wait_for(lambda: dead in cluster.state("failover", p)["isr"], TIMEOUT,
             f"broker {dead} back in failover-{p}'s ISR (its leader's replica manager)")
    # Preferred-leader election (the controller's; out of sync it is refused, rows P1-P3 of
    # leader_election.py's model test): `oncelog cluster elect-leaders` through oncelog's
    # Admin, sent to the controller, makes the preferred replica lead again.
    from oncelog.cli.main import main

    assert main(["cluster", "elect-leaders", "--bootstrap-server",
                 cluster.brokers[survivor].bootstrap, "--topic", "failover",
                 "--partition", str(p)]) == 0
    assert f"Successfully completed leader election (PREFERRED) for partition failover-{p}" \
        in capsys.readouterr().out
    after = cluster.state("failover", p)
    assert after["leader"] == dead and after["leader_epoch"] == new["leader_epoch"] + 1


def test_controlled_shutdown_moves_leadership_first(cluster):
    cluster.create("handover", 3, 3)
    controller = cluster.controller()
    stopping = next(b for b in (1, 2, 3) if b != controller)
    led = [p for p in range(3) if cluster.state("handover", p)["leader"] == stopping]
    assert led  # leaders are spread: each broker leads one partition of three
    before = {p: cluster.state("handover", p)["leader_epoch"] for p in led}
    broker = cluster.brokers[stopping]
    assert broker.stop() == 0
    log = broker.log_text()
    assert f"controlled shutdown: broker {stopping} leads no partition" in log
    # and, told so, it led nothing more (no acks=1 produce acknowledged into a log the new
    # leader has it truncate) before its replica manager read the moves
    assert f"broker {stopping} leads nothing from now on" in log
    for p in led:
        state = cluster.state("handover", p)
        assert state["leader"] != stopping and state["leader_epoch"] == before[p] + 1
    # out of every ISR (the controller's pass that moved its leaderships shrank the others
    # in the same transaction), and no leader put it back: it fetched no more (row B5)
    assert all(stopping not in cluster.state("handover", p)["isr"] for p in range(3))
    broker.start()
    wait_for(lambda: str(stopping) in cluster.zk.get_children("/brokers/ids"), TIMEOUT,
             f"broker {stopping} registered again")


def test_reassignment_completed_by_the_controller(cluster):
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    cluster.create("moving", 1, 2)
    old = cluster.assignment("moving")["partitions"]["0"]
    target = [b for b in (1, 2, 3) if b not in old] + [old[0]]
    admin = KafkaAdminClient(bootstrap_servers=cluster.brokers[1].bootstrap)
    try:
        admin.alter_partition_reassignments({TopicPartition("moving", 0): target})
        listed = admin.list_partition_reassignments()
    finally:
        admin.close()
    assert listed[TopicPartition("moving", 0)]["adding_replicas"] == target[:1]
    ongoing = cluster.assignment("moving")
    assert ongoing["partitions"]["0"] == [*target, old[1]]
    assert ongoing["adding_replicas"] == {"0": target[:1]}
    assert ongoing["removing_replicas"] == {"0": [old[1]]}
    # the new replica catches up and its leader puts it in the ISR: the controller completes
    wait_for(lambda: cluster.assignment("moving")["partitions"]["0"] == target, TIMEOUT,
             "the reassignment completed")
    done = cluster.assignment("moving")
    assert done["adding_replicas"] == {} and done["removing_replicas"] == {}
    state = cluster.state("moving", 0)
    assert sorted(state["isr"]) == sorted(target) and state["leader"] in target
    # the added broker holds a replica; the removed one's broker deleted its copy
    assert (cluster.brokers[target[0]].data_dir / "moving-0").is_dir()
    wait_for(lambda: not (cluster.brokers[old[1]].data_dir / "moving-0").exists(), TIMEOUT,
             f"broker {old[1]}'s replica of moving-0 deleted")


def test_auto_created_topic_gets_default_replication(cluster):
    from oncelog.client.network.connection import connect
    from oncelog.protocol import api_versions as apis
    from oncelog.protocol.schema import build

    def make(mod, version):
        return build(mod.MetadataRequest, topics=(build(mod.MetadataRequestTopic, name="auto",
                                                        topic_id=None),),
                     allow_auto_topic_creation=True, include_cluster_authorized_operations=False,
                     include_topic_authorized_operations=False)

    with connect(cluster.brokers[1].bootstrap, timeout=TIMEOUT) as conn:
        answer = conn.call(apis.METADATA, make)
    assert answer.topics[0].error_code.name == "leader_not_available"  # being created

    def led():  # one read, judged and returned: no partitions (not yet known) is not led
        shown = cluster.metadata(3, "auto")
        return shown if shown and all(leader >= 0 for leader, _, _ in shown.values()) else None

    replicas = wait_for(led, TIMEOUT, "auto's leaders in broker 3's Metadata")
    assert len(replicas) == 2 and all(len(r) == 3 for _, r, _ in replicas.values())


def test_controller_killed_its_partitions_get_new_leaders(cluster):
    cluster.create("orphans", 3, 3)
    controller = cluster.controller()
    before = {p: cluster.state("orphans", p) for p in range(3)}
    led = [p for p, s in before.items() if s["leader"] == controller]
    assert led
    killed_at = time.monotonic()
    cluster.brokers[controller].kill()
    survivor = next(b for b in (1, 2, 3) if b != controller)
    wait_for(lambda: all(cluster.metadata(survivor, "orphans")[p][0] not in (controller, -1)
                         for p in led),
             SESSION_MS / 1000 + 1, "new leaders elected by the new controller")
    print(f"controller's partitions led again {time.monotonic() - killed_at:.2f}s after "
          f"kill -9 (session timeout {SESSION_MS} ms)")
    assert cluster.controller() != controller
    epoch = int(cluster.zk.get("/controller_epoch")[0])
    for p in led:
        state = cluster.state("orphans", p)
        assert state["leader_epoch"] == before[p]["leader_epoch"] + 1
        assert state["controller_epoch"] == epoch and controller not in state["isr"]
    cluster.brokers[controller].start()
    # back in every ISR by its leaders' writes, which keep the controller epoch of the
    # state they read (the new controller's shrink included)
    wait_for(lambda: all(controller in cluster.state("orphans", p)["isr"] for p in range(3)),
             TIMEOUT, f"broker {controller} back in every ISR of orphans")
    assert {cluster.state("orphans", p)["controller_epoch"] for p in range(3)} == {epoch}


def test_acknowledged_writes_survive_a_leader_kill_exactly_once(cluster):
    """Seed 004, case 2, end to end: librdkafka's idempotent producer (acks=all) writes while
    the leader is killed with SIGKILL; the controller elects a new leader from the ISR, the
    producer retries there, and the new leader, whose producer state was built from the
    batches it replicated, stores no retry twice. Read back, the topic holds every record
    once, in order, each at the offset its acknowledgement named."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    cluster.create("exactly", 1, 3, **{"min.insync.replicas": "2"})
    wait_for(lambda: len(cluster.state("exactly", 0)["isr"]) == 3, TIMEOUT, "ISR of three")
    total, warm, kill_after = 3000, 200, 1000
    acked: dict[int, int] = {}  # value -> offset
    failed: list[str] = []

    def delivered(err, msg):
        if err is not None:
            failed.append(str(err))
        else:
            acked[int(msg.value())] = msg.offset()

    producer = Producer({"bootstrap.servers": cluster.bootstrap(), "enable.idempotence": True,
                         "acks": "all", "linger.ms": 2, "message.timeout.ms": 60_000})
    leader = cluster.state("exactly", 0)["leader"]
    for i in range(total):
        producer.produce("exactly", str(i).encode(), partition=0, on_delivery=delivered)
        producer.poll(0)
        if i == warm:  # the producer id known, its first batches acknowledged
            assert producer.flush(TIMEOUT) == 0
        if i == kill_after:  # batches in flight when the leader dies
            cluster.brokers[leader].kill()
            producer.poll(0)
            print(f"leader {leader} killed with {i + 1 - len(acked)} of {i + 1} records "
                  f"not yet acknowledged")
    assert producer.flush(90) == 0
    assert not failed, failed[:5]
    new_leader = cluster.state("exactly", 0)["leader"]
    assert new_leader not in (leader, -1)

    survivor = next(b for b in (1, 2, 3) if b != leader)
    consumer = Consumer({"bootstrap.servers": cluster.brokers[survivor].bootstrap,
                         "group.id": "exactly-check", "enable.auto.commit": False})
    consumer.assign([TopicPartition("exactly", 0, 0)])
    seen: list[tuple[int, int]] = []
    deadline = time.monotonic() + TIMEOUT
    while len(seen) < total and time.monotonic() < deadline:
        for msg in consumer.consume(1000, timeout=0.5):
            assert msg.error() is None, msg.error()
            seen.append((int(msg.value()), msg.offset()))
    consumer.close()
    assert [v for v, _ in seen] == list(range(total))  # no loss, no duplicate, in order
    assert dict(seen) == acked  # each where its acknowledgement said
    cluster.brokers[leader].start()  # the module's cluster is whole again for the next test
    wait_for(lambda: leader in cluster.state("exactly", 0)["isr"], TIMEOUT,
             f"broker {leader} caught up and back in the ISR")


def test_acks_one_acknowledged_through_a_controlled_shutdown_is_never_lost(cluster):
    """librdkafka produces with acks=1 (not idempotent) to the partitions one broker leads
    while that broker stops with SIGTERM. From the moment its controlled shutdown begins, a
    leader answers acks=1 only once the ISR has the batch (isr.py's row K6), and asks the
    controller to move its leaderships only once the ISR has what it had acknowledged: the
    new leader, elected from the ISR, holds every record an acknowledgement named."""
    import threading

    from confluent_kafka import Producer
    from support.brokers import read_to_end

    partitions = 6
    cluster.create("acks1", partitions, 3)
    wait_for(lambda: all(len(cluster.state("acks1", p)["isr"]) == 3
                         for p in range(partitions)), TIMEOUT, "every ISR of three")
    controller = cluster.controller()
    stopping = next(b for b in (1, 2, 3) if b != controller)
    led = [p for p in range(partitions) if cluster.state("acks1", p)["leader"] == stopping]
    assert led
    acked: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset)

    def delivered(err, msg):
        if err is None:
            acked[msg.value()] = (msg.partition(), msg.offset())

    producer = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": 1,
                         "enable.idempotence": False, "linger.ms": 1,
                         "retry.backoff.ms": 20, "message.timeout.ms": 60_000})
    done = threading.Event()

    def produce() -> None:
        i = 0
        while not done.is_set():
            for p in led:
                try:
                    producer.produce("acks1", b"%d" % i, partition=p, on_delivery=delivered)
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.01)
                i += 1
            producer.poll(0.001)

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    try:
        wait_for(lambda: len(acked) >= 2000, TIMEOUT, "2,000 records acknowledged")
        before = len(acked)
        assert cluster.brokers[stopping].stop() == 0  # controlled shutdown, mid-stream
        wait_for(lambda: len(acked) >= before + 2000, TIMEOUT,
                 "2,000 more acknowledged by the new leaders")
    finally:
        done.set()
        writer.join(TIMEOUT)
    assert producer.flush(TIMEOUT) == 0
    assert all(cluster.state("acks1", p)["leader"] != stopping for p in led)
    survivor = next(b for b in (1, 2, 3) if b != stopping)
    found = read_to_end(cluster.brokers[survivor].bootstrap, "acks1", partitions)
    stored = {(p, offset): value for p, records in found.items() for offset, value in records}
    lost = sorted((where, value) for value, where in acked.items()
                  if stored.get(where) != value)
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged records lost: {lost[:5]}"
    cluster.brokers[stopping].start()  # the module's cluster whole again
    wait_for(lambda: str(stopping) in cluster.zk.get_children("/brokers/ids"), TIMEOUT,
             f"broker {stopping} registered again")


def test_an_election_zookeeper_refuses_is_answered_with_an_error(cluster):
    """ElectLeaders on the controller, for a topic whose config znode the brokers may not
    read (a NoAuth, not an absence: the read raises): the partition is answered with an
    error and the connection stays up, where the failure used to close it."""
    from confluent_kafka import ElectionType, KafkaError, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient
    from kazoo.security import make_digest_acl

    from oncelog.cluster import znodes as zn

    name = "locked"
    cluster.zk.create(zn.topic_config_path(name), b'{"version":1,"config":{}}',
                      acl=[make_digest_acl("someone-else", "secret", all=True)])
    cluster.zk.create(zn.topic_path(name), zn.TopicAssignment(
        "AAAAAAAAAAAAAAAAAAAAAA", {0: (1, 2)}, {}, {}).encode(), makepath=True)
    try:
        def answered():  # by the controller of now (an earlier test moved it)
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap()})
            try:
                return admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(name, 0)]
                                           ).result(TIMEOUT)
            except KafkaException as exc:
                assert exc.args[0].code() == KafkaError.NOT_CONTROLLER, exc
                return None

        found = wait_for(answered, TIMEOUT, "an answer from the controller", 0.2)
        [(partition, error)] = found.items()
        assert (partition.topic, partition.partition) == (name, 0)
        assert error is not None and error.code() == KafkaError.UNKNOWN, error
    finally:
        cluster.zk.delete(zn.topic_path(name), recursive=True)
        cluster.zk.delete(zn.topic_config_path(name))


def test_whole_cluster_stopped_at_once_does_not_wait_out_the_leave_timeout(cluster):
    """`make cluster`'s Ctrl-C: every broker gets SIGTERM at once while acks=1 and acks=all
    records are coming in; all stop cleanly. Each leaving leader waits for its ISRs to have
    what it appended before it stops following the others, so the high watermarks still
    advance and no broker waits out replica_manager.py's LEAVE_TIMEOUT_S: one that did logs
    that its ISR lacks records and moves its partitions anyway, which the test looks for (a
    log line, not a clock: no wall-time bound to flake on a loaded machine). Started again,
    once every ISR is of three again (a high watermark still behind must not read as a
    loss), every record acknowledged before (either acks) is where its acknowledgement
    said. Last in the module: it restarts all three."""
    import signal
    import threading

    from confluent_kafka import Producer
    from support.brokers import read_to_end

    partitions = 3
    cluster.create("allstop", partitions, 3, **{"min.insync.replicas": "2"})
    wait_for(lambda: all(len(cluster.state("allstop", p)["isr"]) == 3
                         for p in range(partitions)), TIMEOUT, "every ISR of three")
    acked: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset)

    def delivered(err, msg):
        if err is None:
            acked[msg.value()] = (msg.partition(), msg.offset())

    producers = {acks: Producer({"bootstrap.servers": cluster.bootstrap(), "acks": acks,
                                 "enable.idempotence": acks == "all", "linger.ms": 1,
                                 "message.timeout.ms": 5000}) for acks in ("1", "all")}
    done = threading.Event()

    def produce(acks: str) -> None:
        producer, i = producers[acks], 0
        while not done.is_set():
            try:
                producer.produce("allstop", b"%s-%d" % (acks.encode(), i),
                                 partition=i % partitions, on_delivery=delivered)
            except BufferError:
                producer.poll(0.01)
            i += 1
            producer.poll(0)

    writers = [threading.Thread(target=produce, args=(acks,), daemon=True)
               for acks in producers]
    for writer in writers:
        writer.start()
    sizes = {}
    try:
        wait_for(lambda: sum(v.startswith(b"all-") for v in list(acked)) >= 500 and
                 len(acked) >= 2000, TIMEOUT, "2,000 records acknowledged, 500 with acks=all")
        for broker in cluster.brokers.values():
            sizes[broker] = len(broker.log_text())
        began = time.monotonic()
        for broker in cluster.brokers.values():
            broker.proc.send_signal(signal.SIGTERM)  # to all three at once
        for broker in cluster.brokers.values():
            assert broker.proc.wait(TIMEOUT) == 0
            broker.proc = None
        print(f"the whole cluster stopped in {time.monotonic() - began:.2f}s")
    finally:
        done.set()
        for writer in writers:
            writer.join(TIMEOUT)
    for broker, size in sizes.items():
        text = broker.log_text()[size:]
        assert "their ISR lacks" not in text, text[-3000:]
    for producer in producers.values():
        producer.flush(0)  # what was acknowledged is in acked; the rest failed meanwhile
    for broker in cluster.brokers.values():
        broker.start()
    wait_for(lambda: sorted(cluster.zk.get_children("/brokers/ids")) == ["1", "2", "3"],
             TIMEOUT, "three brokers registered again")
    wait_for(lambda: all(len(cluster.state("allstop", p)["isr"]) == 3
                         for p in range(partitions)), TIMEOUT, "every ISR of three again")
    found = read_to_end(cluster.bootstrap(), "allstop", partitions)
    stored = {(p, offset): value for p, records in found.items() for offset, value in records}
    lost = sorted((where, value) for value, where in acked.items()
                  if stored.get(where) != value)
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged records lost: {lost[:5]}"
