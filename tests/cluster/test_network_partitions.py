"""Real network partitions in a three-broker cluster (issue 23): each broker, ZooKeeper and the
test's clients in a network namespace of their own (tests/support/netns.py), links cut with
``ip link set ... down`` and healed.

A leader cut off from ZooKeeper and from the other brokers, still reachable by its producer,
acknowledges nothing (its followers cannot fetch, and its ISR cannot shrink without
ZooKeeper); the controller elects a new leader from the ISR once the old leader's session
expires; librdkafka's idempotent producer (acks=all) moves on to it; healed, the old leader
registers again, truncates what only it had and follows. A broker cut off from ZooKeeper
only leaves every ISR and leads nothing, and, still fetching, is not put back into an ISR
while it is not registered (KIP-841); past its session timeout it refuses Produce for what it
led and refuses Metadata (cluster/membership.py's standing table), so a producer that still
reaches it moves on; healed, it comes back. A follower cut off from its
leader alone leaves the ISR after replica.lag.time.max.ms, acks=all goes on with the two in
sync, and healed it catches up and is back. Read back, every partition holds
every acknowledged record once, in order, at the offset its acknowledgement named.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from kazoo.client import KazooClient
from support.brokers import batches_on_disk, read_to_end
from support.netns import NetnsBroker, NetnsZooKeeper, Topology
from support.waits import wait_for
from support.zookeepers import observer

from oncelog.client.network import calls
from oncelog.client.network.connection import KafkaError, connect
from oncelog.protocol import api_versions as apis
from oncelog.protocol.records import encode_batch
from oncelog.protocol.schema import build

SESSION_MS = 2000
TIMEOUT = 30.0
SETTINGS = {"zookeeper.session.timeout.ms": str(SESSION_MS),
            "zookeeper.connection.timeout.ms": "10000",
            "replica.lag.time.max.ms": "2000", "replica.fetch.wait.max.ms": "200",
            "replica.fetch.backoff.ms": "100", "default.replication.factor": "3",
            "min.insync.replicas": "2", "replica.high.watermark.checkpoint.interval.ms": "200"}
BROKERS = (1, 2, 3)


class Net:
    def __init__(self, topology: Topology, zookeeper: NetnsZooKeeper,
                 brokers: dict[int, NetnsBroker], zk: KazooClient) -> None:
        self.topology, self.zookeeper, self.brokers, self.zk = topology, zookeeper, brokers, zk
        self.admins: dict = {}

    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())

    def create(self, topic: str, partitions: int) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = self.admins.setdefault(topic, AdminClient({"bootstrap.servers": self.bootstrap()}))
        admin.create_topics([NewTopic(topic, partitions, 3)], operation_timeout=10)[topic] \
            .result(TIMEOUT)
        for p in range(partitions):
            wait_for(lambda p=p: len(self.state(topic, p)["isr"]) == 3, TIMEOUT,
                     f"{topic}-{p}'s ISR of three")

    def state(self, topic: str, p: int) -> dict:
        return json.loads(self.zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")[0])

    def controller(self) -> int:
        return json.loads(self.zk.get("/controller")[0])["brokerid"]

    def registered(self) -> set[int]:
        return {int(b) for b in self.zk.get_children("/brokers/ids")}

    def log_of(self, broker: int, topic: str, p: int) -> list[tuple[int, int, int]]:
        b = self.brokers[broker]
        if not (b.data_dir / f"{topic}-{p}").exists():
            return []
        return [(h.base_offset, h.last_offset, h.crc) for h in batches_on_disk(b, topic, p)]


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    """ZooKeeper, three brokers and the test's clients, five namespaces joined pairwise;
    the test runs inside ``client``. Everything is removed at the end, whatever happened."""
    # Tests run as root with iproute2 (make test installs it): never skipped, or a CI that
    # cannot make namespaces would pass without having partitioned anything.
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("network namespaces need root and iproute2's ip (make test installs it)")
    base = tmp_path_factory.mktemp("netns")
    topology = Topology(["zk", "b1", "b2", "b3", "client"])
    zookeeper = brokers = zk = None
    try:
        zookeeper = NetnsZooKeeper(topology, "zk").start()
        brokers = {i: NetnsBroker(topology, f"b{i}", base / f"b{i}", {
            "broker.id": str(i), "zookeeper.connect": zookeeper.connect, **SETTINGS})
            for i in BROKERS}
        with ThreadPoolExecutor(3) as starting:  # each is a fresh interpreter: in parallel
            list(starting.map(NetnsBroker.start, brokers.values()))
        with topology.inside("client"):
            zk = observer(zookeeper.connect)
            running = Net(topology, zookeeper, brokers, zk)
            wait_for(lambda: running.registered() == set(BROKERS), TIMEOUT, "three registered")
            yield running
            running.admins.clear()
            zk.stop()
            zk.close()
            zk = None
        for broker in brokers.values():
            assert "Traceback" not in broker.log_text(), broker.log_text()
    finally:
        for broker in (brokers or {}).values():
            broker.kill()
        if zk is not None:
            zk.stop()
        if zookeeper is not None:
            zookeeper.close()
        topology.close()


class Acked:
    """librdkafka, idempotent, acks=all, short request timeouts (a produce to a leader that
    cannot replicate times out in seconds and is retried): what it acknowledged, where."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.acked: dict[tuple[int, bytes], int] = {}  # (partition, value) -> offset
        self.failed: list[str] = []
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "message.timeout.ms": 60_000,
            # an answer lost on a cut link is given up on in seconds, not socket.timeout.ms'
            # default minute (librdkafka's in-flight timeout; request.timeout.ms is the
            # broker's acks=all wait)
            "request.timeout.ms": 3000, "socket.timeout.ms": 5000,
            "topic.metadata.refresh.interval.ms": 500, "retry.backoff.ms": 50,
            "retry.backoff.max.ms": 300})

    def _report(self, err, msg) -> None:
        if err is None:
            self.acked[(msg.partition(), msg.value())] = msg.offset()
        else:
            self.failed.append(str(err))

    def send(self, partition: int, values: range) -> None:
        for i in values:
            self.producer.produce(self.topic, b"%06d" % i, partition=partition,
                                  on_delivery=self._report)
            self.producer.poll(0)

    def flush(self, timeout: float = 60.0) -> None:
        assert self.producer.flush(timeout) == 0, "records left unacknowledged"
        assert not self.failed, self.failed[:5]


def metadata_refused(bootstrap: str, topic: str) -> bool:
    """Whether one broker closes the connection on a Metadata request for ``topic``."""
    def make(mod, _version):
        return build(mod.MetadataRequest, topics=(build(mod.MetadataRequestTopic,
                                                        topic_id=None, name=topic),),
                     allow_auto_topic_creation=False,
                     include_cluster_authorized_operations=False,
                     include_topic_authorized_operations=False)

    with connect(bootstrap, timeout=TIMEOUT) as conn:
        try:
            conn.call(apis.METADATA, make)
        except (OSError, EOFError, KafkaError):
            return True
    return False


def check_exactly_once(net: Net, producer: Acked, partitions: dict[int, int]) -> None:
    """Each partition p holds values 0..partitions[p]-1 once, in order, each at the offset
    its acknowledgement named, read with librdkafka from the whole cluster."""
    records = read_to_end(net.bootstrap(), producer.topic, max(partitions) + 1)
    for p, count in partitions.items():
        values = [v for _, v in records[p]]
        assert values == [b"%06d" % i for i in range(count)], \
            f"partition {p}: lost, duplicated or reordered records"
        assert {(p, v): o for o, v in records[p]} == \
            {k: o for k, o in producer.acked.items() if k[0] == p}


def test_leader_cut_off_acknowledges_nothing_and_follows_after_healing(net):
    topic = "cut-leader"
    net.create(topic, 3)
    controller = net.controller()
    # a partition led by a broker that is not the controller (the controller elects at once)
    p, before = next((p, s) for p in range(3)
                     if (s := net.state(topic, p))["leader"] != controller)
    old = before["leader"]
    others = [b for b in BROKERS if b != old]
    producer = Acked(net.bootstrap(), topic)
    producer.send(p, range(0, 300))
    producer.flush()

    heal = net.topology.isolate(f"b{old}", ["zk", *(f"b{b}" for b in others)])
    try:
        producer.send(p, range(300, 600))
        # The old leader, still reachable by clients, acknowledges nothing with acks=all: no
        # follower fetches from it and its ISR cannot shrink without ZooKeeper.
        with connect(net.brokers[old].bootstrap, timeout=TIMEOUT) as conn:
            with pytest.raises(KafkaError) as refused:
                calls.produce(conn, topic, p, encode_batch(
                    [(None, b"zombie", (), int(time.time() * 1000))]), timeout_ms=2500)
        assert refused.value.code().name in ("request_timed_out", "not_leader_or_follower")
        new = wait_for(lambda: (s := net.state(topic, p))["leader"] != old and s,
                       SESSION_MS / 1000 + TIMEOUT, "a new leader elected without the old one")
        assert new["leader_epoch"] == before["leader_epoch"] + 1
        assert old not in new["isr"] and new["leader"] in before["isr"]
        assert old not in net.registered()  # its session expired
        # librdkafka asks the brokers it is connected to for Metadata: the old leader,
        # still reachable, away from ZooKeeper past its session timeout, refuses it and
        # closes the connection, and librdkafka asks another broker (a ZooKeeper-mode Kafka
        # broker would name itself from its frozen picture)
        producer.send(p, range(600, 900))
        producer.flush()  # moved on to the new leader
    finally:
        heal()
    wait_for(lambda: old in net.registered(), TIMEOUT, f"broker {old} registered again")
    leader = net.state(topic, p)["leader"]
    wait_for(lambda: net.log_of(old, topic, p) == net.log_of(leader, topic, p), TIMEOUT,
             f"broker {old} truncated and followed broker {leader}")
    wait_for(lambda: old in net.state(topic, p)["isr"], TIMEOUT, f"broker {old} back in the ISR")
    check_exactly_once(net, producer, {p: 900})


def test_broker_cut_off_from_zookeeper_only_stays_out_of_every_isr(net):
    """Still reaching every broker and client, the broker loses its ZooKeeper session: the
    controller moves its leaderships away and takes it out of every ISR; it keeps fetching
    (its link to each leader is up) and catches up, yet no leader puts it back while it is
    not registered (KIP-841: the ISR would flap, the controller removing it, its leader
    adding it). Healed, it registers again and is back in every ISR."""
    topic = "cut-zookeeper"
    net.create(topic, 3)
    controller = net.controller()
    cut = next(b for b in BROKERS if b != controller)
    states: dict[int, list[tuple[int, dict]]] = {p: [] for p in range(3)}

    def record(p: int):  # each state with the zxid ZooKeeper wrote it at
        return lambda data, stat, _event=None: data and states[p].append(
            (stat.mzxid, json.loads(data)))

    for p in range(3):  # every state each partition goes through
        net.zk.DataWatch(f"/brokers/topics/{topic}/partitions/{p}/state", record(p))
    led = [p for p in range(3) if net.state(topic, p)["leader"] == cut]
    assert led, f"broker {cut} leads none of {topic}'s partitions"
    # Produced to: every partition, those it led too. Past its session timeout it refuses
    # Metadata and Produce (a ZooKeeper-mode Kafka broker would go on answering from its
    # frozen picture, and a producer asking it would stall there).
    producer = Acked(net.bootstrap(), topic)
    counts = dict.fromkeys(range(3), 0)

    def send(n: int) -> None:
        for p in range(3):
            producer.send(p, range(counts[p], counts[p] + n))
            counts[p] += n

    send(100)
    producer.flush()
    heal = net.topology.isolate(f"b{cut}", ["zk"])
    try:
        wait_for(lambda: cut not in net.registered(), SESSION_MS / 1000 + TIMEOUT,
                 f"broker {cut}'s session expired")
        # ZooKeeper's order, not the watches' arrival: the expiry's zxid (its registration's
        # deletion, the last change of /brokers/ids's children). Before it the broker was
        # registered, and a leader rightly put it back after a lag shrink (load can make
        # one before the cut, or while its session still runs).
        expired = net.zk.exists("/brokers/ids").pzxid
        wait_for(lambda: all(cut not in (s := net.state(topic, p))["isr"] and
                             s["leader"] != cut for p in range(3)), TIMEOUT,
                 f"broker {cut} out of every ISR, leading nothing")
        bootstrap = net.brokers[cut].bootstrap
        # away past its session timeout, it vouches for nothing it read: no Metadata (a
        # client asks another broker), no Produce to what it led
        wait_for(lambda: metadata_refused(bootstrap, topic), SESSION_MS / 1000 + TIMEOUT,
                 f"broker {cut} refusing Metadata")
        for p in led:
            with connect(bootstrap, timeout=TIMEOUT) as conn:
                with pytest.raises(KafkaError) as refused:
                    calls.produce(conn, topic, p, encode_batch(
                        [(None, b"zombie", (), int(time.time() * 1000))]), timeout_ms=2500)
            assert refused.value.code().name == "not_leader_or_follower"
        send(100)
        producer.flush()
        # it is still a follower that fetches: it catches up with every partition it
        # followed (the new leaders of those it led it learns of once healed)
        followed = [p for p in range(3) if p not in led]
        for p in followed:
            leader = net.state(topic, p)["leader"]
            wait_for(lambda p=p, leader=leader: net.log_of(cut, topic, p) ==
                     net.log_of(leader, topic, p), TIMEOUT, f"broker {cut} caught up on {p}")
        send(50)  # and fetches again after being caught up: its leaders see it in sync
        producer.flush()
        for p in followed:
            leader = net.state(topic, p)["leader"]
            wait_for(lambda p=p, leader=leader: net.log_of(cut, topic, p) ==
                     net.log_of(leader, topic, p), TIMEOUT, f"broker {cut} caught up on {p}")
        assert cut not in net.registered()
        for p, seen in states.items():
            after = [s for zxid, s in seen if zxid > expired]
            out = next(i for i, s in enumerate(after) if cut not in s["isr"])
            assert all(cut not in s["isr"] for s in after[out:]), \
                f"{topic}-{p}: broker {cut} put back into the ISR unregistered: {seen}"
    finally:
        heal()
    wait_for(lambda: cut in net.registered(), TIMEOUT, f"broker {cut} registered again")
    wait_for(lambda: all(cut in net.state(topic, p)["isr"] for p in range(3)), TIMEOUT,
             f"broker {cut} back in every ISR")
    send(50)
    producer.flush()
    check_exactly_once(net, producer, counts)


def test_follower_cut_off_from_its_leader_only_leaves_the_isr_and_comes_back(net):
    """A partition between two brokers: the follower still reaches ZooKeeper, the other
    follower and the clients, not its leader. It stays registered; the leader takes it out of
    the ISR after replica.lag.time.max.ms and acks=all goes on with the two left
    (min.insync.replicas 2); healed, it catches up and the leader puts it back."""
    topic = "cut-link"
    net.create(topic, 1)
    state = net.state(topic, 0)
    leader = state["leader"]
    follower = next(b for b in state["isr"] if b != leader)
    producer = Acked(net.bootstrap(), topic)
    producer.send(0, range(0, 200))
    producer.flush()
    heal = net.topology.isolate(f"b{leader}", [f"b{follower}"])
    try:
        producer.send(0, range(200, 400))
        wait_for(lambda: follower not in net.state(topic, 0)["isr"], TIMEOUT,
                 f"broker {follower} out of the ISR")
        producer.send(0, range(400, 600))
        producer.flush()  # acknowledged by the two in sync
        after = net.state(topic, 0)
        assert after["leader"] == leader and after["leader_epoch"] == state["leader_epoch"]
        assert follower in net.registered()  # its ZooKeeper session never went
    finally:
        heal()
    wait_for(lambda: follower in net.state(topic, 0)["isr"], TIMEOUT,
             f"broker {follower} caught up, back in the ISR")
    assert net.log_of(follower, topic, 0) == net.log_of(leader, topic, 0)
    check_exactly_once(net, producer, {0: 600})


def test_leader_cut_off_refuses_acks_1_before_a_new_leader_is_elected(net):
    """A leader cut off from ZooKeeper and its followers, still reached by a producer with
    acks=1: kazoo notices the lost connection late, yet the broker stops leading once
    ZooKeeper has not answered it for half the session timeout (membership.py's standing
    table, V3), before ZooKeeper can expire its session and the controller elect another
    leader. Measured as an order of two moments, not a duration: the first refusal
    (NOT_LEADER_OR_FOLLOWER) comes before the controller's state write naming a new leader."""
    topic = "cut-acks-1"
    net.create(topic, 3)
    controller = net.controller()
    # a partition led by a broker that is not the controller (the controller elects at once)
    p = next(p for p in range(3) if net.state(topic, p)["leader"] != controller)
    old = net.state(topic, p)["leader"]
    elected: list[float] = []

    def watch(data, _stat, _event=None):
        if data and not elected and json.loads(data)["leader"] != old:
            elected.append(time.monotonic())

    net.zk.DataWatch(f"/brokers/topics/{topic}/partitions/{p}/state", watch)
    others = [b for b in BROKERS if b != old]
    refused_at = None
    acked = 0
    with connect(net.brokers[old].bootstrap, timeout=TIMEOUT) as conn:
        def leads() -> bool:
            try:
                calls.produce(conn, topic, p, encode_batch(
                    [(None, b"acks-1", (), int(time.time() * 1000))]), acks=1)
            except KafkaError:
                return False  # the state is in ZooKeeper, not yet read by the broker
            return True

        wait_for(leads, TIMEOUT, f"broker {old} leading {topic}-{p}")
        heal = net.topology.isolate(f"b{old}", ["zk", *(f"b{b}" for b in others)])
        try:
            deadline = time.monotonic() + SESSION_MS / 1000 + TIMEOUT
            while refused_at is None:
                assert time.monotonic() < deadline, "the cut leader never refused acks=1"
                try:
                    calls.produce(conn, topic, p, encode_batch(
                        [(None, b"acks-1", (), int(time.time() * 1000))]), acks=1)
                    acked += 1
                except KafkaError as exc:
                    assert exc.code().name == "not_leader_or_follower", exc
                    refused_at = time.monotonic()
            wait_for(lambda: elected, SESSION_MS / 1000 + TIMEOUT, "a new leader elected")
        finally:
            heal()
    # It led, answering acks=1 (leads() above), until it could no longer vouch: how many
    # it answered after the cut depends on how soon the next produce came (under load the
    # first one may come after half the session timeout, refused at once), not a property.
    print(f"broker {old} answered {acked} acks=1 produces after the cut, then refused "
          f"{elected[0] - refused_at:.3f}s before the new leader")
    assert refused_at < elected[0], \
        f"broker {old} refused acks=1 only {refused_at - elected[0]:.3f}s after broker " \
        f"{net.state(topic, p)['leader']} was elected leader"
    wait_for(lambda: old in net.registered(), TIMEOUT, f"broker {old} registered again")
    wait_for(lambda: old in net.state(topic, p)["isr"], TIMEOUT, f"broker {old} back in the ISR")
