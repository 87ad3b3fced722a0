"""Issue 25, listeners: Kafka's listener syntax and its mistakes, and TLS files checked when the
broker starts: a missing or bad file is a message naming the listener and the key and exit
status 2, never a traceback nor a broker that fails at its first connection."""

from __future__ import annotations

import pytest
from support.certs import CertificateAuthority

from oncelog.broker.config import BrokerConfig, ConfigError
from oncelog.broker.listener_security import certificate_principal, listener_securities

MAP = "listener.security.protocol.map"


def test_named_listeners_map_to_their_security_protocols():
    config = BrokerConfig({
        "listeners": "CLIENT://:0,INTERNAL://127.0.0.1:0,PLAINTEXT://[::1]:0",
        MAP: "CLIENT:SASL_SSL,INTERNAL:SASL_PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "advertised.listeners": "CLIENT://kafka.example:9093",
        "listener.name.internal.sasl.enabled.mechanisms": "SCRAM-SHA-256",
    })
    assert [(e.name, e.host, e.security_protocol) for e in config.listeners] == [
        ("CLIENT", "0.0.0.0", "SASL_SSL"), ("INTERNAL", "127.0.0.1", "SASL_PLAINTEXT"),
        ("PLAINTEXT", "::1", "PLAINTEXT")]
    assert config.advertised_listeners["CLIENT"].host == "kafka.example"
    assert config.listener_setting("INTERNAL", "sasl.enabled.mechanisms") == "SCRAM-SHA-256"
    assert config.listener_setting("CLIENT", "sasl.enabled.mechanisms") == "GSSAPI"
    # the older form without a name is PLAINTEXT
    assert BrokerConfig({"listeners": "127.0.0.1:9092"}).listener.security_protocol == \
        "PLAINTEXT"


@pytest.mark.parametrize(("settings", "message"), [
    ({"listeners": "CLIENT://:0"}, "listener CLIENT is not in listener.security.protocol.map"),
    ({"listeners": "PLAINTEXT://:0,PLAINTEXT://:1"}, "named twice"),
    ({"listeners": "PLAINTEXT://:9092,SSL://:9092"}, "two listeners on one port"),
    ({MAP: "A:TLS"}, "PROTOCOL one of"),
    ({"advertised.listeners": "SSL://x:1"}, "SSL is not in listeners"),
    ({"listener.name.ssl.ssl.client.auth": "required"}, "no listener ssl"),
    ({"listener.name.plaintext.log.dirs": "x"}, "unknown config key"),
    ({"ssl.keystore.type": "JKS"}, "PEM files only"),
    ({"ssl.principal.mapping.rules": "RULE:^CN=(.*)\\1$/$1/"}, "not one RE2 accepts"),
])
def test_listener_mistakes_name_the_key(settings, message):
    with pytest.raises(ConfigError, match=message):
        BrokerConfig(settings)


def test_tls_and_sasl_settings_are_checked_at_start(tmp_path):
    ca = CertificateAuthority(tmp_path)
    server = ca.issue("server", "localhost", server=True, password=b"key-pw")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    ssl_listener = {"listeners": "SSL://127.0.0.1:0"}
    for settings, message in [
        ({}, "listener SSL: ssl.keystore.location: a TLS listener needs"),
        ({"ssl.keystore.location": str(garbage)}, "not a usable PEM"),
        ({"ssl.keystore.location": str(server.both)}, "not a usable PEM"),  # no password
        ({"ssl.keystore.location": str(server.both), "ssl.key.password": "key-pw",
          "ssl.client.auth": "required"}, "required needs ssl.truststore.location"),
        ({"ssl.keystore.location": str(server.both), "ssl.key.password": "key-pw",
          "ssl.truststore.location": str(garbage)}, "ssl.truststore.location"),
    ]:
        with pytest.raises(ConfigError, match=message):
            listener_securities(BrokerConfig({**ssl_listener, **settings}))
    # right: the key's password given, or the PEM text itself (Kafka's two PEM forms)
    listener_securities(BrokerConfig({**ssl_listener, "ssl.keystore.location": str(server.both),
                                      "ssl.key.password": "key-pw"}))
    listener_securities(BrokerConfig({
        **ssl_listener, "ssl.keystore.certificate.chain": server.cert.read_text(),
        "ssl.keystore.key": server.key.read_text(), "ssl.key.password": "key-pw",
        "ssl.truststore.certificates": ca.pem.read_text(), "ssl.client.auth": "requested"}))
    with pytest.raises(ConfigError, match="GSSAPI not available"):
        listener_securities(BrokerConfig({"listeners": "SASL_PLAINTEXT://127.0.0.1:0"}))


def test_the_broker_exits_with_the_message_when_a_file_is_missing(tmp_path, capsys):
    from oncelog.cli.main import main

    code = main(["broker", "--set", "listeners=SSL://127.0.0.1:0",
                 "--set", f"log.dirs={tmp_path / 'data'}",
                 "--set", f"ssl.keystore.location={tmp_path / 'missing.pem'}"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        f"oncelog broker: listener SSL: ssl.keystore.location: {tmp_path / 'missing.pem'}: "
        f"no such file")


def test_a_certificates_subject_is_the_principal_as_kafka_writes_it():
    subject = ((("countryName", "FR"),), (("organizationName", "oncelog, inc"),),
               (("organizationalUnitName", "a"), ("organizationalUnitName", "b")),
               (("commonName", "#carol "),))
    assert str(certificate_principal({"subject": subject})) == \
        "User:CN=\\#carol\\ ,OU=a+OU=b,O=oncelog\\, inc,C=FR"
    assert str(certificate_principal(None)) == "User:ANONYMOUS"


def test_plain_checks_the_static_users_of_its_jaas_configuration():
    from oncelog.security.sasl_server import AuthenticationFailed, PlainServer

    config = BrokerConfig({
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config":
            'org.apache.kafka.common.security.plain.PlainLoginModule required '
            'username="admin" password="admin-secret" user_admin="admin-secret" '
            'user_alice="alice-secret";'})
    users = listener_securities(config)[0].plain_users
    assert users == {"admin": "admin-secret", "alice": "alice-secret"}
    server = PlainServer(None, users)
    server.step(b"\0alice\0alice-secret")
    assert server.done and server.username == "alice"
    for token in (b"\0alice\0wrong", b"\0mallory\0alice-secret", b"bob\0alice\0alice-secret"):
        with pytest.raises(AuthenticationFailed):
            PlainServer(None, users).step(token)


def test_a_cluster_registration_names_every_listener_as_kafka_writes_it():
    import json

    from oncelog.cluster.znodes import BrokerRegistration

    registration = BrokerRegistration(1, "h", 9093, None, (
        ("SASL_SSL", "h", 9093, "SASL_SSL"), ("CLIENT", "h", 9092, "PLAINTEXT")))
    value = json.loads(registration.encode())
    assert value["endpoints"] == ["SASL_SSL://h:9093", "CLIENT://h:9092"]
    assert value["listener_security_protocol_map"] == {"SASL_SSL": "SASL_SSL",
                                                       "CLIENT": "PLAINTEXT"}
    back = BrokerRegistration.decode(1, registration.encode())
    assert (back.endpoint("CLIENT"), back.endpoint("SASL_SSL")) == (("h", 9092), ("h", 9093))
