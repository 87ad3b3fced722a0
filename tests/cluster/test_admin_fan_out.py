"""oncelog.Admin's calls to every broker (ListTransactions, ListGroups, DescribeLogDirs:
AdminBase._each_broker) answer only once every broker the cluster's metadata names has
answered: a broker SIGKILLed stays named until its ZooKeeper session expires, and its
connection is refused meanwhile. Kafka's Admin fails such a call for that broker and retries
a retriable error with fresh metadata within its timeout; a listing that left the dead
broker out instead would miss what it held, and the Spark sink's recovery would take an
open transaction of the dead coordinator for absent (never ended). Here the broker killed is
the coordinator of an open transaction: after the kill the listing names that transaction
again, held by the coordinator elected after it (each partition of __transaction_state led
by a broker that answered).

Before: every call made right after the kill raised NETWORK_EXCEPTION (connection refused
by the dead broker still named)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from support.three_brokers import TIMEOUT
from support.txn_cluster import TxnCluster
from support.waits import wait_for

from oncelog import Admin, Producer
from oncelog.client.network.connection import KafkaError

STATE = "__transaction_state"
# Longer than the harness's 2 s: the calls made right after the kill find the dead broker
# still named, even on a loaded machine.
SESSION_MS = 6000
SHORT_TIMEOUT_MS = 300
TXN = "fan-out-txn"
GROUP = "fan-out-group"
TOPIC = "fan-out"


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    running = TxnCluster(zookeeper, tmp_path_factory.mktemp("fanout"), "fanout",
                         **{"zookeeper.session.timeout.ms": str(SESSION_MS),
                            "transaction.state.log.num.partitions": "1",
                            "offsets.topic.num.partitions": "1"})
    yield running
    running.close()


def _admin(bootstrap: str, timeout_ms: float = TIMEOUT * 1000) -> Admin:
    return Admin({"bootstrap.servers": bootstrap, "request.timeout.ms": str(int(timeout_ms))})


def _listed(listing: dict) -> dict[str, tuple[int, str]]:
    return {t.transactional_id: (t.coordinator_id, t.state)
            for found in listing.values() for t in found}


def test_every_broker_calls_wait_until_a_dead_broker_is_no_longer_named(cluster):
    with _admin(cluster.bootstrap()) as admin:
        victim = admin.find_transaction_coordinator(TXN).node_id  # (creates the topic)
    survivors = sorted(b for b in (1, 2, 3) if b != victim)
    cluster.create(TOPIC, [[*survivors, victim]])
    producer = Producer({"bootstrap.servers": cluster.bootstrap(), "transactional.id": TXN,
                         "transaction.timeout.ms": "600000"})
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(TOPIC, b"open", None, 0)
        producer.flush()  # the transaction is Ongoing at the victim, and stays open
        # Metadata from a survivor: it names the victim until the victim's session expires
        bootstrap = cluster.brokers[survivors[0]].bootstrap
        with _admin(bootstrap) as admin:
            admin.alter_group_offsets(GROUP, {(TOPIC, 0): 1})
            assert _listed(admin.list_transactions()) == {TXN: (victim, "Ongoing")}
            assert GROUP in {g.group_id for g in admin.list_groups()}

        cluster.brokers[victim].kill()
        # Shorter than the session: the dead broker named throughout, the retriable error
        with _admin(bootstrap, SHORT_TIMEOUT_MS) as admin:
            with pytest.raises(KafkaError) as raised:
                admin.list_transactions()
            assert raised.value.is_retriable(), raised.value

        def call(what):
            with _admin(bootstrap) as admin:
                return what(admin)

        with ThreadPoolExecutor(3) as calls:  # each made at once, the victim still named
            txns, groups, dirs = calls.map(call, (
                lambda a: a.list_transactions(), lambda a: a.list_groups(),
                lambda a: a.describe_log_dirs()))
        assert sorted(txns) == survivors and sorted(dirs) == survivors
        listed = _listed(txns)
        assert list(listed) == [TXN] and listed[TXN][1] == "Ongoing", listed
        assert listed[TXN][0] in survivors
        assert GROUP in {g.group_id for g in groups}
        assert wait_for(lambda: cluster.state(STATE, 0)["leader"], TIMEOUT,
                        "the state log's leader") == listed[TXN][0]
    finally:
        producer.close(0)
