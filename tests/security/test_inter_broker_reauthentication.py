"""KIP-368 between brokers: with ``inter.broker.listener.name`` a SASL listener whose sessions
end (``connections.max.reauth.ms``), each broker's connections to the other (its replica
fetcher's, its inter-broker channel's carrying WriteTxnMarkers and KIP-890 verification)
re-authenticate before their sessions end (security/sasl_reauth_client.py, as oncelog's
clients): across three lifetimes a transactional producer commits transactions spanning the
two brokers' partitions (acks=all, min.insync.replicas=2: each record waits for the other
broker's fetch), no connection between the brokers is closed or opened again, and every
committed record is read back once.
"""

from __future__ import annotations

import concurrent.futures
import random
import re
import time
from pathlib import Path

from support.brokers import BrokerProcess
from support.waits import wait_for

import oncelog
from oncelog.metadata.zookeeper import ZooKeeperStore
from oncelog.security.credentials import ScramCredentials
from oncelog.security.scram import make_credential

TIMEOUT = 30.0
MECHANISM = "SCRAM-SHA-256"
LIFETIME_MS = 1500
TOPIC = "ib-reauth"
JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
        'username="broker" password="broker-secret";')


def _established(remote_port: int) -> set[int]:
    """Local ports of the open TCP connections to ``remote_port`` (Linux's /proc/net/tcp)."""
    ports = set()
    with open("/proc/net/tcp") as table:
        for line in list(table)[1:]:
            local, remote, state = line.split()[1:4]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == remote_port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def _sessions(broker: BrokerProcess) -> tuple[dict[int, int], list[str]]:
    """The other broker's connections to this one on INTERNAL: re-authentications by port
    (one entry per first authentication), and the lines closing one for an ended session."""
    text = broker.log_text()
    again: dict[int, int] = {}
    for port, re_ in re.findall(r"127\.0\.0\.1:(\d+): (re-)?authenticated as User:broker "
                                r"with SCRAM-SHA-256 on listener INTERNAL", text):
        again[int(port)] = again.get(int(port), 0) + (1 if re_ else 0)
    assert all(text.count(f"127.0.0.1:{p}: authenticated as") == 1 for p in again)
    return again, re.findall(r".*the session of User:broker ended.*", text)


def test_replication_and_markers_go_on_across_three_lifetimes(zookeeper, tmp_path: Path):
    connect = zookeeper.chroot("ib-reauth")
    store = ZooKeeperStore(connect, 10_000)
    try:
        ScramCredentials(store).put("broker", MECHANISM,
                                    make_credential(MECHANISM, b"broker-secret"))
    finally:
        store.close()
    brokers = {i: BrokerProcess(tmp_path / f"b{i}", {
        "broker.id": str(i), "zookeeper.connect": connect,
        "zookeeper.session.timeout.ms": "4000",
        "listeners": "PLAINTEXT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:SASL_PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        "listener.name.internal.scram-sha-256.sasl.jaas.config": JAAS,
        "listener.name.internal.connections.max.reauth.ms": str(LIFETIME_MS),
        "replica.fetch.wait.max.ms": "200", "replica.lag.time.max.ms": "10000",
        "min.insync.replicas": "2", "default.replication.factor": "2",
        "offsets.topic.num.partitions": "1", "offsets.topic.replication.factor": "2",
        "transaction.state.log.num.partitions": "1",
        "transaction.state.log.replication.factor": "2",
        "transaction.state.log.min.isr": "2"})
        for i in (1, 2)}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(BrokerProcess.start, brokers.values()))
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    try:
        with oncelog.Admin({"bootstrap.servers": bootstrap}) as admin:
            admin.create_topic(TOPIC, assignments={0: [1, 2], 1: [2, 1]})
        producer = oncelog.Producer({"bootstrap.servers": bootstrap, "transactional.id": "ib",
                                     "linger.ms": 5})
        committed: list[bytes] = []
        try:
            producer.init_transactions(TIMEOUT)
            deadline = time.monotonic() + TIMEOUT

            def three_lifetimes() -> bool:
                counts = [max(_sessions(b)[0].values(), default=0) for b in brokers.values()]
                return min(counts) >= 3

            # bounded: until a connection to each broker re-authenticated three times
            while not three_lifetimes():
                assert time.monotonic() < deadline, [_sessions(b) for b in brokers.values()]
                producer.begin_transaction()
                values = [b"t%d-%d" % (len(committed), p) for p in (0, 1)]
                for p, value in enumerate(values):  # one partition led by each broker
                    producer.produce(TOPIC, value, partition=p)
                producer.commit_transaction(TIMEOUT)
                committed += values
                time.sleep(0.05)
            ports = {i: _established(b.ports["INTERNAL"]) for i, b in brokers.items()}
        finally:
            producer.close()
        for i, broker in brokers.items():
            again, ended = _sessions(broker)
            assert ended == []
            # none closed and opened again: every one ever authenticated is open still
            assert set(again) <= ports[i], (i, again, ports[i])
            # the other's fetcher and its channel (markers or verification) both did
            assert sum(1 for n in again.values() if n) >= 2, (i, again)
        with oncelog.Consumer({"bootstrap.servers": bootstrap, "group.id": "ib-check",
                               "isolation.level": "read_committed",
                               "auto.offset.reset": "earliest"}) as consumer:
            consumer.assign([oncelog.TopicPartition(TOPIC, p) for p in (0, 1)])
            got: list[bytes] = []
            wait_for(lambda: got.extend(r.value for r in consumer.poll(0.2)) or
                     len(got) >= len(committed), TIMEOUT, "the committed records")
        assert sorted(got) == sorted(committed)
    finally:
        for broker in brokers.values():
            if broker.alive:
                assert broker.stop() == 0, broker.log_text()[-3000:]
            assert "Traceback" not in broker.log_text(), broker.log_text()[-3000:]


class _AtOnce(random.Random):
    """Draws every point at the start of its exchange: as if each exchange took longer
    than the window (the point has passed when it ends)."""

    def uniform(self, a, b):
        return 0.0


def test_a_call_waits_for_one_exchange_then_goes_out(secured):
    """Row C5 (a): a call past the point waits for its re-authentication, then goes out
    although the drawn point has passed too, and so does a call right after it: the point
    is never within the broker's gap after an exchange (before: the second call began
    another exchange, which the broker refuses within a second, R2, closing the
    connection)."""
    import asyncio

    from support.secured import USERS

    from oncelog.broker import inter_broker
    from oncelog.broker.inter_broker_connect import _authenticate
    from oncelog.protocol import api_versions as apis
    from oncelog.protocol.schema import build, request_module
    from oncelog.security.sasl_reauth_client import Reauthentication

    async def run():
        reader, writer = await asyncio.open_connection("127.0.0.1",
                                                       secured.broker.ports["SHORT"])
        reauth = Reauthentication("PLAIN", "alice", USERS["alice"], _AtOnce())
        await _authenticate(reader, writer, reauth, "broker-9")
        conn = inter_broker.BrokerConnection(reader, writer, "broker-9", TIMEOUT, reauth)
        mod = request_module(apis.METADATA, 9)
        body = build(mod.MetadataRequest, topics=(), allow_auto_topic_creation=False,
                     include_topic_authorized_operations=False,
                     include_cluster_authorized_operations=False)
        try:
            await asyncio.sleep(max(0.0, reauth.due_at - time.monotonic()))  # the point
            first = await conn.call(apis.METADATA, 9, body)
            second = await conn.call(apis.METADATA, 9, body)
            return first, second, reauth.count, conn.closed
        finally:
            conn.close()

    first, second, count, closed = asyncio.run(run())
    assert first.brokers and second.brokers and count == 1 and not closed
