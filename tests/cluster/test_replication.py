"""Replication on a real ZooKeeper with three real broker processes (issue 23, the data path).

The test plays the controller: it writes Kafka's znodes (the topic's assignment and each
partition's state) with kazoo, as the controller would, and the brokers' replica managers
follow them. The brokers' own controller runs beside it: each election the test writes
comes at once after the kill (before the dead broker's session expires), so the
controller's passes find a live leader and keep it (row L2), or shrink an ISR as the
leader would (L1); deletion goes through DeleteTopics, the controller's one transaction.
Metadata answers from the ZooKeeper-fed cache, which may name a new leader before that
leader's replica manager took the state: the test waits on each broker's own role
(``acts_on``) before it produces.

librdkafka produces idempotently with acks=all; the followers hold the leader's batches
at the same offsets; the leader is killed with SIGKILL and the test elects another ISR
member at leader_epoch + 1; the producer goes on; the topic holds every acknowledged
record exactly once, in order. Seed 004, case 2: a retry of each of the producer's last five
batches is answered by the new leader with its original offset, because the follower built
its producer state from the batches it replicated; the old leader comes back, truncates
what it alone had, and holds the new leader's log.
"""

from __future__ import annotations

import base64
import concurrent.futures
import datetime
import os
import re
import signal
import socket
import struct
import time
import uuid

import pytest
from kazoo.exceptions import BadVersionError
from kio.schema.errors import ErrorCode
from support.audit_helpers import batch as idempotent_batch
from support.brokers import BrokerProcess, batches_on_disk, read_to_end
from support.sigstop import sigstop
from support.txn_wire import write_marker
from support.waits import wait_for
from support.zookeepers import observer

from oncelog.client.network import calls
from oncelog.client.network.connection import KafkaError, connect
from oncelog.cluster import znodes as zn
from oncelog.protocol import api_versions as apis
from oncelog.protocol.messages import decode_response, encode_request
from oncelog.protocol.records import encode_batch
from oncelog.protocol.schema import build, request_module

SESSION_MS = 2000
TIMEOUT = 30.0
TOPIC = "replicated"
LONELY = "replicated-lonely"
STRICT = "replicated-strict"
MARKER = "replicated-marker"
SETTINGS = {"zookeeper.session.timeout.ms": str(SESSION_MS),
            "replica.lag.time.max.ms": "2000", "replica.fetch.wait.max.ms": "200",
            "replica.fetch.backoff.ms": "100", "min.insync.replicas": "2",
            "replica.high.watermark.checkpoint.interval.ms": "200"}


@pytest.fixture(scope="module")
def three(zookeeper, tmp_path_factory):
    """Three brokers of one fresh cluster (its own chroot), started side by side, and a
    kazoo client on it; shared by this module's tests, each with its own topic (a test
    that kills a broker starts it again)."""
    connect_string = zookeeper.chroot("replication")
    chroot = connect_string[len(zookeeper.connect):]
    zk = observer(zookeeper.connect, chroot)
    base = tmp_path_factory.mktemp("replication")
    brokers = {i: BrokerProcess(base / f"broker{i}", {
        "broker.id": str(i), "zookeeper.connect": connect_string, **SETTINGS})
        for i in (1, 2, 3)}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        list(pool.map(BrokerProcess.start, brokers.values()))
    yield zk, brokers
    for broker in brokers.values():
        if broker.alive:
            assert broker.stop() == 0, broker.log_text()
        assert "Traceback" not in broker.log_text(), broker.log_text()
    zk.stop()
    zk.close()


@pytest.fixture
def cluster(three):
    _, brokers = three
    for broker in brokers.values():
        if not broker.alive:
            broker.start()
    return three


def create_topic(zk, topic: str, replicas: tuple[int, ...], leader: int) -> None:
    """As the controller creates a topic: its assignment and its partition's first state in
    one ZooKeeper transaction."""
    raw = uuid.uuid4()
    TOPIC_IDS[topic] = raw
    topic_id = base64.urlsafe_b64encode(raw.bytes).rstrip(b"=").decode()
    assignment = zn.TopicAssignment(topic_id, {0: replicas}, {}, {})
    state = zn.PartitionState(leader, 0, replicas, 1)
    zk.ensure_path(zn.BROKER_TOPICS)
    txn = zk.transaction()
    txn.create(zn.topic_path(topic), assignment.encode())
    txn.create(f"{zn.topic_path(topic)}/partitions")
    txn.create(f"{zn.topic_path(topic)}/partitions/0")
    txn.create(zn.partition_state_path(topic, 0), state.encode())
    assert not any(isinstance(r, Exception) for r in txn.commit())


def elect(zk, topic: str, leader: int, isr: tuple[int, ...]) -> zn.PartitionState:
    """As the controller elects a leader: leader_epoch + 1, by a conditional write (read
    again when the leader's ISR write got there first)."""
    for _ in range(20):
        data, stat = zk.get(zn.partition_state_path(topic, 0))
        old = zn.PartitionState.decode(data)
        new = zn.PartitionState(leader, old.leader_epoch + 1, isr, old.controller_epoch)
        try:
            zk.set(zn.partition_state_path(topic, 0), new.encode(), version=stat.version)
        except BadVersionError:
            continue
        return new
    raise AssertionError(f"the state of {topic} kept changing")


def state_of(zk, topic: str, partition: int = 0) -> zn.PartitionState:
    return zn.PartitionState.decode(zk.get(zn.partition_state_path(topic, partition))[0])


def leader_seen(broker, topic: str, leader: int, epoch: int, partition: int = 0) -> bool:
    """Whether ``broker``'s Metadata names ``leader`` of ``partition`` at ``epoch``."""
    def make(mod, version):
        return build(mod.MetadataRequest, topics=(build(mod.MetadataRequestTopic,
                                                        topic_id=None, name=topic),),
                     allow_auto_topic_creation=False,
                     include_cluster_authorized_operations=False,
                     include_topic_authorized_operations=False)

    try:
        with connect(broker.bootstrap, timeout=5) as conn:
            answer = conn.call(apis.METADATA, make)
    except (KafkaError, OSError):
        return False
    for t in answer.topics:
        for p in t.partitions:
            if t.name == topic and p.partition_index == partition:
                return p.leader_id == leader and p.leader_epoch == epoch
    return False


def acts_on(broker, topic: str, leader: int, epoch: int, partition: int = 0) -> bool:
    """Whether ``broker``'s own replica acts on ``leader`` at ``epoch``: its local role,
    which decides NOT_LEADER_OR_FOLLOWER (Metadata answers from the ZooKeeper-fed cache,
    which may show a new leader before that leader's replica manager took the state). A
    Fetch v16 naming ``epoch`` answers: nothing wrong on the leader at it; on a follower,
    NOT_LEADER_OR_FOLLOWER with the leader it follows (KIP-951's hint)."""
    mod = request_module(apis.FETCH, 16)
    part = build(mod.FetchPartition, partition=partition, current_leader_epoch=epoch,
                 fetch_offset=0, log_start_offset=-1, partition_max_bytes=0,
                 last_fetched_epoch=-1)
    body = build(mod.FetchRequest, replica_id=-1, max_wait=datetime.timedelta(0),
                 min_bytes=0, max_bytes=1, isolation_level=0, session_id=0,
                 session_epoch=-1, rack_id="", forgotten_topics_data=(), cluster_id=None,
                 replica_state=build(mod.ReplicaState, replica_id=-1, replica_epoch=-1),
                 topics=(build(mod.FetchTopic, topic=topic, topic_id=topic_id_of(topic),
                               partitions=(part,)),))
    try:
        answer = call(broker, apis.FETCH, 16, body).responses[0].partitions[0]
    except OSError:
        return False
    if answer.error_code == ErrorCode.none:
        return int(broker.settings["broker.id"]) == leader
    hint = answer.current_leader
    return answer.error_code == ErrorCode.not_leader_or_follower and \
        (hint.leader_id, hint.leader_epoch) == (leader, epoch)


def call(broker, api_key: int, version: int, body):
    """One request at exactly ``version``, its answer decoded."""
    with socket.create_connection(("127.0.0.1", broker.port), timeout=TIMEOUT) as sock:
        sock.sendall(encode_request(api_key, version, 9, "t", body))
        sock_file = sock.makefile("rb")
        (size,) = struct.unpack(">i", sock_file.read(4))
        return decode_response(api_key, version, sock_file.read(size))[1]


def fetch_error(broker, topic: str, epoch: int, replica_id: int = -1,
                version: int = 12) -> ErrorCode:
    """The error a Fetch of partition 0 at offset 0 naming leader ``epoch`` gets (v15 on,
    a follower names itself in replica_state)."""
    mod = request_module(apis.FETCH, version)
    part = build(mod.FetchPartition, partition=0, current_leader_epoch=epoch,
                 fetch_offset=0, log_start_offset=-1, partition_max_bytes=1 << 20,
                 last_fetched_epoch=-1)
    state = {"replica_state": build(mod.ReplicaState, replica_id=replica_id,
                                    replica_epoch=-1)} if version >= 15 else {}
    body = build(mod.FetchRequest, replica_id=replica_id, max_wait=datetime.timedelta(0),
                 min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=0,
                 session_epoch=-1, rack_id="", forgotten_topics_data=(), cluster_id=None,
                 topics=(build(mod.FetchTopic, topic=topic, topic_id=topic_id_of(topic),
                               partitions=(part,)),), **state)
    return call(broker, apis.FETCH, version, body).responses[0].partitions[0].error_code


TOPIC_IDS: dict[str, uuid.UUID] = {}


def topic_id_of(topic: str) -> uuid.UUID | None:
    return TOPIC_IDS.get(topic)


def epoch_end(broker, topic: str, epoch: int) -> tuple[int, int]:
    """OffsetForLeaderEpoch: (epoch, end offset) the leader answers for ``epoch``, the same
    in every version served."""
    answers = set()
    for version in (2, 3, 4):
        mod = request_module(apis.OFFSET_FOR_LEADER_EPOCH, version)
        body = build(mod.OffsetForLeaderEpochRequest, replica_id=-1, topics=(build(
            mod.OffsetForLeaderTopic, topic=topic, partitions=(build(
                mod.OffsetForLeaderPartition, partition=0, current_leader_epoch=-1,
                leader_epoch=epoch),)),))
        result = call(broker, apis.OFFSET_FOR_LEADER_EPOCH, version, body).topics[0] \
            .partitions[0]
        assert result.error_code == ErrorCode.none, result
        answers.add((result.leader_epoch, result.end_offset))
    (answer,) = answers
    return answer


def produce_error(broker, topic: str) -> ErrorCode | None:
    with connect(broker.bootstrap, timeout=TIMEOUT) as conn:
        try:
            calls.produce(conn, topic, 0, idempotent_batch(0, 0, 0, [b"no"]), acks=1)
        except KafkaError as exc:
            return exc.code()
    return None


def produced(conn, batch: bytes) -> bool:
    """Whether an acks=all produce of ``batch`` went through (NOT_ENOUGH_REPLICAS: not)."""
    try:
        calls.produce(conn, STRICT, 0, batch)
    except KafkaError as exc:
        assert exc.code() == ErrorCode.not_enough_replicas, exc
        return False
    return True


def log_of(broker, topic: str) -> list[tuple[int, int, int]]:
    """(base offset, last offset, CRC) of every batch on disk (none before the replica's
    directory is made)."""
    if not (broker.data_dir / f"{topic}-0").exists():
        return []
    return [(h.base_offset, h.last_offset, h.crc) for h in batches_on_disk(broker, topic, 0)]


class AckedProducer:
    """librdkafka, idempotent, acks=all: what it was told was acknowledged, and where."""

    def __init__(self, bootstrap: str, topic: str = TOPIC) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.acked: list[tuple[int, bytes]] = []
        self.failed: list = []
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "batch.num.messages": 20, "message.timeout.ms": 25_000,
            "topic.metadata.refresh.interval.ms": 500, "retry.backoff.ms": 50,
            "retry.backoff.max.ms": 200})

    def _report(self, err, msg) -> None:
        if err is None:
            self.acked.append((msg.offset(), msg.value()))
        else:
            self.failed.append(err)

    def send(self, values: list[bytes]) -> None:
        for value in values:
            self.producer.produce(self.topic, value, partition=0, on_delivery=self._report)
            self.producer.poll(0)

    def flush(self) -> None:
        assert self.producer.flush(TIMEOUT) == 0, "records left unacknowledged"
        assert not self.failed, self.failed


def test_failover_keeps_every_acknowledged_record_once_and_retries_get_their_offsets(cluster):
    zk, brokers = cluster
    create_topic(zk, TOPIC, (1, 2, 3), leader=1)
    for broker in brokers.values():
        wait_for(lambda b=broker: acts_on(b, TOPIC, 1, 0), TIMEOUT, "broker 1 leads")
    bootstrap = ",".join(b.bootstrap for b in brokers.values())

    producer = AckedProducer(bootstrap)
    producer.send([b"a%04d" % i for i in range(200)])
    producer.flush()
    assert [v for _, v in sorted(producer.acked)] == [b"a%04d" % i for i in range(200)]

    # Our own idempotent producer's last five batches, acknowledged by acks=all: every ISR
    # member has them, with its producer state.
    with connect(brokers[1].bootstrap, timeout=TIMEOUT) as conn:
        pid, _ = calls.init_producer_id(conn)
        sent = [idempotent_batch(pid, 0, 3 * i, [b"p%d-%d" % (i, j) for j in range(3)])
                for i in range(7)]
        offsets = [calls.produce(conn, TOPIC, 0, b) for b in sent]
    end = log_of(brokers[1], TOPIC)
    for follower in (brokers[2], brokers[3]):
        assert log_of(follower, TOPIC) == end  # acks=all: the followers had it already

    # librdkafka has batches in flight when the leader dies (kill -9); the controller (the
    # test) elects broker 2 at leader epoch 1; the producer retries there and goes on.
    producer.send([b"b%04d" % i for i in range(100)])
    brokers[1].kill()
    elect(zk, TOPIC, 2, (2, 3))
    producer.send([b"b%04d" % i for i in range(100, 200)])
    wait_for(lambda: acts_on(brokers[2], TOPIC, 2, 1), TIMEOUT, "broker 2 leads")
    for broker in (brokers[2], brokers[3]):  # and every broker's Metadata says so
        wait_for(lambda b=broker: leader_seen(b, TOPIC, 2, 1), TIMEOUT, "Metadata")
    with connect(brokers[2].bootstrap, timeout=TIMEOUT) as conn:
        for batch, offset in zip(sent[-5:], offsets[-5:], strict=True):
            assert calls.produce(conn, TOPIC, 0, batch) == offset
        # and the next batch is stored, where the log is now
        assert calls.produce(conn, TOPIC, 0, idempotent_batch(
            pid, 0, 21, [b"p7-0"])) > offsets[-1]
    producer.flush()
    assert log_of(brokers[2], TOPIC)[:len(end)] == end  # nothing stored twice

    # A stale state (a deposed controller's write at the old leader epoch) changes nothing:
    # the leader epoch fences it (row B1). A topic created after it is seen only in a view
    # read after the stale state was written.
    data, stat = zk.get(zn.partition_state_path(TOPIC, 0))
    zk.set(zn.partition_state_path(TOPIC, 0), zn.PartitionState(3, 0, (3,), 0).encode(),
           version=stat.version)
    create_topic(zk, MARKER, (2, 3), leader=3)
    for broker in (brokers[2], brokers[3]):
        wait_for(lambda b=broker: acts_on(b, MARKER, 3, 0), TIMEOUT, "the later topic")
        assert acts_on(broker, TOPIC, 2, 1)
    zk.set(zn.partition_state_path(TOPIC, 0), data)  # as the controller had it

    # Only the leader is produced to and read from, at its epoch (KIP-320's rules); epoch
    # 0 ends where broker 2's first batch of epoch 1 begins.
    assert produce_error(brokers[3], TOPIC) == ErrorCode.not_leader_or_follower
    with connect(brokers[3].bootstrap, timeout=TIMEOUT) as conn:  # nor a marker written
        assert write_marker(conn, pid, 0, False, 0, [(TOPIC, 0)]) == \
            [ErrorCode.not_leader_or_follower]
    assert fetch_error(brokers[3], TOPIC, -1) == ErrorCode.not_leader_or_follower
    assert fetch_error(brokers[2], TOPIC, 1) == ErrorCode.none
    assert fetch_error(brokers[2], TOPIC, 0) == ErrorCode.fenced_leader_epoch
    assert fetch_error(brokers[2], TOPIC, 2) == ErrorCode.unknown_leader_epoch
    assert fetch_error(brokers[2], TOPIC, 0, replica_id=3) == ErrorCode.fenced_leader_epoch
    assert fetch_error(brokers[2], TOPIC, 0, replica_id=3, version=16) == \
        ErrorCode.fenced_leader_epoch
    epoch_1 = min(h.base_offset for h in batches_on_disk(brokers[2], TOPIC, 0)
                  if h.partition_leader_epoch == 1)
    assert epoch_end(brokers[2], TOPIC, 0) == (0, epoch_1)

    # The old leader comes back a follower (its state is epoch 0, the partition's 1) and
    # holds the new leader's log.
    brokers[1].start()
    wait_for(lambda: log_of(brokers[1], TOPIC) == log_of(brokers[2], TOPIC), TIMEOUT,
             "the old leader caught up")
    records = read_to_end(f"{brokers[2].bootstrap},{brokers[3].bootstrap}", TOPIC)[0]
    values = [v for _, v in records]
    assert len(values) == len(set(values)), "a record was stored twice"
    for prefix in (b"a", b"b"):
        acked = sorted((o, v) for o, v in producer.acked if v[:1] == prefix)
        assert [v for _, v in acked] == [prefix + b"%04d" % i for i in range(200)]
        assert [(o, v) for o, v in records if v[:1] == prefix] == acked, \
            "acknowledged records lost, moved or reordered"
    assert [o for o, _ in records] == list(range(len(records)))

    # The ISR, as the leader writes it to the state znode: the old leader caught up joins
    # it; a follower that stops fetching leaves it after replica.lag.time.max.ms, and
    # comes back once it fetches again.
    wait_for(lambda: state_of(zk, TOPIC).isr == (1, 2, 3), TIMEOUT, "broker 1 in the ISR")
    os.kill(brokers[3].proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: state_of(zk, TOPIC).isr == (1, 2), TIMEOUT, "broker 3 out of it")
        assert state_of(zk, TOPIC).leader_epoch == 1  # the leader's writes keep its epoch
    finally:
        os.kill(brokers[3].proc.pid, signal.SIGCONT)
    wait_for(lambda: state_of(zk, TOPIC).isr == (1, 2, 3), TIMEOUT, "broker 3 back in")


def test_an_old_leader_truncates_what_only_it_had(cluster):
    """The followers are stopped (SIGSTOP); the leader takes a batch with acks=1 no one else
    has; it is killed; broker 2 leads at epoch 1 and takes other batches; broker 1 comes back
    as follower, truncates to the end of epoch 0 on broker 2 (OffsetForLeaderEpoch) and
    then holds exactly broker 2's log."""
    zk, brokers = cluster
    create_topic(zk, LONELY, (1, 2, 3), leader=1)
    for broker in brokers.values():
        wait_for(lambda b=broker: acts_on(b, LONELY, 1, 0), TIMEOUT, "broker 1 leads")
    with connect(brokers[1].bootstrap, timeout=TIMEOUT) as conn:
        pid, _ = calls.init_producer_id(conn)
        calls.produce(conn, LONELY, 0, idempotent_batch(pid, 0, 0, [b"x0", b"x1"]))
        for follower in (brokers[2], brokers[3]):
            sigstop(follower.proc.pid)  # stopped, not only signalled
        try:
            # A fetch the followers had in flight may still carry x2 to them; x3 cannot
            # (the leader dies before they fetch again).
            assert calls.produce(conn, LONELY, 0, idempotent_batch(pid, 0, 2, [b"x2"]),
                                 acks=1) == 2
            # A consumer never sees what the ISR does not have.
            assert calls.list_offset(conn, LONELY, 0, -1) == 2
            # acks=all cannot be answered without the followers: it times out
            with pytest.raises(KafkaError) as refused:
                calls.produce(conn, LONELY, 0, idempotent_batch(pid, 0, 3, [b"x3"]),
                              timeout_ms=300)
            assert refused.value.code() == ErrorCode.request_timed_out
            brokers[1].kill()
        finally:
            for follower in (brokers[2], brokers[3]):
                os.kill(follower.proc.pid, signal.SIGCONT)
    # What it persisted as its high watermark is what the ISR had, never its log end: a
    # restart does not make x2 and x3 committed.
    checkpoint = brokers[1].data_dir / "replication-offset-checkpoint"  # one per log dir
    assert f"\n{LONELY} 0 2\n" in checkpoint.read_text()
    elect(zk, LONELY, 2, (2, 3))
    wait_for(lambda: acts_on(brokers[2], LONELY, 2, 1), TIMEOUT, "broker 2 leads")
    with connect(brokers[2].bootstrap, timeout=TIMEOUT) as conn:
        # x2 is stored at 2 (a duplicate if the follower had it); x3 never reached broker 2
        assert calls.produce(conn, LONELY, 0, idempotent_batch(pid, 0, 2, [b"x2"])) == 2
        assert calls.produce(conn, LONELY, 0, idempotent_batch(pid, 0, 3, [b"y3", b"y4"])) == 3
    brokers[1].start()
    wait_for(lambda: log_of(brokers[1], LONELY) == log_of(brokers[2], LONELY), TIMEOUT,
             "the old leader truncated and caught up")
    assert re.search(r"replicated-lonely-0: truncating from 4 to [23]", brokers[1].log_text())
    # Its producer state was rebuilt from what it kept and replicated: leading again, it
    # answers a retry of y3-y4 with its offset (with x3 still in its state, that retry
    # would straddle x3: OUT_OF_ORDER_SEQUENCE_NUMBER).
    # Restarted within a controller pass, broker 1 may count as bounced: the controller then
    # takes it out of the ISR (a leader epoch more) until its leader adds it back. Elect it
    # only once it is back in the ISR, at whatever epoch that took.
    wait_for(lambda: 1 in state_of(zk, LONELY).isr, TIMEOUT, "broker 1 back in the ISR")
    again = elect(zk, LONELY, 1, (1, 2, 3))
    wait_for(lambda: acts_on(brokers[1], LONELY, 1, again.leader_epoch), TIMEOUT,
             "broker 1 leads again")
    with connect(brokers[1].bootstrap, timeout=TIMEOUT) as conn:
        assert calls.produce(conn, LONELY, 0, idempotent_batch(pid, 0, 3, [b"y3", b"y4"])) == 3

    # A zombie: the leader is paused, broker 3 is elected meanwhile; resumed, the old
    # leader acknowledges nothing with acks=all (nobody fetches from it any more), learns
    # the new epoch, and ends up holding broker 3's log.
    os.kill(brokers[1].proc.pid, signal.SIGSTOP)
    try:
        third = elect(zk, LONELY, 3, (2, 3))
        for broker in (brokers[2], brokers[3]):
            wait_for(lambda b=broker: acts_on(b, LONELY, 3, third.leader_epoch), TIMEOUT,
                     "broker 3 leads")
    finally:
        os.kill(brokers[1].proc.pid, signal.SIGCONT)
    with connect(brokers[1].bootstrap, timeout=TIMEOUT) as conn:
        with pytest.raises(KafkaError) as zombie:
            calls.produce(conn, LONELY, 0, idempotent_batch(pid, 0, 5, [b"z5"]),
                          timeout_ms=2000)
        assert zombie.value.code() in (ErrorCode.not_leader_or_follower,
                                       ErrorCode.request_timed_out)
    with connect(brokers[3].bootstrap, timeout=TIMEOUT) as conn:
        assert calls.produce(conn, LONELY, 0, idempotent_batch(pid, 0, 5, [b"w5"])) == 5
    wait_for(lambda: log_of(brokers[1], LONELY) == log_of(brokers[3], LONELY), TIMEOUT,
             "the zombie follows the new leader")


def test_topic_configs_min_insync_replicas_and_deletion(cluster):
    """The topic's configs come from /config/topics: min.insync.replicas 3 over two replicas
    refuses acks=all before the append (NOT_ENOUGH_REPLICAS), acks=1 goes through; a broker
    with no replica of the topic holds nothing of it; once the assignment is deleted, every
    replica's local log goes."""
    zk, brokers = cluster
    zk.create(f"{zn.CONFIG_TOPICS}/{STRICT}", zn.encode_topic_config(
        {"min.insync.replicas": "3"}), makepath=True)
    create_topic(zk, STRICT, (1, 2), leader=1)
    for broker in (brokers[1], brokers[2]):  # a leader not there yet: UNKNOWN_TOPIC...
        wait_for(lambda b=broker: acts_on(b, STRICT, 1, 0), TIMEOUT, "the state read")
    plain = encode_batch([(None, b"s", (), int(time.time() * 1000))])
    with connect(brokers[1].bootstrap, timeout=TIMEOUT) as conn:
        with pytest.raises(KafkaError) as refused:
            calls.produce(conn, STRICT, 0, plain)
        assert refused.value.code() == ErrorCode.not_enough_replicas
        assert calls.produce(conn, STRICT, 0, plain, acks=1) == 0
    wait_for(lambda: log_of(brokers[2], STRICT) == log_of(brokers[1], STRICT), TIMEOUT,
             "broker 2 replicated it")
    assert not (brokers[3].data_dir / f"{STRICT}-0").exists()
    # DeleteRecords at the leader moves the follower's log start too; a follower refuses it.
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    def high_watermark() -> int:
        with connect(brokers[1].bootstrap, timeout=TIMEOUT) as conn:
            return calls.list_offset(conn, STRICT, 0, -1)

    wait_for(lambda: high_watermark() == 1, TIMEOUT, "the ISR has offset 0")
    # a config changed in /config/topics takes effect: 2 in sync are enough now
    zk.set(f"{zn.CONFIG_TOPICS}/{STRICT}", zn.encode_topic_config({"min.insync.replicas": "2"}))
    with connect(brokers[1].bootstrap, timeout=TIMEOUT) as conn:
        wait_for(lambda: produced(conn, plain), TIMEOUT, "acks=all with min.insync 2")
    wait_for(lambda: high_watermark() == 2, TIMEOUT, "the ISR has offset 1")
    # the follower stops: an acks=all batch waits, the ISR shrinks to the leader alone
    # after replica.lag.time.max.ms, and the batch is answered
    # NOT_ENOUGH_REPLICAS_AFTER_APPEND (stored, not acknowledged)
    os.kill(brokers[2].proc.pid, signal.SIGSTOP)
    try:
        with connect(brokers[1].bootstrap, timeout=TIMEOUT) as conn:
            with pytest.raises(KafkaError) as after:
                calls.produce(conn, STRICT, 0, plain)
        assert after.value.code() == ErrorCode.not_enough_replicas_after_append
        assert state_of(zk, STRICT).isr == (1,)
    finally:
        os.kill(brokers[2].proc.pid, signal.SIGCONT)
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    done = admin.delete_records([TopicPartition(STRICT, 0, 1)])
    assert next(iter(done.values())).result(TIMEOUT).low_watermark == 1
    del admin
    start = brokers[2].data_dir / f"{STRICT}-0" / "log-start-offset-checkpoint"
    wait_for(lambda: start.exists() and start.read_text() == "1\n", TIMEOUT,
             "the follower's log start moved")
    # CreatePartitions, as the controller writes it: the assignment grows, the new
    # partition's state appears, the replicas follow it.
    data, stat = zk.get(zn.topic_path(STRICT))
    grown = zn.TopicAssignment.decode(data)
    grown = zn.TopicAssignment(grown.topic_id, {0: (1, 2), 1: (2, 1)}, {}, {})
    txn = zk.transaction()
    txn.create(f"{zn.topic_path(STRICT)}/partitions/1")
    txn.create(zn.partition_state_path(STRICT, 1), zn.PartitionState(2, 0, (2, 1), 1).encode())
    txn.set_data(zn.topic_path(STRICT), grown.encode(), version=stat.version)
    assert not any(isinstance(r, Exception) for r in txn.commit())

    def both_act_on_the_state() -> bool:
        # The state written names broker 2 at epoch 0. When broker 2's SIGSTOP above
        # outlasted its 2 s ZooKeeper session (a full suite's load), broker 2 has not
        # registered again yet when the state appears, and the controller rightly elects
        # broker 1 at epoch 1. Either way both replicas act on what ZooKeeper says.
        state = state_of(zk, STRICT, 1)
        return all(acts_on(brokers[b], STRICT, state.leader, state.leader_epoch, partition=1)
                   for b in (1, 2))

    wait_for(both_act_on_the_state, TIMEOUT, "both replicas act on the new partition's state")
    # DeleteTopics: the controller removes the znodes in one transaction (a recursive
    # delete here would race its pass, which creates a missing state znode)
    deleting = AdminClient({"bootstrap.servers": brokers[2].bootstrap})
    deleting.delete_topics([STRICT], operation_timeout=10)[STRICT].result(TIMEOUT)
    del deleting
    for broker in (brokers[1], brokers[2]):
        wait_for(lambda b=broker: not (b.data_dir / f"{STRICT}-0").exists(), TIMEOUT,
                 "the local replica deleted")


def test_a_leader_alone_in_its_isr_commits_its_own_appends(cluster):
    """A partition whose ISR is its leader alone (a single replica here): nothing but the
    leader's own append can move its high watermark (no follower fetches), so the append
    does, as Kafka's leader does after every append: the record is visible (ListOffsets
    latest, the high watermark) as soon as the produce is answered. Before, it waited for
    some later event, and an acks=all write (a coordinator's, on a one-broker cluster) for
    its timeout."""
    zk, brokers = cluster
    create_topic(zk, "replicated-single", (1,), leader=1)
    wait_for(lambda: acts_on(brokers[1], "replicated-single", 1, 0), TIMEOUT, "broker 1 leads")
    with connect(brokers[1].bootstrap, timeout=TIMEOUT) as conn:
        for n in range(1, 4):
            calls.produce(conn, "replicated-single", 0,
                          idempotent_batch(-1, -1, -1, [b"v%d" % n]), acks=1)
            assert calls.list_offset(conn, "replicated-single", 0, -1) == n


def test_a_failed_log_dir_moves_leadership_away_and_nothing_acknowledged_is_lost(cluster):
    """Broker 1 leads; its fsync of the partition's segment fails (EIO, injected: see
    log/disk.py) and its log directory goes offline. It reports the replica under
    /oncelog/offline_replicas with Kafka's /log_dir_event_notification; the controller
    elects another in-sync replica (leader_election.py's D1) without broker 1 in the ISR;
    librdkafka (idempotent, acks=all) goes on there, and every acknowledged record is read
    back once, at its offset. Restarted without the fault, broker 1 recovers the directory
    and its report empties."""
    zk, brokers = cluster
    topic = "replicated-failed-dir"
    one = brokers[1]
    one.stop()
    one.env = {"ONCELOG_DISK_FAULTS": f"fsync:{topic}-0/{0:020d}.log:10:EIO"}
    one.settings["log.flush.interval.messages"] = "1"
    one.start()
    try:
        create_topic(zk, topic, (1, 2, 3), leader=1)
        for broker in brokers.values():
            wait_for(lambda b=broker: acts_on(b, topic, 1, 0), TIMEOUT, "broker 1 leads")
        producer = AckedProducer(",".join(b.bootstrap for b in brokers.values()), topic)
        for i in range(0, 300, 10):  # batches of ten, each fsynced on broker 1 by itself
            producer.send([b"v%04d" % j for j in range(i, i + 10)])
            producer.flush()
        assert "is now OFFLINE" in one.log_text()
        state = state_of(zk, topic)
        assert state.leader in (2, 3) and state.leader_epoch >= 1 and 1 not in state.isr
        # every replica in that directory: the other topics' too
        assert (topic, 0) in zn.decode_offline_replicas(
            zk.get(f"{zn.OFFLINE_REPLICAS}/1")[0])
        wait_for(lambda: not zk.get_children(zn.LOG_DIR_EVENT_NOTIFICATION), TIMEOUT,
                 "the controller handled the log directory event")
        records = read_to_end(",".join(b.bootstrap for b in (brokers[2], brokers[3])),
                              topic)[0]
        assert [v for _, v in records] == [b"v%04d" % i for i in range(300)]
        assert sorted(producer.acked) == records
    finally:
        one.stop()
        one.env = {}
        del one.settings["log.flush.interval.messages"]
        one.start()
    wait_for(lambda: not zk.exists(f"{zn.OFFLINE_REPLICAS}/1"), TIMEOUT,
             "broker 1 recovered its directory")


def test_a_broker_whose_disk_was_wiped_replicates_everything_again(cluster):
    """Broker 3 is killed (kill -9) and its data directory wiped while librdkafka produces
    (idempotent, acks=all); started again, it comes back empty, fetches the whole log from the
    leader again and rejoins the ISR. Then brokers 1 and 2 are killed: broker 3 alone leads
    and serves every acknowledged record once, at its offset, none lost."""
    import shutil

    zk, brokers = cluster
    topic = "replicated-wiped"
    create_topic(zk, topic, (1, 2, 3), leader=1)
    for broker in brokers.values():
        wait_for(lambda b=broker: acts_on(b, topic, 1, 0), TIMEOUT, "broker 1 leads")
    producer = AckedProducer(",".join(b.bootstrap for b in brokers.values()), topic)
    three = brokers[3]
    try:
        producer.send([b"v%04d" % i for i in range(200)])
        producer.flush()
        three.kill()
        shutil.rmtree(three.data_dir)
        producer.send([b"v%04d" % i for i in range(200, 300)])  # while it is down
        three.start()
        producer.send([b"v%04d" % i for i in range(300, 400)])  # while it catches up
        producer.flush()

        def records_on_three() -> int:
            if not (three.data_dir / f"{topic}-0").exists():
                return 0  # not made again yet
            return sum(h.last_offset_delta + 1 for h in batches_on_disk(three, topic, 0))

        wait_for(lambda: records_on_three() == 400, TIMEOUT,
                 "broker 3 fetched the whole log again")
        wait_for(lambda: 3 in state_of(zk, topic).isr, TIMEOUT, "broker 3 back in the ISR")
        brokers[1].kill()
        brokers[2].kill()
        wait_for(lambda: state_of(zk, topic).leader == 3, TIMEOUT, "broker 3 leads")
        records = read_to_end(three.bootstrap, topic)[0]
        assert [v for _, v in records] == [b"v%04d" % i for i in range(400)]
        assert sorted(producer.acked) == records
    finally:
        for broker in (brokers[1], brokers[2]):
            if not broker.alive:
                broker.start()
