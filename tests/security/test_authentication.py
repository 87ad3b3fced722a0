"""Issue 25, authentication: every Kafka client's own security settings work unchanged against
one broker with SASL_SSL, SSL (mutual TLS), SASL_PLAINTEXT and PLAINTEXT listeners, and
whoever does not prove who they are gets nothing but a refusal and a closed connection.

One broker for the session (``secured`` in tests/conftest.py); each test its own topic.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
import subprocess
import time

import pytest
from support.raw_kafka import Raw
from support.secured import CLIENT_DN

from oncelog.client.network.connection import BrokerConnection, KafkaError
from oncelog.client.network.security import ClientSecurity
from oncelog.protocol import api_versions as apis
from oncelog.protocol.schema import build
from oncelog.security import scram

TIMEOUT = 30.0
RECORDS = 20


def _wait_log(secured, needle: str) -> str:
    deadline = time.monotonic() + TIMEOUT
    while needle not in (text := secured.broker.log_text()):
        assert time.monotonic() < deadline, f"{needle!r} never logged:\n{text[-3000:]}"
        time.sleep(0.05)
    return text


# --- confluent-kafka, kcat: librdkafka's settings -------------------------------------------

@pytest.mark.parametrize("listener", ["SASL_SSL", "SSL"])
def test_confluent_kafka_produces_idempotently_and_consumes(secured, listener):
    from confluent_kafka import Consumer, Producer

    topic = f"ck-{listener.lower()}"
    conf = secured.librdkafka(listener)
    producer = Producer({**conf, "enable.idempotence": True})
    for i in range(RECORDS):
        producer.produce(topic, b"v%d" % i)
    assert producer.flush(TIMEOUT) == 0
    consumer = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while len(got) < RECORDS and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg.value())
    finally:
        consumer.close()
    assert got == [b"v%d" % i for i in range(RECORDS)]
    if listener == "SSL":  # the principal is the certificate's subject, as Kafka writes it
        _wait_log(secured, f"authenticated as User:{CLIENT_DN} by its certificate")


@pytest.mark.parametrize("listener", ["SASL_SSL", "SSL"])
def test_kcat_produces_and_consumes(secured, listener):
    topic = f"kcat-{listener.lower()}"
    options = [arg for key, value in secured.librdkafka(listener).items()
               if key != "bootstrap.servers" for arg in ("-X", f"{key}={value}")]
    base = ["kcat", "-b", secured.bootstrap(listener), "-t", topic, *options]
    lines = b"".join(b"line %d\n" % i for i in range(RECORDS))
    done = subprocess.run([*base, "-P", "-X", "enable.idempotence=true"], input=lines,
                          capture_output=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([*base, "-C", "-o", "beginning", "-e", "-q"], capture_output=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == lines


# --- kafka-python, aiokafka: their own names ----------------------------------------------

def _python_client_settings(secured, listener: str) -> dict:
    conf = {"bootstrap_servers": secured.bootstrap(listener), "security_protocol": listener,
            "ssl_cafile": str(secured.ca.pem)}
    if listener == "SASL_SSL":
        conf.update(sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="bob",
                    sasl_plain_password="bob-secret")
    else:
        conf.update(ssl_certfile=str(secured.client.cert), ssl_keyfile=str(secured.client.key))
    return conf


@pytest.mark.parametrize("listener", ["SASL_SSL", "SSL"])
def test_kafka_python_produces_idempotently_and_consumes(secured, listener):
    from kafka import KafkaConsumer, KafkaProducer

    topic = f"kp-{listener.lower()}"
    conf = _python_client_settings(secured, listener)
    producer = KafkaProducer(**conf, enable_idempotence=True, acks="all")
    for i in range(RECORDS):
        producer.send(topic, b"v%d" % i)
    producer.flush(TIMEOUT)
    producer.close(TIMEOUT)
    consumer = KafkaConsumer(topic, **conf, auto_offset_reset="earliest",
                             consumer_timeout_ms=int(TIMEOUT * 1000))
    got = []
    for msg in consumer:
        got.append(msg.value)
        if len(got) == RECORDS:
            break
    consumer.close()
    assert got == [b"v%d" % i for i in range(RECORDS)]


@pytest.mark.parametrize("listener", ["SASL_SSL", "SSL"])
def test_aiokafka_produces_idempotently_and_consumes(secured, listener):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    topic = f"aio-{listener.lower()}"
    conf = _python_client_settings(secured, listener)
    context = create_ssl_context(cafile=conf.pop("ssl_cafile"),
                                 certfile=conf.pop("ssl_certfile", None),
                                 keyfile=conf.pop("ssl_keyfile", None))

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(**conf, ssl_context=context, enable_idempotence=True)
        await producer.start()
        try:
            for i in range(RECORDS):
                await producer.send_and_wait(topic, b"v%d" % i)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, **conf, ssl_context=context,
                                    auto_offset_reset="earliest")
        await consumer.start()
        got: list[bytes] = []
        try:
            async with asyncio.timeout(TIMEOUT):
                async for msg in consumer:
                    got.append(msg.value)
                    if len(got) == RECORDS:
                        break
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(run()) == [b"v%d" % i for i in range(RECORDS)]


# --- oncelog's own clients ----------------------------------------------------------------

@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
def test_oncelog_clients_over_sasl_ssl(secured, mechanism):
    from oncelog import Consumer, Producer, TopicPartition

    topic = f"ours-{mechanism.lower()}"
    conf = secured.librdkafka("SASL_SSL", mechanism=mechanism)
    producer = Producer({**conf, "enable.idempotence": True})
    for i in range(RECORDS):
        producer.produce(topic, value=b"v%d" % i)
    producer.flush(TIMEOUT)  # raises the first delivery error
    producer.close()
    with Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"}) as c:
        c.subscribe([topic])
        got: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < RECORDS and time.monotonic() < deadline:
            got += [r.value for r in c.poll(0.5)]
        c.commit()
        tp = TopicPartition(topic, 0)
        assert c.committed([tp])[tp].offset == RECORDS
    assert got == [b"v%d" % i for i in range(RECORDS)]


def test_metadata_names_the_listener_the_client_came_in_on(secured):
    from confluent_kafka.admin import AdminClient

    for listener in ("SASL_SSL", "SSL", "PLAINTEXT"):
        admin = AdminClient(secured.librdkafka(listener))
        brokers = admin.list_topics(timeout=TIMEOUT).brokers
        assert [(b.host, b.port) for b in brokers.values()] == \
            [("127.0.0.1", secured.broker.ports[listener])], listener


# --- refusals ---------------------------------------------------------------------------------

def test_a_wrong_password_is_refused_and_the_broker_serves_the_others(secured):
    from confluent_kafka import KafkaError as CKError
    from confluent_kafka import Producer

    errors = []
    producer = Producer({**secured.librdkafka("SASL_SSL", password="wrong"),
                         "error_cb": errors.append})
    producer.produce("refused", b"x")
    deadline = time.monotonic() + TIMEOUT
    while not errors and time.monotonic() < deadline:
        producer.poll(0.1)
    assert errors and errors[0].code() == CKError._AUTHENTICATION, errors
    assert "Authentication failed" in errors[0].str()
    # Closed now: left open, librdkafka would go on reconnecting with the wrong password
    # (backoff from reconnect.backoff.ms) for the rest of the test, each attempt refused and
    # logged; the slower the machine, the more attempts.
    producer.purge()
    producer.close(0)
    # ours: the broker's error, SASL_AUTHENTICATION_FAILED, not retriable, at once
    from oncelog import Consumer, Producer

    wrong = secured.librdkafka("SASL_SSL", password="wrong")
    with pytest.raises(KafkaError, match="SASL_AUTHENTICATION_FAILED"):
        Producer(wrong)
    with pytest.raises(KafkaError, match="SASL_AUTHENTICATION_FAILED"):
        with Consumer({**wrong, "group.id": "refused"}) as consumer:
            consumer.subscribe(["refused"])
            consumer.poll(TIMEOUT)
    for attempt in range(3):  # bounded: a loop of wrong passwords is each refused alike
        with pytest.raises(KafkaError) as refused:
            BrokerConnection("127.0.0.1", secured.broker.ports["SASL_PLAINTEXT"],
                             timeout=TIMEOUT, security=ClientSecurity.from_config(
                                 secured.librdkafka("SASL_PLAINTEXT", password=f"no{attempt}")))
        assert refused.value.name() == "SASL_AUTHENTICATION_FAILED"
        assert not refused.value.is_retriable()
    _wait_log(secured, "authentication failed on listener SASL_PLAINTEXT (SCRAM-SHA-512)")
    # the others are served meanwhile and after
    with BrokerConnection("127.0.0.1", secured.broker.ports["SASL_PLAINTEXT"], timeout=TIMEOUT,
                          security=ClientSecurity.from_config(
                              secured.librdkafka("SASL_PLAINTEXT", user="bob"))) as conn:
        assert apis.METADATA in conn.versions


def test_a_flood_of_wrong_passwords_on_one_listener_hides_no_other_listeners_refusals(
        secured):
    """The log's rate limit on refusals is per listener: wrong passwords past the limit on
    SASL_SSL (counted, summed up later) leave the next SASL_PLAINTEXT refusal logged."""
    from concurrent.futures import ThreadPoolExecutor

    from oncelog.broker.sasl_gate import _failures

    def refused_over_tls(_attempt: int) -> int:
        context = ssl.create_default_context(cafile=str(secured.ca.pem))
        raw = Raw(secured, "SASL_SSL", context)
        assert raw.handshake("PLAIN").error_code == 0
        assert raw.token(b"\0alice\0not-alices").error_code == 58
        return raw.closed()

    with ThreadPoolExecutor(4) as pool:  # bounded: one burst's worth
        assert all(pool.map(refused_over_tls, range(_failures.burst)))
    raw = Raw(secured)
    port = raw.sock.getsockname()[1]
    assert raw.handshake("PLAIN").error_code == 0
    assert raw.token(b"\0alice\0not-alices").error_code == 58
    _wait_log(secured, f"127.0.0.1:{port}: authentication failed on listener SASL_PLAINTEXT")


def test_an_untrusted_certificate_is_refused(secured):
    context = ssl.create_default_context(cafile=str(secured.ca.pem))
    context.load_cert_chain(str(secured.stranger.cert), str(secured.stranger.key))
    with pytest.raises(KafkaError):
        with BrokerConnection("127.0.0.1", secured.broker.ports["SSL"], timeout=TIMEOUT,
                              security=ClientSecurity("SSL", ssl_context=context)) as conn:
            conn.call(apis.METADATA, lambda mod, _v: build(mod.MetadataRequest, topics=()))
    context = ssl.create_default_context(cafile=str(secured.ca.pem))  # no certificate at all
    with pytest.raises(KafkaError):
        with BrokerConnection("127.0.0.1", secured.broker.ports["SSL"], timeout=TIMEOUT,
                              security=ClientSecurity("SSL", ssl_context=context)) as conn:
            conn.call(apis.METADATA, lambda mod, _v: build(mod.MetadataRequest, topics=()))


# --- the protocol by hand: what a hostile client may try -------------------------------------

def test_a_request_before_authentication_closes_the_connection(secured):
    raw = Raw(secured)
    assert raw.call(apis.API_VERSIONS_KEY, 0).error_code == 0  # allowed before
    with pytest.raises(ConnectionError):
        raw.call(apis.METADATA, 1, topics=None)
    _wait_log(secured, "api key 3 before authentication; closing the connection")
    raw = Raw(secured)  # halfway through the exchange is still before
    raw.handshake()
    with pytest.raises(ConnectionError):
        raw.call(apis.METADATA, 1, topics=None)


def test_an_unknown_mechanism_is_refused_with_the_enabled_ones(secured):
    raw = Raw(secured)
    answer = raw.handshake("GSSAPI")
    assert answer.error_code == 33  # UNSUPPORTED_SASL_MECHANISM
    assert list(answer.mechanisms) == ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]
    assert raw.closed()


def _server_first(raw: Raw, nonce: str) -> scram.ServerFirst:
    assert raw.handshake().error_code == 0
    answer = raw.token(scram.client_first("alice", nonce))
    assert answer.error_code == 0, answer
    return scram.parse_server_first(bytes(answer.auth_bytes), nonce)


@pytest.mark.parametrize("tamper", ["nonce", "proof", "binding", "garbage"])
def test_scram_with_a_wrong_nonce_or_proof_is_refused(secured, tamper):
    raw = Raw(secured)
    server = _server_first(raw, "clientnonce")
    final, _ = scram.client_final("SCRAM-SHA-256", b"alice-secret", "n=alice,r=clientnonce",
                                  server)
    text = final.decode()
    if tamper == "nonce":  # a nonce the server did not send (its own part changed)
        # (to another character than its own: the server's random nonce ends with "X" once
        # in 64 runs, and the "tampered" exchange was the genuine one: a fresh-clone failure)
        other = "Y" if server.nonce.endswith("X") else "X"
        text = text.replace(server.nonce, server.nonce[:-1] + other)
        assert server.nonce not in text
    elif tamper == "proof":  # the proof of another password
        text, _ = scram.client_final("SCRAM-SHA-256", b"not-alice", "n=alice,r=clientnonce",
                                     server)
        text = text.decode()
    elif tamper == "binding":
        text = text.replace("c=biws", "c=eSws")
    else:
        text = "p=,,,=\x00" + text[:5]
    answer = raw.token(text.encode())
    assert answer.error_code == 58  # SASL_AUTHENTICATION_FAILED
    assert raw.closed()
    # the genuine exchange on a new connection works: nothing was spoilt
    raw = Raw(secured)
    server = _server_first(raw, "again")
    final, signature = scram.client_final("SCRAM-SHA-256", b"alice-secret", "n=alice,r=again",
                                          server)
    answer = raw.token(final)
    assert answer.error_code == 0
    scram.check_server_final(bytes(answer.auth_bytes), signature)
    assert raw.call(apis.METADATA, 1, topics=None).brokers  # authenticated: served


@pytest.mark.parametrize("first", [b"", b"n,,", b"x,,n=alice,r=a", b"n,,n=nobody,r=abc",
                                   b"n,a=bob,n=alice,r=abc", b"\xff\xfe", b"n,,n=alice,r=a" * 999])
def test_malformed_or_unknown_client_first_is_refused(secured, first):
    raw = Raw(secured)
    assert raw.handshake().error_code == 0
    answer = raw.token(first)
    assert answer.error_code == 58
    assert raw.closed()


def test_authenticate_before_handshake_is_illegal(secured):
    raw = Raw(secured)
    answer = raw.token(b"n,,n=alice,r=abc")
    assert answer.error_code == 34  # ILLEGAL_SASL_STATE
    assert raw.closed()


def test_the_spark_sources_and_sinks_clients_take_kafka_prefixed_security_options(secured):
    """What format("oncelog") runs, without a Spark session: the sink's producer and admin
    client, the source's driver lookups and an executor's read, all from kafka.-prefixed
    options as Spark's Kafka source takes them."""
    from oncelog import Admin, Producer
    from oncelog.spark.columns import read_range
    from oncelog.spark.offsets import Cluster, OffsetRange
    from oncelog.spark.options import read_options, write_options

    topic = "spark-sasl"
    options = {f"kafka.{k}": v for k, v in secured.librdkafka("SASL_SSL").items()}
    sink = write_options({**options, "topic": topic})
    producer = Producer({**sink.producer, "enable.idempotence": True})
    for i in range(5):
        producer.produce(topic, value=b"v%d" % i)
    producer.flush(TIMEOUT)
    producer.close()
    with Admin(sink.admin_config()) as admin:
        assert topic in admin.metadata([topic]).topics
    source = read_options({**options, "subscribe": topic}, streaming=False)
    assert Cluster(source).partitions(must_exist=True) == [(topic, 0)]
    batches = list(read_range(source.bootstrap, OffsetRange(topic, 0, 0, 5), False, True, 5000,
                              False, source.security))
    assert sum(b.num_rows for b in batches) == 5


def test_sasl_handshake_v0_takes_bare_tokens(secured):
    """SaslHandshake v0 (clients before SaslAuthenticate): the exchange's tokens come and go
    as bare size-prefixed frames, without Kafka's request framing."""
    raw = Raw(secured)
    answer = raw.call(apis.SASL_HANDSHAKE, 0, mechanism="SCRAM-SHA-256")
    assert answer.error_code == 0

    def token(data: bytes) -> bytes:
        raw.sock.sendall(struct.pack(">i", len(data)) + data)
        return raw._read(struct.unpack(">i", raw._read(4))[0])

    server = scram.parse_server_first(token(scram.client_first("bob", "v0nonce")), "v0nonce")
    final, signature = scram.client_final("SCRAM-SHA-256", b"bob-secret", "n=bob,r=v0nonce",
                                          server)
    scram.check_server_final(token(final), signature)
    assert raw.call(apis.METADATA, 1, topics=None).brokers  # authenticated: Kafka framing again


@pytest.mark.parametrize("version", [0, 1, 2])
def test_every_sasl_authenticate_version_completes_an_exchange(secured, version):
    raw = Raw(secured)
    assert raw.handshake("PLAIN").error_code == 0
    answer = raw.token(b"\0bob\0bob-secret", version)
    assert answer.error_code == 0, answer
    assert raw.call(apis.METADATA, 1, topics=None).brokers


def test_large_fetches_read_the_same_records_on_every_listener(secured):
    """A Fetch answer of more than SPLICE_MIN per partition goes out with sendfile on a
    plaintext socket; on TLS it must be read in and encrypted instead. librdkafka reads the
    same records over SASL_SSL, SSL, SASL_PLAINTEXT and PLAINTEXT."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from oncelog.log.regions import SPLICE_MIN

    topic = "large-fetch"
    values = [(b"%06d" % i) * 1000 for i in range(4 * SPLICE_MIN // 6000 + 8)]
    producer = Producer({**secured.librdkafka("PLAINTEXT"), "linger.ms": 50})
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(TIMEOUT) == 0
    for listener in ("SASL_SSL", "SSL", "SASL_PLAINTEXT", "PLAINTEXT"):
        consumer = Consumer({**secured.librdkafka(listener), "group.id": f"large-{listener}",
                             "fetch.min.bytes": 2 * SPLICE_MIN})
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < len(values) and time.monotonic() < deadline:
            for msg in consumer.consume(100, timeout=0.5):
                assert msg.error() is None, (listener, msg.error())
                got.append(msg.value())
        consumer.close()
        assert got == values, listener
