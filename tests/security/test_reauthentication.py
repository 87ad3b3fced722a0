"""KIP-368 (broker/sasl_reauth.py): a SASL session ends connections.max.reauth.ms after it was
authenticated; SaslAuthenticate v1+ says so, the client re-authenticates on the same
connection or loses it at its next request, and may not become someone else meanwhile.

On the session's secured broker (tests/conftest.py), listener REAUTH: its lifetimes are
REAUTH_MS in tests/support/secured.py.
"""

from __future__ import annotations

import time

import pytest
from support.raw_kafka import Raw
from support.secured import REAUTH_MS

from oncelog.broker.sasl_reauth import MIN_REAUTH_INTERVAL_S, Step, decide
from oncelog.protocol import api_versions as apis
from oncelog.security import scram

TIMEOUT = 30.0
HANDSHAKE, METADATA = apis.SASL_HANDSHAKE, apis.METADATA


@pytest.mark.parametrize(("row", "api_key", "now", "last_start", "step"), [
    ("R1 first", HANDSHAKE, 5.0, None, Step.REAUTHENTICATE),
    ("R1 a second later", HANDSHAKE, 5.0, 5.0 - MIN_REAUTH_INTERVAL_S, Step.REAUTHENTICATE),
    ("R1 after the end", HANDSHAKE, 50.0, None, Step.REAUTHENTICATE),
    ("R2", HANDSHAKE, 5.0, 4.5, Step.SERVE),
    ("R3", METADATA, 10.5, None, Step.CLOSE),
    ("R3 too soon", HANDSHAKE, 10.5, 10.0, Step.CLOSE),
    ("R3 a frame too short", None, 10.5, None, Step.CLOSE),
    ("R4", METADATA, 10.0, None, Step.SERVE),
])
def test_the_rows(row, api_key, now, last_start, step):
    assert decide(api_key, now, 10.0, last_start) is step, row


def _wait_log(secured, needle: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while needle not in (text := secured.broker.log_text()):
        assert time.monotonic() < deadline, f"{needle!r} never logged:\n{text[-3000:]}"
        time.sleep(0.05)


def _plain(raw: Raw, user: str = "alice", version: int = 2):
    assert raw.handshake("PLAIN").error_code == 0
    return raw.token(b"\0%s\0%s-secret" % (user.encode(), user.encode()), version)


def _scram(raw: Raw, user: str = "alice"):
    """A whole SCRAM-SHA-256 exchange; the last SaslAuthenticate answer."""
    nonce = f"{user}nonce"
    assert raw.handshake("SCRAM-SHA-256").error_code == 0
    answer = raw.token(scram.client_first(user, nonce))
    assert answer.error_code == 0, answer
    server = scram.parse_server_first(bytes(answer.auth_bytes), nonce)
    final, _ = scram.client_final("SCRAM-SHA-256", f"{user}-secret".encode(),
                                  f"n={user},r={nonce}", server)
    return raw.token(final)


def test_a_session_not_reauthenticated_is_closed_at_its_next_request(secured):
    raw = Raw(secured, "REAUTH")
    answer = _plain(raw)
    began = time.monotonic()
    assert answer.error_code == 0
    assert answer.session_lifetime.total_seconds() * 1000 == REAUTH_MS["PLAIN"]
    time.sleep(max(0.0, began + REAUTH_MS["PLAIN"] / 1000 - time.monotonic()) + 0.05)
    with pytest.raises(ConnectionError):  # row R3
        raw.call(METADATA, 1, topics=None)
    _wait_log(secured, f"127.0.0.1:{raw.sock.getsockname()[1]}: listener REAUTH: the session "
                       f"of User:alice ended")
    # SaslAuthenticate v0 has no field for the lifetime: the exchange completes all the same
    assert _plain(Raw(secured, "REAUTH"), version=0).error_code == 0
    # a listener without connections.max.reauth.ms says 0: sessions never end
    answer = _plain(Raw(secured, "SASL_PLAINTEXT"))
    assert (answer.error_code, answer.session_lifetime.total_seconds()) == (0, 0)


def test_reauthenticating_on_the_open_connection_as_the_same_principal(secured):
    raw = Raw(secured, "REAUTH")
    assert _scram(raw).error_code == 0
    assert raw.call(METADATA, 1, topics=None).brokers
    answer = _scram(raw)  # row R7, between requests
    assert answer.error_code == 0, answer
    assert answer.session_lifetime.total_seconds() * 1000 == REAUTH_MS["SCRAM-SHA-256"]
    assert raw.call(METADATA, 1, topics=None).brokers


def test_reauthenticating_as_another_principal_closes_the_connection(secured):
    raw = Raw(secured, "REAUTH")
    assert _scram(raw, "alice").error_code == 0
    answer = _scram(raw, "bob")  # row R6
    assert answer.error_code == 58  # SASL_AUTHENTICATION_FAILED
    assert "Cannot change principals during re-authentication from User.alice: User.bob" \
        in answer.error_message
    assert raw.closed()


def test_reauthenticating_with_another_mechanism_closes_the_connection(secured):
    raw = Raw(secured, "REAUTH")
    assert _scram(raw).error_code == 0
    answer = _plain(raw)  # row R5: the handshake is answered, the exchange refused
    assert answer.error_code == 58
    assert "not supported for re-authentication of mechanism 'SCRAM-SHA-256'" \
        in answer.error_message
    assert raw.closed()


def test_librdkafka_reauthenticates_across_several_lifetimes_without_losing_a_record(secured):
    """librdkafka (since 2.2.0) re-authenticates at 90% of session_lifetime_ms: an idempotent
    producer keeps its connection across several lifetimes; no error, every record once."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = "reauth-librdkafka"
    needle = "re-authenticated as User:alice with SCRAM-SHA-512 on listener REAUTH"
    before = secured.broker.log_text().count(needle)
    errors: list = []
    delivered: list = []
    producer = Producer({"bootstrap.servers": secured.bootstrap("REAUTH"),
                         "security.protocol": "sasl_plaintext", "sasl.mechanism": "SCRAM-SHA-512",
                         "sasl.username": "alice", "sasl.password": "alice-secret",
                         "enable.idempotence": True, "linger.ms": 5, "error_cb": errors.append})

    def report(err, msg) -> None:
        delivered.append((err, msg.offset() if err is None else None))

    sent = 0
    deadline = time.monotonic() + TIMEOUT
    # bounded: until the broker saw two re-authentications of this producer
    while secured.broker.log_text().count(needle) < before + 2:
        assert time.monotonic() < deadline, secured.broker.log_text()[-3000:]
        producer.produce(topic, b"v%d" % sent, on_delivery=report)
        sent += 1
        producer.poll(0.05)
    assert producer.flush(TIMEOUT) == 0
    producer.close()
    assert errors == []
    assert delivered == [(None, offset) for offset in range(sent)]
    consumer = Consumer({"bootstrap.servers": secured.bootstrap("PLAINTEXT"),
                         "group.id": topic, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT
    while len(got) < sent and time.monotonic() < deadline:
        got += [m.value() for m in consumer.consume(100, timeout=0.5) if m.error() is None]
    consumer.close()
    assert got == [b"v%d" % i for i in range(sent)]
