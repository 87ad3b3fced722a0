"""Issue 25: brokers reach each other on ``inter.broker.listener.name`` with its security.

A cluster whose only listener, for clients and brokers alike, is SASL_SSL (mutual TLS
required, SCRAM-SHA-512) behind an authorizer: followers fetch from their leaders over it as
User:broker (a super user: ClusterAction), so acks=all produces and reads back. Broker 3 has
the wrong password in its JAAS line: it replicates nothing (the ISR of every partition it
follows shrinks without it), says so in its log, and still leads its own partition, which the
other two replicate. A two-broker cluster on SSL alone replicates with each broker's
certificate as its principal. Kafka's start-up rules for the inter-broker settings are config
errors.
"""

from __future__ import annotations

import concurrent.futures
import re
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support.acl_wire import AUTHORIZER
from support.brokers import BrokerProcess
from support.certs import CertificateAuthority
from support.waits import wait_for

from oncelog.broker.config import BrokerConfig, ConfigError
from oncelog.broker.inter_broker_connect import inter_broker_security
from oncelog.metadata.zookeeper import ZooKeeperStore
from oncelog.security.acl_store import AclStore
from oncelog.security.acls import (
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from oncelog.security.credentials import ScramCredentials
from oncelog.security.scram import make_credential

TIMEOUT = 30.0
MECHANISM = "SCRAM-SHA-512"
PASSWORDS = {"broker": "broker-secret", "alice": "alice-secret"}
TOPIC = "ib-t"
JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
        'username="broker" password="{}";')


def _seed(connect: str) -> None:
    """As an operator prepares the cluster: the users' SCRAM credentials and alice's ACLs in
    ZooKeeper before any broker starts."""
    store = ZooKeeperStore(connect, 10_000)
    try:
        credentials = ScramCredentials(store)
        for user, password in PASSWORDS.items():
            credentials.put(user, MECHANISM, make_credential(MECHANISM, password.encode()))
        AclStore(store).create([AclBinding(
            ResourcePattern(kind, "ib-", PatternType.PREFIXED),
            AccessControlEntry("User:alice", "*", AclOperation.ALL, AclPermissionType.ALLOW))
            for kind in (ResourceType.TOPIC, ResourceType.GROUP)])
    finally:
        store.close()


def _client(bootstrap: str, ca: CertificateAuthority, cert, **extra) -> dict:
    return {"bootstrap.servers": bootstrap, "security.protocol": "sasl_ssl",
            "ssl.ca.location": str(ca.pem), "ssl.certificate.location": str(cert.cert),
            "ssl.key.location": str(cert.key), "sasl.mechanism": MECHANISM,
            "sasl.username": "alice", "sasl.password": PASSWORDS["alice"], **extra}


def test_replication_over_sasl_ssl_and_a_follower_refused(zookeeper, tmp_path: Path):
    connect = zookeeper.chroot("inter-broker")
    _seed(connect)
    ca = CertificateAuthority(tmp_path / "ca")
    server = ca.issue("broker", "localhost", server=True)
    client = ca.issue("alice", "alice")
    common = {
        "zookeeper.connect": connect, "zookeeper.session.timeout.ms": "4000",
        "listeners": "SASL_SSL://127.0.0.1:0", "inter.broker.listener.name": "SASL_SSL",
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        "ssl.keystore.location": str(server.both), "ssl.truststore.location": str(ca.pem),
        "listener.name.sasl_ssl.ssl.client.auth": "required",
        "authorizer.class.name": AUTHORIZER, "super.users": "User:broker",
        "replica.lag.time.max.ms": "1500", "replica.fetch.wait.max.ms": "200",
        "replica.fetch.backoff.ms": "100", "min.insync.replicas": "2",
        "connection.failed.authentication.delay.ms": "10",
        "num.partitions": "1", "group.initial.rebalance.delay.ms": "0"}
    brokers = {i: BrokerProcess(tmp_path / f"broker{i}", {
        **common, "broker.id": str(i),
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
            JAAS.format(PASSWORDS["broker"] if i != 3 else "not-the-password")})
        for i in (1, 2, 3)}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        list(pool.map(BrokerProcess.start, brokers.values()))
    try:
        bootstrap = ",".join(b.bootstrap for b in brokers.values())
        admin = AdminClient(_client(bootstrap, ca, client))
        admin.create_topics([NewTopic(TOPIC, 3, 3)])[TOPIC].result(TIMEOUT)
        # idempotent: a retry under load is not a second copy (Write on a topic allows it)
        producer = Producer(_client(bootstrap, ca, client, acks="all",
                                    **{"message.timeout.ms": "30000",
                                       "enable.idempotence": True}))
        failed = []
        for i in range(30):
            producer.produce(TOPIC, f"v{i}".encode(), partition=i % 3,
                             on_delivery=lambda err, _m: err and failed.append(err))
        assert producer.flush(TIMEOUT) == 0 and not failed, failed

        consumer = Consumer(_client(bootstrap, ca, client, **{"group.id": "ib-g",
                                                              "enable.auto.commit": False}))
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(3)])
        values: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT
        while len(set(values)) < 30 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
        consumer.close()
        assert sorted(values) == sorted(f"v{i}".encode() for i in range(30))

        def partitions():
            return admin.list_topics(TOPIC, timeout=TIMEOUT).topics[TOPIC].partitions.values()

        led_elsewhere = [p.id for p in partitions() if p.leader != 3]
        assert led_elsewhere, "placement gave broker 3 every partition"
        wait_for(lambda: all(3 not in p.isrs for p in partitions() if p.leader != 3),
                 TIMEOUT, "broker 3 leaves the ISR of the partitions it follows")
        for p in partitions():  # replicated over SASL_SSL by the brokers that may
            assert {1, 2} <= set(p.isrs), (p.id, p.leader, p.isrs)
        refused = "authenticating to broker"
        assert refused in brokers[3].log_text()
        assert "SASL_AUTHENTICATION_FAILED" in brokers[3].log_text()
        assert refused not in brokers[1].log_text() + brokers[2].log_text()
    finally:
        for broker in brokers.values():
            if broker.alive:
                assert broker.stop() == 0, broker.log_text()
            assert "Traceback" not in broker.log_text(), broker.log_text()


def test_replication_over_mutual_tls(zookeeper, tmp_path: Path):
    """security.inter.broker.protocol=SSL: each broker's keystore is its client certificate,
    its principal (the certificate's subject) a super user; a client with a certificate of
    its own and an ACL produces acks=all to a topic both brokers hold."""
    connect = zookeeper.chroot("inter-broker-tls")
    store = ZooKeeperStore(connect, 10_000)
    try:
        AclStore(store).create([AclBinding(
            ResourcePattern(ResourceType.TOPIC, "ib-", PatternType.PREFIXED),
            AccessControlEntry("User:CN=alice,O=oncelog,C=FR", "*", AclOperation.ALL,
                               AclPermissionType.ALLOW))])
    finally:
        store.close()
    ca = CertificateAuthority(tmp_path / "ca")
    server = ca.issue("broker", "localhost", server=True)
    client = ca.issue("alice", "alice")
    brokers = {i: BrokerProcess(tmp_path / f"broker{i}", {
        "broker.id": str(i), "zookeeper.connect": connect,
        "zookeeper.session.timeout.ms": "4000", "listeners": "SSL://127.0.0.1:0",
        "security.inter.broker.protocol": "SSL",
        "ssl.keystore.location": str(server.both), "ssl.truststore.location": str(ca.pem),
        "ssl.client.auth": "required", "authorizer.class.name": AUTHORIZER,
        "super.users": "User:CN=localhost,O=oncelog,C=FR", "min.insync.replicas": "2",
        "replica.fetch.wait.max.ms": "200", "replica.fetch.backoff.ms": "100"})
        for i in (1, 2)}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(BrokerProcess.start, brokers.values()))
    try:
        conf = {"bootstrap.servers": ",".join(b.bootstrap for b in brokers.values()),
                "security.protocol": "ssl", "ssl.ca.location": str(ca.pem),
                "ssl.certificate.location": str(client.cert),
                "ssl.key.location": str(client.key)}
        admin = AdminClient(conf)
        admin.create_topics([NewTopic("ib-tls", 1, 2)])["ib-tls"].result(TIMEOUT)
        producer = Producer({**conf, "acks": "all", "message.timeout.ms": "30000"})
        failed = []
        for i in range(10):
            producer.produce("ib-tls", f"v{i}".encode(),
                             on_delivery=lambda err, _m: err and failed.append(err))
        assert producer.flush(TIMEOUT) == 0 and not failed, failed
        (partition,) = admin.list_topics("ib-tls", timeout=TIMEOUT).topics["ib-tls"] \
            .partitions.values()
        assert sorted(partition.isrs) == [1, 2]
    finally:
        for broker in brokers.values():
            if broker.alive:
                assert broker.stop() == 0, broker.log_text()
            assert "Traceback" not in broker.log_text(), broker.log_text()


@pytest.mark.parametrize(("settings", "message"), [
    ({"inter.broker.listener.name": "SASL_PLAINTEXT", "security.inter.broker.protocol": "SSL"},
     "Only one of inter.broker.listener.name and security.inter.broker.protocol"),
    ({"inter.broker.listener.name": "INTERNAL"},
     "INTERNAL must be a listener name defined in advertised.listeners"),
    ({"zookeeper.connect": "127.0.0.1:1"},  # the default PLAINTEXT, in cluster mode
     "PLAINTEXT must be a listener name defined in advertised.listeners"),
    ({"security.inter.broker.protocol": "TLS"}, "expected one of"),
])
def test_which_inter_broker_listener_is_a_start_up_rule(settings, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        BrokerConfig({"listeners": "SASL_PLAINTEXT://127.0.0.1:0", **settings})


def test_the_inter_broker_sasl_settings_are_checked_at_start():
    base = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0",
            "security.inter.broker.protocol": "SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN"}
    with pytest.raises(ConfigError, match=re.escape("GSSAPI must be included in sasl.enabled")):
        inter_broker_security(BrokerConfig(base))  # Kafka's default mechanism
    with pytest.raises(ConfigError, match=re.escape("name.sasl_plaintext.plain.sasl.jaas")):
        inter_broker_security(BrokerConfig(
            {**base, "sasl.mechanism.inter.broker.protocol": "PLAIN"}))
    found = inter_broker_security(BrokerConfig({
        **base, "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config":
            'org.apache.kafka.common.security.plain.PlainLoginModule required '
            'username="b" password="p" user_b="p";'}))
    assert (found.listener, found.mechanism, found.username, found.password) == \
        ("SASL_PLAINTEXT", "PLAIN", "b", "p")
    assert found.ssl_context is None
