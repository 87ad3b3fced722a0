"""ssl.principal.mapping.rules (security/principal_mapping.py): Kafka's rules read and applied
as Kafka's SslPrincipalMapper does, the patterns by RE2 (the subject is the client's); then a
broker that names mutual-TLS clients by them, and an ACL on the mapped name."""

from __future__ import annotations

import time

import pytest
from support.certs import CertificateAuthority

from oncelog.security.principal_mapping import parse_rules, principal_name

TIMEOUT = 15.0
# Kafka's documentation's example rules and subjects
DOCS_RULES = ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
              "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,"
              "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,"
              "DEFAULT")


@pytest.mark.parametrize(("rules", "subject", "name"), [
    (DOCS_RULES, "CN=serviceuser,OU=ServiceUsers,O=Unknown,L=Unknown,ST=Unknown,C=Unknown",
     "serviceuser"),
    (DOCS_RULES, "CN=adminUser,OU=Admin,O=Unknown,L=Unknown,ST=Unknown,C=Unknown",
     "adminuser@admin"),
    (DOCS_RULES, "CN=Kafka.Client,O=x", "kafka.client"),
    (DOCS_RULES, "OU=nobody", "OU=nobody"),  # DEFAULT: the subject itself
    ("DEFAULT", "CN=a\\,b,O=c", "CN=a\\,b,O=c"),
    ("RULE:^CN=([^,]*),.*$/$1/U", "CN=carol,O=x", "CAROL"),
    ("RULE:^CN=([^,]*),.*$/$1/U", "O=x", None),  # no rule applies
    ("RULE:^CN=(.*),O=(.*)$/$2\\/$1/", "CN=a,O=b", "b/a"),  # \/ a slash
    ("RULE:^CN=(.*)$/x\\/y\\$$1 $4/", "CN=a", "x/y$a $4"),  # $4: no such group: literal
    ("RULE:^CN=(.*)$/[$11]/", "CN=a", "[a1]"),  # $11 of one group: $1 then 1 (Java)
    ("RULE:CN=a\\/b/ok/, DEFAULT", "CN=a/b", "ok"),
    (" , RULE:^O=(.*)$/$1/L ,, DEFAULT ", "O=ACME", "acme"),  # empty entries are ignored
])
def test_rules_name_a_subject_as_kafka_does(rules, subject, name):
    assert principal_name(parse_rules(rules), subject) == name


@pytest.mark.parametrize("rules", [
    "RULE:a/b", "RULE:a", "FOO", "RULE:a/b/Lx", "DEFAULT DEFAULT",
    "RULE:(a)\\1/x/",  # a back-reference: RE2 refuses it, as Kafka's client regexes
    "RULE:(?=a)a/x/",  # a look-ahead
    "RULE:a/$1/",  # a group the pattern does not have
    "RULE:(a)/x$/", "RULE:(a)/x\\/",
])
def test_what_is_not_a_rule_is_refused_when_read(rules):
    with pytest.raises(ValueError):
        parse_rules(rules)


def test_a_mutual_tls_client_is_named_by_the_rules_and_its_acl_applies(tmp_path):
    """Certificates made here; the rule maps CN=Carol,OU=test,... to carol (lower-cased); an
    ACL for User:carol lets it produce to its topics and not to others; a certificate no rule
    applies to is refused."""
    from confluent_kafka import KafkaError, Producer
    from support.acl_wire import AUTHORIZER, METADATA_DIR
    from support.brokers import BrokerProcess

    from oncelog.metadata.store import LocalFileStore
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

    ca = CertificateAuthority(tmp_path / "ca")
    server = ca.issue("broker", "localhost", server=True)
    carol = ca.issue("carol", "Carol", unit="test")
    other = ca.issue("other", "Dave", unit="elsewhere")  # trusted, but no rule names it
    data = tmp_path / "data"
    AclStore(LocalFileStore(str(data / METADATA_DIR))).create([AclBinding(
        ResourcePattern(ResourceType.TOPIC, "carols-", PatternType.PREFIXED),
        AccessControlEntry("User:carol", "*", AclOperation.ALL,
                           AclPermissionType.ALLOW))])
    broker = BrokerProcess(data, {
        "listeners": "SSL://127.0.0.1:0",
        "ssl.keystore.location": str(server.both),
        "ssl.truststore.location": str(ca.pem),
        "ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]+),OU=test,O=oncelog,C=FR$/$1/L",
        "authorizer.class.name": AUTHORIZER,
        "num.partitions": "1",
    }).start()
    try:
        def producer(pem):
            errors: list = []
            return errors, Producer({
                "bootstrap.servers": broker.bootstrap_for("SSL"), "security.protocol": "ssl",
                "ssl.ca.location": str(ca.pem), "ssl.certificate.location": str(pem.cert),
                "ssl.key.location": str(pem.key), "error_cb": errors.append,
                "message.timeout.ms": int(TIMEOUT * 1000)})

        outcomes: dict[str, object] = {}
        _, mine = producer(carol)
        for topic in ("carols-topic", "someone-elses"):
            mine.produce(topic, b"x", on_delivery=lambda err, msg: outcomes.update(
                {msg.topic(): err}))
        assert mine.flush(TIMEOUT) == 0
        mine.close()
        assert outcomes["carols-topic"] is None
        assert outcomes["someone-elses"].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert "authenticated as User:carol by its certificate" in broker.log_text()

        errors, theirs = producer(other)
        deadline = time.monotonic() + TIMEOUT
        while not errors and time.monotonic() < deadline:
            theirs.poll(0.1)
        theirs.close(0)
        assert errors, "a certificate no rule applies to was served"
        assert "no ssl.principal.mapping.rules rule applies" in broker.log_text()
    finally:
        assert broker.stop() == 0, broker.log_text()
    assert "Traceback" not in broker.log_text()
