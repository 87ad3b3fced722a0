"""Transactions across the brokers of a three-broker cluster (issue 24): a transaction spans
partitions led by different brokers, so its coordinator sends the COMMIT / ABORT markers to
each partition's leader (WriteTxnMarkers over the inter-broker channel), retried through a
leader's death until the new leader takes them, and each partition leader verifies a
transactional produce with the coordinator wherever it is (KIP-890 part 1). The coordinator
of a transactional id is the leader of its ``__transaction_state`` partition, which every
broker names alike (FindCoordinator), and it moves when that leader dies."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from kio.schema.errors import ErrorCode
from support import txn_wire
from support.acl_wire import AUTHORIZER
from support.broker_forks import run_oncelog
from support.txn_cluster import TIMEOUT, TxnCluster, end_offsets, read_committed
from support.waits import wait_for

import oncelog
from oncelog.client.admin.admin import Admin
from oncelog.client.network import calls
from oncelog.client.network.connection import BrokerConnection, KafkaError
from oncelog.coordinator.internal_log import partition_for
from oncelog.protocol import api_versions as apis
from oncelog.protocol.schema import build

SPAN = "span"  # three partitions, led by brokers 1, 2, 3
COPIER = Path(__file__).resolve().parents[1] / "support" / "txn_copier.py"


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    running = TxnCluster(zookeeper, tmp_path_factory.mktemp("txnremote"), "txnremote")
    running.create(SPAN, [[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    yield running
    running.close()


@contextlib.contextmanager
def pinned_producer(cluster: TxnCluster, txn_id: str):
    """oncelog's transactional producer bootstrapped at broker 1 alone (it finds its
    coordinator, wherever it is, through broker 1)."""
    with oncelog.Producer({"bootstrap.servers": cluster.bootstrap(1),
                           "transactional.id": txn_id, "linger.ms": 5}) as producer:
        producer.init_transactions(TIMEOUT)
        yield producer


def settled(cluster: TxnCluster, topic: str, partitions: int) -> list[int]:
    """Wait until every partition's last stable offset reached its high watermark (no
    transaction open anywhere); the high watermarks."""
    bootstrap = cluster.bootstrap()

    def caught_up():
        try:
            high = end_offsets(bootstrap, topic, partitions, committed=False)
            stable = end_offsets(bootstrap, topic, partitions, committed=True)
        except KafkaException:  # a leader moving: asked again
            return None
        return high if stable == high else None

    return wait_for(caught_up, TIMEOUT, f"the last stable offsets of {topic}")


def coordinator_of(cluster: TxnCluster, txn_id: str) -> int:
    with Admin({"bootstrap.servers": cluster.bootstrap()}) as admin:
        listed = admin.list_transactions()
    return next(b for b, txns in listed.items()
                if any(t.transactional_id == txn_id for t in txns))


def txn_coordinator(cluster: TxnCluster, txn_id: str) -> tuple[int, int]:
    """(the id's __transaction_state partition, its leader: the id's coordinator), once
    FindCoordinator names one (the topic is created by the first that asks)."""
    def named():
        broker = next(b for b in cluster.brokers.values() if b.alive)
        conn = BrokerConnection("127.0.0.1", broker.port, timeout=TIMEOUT)
        try:
            found = calls.find_coordinator_result(conn.call(
                apis.FIND_COORDINATOR, calls.find_coordinator_request(txn_id, 1)))
        finally:
            conn.close()
        return found.node_id if found.error == ErrorCode.none else None

    node = wait_for(named, TIMEOUT, f"the coordinator of {txn_id}")
    p = partition_for(txn_id, len(cluster.zk.get_children(
        "/brokers/topics/__transaction_state/partitions")))
    assert cluster.state("__transaction_state", p)["leader"] == node
    return p, node


def find_hanging(cluster: TxnCluster, topic: str) -> str:
    out = run_oncelog("transactions", "find-hanging", "--topic", topic,
                      "--max-transaction-timeout", "0", "--bootstrap-server",
                      cluster.bootstrap(), timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_transactions_span_partitions_led_by_three_brokers(cluster):
    """oncelog's transactional producer, its coordinator wherever FindCoordinator says:
    each transaction writes to the partitions led by brokers 1, 2 and 3; confluent-kafka's
    read_committed reader sees the committed ones once and none of the aborted, and every
    leader's last stable offset reaches its end."""
    before = settled(cluster, SPAN, 3)
    earlier = read_committed(cluster.bootstrap(), SPAN, 3)
    expected: dict[int, list[bytes]] = {p: [] for p in range(3)}
    with pinned_producer(cluster, "span-oncelog") as own:
        for n, commit in ((0, True), (1, False), (2, True), (3, False)):
            own.begin_transaction()
            for p in range(3):
                value = b"o%d-%d" % (n, p)
                own.produce(SPAN, value=value, partition=p)
                if commit:
                    expected[p].append(value)
            if commit:
                own.commit_transaction(TIMEOUT)
            else:
                own.abort_transaction(TIMEOUT)
    assert coordinator_of(cluster, "span-oncelog") == txn_coordinator(cluster, "span-oncelog")[1]
    after = settled(cluster, SPAN, 3)
    assert all(after[p] > before[p] for p in range(3))
    found = read_committed(cluster.bootstrap(), SPAN, 3)
    assert {p: found[p][len(earlier[p]):] for p in range(3)} == expected
    assert cluster.leaders(SPAN) == [1, 2, 3]


def test_confluent_transactions_span_partitions_led_by_three_brokers(cluster):
    """confluent-kafka's transactional producer, bootstrapped at every broker (librdkafka
    asks FindCoordinator again of whichever broker it likes: each names the same leader):
    transactions over the partitions led by brokers 1, 2 and 3, committed and aborted in
    turn, are read back committed once and aborted never."""
    from confluent_kafka import Producer

    txn_id = "span-confluent"
    before = settled(cluster, SPAN, 3)
    earlier = read_committed(cluster.bootstrap(), SPAN, 3)
    expected: dict[int, list[bytes]] = {p: [] for p in range(3)}
    producer = Producer({"bootstrap.servers": cluster.bootstrap(), "transactional.id": txn_id,
                         "linger.ms": 5})
    producer.init_transactions(TIMEOUT)
    for n, commit in ((0, True), (1, False), (2, True), (3, True), (4, False)):
        producer.begin_transaction()
        for p in range(3):
            value = b"c%d-%d" % (n, p)
            producer.produce(SPAN, value=value, partition=p)
            if commit:
                expected[p].append(value)
        if commit:
            producer.commit_transaction(TIMEOUT)
        else:
            producer.abort_transaction(TIMEOUT)
    assert producer.flush(TIMEOUT) == 0
    assert coordinator_of(cluster, txn_id) == txn_coordinator(cluster, txn_id)[1]
    after = settled(cluster, SPAN, 3)
    assert all(after[p] > before[p] for p in range(3))
    found = read_committed(cluster.bootstrap(), SPAN, 3)
    assert {p: found[p][len(earlier[p]):] for p in range(3)} == expected
    assert cluster.leaders(SPAN) == [1, 2, 3]


def test_a_transaction_begun_right_after_a_commit_is_added_and_its_abort_ends_it(cluster):
    """librdkafka's abort_transaction() sends EndTxn whenever an AddPartitionsToTxn of the
    transaction went out, answered or refused (its issue #4849). An add refused
    CONCURRENT_TRANSACTIONS because the last commit's markers were still going to the
    leaders on the other brokers left an abort that met the completed commit:
    INVALID_TXN_STATE, fatal to the producer (this module's confluent test met it once).
    Now the add waits for the markers and is taken, and the abort ends the transaction it
    began. On the wire, as librdkafka does it: the add sent the moment the commit is
    answered."""
    txn_id = "begun-after-commit"
    coordinator = txn_coordinator(cluster, txn_id)[1]
    conn = BrokerConnection("127.0.0.1", cluster.brokers[coordinator].port, client_id="t",
                            timeout=TIMEOUT)
    everywhere = [(SPAN, p) for p in range(3)]  # leaders 1, 2, 3: markers to each
    try:
        error, pid, epoch = txn_wire.init_producer_id(conn, txn_id)
        assert error is ErrorCode.none
        for n in range(4):
            assert txn_wire.add_partitions(conn, txn_id, pid, epoch, everywhere) == \
                dict.fromkeys(everywhere, ErrorCode.none)
            error, epoch = txn_wire.end_txn(conn, txn_id, pid, epoch, commit=True)
            assert error is ErrorCode.none
            added = [(SPAN, n % 3)]
            assert txn_wire.add_partitions(conn, txn_id, pid, epoch, added) == \
                dict.fromkeys(added, ErrorCode.none), f"round {n}"
            error, epoch = txn_wire.end_txn(conn, txn_id, pid, epoch, commit=False)
            assert error is ErrorCode.none, f"round {n}: {error.name}"
    finally:
        conn.close()
    settled(cluster, SPAN, 3)


def test_a_transactional_write_is_verified_with_the_coordinator_on_another_broker(cluster):
    """KIP-890 part 1 across brokers: a partition's leader asks the transaction's
    coordinator (on another broker) whether the partition is in the transaction: a write to
    one added is appended, a write to one never added is refused INVALID_TXN_STATE and stores
    nothing; DescribeProducers is answered by the leader alone."""
    coordinator = txn_coordinator(cluster, "verified-remotely")[1]
    leaders = cluster.leaders(SPAN)
    added, stray = (p for p, leader in enumerate(leaders) if leader != coordinator)
    conns = {b: BrokerConnection("127.0.0.1", cluster.brokers[b].port, client_id="t",
                                 timeout=30) for b in (1, 2, 3)}
    try:
        error, pid, epoch = txn_wire.init_producer_id(conns[coordinator], "verified-remotely")
        assert error is ErrorCode.none
        assert txn_wire.add_partitions(conns[coordinator], "verified-remotely", pid, epoch,
                                       [(SPAN, added)]) == {(SPAN, added): ErrorCode.none}
        high = end_offsets(cluster.bootstrap(), SPAN, 3, committed=False)
        assert txn_wire.produce_txn(conns[leaders[stray]], "verified-remotely", SPAN, stray,
                                    pid, epoch, 0, [b"stray"]) is ErrorCode.invalid_txn_state
        assert txn_wire.produce_txn(conns[leaders[added]], "verified-remotely", SPAN, added,
                                    pid, epoch, 0, [b"added"]) is ErrorCode.none
        assert end_offsets(cluster.bootstrap(), SPAN, 3, committed=False)[stray] == high[stray]
        follower = next(b for b in (1, 2, 3) if b != leaders[added])
        assert describe_producers_error(conns[follower], SPAN, added) \
            is ErrorCode.not_leader_or_follower
        assert describe_producers_error(conns[leaders[added]], SPAN, added) is ErrorCode.none
        assert txn_wire.end_txn(conns[coordinator], "verified-remotely", pid, epoch,
                                False)[0] \
            is ErrorCode.none
    finally:
        for conn in conns.values():
            conn.close()
    settled(cluster, SPAN, 3)


def describe_producers_error(conn: BrokerConnection, topic: str, partition: int) -> ErrorCode:
    answer = conn.call(apis.DESCRIBE_PRODUCERS, lambda mod, v: build(
        mod.DescribeProducersRequest, topics=(build(mod.TopicRequest, name=topic,
                                                    partition_indexes=(partition,)),)))
    return ErrorCode(answer.topics[0].partitions[0].error_code)


def test_a_stale_coordinator_epoch_is_fenced(cluster):
    """WriteTxnMarkers to a partition's leader with a coordinator epoch older than the last
    marker it took for the producer: TRANSACTION_COORDINATOR_FENCED (producer_state's M3)."""
    with oncelog.Producer({"bootstrap.servers": cluster.bootstrap(),
                           "enable.idempotence": True}) as idempotent:
        idempotent.produce(SPAN, value=b"not in a transaction", partition=1)
        idempotent.flush(TIMEOUT)
    with Admin({"bootstrap.servers": cluster.bootstrap()}) as admin:
        producer = next(p for p in admin.describe_producers(SPAN, [1])[1]
                        if p.current_txn_start_offset < 0 and p.coordinator_epoch < 0)
        admin.abort_transaction(SPAN, 1, producer.producer_id, producer.epoch, 7)
        with pytest.raises(KafkaError) as refused:
            admin.abort_transaction(SPAN, 1, producer.producer_id, producer.epoch, 6)
        assert refused.value.error == ErrorCode.transaction_coordinator_fenced
        # a follower does not answer for the partition's producers
        assert [p.coordinator_epoch for p in admin.describe_producers(SPAN, [1])[1]
                if p.producer_id == producer.producer_id] == [7]
    # the followers replayed the marker: its new leader fences the stale epoch as well
    leader = cluster.leaders(SPAN)[1]
    cluster.kill(leader, SPAN, 1)
    try:
        # the admin follows the leadership while it moves (AdminBase._leader_call)
        with Admin({"bootstrap.servers": cluster.bootstrap()}) as admin, \
                pytest.raises(KafkaError) as refused:
            admin.abort_transaction(SPAN, 1, producer.producer_id, producer.epoch, 6)
        assert refused.value.error == ErrorCode.transaction_coordinator_fenced
    finally:  # the module's other tests need all three
        cluster.bring_back(leader, [SPAN])


def test_a_partition_deleted_before_its_marker_is_skipped(cluster):
    """A topic of the transaction deleted between its records and the commit: the
    coordinator finds no leader for it (the cluster's metadata has it no more), skips its
    marker as Kafka does, writes the others and completes the transaction."""
    cluster.create("doomed", [[2, 3, 1]])
    before = read_committed(cluster.bootstrap(), SPAN, 3)
    with pinned_producer(cluster, "doomed-txn") as producer:
        producer.begin_transaction()
        producer.produce("doomed", value=b"lost with its topic", partition=0)
        producer.produce(SPAN, value=b"kept", partition=2)
        producer.flush(TIMEOUT)
        with Admin({"bootstrap.servers": cluster.bootstrap()}) as admin:
            admin.delete_topic("doomed")
        wait_for(lambda: not cluster.zk.exists("/brokers/topics/doomed"), TIMEOUT,
                 "the topic deleted")
        producer.commit_transaction(TIMEOUT)
    with Admin({"bootstrap.servers": cluster.bootstrap(1)}) as admin:
        wait_for(lambda: admin.describe_transactions(["doomed-txn"])["doomed-txn"].state
                 == "CompleteCommit", TIMEOUT, "the transaction completed")
    settled(cluster, SPAN, 3)
    after = read_committed(cluster.bootstrap(), SPAN, 3)
    assert after[2][len(before[2]):] == [b"kept"]


def test_markers_are_retried_until_a_new_leader_takes_them(cluster):
    """The leader of one partition of a transaction is SIGKILLed after the transaction's
    records are acknowledged and before it commits: the coordinator's marker for that
    partition is retried until the controller elected a new leader, which takes it; the
    read_committed output is the committed input once, and nothing hangs."""
    before = read_committed(cluster.bootstrap(), SPAN, 3)
    with pinned_producer(cluster, "span-kill") as producer:
        producer.begin_transaction()
        for p in range(3):
            producer.produce(SPAN, value=b"k-%d" % p, partition=p)
        producer.flush(TIMEOUT)
        coordinator = txn_coordinator(cluster, "span-kill")[1]
        assert coordinator_of(cluster, "span-kill") == coordinator
        victim = next(p for p, leader in enumerate(cluster.leaders(SPAN))
                      if leader != coordinator)
        leader = cluster.leaders(SPAN)[victim]
        cluster.brokers[leader].kill()  # the marker's first attempts find no one there
        producer.commit_transaction(TIMEOUT)
    new_leader = wait_for(lambda: (lead := cluster.state(SPAN, victim)["leader"])
                          not in (leader, -1) and lead, TIMEOUT, "a new leader")
    assert new_leader != leader
    # EndTxn is answered before the markers are written: until then the new leader's high
    # watermark may stand below k-0 (it moves once its followers fetch), so "settled"
    # (last stable offset at the high watermark) can hold without the transaction in view
    with Admin({"bootstrap.servers": cluster.bootstrap()}) as admin:
        wait_for(lambda: admin.describe_transactions(["span-kill"])["span-kill"].state
                 == "CompleteCommit", TIMEOUT, "the transaction completed")
    settled(cluster, SPAN, 3)
    after = read_committed(cluster.bootstrap(), SPAN, 3)
    assert {p: after[p][len(before[p]):] for p in range(3)} == \
        {p: [b"k-%d" % p] for p in range(3)}
    assert find_hanging(cluster, SPAN).strip().count("\n") == 0  # the header only
    cluster.bring_back(leader, [SPAN])


@pytest.mark.parametrize("client", ["oncelog", "confluent"])
def test_copier_exactly_once_through_hard_bounces(cluster, tmp_path, client):
    """Kafka's transactions system test: a copier (``client``) copies an input topic to an
    output topic in transactions with its consumer offsets (send_offsets_to_transaction)
    while the leader of an output partition, then the transaction coordinator's broker, are
    hard-bounced (SIGKILL, then started again), and then the copier itself is SIGKILLed and
    started again; the read_committed output is the input once and in order per partition,
    and no transaction is left hanging."""
    records = 150  # per partition
    source, target = f"bounce-in-{client}", f"bounce-out-{client}"
    group, txn_id = f"bounce-group-{client}", f"bounce-txn-{client}"
    cluster.create(source, [[1, 2, 3], [1, 3, 2]])
    cluster.create(target, [[2, 1, 3], [3, 1, 2]])
    with oncelog.Producer({"bootstrap.servers": cluster.bootstrap()}) as plain:
        for i in range(records):
            for p in range(2):
                plain.produce(source, value=b"%d-%05d" % (p, i), partition=p)
        plain.flush(TIMEOUT)
    gate = tmp_path / "gate"

    def open_gate(limit: int) -> None:
        tmp = tmp_path / "gate.tmp"
        tmp.write_text(str(limit))
        tmp.rename(gate)

    copier_log = open(tmp_path / "copier.log", "wb")
    bootstrap = cluster.bootstrap()  # all three: each comes back on its own port

    def start_copier() -> subprocess.Popen:
        # -X faulthandler: a loaded run's copier died of SIGSEGV, its log empty
        return subprocess.Popen(
            [sys.executable, "-X", "faulthandler", str(COPIER), client, bootstrap, source,
             target, group, txn_id, f"{records},{records}", str(gate)],
            stdout=copier_log, stderr=copier_log)

    open_gate(records // 2)
    copier = start_copier()
    deadline = time.monotonic() + 150

    def step(done) -> None:
        """Restart the copier when it stopped for an abortable error; until ``done``."""
        nonlocal copier
        while not done():
            assert time.monotonic() < deadline, (tmp_path / "copier.log").read_text()
            code = copier.poll()
            if code == 3:
                copier = start_copier()
            else:
                assert code is None, f"the copier exited {code}"
            time.sleep(0.05)

    def committed_sum() -> int:
        with Admin({"bootstrap.servers": cluster.bootstrap()}) as admin:
            try:
                offsets = admin.list_group_offsets(group)
            except KafkaError:
                return 0
        return sum(max(0, o.offset) for o in offsets.values())

    step(lambda: committed_sum() >= records // 2)
    # Each fault lands as the copier starts its next transactions (the gate just opened).
    open_gate(records)
    output_leader = cluster.leaders(target)[0]
    cluster.kill(output_leader, target, 0)
    cluster.bring_back(output_leader, [target])
    step(lambda: committed_sum() >= records)
    open_gate(3 * records // 2)
    state_partition, coordinator = txn_coordinator(cluster, txn_id)
    cluster.kill(coordinator, "__transaction_state", state_partition)
    cluster.bring_back(coordinator, [target, "__transaction_state"])
    step(lambda: committed_sum() >= 3 * records // 2)
    open_gate(10 * records)
    time.sleep(0.2)  # into its next transactions
    copier.kill()
    copier.wait(TIMEOUT)
    copier = start_copier()
    step(lambda: copier.poll() is not None)
    assert copier.wait(TIMEOUT) == 0, (tmp_path / "copier.log").read_text()
    settled(cluster, target, 2)
    out = read_committed(cluster.bootstrap(), target, 2)
    assert out == {p: [b"copied:%d-%05d" % (p, i) for i in range(records)] for p in range(2)}
    assert find_hanging(cluster, target).strip().count("\n") == 0  # the header only


def test_write_txn_markers_from_a_client_is_refused_under_an_authorizer(zookeeper,
                                                                       start_broker):
    """WriteTxnMarkers is a broker's request: on a cluster with an authorizer, a client
    without ClusterAction gets CLUSTER_AUTHORIZATION_FAILED for every partition, and the
    partition's producers are left as they were."""
    broker = start_broker(**{"broker.id": "1", "zookeeper.connect":
                             zookeeper.chroot("txnremote-acl"),
                             "authorizer.class.name": AUTHORIZER})

    def make(mod, version):
        return build(mod.WriteTxnMarkersRequest, markers=(build(
            mod.WritableTxnMarker, producer_id=1, producer_epoch=0, transaction_result=False,
            coordinator_epoch=0, transaction_version=0,
            topics=(build(mod.WritableTxnMarkerTopic, name="t", partition_indexes=(0, 1)),)),))

    conn = BrokerConnection("127.0.0.1", broker.port, client_id="not-a-broker", timeout=30)
    try:
        answer = conn.call(apis.WRITE_TXN_MARKERS, make)
    finally:
        conn.close()
    assert [(t.name, p.partition_index, p.error_code) for m in answer.markers
            for t in m.topics for p in t.partitions] == [
        ("t", 0, ErrorCode.cluster_authorization_failed),
        ("t", 1, ErrorCode.cluster_authorization_failed)]


def test_add_offsets_to_txn_creates_the_offsets_topic(zookeeper, start_broker):
    """AddOffsetsToTxn on a cluster where no group's coordinator was ever asked for:
    ``__consumer_offsets`` does not exist yet, and the request creates it (as Kafka's
    coordinator needs no FindCoordinator first): answered NONE once the topic is there,
    COORDINATOR_NOT_AVAILABLE (retriable) only while it is being created."""
    broker = start_broker(**{"broker.id": "1", "zookeeper.connect":
                             zookeeper.chroot("txninteg-offsets"),
                             "zookeeper.session.timeout.ms": "2000",
                             "offsets.topic.num.partitions": "1",
                             "transaction.state.log.num.partitions": "1"})
    conn = BrokerConnection("127.0.0.1", broker.port, client_id="t", timeout=TIMEOUT)
    try:
        def found():
            answer = calls.find_coordinator_result(conn.call(
                apis.FIND_COORDINATOR, calls.find_coordinator_request("adds-offsets", 1)))
            return answer.error == ErrorCode.none

        wait_for(found, TIMEOUT, "a transaction coordinator")
        _, pid, epoch = wait_for(
            lambda: (got := txn_wire.init_producer_id(conn, "adds-offsets"))[0]
            is ErrorCode.none and got, TIMEOUT, "a producer id")
        answers = []

        def added():
            answers.append(txn_wire.add_offsets(conn, "adds-offsets", pid, epoch, "g"))
            return answers[-1] is ErrorCode.none

        wait_for(added, TIMEOUT, "AddOffsetsToTxn taken")
        assert set(answers) <= {ErrorCode.none, ErrorCode.coordinator_not_available}
        assert txn_wire.end_txn(conn, "adds-offsets", pid, epoch, False)[0] is ErrorCode.none
    finally:
        conn.close()


def test_a_produce_naming_two_transactional_producers_is_refused_unasked(cluster):
    """KIP-890 part 1 verifies one producer per produce request: as Kafka, transactional
    batches of more than one (producer id, epoch) in one produce are refused
    INVALID_PRODUCER_ID_MAPPING, the coordinator not asked. Before, each producer named was
    asked of the coordinator in turn, so a produce naming a thousand producers waited for a
    thousand round trips (each up to request.timeout.ms while the coordinator is away), and
    a batch of the transaction's own producer beside a stray one was appended."""
    coordinator = txn_coordinator(cluster, "two-producers")[1]
    leader = next(b for b in (1, 2, 3) if b != coordinator)
    others = [b for b in (1, 2, 3) if b != leader]
    cluster.create("twopids", [[leader, *others], [leader, *others]])
    conns = {b: BrokerConnection("127.0.0.1", cluster.brokers[b].port, client_id="t",
                                 timeout=30) for b in (coordinator, leader)}
    try:
        error, pid, epoch = txn_wire.init_producer_id(conns[coordinator], "two-producers")
        assert error is ErrorCode.none
        both = [("twopids", 0), ("twopids", 1)]
        assert txn_wire.add_partitions(conns[coordinator], "two-producers", pid, epoch,
                                       both) == dict.fromkeys(both, ErrorCode.none)
        # another transactional id's producer, issued as well
        error, stray, stray_epoch = txn_wire.init_producer_id(conns[leader], "two-producers-b")
        assert error in (ErrorCode.none, ErrorCode.not_coordinator)
        if error is ErrorCode.not_coordinator:
            stray_at = txn_coordinator(cluster, "two-producers-b")[1]
            with contextlib.closing(BrokerConnection(
                    "127.0.0.1", cluster.brokers[stray_at].port, timeout=30)) as conn:
                error, stray, stray_epoch = txn_wire.init_producer_id(conn, "two-producers-b")
        assert error is ErrorCode.none
        not_yet = {ErrorCode.unknown_topic_or_partition, ErrorCode.not_leader_or_follower}
        answers = wait_for(  # until the leader acts on its new partitions
            lambda: not_yet.isdisjoint((got := txn_wire.produce_txn_batches(
                conns[leader], "two-producers", "twopids",
                {0: (pid, epoch), 1: (stray, stray_epoch)})).values()) and got,
            TIMEOUT, "the leader of twopids")
        assert answers == {0: ErrorCode.invalid_producer_id_mapping,
                           1: ErrorCode.invalid_producer_id_mapping}
        assert end_offsets(cluster.bootstrap(), "twopids", 2, committed=False) == [0, 0]
        assert txn_wire.end_txn(conns[coordinator], "two-producers", pid, epoch,
                                False)[0] is ErrorCode.none
    finally:
        for conn in conns.values():
            conn.close()


def test_every_marker_of_a_write_txn_markers_is_written_at_once(cluster):
    """WriteTxnMarkers of two markers, the first to a partition whose follower was just
    killed (in its ISR until its ZooKeeper session expires: the marker's acks=all waits),
    the second to a partition whose ISR is alive: the second is appended and replicated
    while the first still waits, as Kafka appends every marker of a request before waiting.
    Before, each marker was appended only once the one before it was replicated, so a
    request of K markers could wait K times the markers' timeout."""
    leader, follower, other = 1, 2, 3
    cluster.create("markerwait", [[leader, follower], [leader, other]])
    marking = BrokerConnection("127.0.0.1", cluster.brokers[leader].port, timeout=TIMEOUT)
    polling = BrokerConnection("127.0.0.1", cluster.brokers[leader].port, timeout=TIMEOUT)
    try:
        before = wait_for(lambda: txn_wire.high_watermarks(polling, "markerwait", 2),
                          TIMEOUT, "the leader of markerwait")
        cluster.brokers[follower].kill()
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(txn_wire.write_markers, marking, [
                (4242, 0, False, 0, [("markerwait", 0)]),
                (4243, 0, False, 0, [("markerwait", 1)])])
            moved = wait_for(lambda: (now := txn_wire.high_watermarks(
                polling, "markerwait", 2)) is not None and now[1] > before[1] and now,
                TIMEOUT, "the second marker replicated")
            assert moved[0] == before[0], "the first marker stopped waiting first"
            assert answer.result(TIMEOUT) == [[ErrorCode.none], [ErrorCode.none]]
    finally:
        marking.close()
        polling.close()
    cluster.bring_back(follower, ["markerwait"])
