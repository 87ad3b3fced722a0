"""A broker with every kind of listener, for the security tests: SASL_SSL (SCRAM-SHA-512,
SCRAM-SHA-256, PLAIN), SSL with mutual TLS required, SASL_PLAINTEXT (SCRAM, for the tests
that speak the protocol by hand), PLAINTEXT, and REAUTH, a SASL_PLAINTEXT listener whose
sessions end (KIP-368: REAUTH_MS per mechanism), SHORT and SHORT_SSL, SASL_PLAINTEXT and
SASL_SSL whose sessions of every mechanism last SHORT_MS (for the clients that re-authenticate);
certificates made by the test; the first users
added with ``oncelog users add --data-dir`` before the broker starts, as an operator would."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from oncelog.broker.server import METADATA_DIR
from oncelog.metadata.store import LocalFileStore
from oncelog.security.credentials import ScramCredentials
from oncelog.security.scram import make_credential
from support.brokers import BrokerProcess
from support.certs import CertificateAuthority, Pem

USERS = {"alice": "alice-secret", "bob": "bob-secret"}
MECHANISMS = "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN"
# connections.max.reauth.ms on the REAUTH listener: librdkafka's SCRAM-SHA-512 re-authenticates
# every 90% of it; PLAIN's ends before a test's next request; SCRAM-SHA-256's outlasts a test.
REAUTH_MS = {"SCRAM-SHA-512": 2000, "PLAIN": 300, "SCRAM-SHA-256": 60_000}
PROTOCOLS = {"REAUTH": "SASL_PLAINTEXT", "SHORT": "SASL_PLAINTEXT", "SHORT_SSL": "SASL_SSL"}
SHORT_MS = 1500  # re-authenticated at 85-95% of it: more than the broker's second apart
CLIENT_DN = "CN=carol,OU=test,O=oncelog,C=FR"  # the client certificate's, as Kafka writes it


@dataclass
class Secured:
    broker: BrokerProcess
    ca: CertificateAuthority
    client: Pem  # signed by the CA: mutual TLS as User:<CLIENT_DN>
    stranger: Pem  # signed by a CA the broker does not trust

    def bootstrap(self, listener: str) -> str:
        return self.broker.bootstrap_for(listener)

    def librdkafka(self, listener: str, user: str = "alice", mechanism: str = "SCRAM-SHA-512",
                   password: str | None = None) -> dict[str, str]:
        """librdkafka's settings (confluent-kafka, kcat, oncelog's clients) for ``listener``."""
        protocol = PROTOCOLS.get(listener, listener)
        conf = {"bootstrap.servers": self.bootstrap(listener),
                "security.protocol": protocol.lower()}
        if protocol.endswith("SSL"):
            conf["ssl.ca.location"] = str(self.ca.pem)
        if protocol.startswith("SASL"):
            conf.update({"sasl.mechanism": mechanism, "sasl.username": user,
                         "sasl.password": USERS[user] if password is None else password})
        if listener == "SSL":
            conf.update({"ssl.certificate.location": str(self.client.cert),
                         "ssl.key.location": str(self.client.key)})
        return conf


def add_user(data_dir: Path, user: str, password: str) -> None:
    """``oncelog users add USER --data-dir DIR``, in this process (no second of imports)."""
    from oncelog.cli.main import main

    assert main(["users", "add", user, "--password", password,
                 "--data-dir", str(data_dir)]) == 0


def start_secured(directory: Path) -> Secured:
    ca = CertificateAuthority(directory / "ca")
    server = ca.issue("broker", "localhost", server=True)
    client = ca.issue("carol", "carol", unit="test")
    stranger = CertificateAuthority(directory / "other-ca", "stranger CA").issue(
        "stranger", "carol", unit="test")
    data = directory / "data"
    first, *others = USERS.items()
    add_user(data, *first)  # as an operator does, before any broker runs
    store = ScramCredentials(LocalFileStore(str(data / METADATA_DIR)))
    for user, password in others:  # the same, without a process each
        for mechanism in MECHANISMS.split(",")[:2]:
            store.put(user, mechanism, make_credential(mechanism, password.encode()))
    broker = BrokerProcess(data, {
        "listeners": "SASL_SSL://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,"
                     "PLAINTEXT://127.0.0.1:0,REAUTH://127.0.0.1:0,SHORT://127.0.0.1:0,"
                     "SHORT_SSL://127.0.0.1:0",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,SSL:SSL,SASL_PLAINTEXT:"
                                          "SASL_PLAINTEXT,PLAINTEXT:PLAINTEXT,REAUTH:SASL_PLAINTEXT,"
                                          "SHORT:SASL_PLAINTEXT,SHORT_SSL:SASL_SSL",
        "listener.name.short.connections.max.reauth.ms": str(SHORT_MS),
        "listener.name.short_ssl.connections.max.reauth.ms": str(SHORT_MS),
        # the listener's, then one mechanism's own (Kafka's prefix overrides)
        "listener.name.reauth.connections.max.reauth.ms": str(REAUTH_MS["SCRAM-SHA-512"]),
        "listener.name.reauth.plain.connections.max.reauth.ms": str(REAUTH_MS["PLAIN"]),
        "listener.name.reauth.scram-sha-256.connections.max.reauth.ms":
            str(REAUTH_MS["SCRAM-SHA-256"]),
        "sasl.enabled.mechanisms": MECHANISMS,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(server.both),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(ca.pem),
        "listener.name.ssl.ssl.client.auth": "required",
        # Kafka's brokers need these lines; accepted here (SCRAM users are in the store)
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "connection.failed.authentication.delay.ms": "50",
        "num.partitions": "1",
        "group.initial.rebalance.delay.ms": "0",
    }).start()
    return Secured(broker, ca, client, stranger)
