"""KIP-368 on oncelog's own clients (security/sasl_reauth_client.py): told a session lifetime,
a connection authenticates again on the same connection before it ends, between its requests,
with every mechanism over SASL_PLAINTEXT and SASL_SSL; an idempotent producer and a consumer
go on across several lifetimes without an error, a new connection, a lost or a repeated record.

On the session's secured broker (tests/support/secured.py): listeners SHORT (SASL_PLAINTEXT) and
SHORT_SSL (SASL_SSL), whose sessions last SHORT_MS. Connections are counted in the broker's log,
which names each connection's address at its first authentication and at each re-authentication.
"""

from __future__ import annotations

import asyncio
import datetime
import random
import re
import socket
import threading
import time

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule
from kio.schema.errors import ErrorCode
from support.secured import SHORT_MS

from oncelog.client.network.aio_connection import AsyncBrokerConnection
from oncelog.client.network.connection import BrokerConnection, RequestNotSent
from oncelog.client.network.security import ClientSecurity
from oncelog.protocol import api_versions as apis
from oncelog.protocol.schema import build
from oncelog.security.sasl_reauth_client import WINDOW, Action, Reauthentication, decide

TIMEOUT = 30.0
LISTENERS = ("SHORT", "SHORT_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.mark.parametrize(("row", "now", "due_at", "running", "action"), [
    ("C1", 50.0, None, False, Action.SEND),
    ("C2", 9.9, 10.0, False, Action.SEND),
    ("C3 at the point", 10.0, 10.0, False, Action.REAUTHENTICATE),
    ("C3 past the end", 99.0, 10.0, False, Action.REAUTHENTICATE),
    ("C4", 10.0, 10.0, True, Action.WAIT),
    ("C4 before the point", 1.0, 10.0, True, Action.WAIT),
])
def test_the_rows(row, now, due_at, running, action):
    assert decide(now, due_at, running) is action, row


def test_the_point_is_drawn_within_javas_window_and_a_lifetime_of_0_never_ends():
    seed = 25
    reauth = Reauthentication("PLAIN", "alice", "x", random.Random(seed))
    points = []
    for _ in range(200):
        reauth.begin()
        reauth.authenticated(100.0, 10_000, again=True)  # row C5
        points.append((reauth.due_at - 100.0) / 10)
    assert all(WINDOW[0] <= p <= WINDOW[1] for p in points), seed
    assert max(points) - min(points) > 0.05, seed  # spread: not all at once
    assert reauth.count == 200
    reauth.authenticated(100.0, 0, again=True)
    assert reauth.decide(1e9) is Action.SEND  # C1
    reauth.begin()
    reauth.failed()  # C6
    assert (reauth.running, reauth.due_at) == (False, None)


def test_the_point_is_never_within_the_brokers_gap_after_the_exchange_ended():
    """C5 (a): a short lifetime, or an exchange longer than the window, still puts the next
    point a second after the exchange ended (the broker refuses one sooner, R2)."""
    reauth = Reauthentication("PLAIN", "alice", "x", random.Random(0))
    reauth.begin()
    reauth.authenticated(100.0, 1000, again=True, ended=100.5)
    assert reauth.due_at == 101.5
    assert reauth.decide(101.4) is Action.SEND


class ReauthModel(RuleBasedStateMachine):
    """A connection's requests against the broker's rules (broker/sasl_reauth.py): a request
    goes out only while the session is on and no exchange runs, never past the point the
    client drew; an exchange begins only for a request past it; the point always lies in
    Java's window of the lifetime told."""

    def __init__(self) -> None:
        super().__init__()
        self.reauth = Reauthentication("PLAIN", "alice", "x", random.Random(0))
        self.now = 0.0
        self.ends_at = None  # the broker's end of the session (None: no lifetime)
        self.began = None

    @rule(lifetime=st.sampled_from([0, 1200, 1500, 60_000]))
    def authenticated(self, lifetime):
        if self.reauth.running or self.began is None:
            self.reauth.begin()
            self.began = self.now
        self.reauth.authenticated(self.began, lifetime, again=True)
        self.ends_at = None if lifetime == 0 else self.began + lifetime / 1000
        if lifetime:
            assert WINDOW[0] <= (self.reauth.due_at - self.began) / (lifetime / 1000) \
                <= WINDOW[1]
        self.began = None

    @rule(seconds=st.floats(0, 2))
    def time_passes(self, seconds):
        self.now += seconds

    @rule()
    def a_request(self):
        action = self.reauth.decide(self.now)
        if action is Action.SEND:
            assert not self.reauth.running
            assert self.ends_at is None or self.now < self.ends_at  # R3 never met
        elif action is Action.REAUTHENTICATE:
            assert self.reauth.due_at is not None and self.now >= self.reauth.due_at
            self.reauth.begin()
            self.began = self.now
        else:
            assert self.reauth.running

    @rule()
    def refused(self):
        if self.reauth.running:
            self.reauth.failed()
            self.reauth = Reauthentication("PLAIN", "alice", "x", random.Random(0))
            self.ends_at = self.began = None  # a new connection


TestReauthModel = ReauthModel.TestCase
TestReauthModel.settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                                    derandomize=True)


def _auth_lines(secured, ports: set[int], since: int
                ) -> tuple[dict[int, int], dict[int, int], list[str]]:
    """For each local port of ours: first authentications, re-authentications; and the
    broker's lines closing one of them for an ended session. Only the log from ``since``
    (its length when the test began): the module's broker served other tests' connections,
    and a local port one of them used may be ours again."""
    first = dict.fromkeys(ports, 0)
    again = dict.fromkeys(ports, 0)
    ended = []
    for line in secured.broker.log_text()[since:].splitlines():
        found = re.search(r"127\.0\.0\.1:(\d+): (re-)?authenticated as ", line)
        if found and int(found[1]) in ports:
            (again if found[2] else first)[int(found[1])] += 1
        found = re.search(r"127\.0\.0\.1:(\d+): listener \S+: the session of", line)
        if found and int(found[1]) in ports:
            ended.append(line)
    return first, again, ended


def _established(remote_port: int) -> set[int]:
    """The local ports of this machine's TCP connections to ``remote_port`` that are open
    (Linux's /proc/net/tcp: addresses in hex, state 01 is ESTABLISHED)."""
    ports = set()
    with open("/proc/net/tcp") as table:
        for line in list(table)[1:]:
            local, remote, state = line.split()[1:4]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == remote_port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def _metadata(mod, _version):
    return build(mod.MetadataRequest, topics=(), allow_auto_topic_creation=False,
                 include_topic_authorized_operations=False,
                 include_cluster_authorized_operations=False)


def _blocking(conns: list[BrokerConnection], stop: threading.Event, errors: list) -> None:
    """Two pipelined Metadata requests at a time on each connection: the second goes out
    past the point with the first in flight, whose answer is kept for its receive."""
    try:
        while not stop.is_set():
            for conn in conns:
                conn.send_only(apis.METADATA, _metadata)
                conn.send_only(apis.METADATA, _metadata)
                conn.receive()
                conn.receive()
            time.sleep(0.01)
    except Exception as exc:
        errors.append(exc)


async def _asyncio(secured, stop: threading.Event, conns: list) -> None:
    """Five requests at a time on each connection: those sent while it re-authenticates
    wait for it, those in flight are answered first."""
    conns.extend([await AsyncBrokerConnection.open(
        "127.0.0.1", secured.broker.ports[listener], "reauth-aio", TIMEOUT,
        ClientSecurity.from_config(secured.librdkafka(listener, mechanism=mechanism)))
        for listener in LISTENERS for mechanism in MECHANISMS])
    while not stop.is_set():
        await asyncio.gather(*(conn.request(apis.METADATA, _metadata)
                               for conn in conns for _ in range(5)))
        await asyncio.sleep(0.01)


def test_every_mechanism_over_both_protocols_reauthenticates_on_its_connection(secured):
    baseline = len(secured.broker.log_text())
    blocking = [BrokerConnection("127.0.0.1", secured.broker.ports[listener], "reauth-sync",
                                 TIMEOUT, ClientSecurity.from_config(
                                     secured.librdkafka(listener, mechanism=mechanism)))
                for listener in LISTENERS for mechanism in MECHANISMS]
    stop = threading.Event()
    errors: list = []
    thread = threading.Thread(target=_blocking, args=(blocking, stop, errors))
    thread.start()
    conns: list[AsyncBrokerConnection] = []

    async def run() -> set[int]:
        task = asyncio.get_running_loop().create_task(_asyncio(secured, stop, conns))
        deadline = time.monotonic() + TIMEOUT
        # bounded: until every connection re-authenticated twice (three sessions each)
        while not conns or not all(c.reauth.count >= 2 for c in [*blocking, *conns]):
            assert time.monotonic() < deadline, [c.reauth.count for c in [*blocking, *conns]]
            assert errors == []
            if task.done():
                task.result()  # what stopped it
            await asyncio.sleep(0.05)
        stop.set()
        await task
        ports = {c.local_port for c in conns} - {None}
        for conn in conns:
            assert not conn.closed
            conn.close()
        return ports

    try:
        ports = asyncio.run(run())
    finally:
        stop.set()
        thread.join(TIMEOUT)
    assert errors == []
    assert len(ports) == len(conns) == 6
    ports |= {c.sock.getsockname()[1] for c in blocking}
    for conn in blocking:
        assert not conn.closed
        conn.close()
    first, again, ended = _auth_lines(secured, ports, baseline)
    assert ended == []
    assert set(first.values()) == {1}, first  # one connection each, never opened again
    assert min(again.values()) >= 2, again


def test_an_idempotent_producer_and_a_consumer_across_three_lifetimes(secured):
    """oncelog.Producer (idempotent, acks=all) and oncelog.Consumer (in a group) on SASL_SSL
    with SCRAM-SHA-256 while three sessions end: every record delivered once, in order, read
    back once; no error, no connection opened after the first records went through (an
    idle one, as the group coordinator's between heartbeats, re-authenticates at its next
    request, past its end), none closed by the broker or replaced."""
    from oncelog import Consumer, Producer

    topic = "reauth-ours"
    conf = secured.librdkafka("SHORT_SSL", mechanism="SCRAM-SHA-256")
    baseline = len(secured.broker.log_text())

    def connections() -> tuple[dict[int, int], dict[int, int], list[str]]:
        text = secured.broker.log_text()[baseline:]
        ports = {int(p) for p in re.findall(
            r"127\.0\.0\.1:(\d+): authenticated as User:alice with SCRAM-SHA-256 on listener "
            r"SHORT_SSL", text)}
        return _auth_lines(secured, ports, baseline)

    producer = Producer({**conf, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    got: list[bytes] = []
    stop = threading.Event()
    errors: list = []

    def consume() -> None:
        try:
            with Consumer({**conf, "group.id": topic, "auto.offset.reset": "earliest"}) as c:
                c.subscribe([topic])
                while not stop.is_set():
                    got.extend(r.value for r in c.poll(0.2))
                    c.commit()
        except Exception as exc:
            errors.append(exc)

    reader = threading.Thread(target=consume)
    reader.start()
    delivered: list = []
    try:
        sent = 0
        deadline = time.monotonic() + TIMEOUT
        warmed_at = None
        while warmed_at is None or time.monotonic() < warmed_at + 3 * SHORT_MS / 1000:
            assert time.monotonic() < deadline and errors == [], errors
            producer.produce(topic, b"v%d" % sent,
                             on_delivery=lambda err, meta: delivered.append((err, meta)))
            sent += 1
            time.sleep(0.01)
            if warmed_at is None and got and delivered:
                warmed_at = time.monotonic()
        producer.flush(TIMEOUT)  # raises the first delivery error
        while len(got) < sent and time.monotonic() < deadline and errors == []:
            time.sleep(0.05)
        still_open = _established(secured.broker.ports["SHORT_SSL"])
    finally:
        stop.set()
        reader.join(TIMEOUT)
        producer.close()
    assert errors == []
    assert [err for err, _ in delivered] == [None] * sent
    assert sorted(meta.offset for _, meta in delivered) == list(range(sent))
    assert got == [b"v%d" % i for i in range(sent)]
    first, again, ended = connections()
    assert ended == []
    # every connection the clients opened was open still at the end: none lost or replaced
    assert set(first) <= still_open and set(first.values()) == {1}, (first, still_open)
    # the producer's connection to the leader and the consumer's fetching one, at least
    assert sorted(again.values())[-2:] >= [3, 3], again


def test_a_refused_reauthentication_closes_the_connection_and_fails_its_requests(secured):
    """Row C6: the user's password changed since the connection authenticated, so its
    re-authentication is refused: the request that began it (blocking), and every request
    waiting on it (asyncio), fail with SASL_AUTHENTICATION_FAILED, the connection closed."""
    from oncelog import Admin
    from oncelog.client.admin.admin_scram import ScramUpsertion
    from oncelog.client.network.connection import KafkaError

    user, mechanism = "reauth-dave", "SCRAM-SHA-256"
    conf = {"bootstrap.servers": secured.bootstrap("SHORT"), "security.protocol": "sasl_plaintext",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": "first"}
    with Admin({"bootstrap.servers": secured.bootstrap("PLAINTEXT")}) as admin:
        assert admin.alter_user_scram_credentials([ScramUpsertion(user, mechanism, "first")]) \
            == {user: None}
        security = ClientSecurity.from_config(conf)
        blocking = BrokerConnection("127.0.0.1", secured.broker.ports["SHORT"], "dave",
                                    TIMEOUT, security)

        async def run() -> list:
            conn = await AsyncBrokerConnection.open("127.0.0.1", secured.broker.ports["SHORT"],
                                                    "dave", TIMEOUT, security)
            assert admin.alter_user_scram_credentials([ScramUpsertion(user, mechanism,
                                                                      "second")]) == {user: None}
            due = max(conn.reauth.due_at, blocking.reauth.due_at)
            await asyncio.sleep(max(0.0, due - time.monotonic()))  # to the point, not a guess
            with pytest.raises(KafkaError) as refused:
                blocking.call(apis.METADATA, _metadata)
            results = await asyncio.gather(*(conn.request(apis.METADATA, _metadata)
                                             for _ in range(3)), return_exceptions=True)
            assert conn.closed
            return [refused.value, *results]

        errors = asyncio.run(run())
        assert blocking.closed
        assert [e.name() for e in errors] == ["SASL_AUTHENTICATION_FAILED"] * 4, errors
        # the asyncio ones waited behind the exchange: never written, the broker never saw them
        assert [isinstance(e, RequestNotSent) for e in errors] == [False, True, True, True]
        admin.alter_user_scram_credentials(deletions=[(user, mechanism)])


def _long_poll(topic: str, wait_ms: int):
    def make(mod, _version):
        return build(mod.FetchRequest, replica_id=-1,
                     max_wait=datetime.timedelta(milliseconds=wait_ms), min_bytes=1,
                     max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                     topics=(build(mod.FetchTopic, topic=topic, partitions=(build(
                         mod.FetchPartition, partition=0, current_leader_epoch=-1,
                         fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
                         partition_max_bytes=1 << 20),)),),
                     forgotten_topics_data=(), rack_id="")
    return make


def test_a_request_in_flight_when_it_begins_is_answered_first(secured):
    """Row C3 with a request in flight: a long-polling Fetch goes out before the point and
    the broker holds it; a Metadata request after the point begins the re-authentication
    behind it. The Fetch is answered first (the blocking connection keeps its answer for
    its receive), then the exchange, then the Metadata: all on the one connection."""
    from oncelog import Admin

    topic, hold_ms, early = "reauth-long-poll", 800, 0.3
    with Admin({"bootstrap.servers": secured.bootstrap("PLAINTEXT")}) as admin:
        admin.create_topic(topic, 1, 1)
    security = ClientSecurity.from_config(secured.librdkafka("SHORT"))
    port = secured.broker.ports["SHORT"]
    baseline = len(secured.broker.log_text())

    def until(moment: float) -> None:  # to a point the connection drew, not a guess
        time.sleep(max(0.0, moment - time.monotonic()))

    def blocking() -> BrokerConnection:
        conn = BrokerConnection("127.0.0.1", port, "in-flight", TIMEOUT, security)
        until(conn.reauth.due_at - early)
        fetch = conn.send_only(apis.FETCH, _long_poll(topic, hold_ms))
        assert conn.reauth.count == 0  # sent before the point
        until(conn.reauth.due_at)
        metadata = conn.send_only(apis.METADATA, _metadata)  # re-authenticates first
        assert conn.reauth.count == 1
        assert [conn.receive()[0] for _ in range(2)] == [fetch, metadata]
        return conn

    async def run() -> tuple[AsyncBrokerConnection, BrokerConnection]:
        other = asyncio.get_running_loop().run_in_executor(None, blocking)
        conn = await AsyncBrokerConnection.open("127.0.0.1", port, "in-flight", TIMEOUT,
                                                security)
        await asyncio.sleep(max(0.0, conn.reauth.due_at - early - time.monotonic()))
        fetch = conn.request(apis.FETCH, _long_poll(topic, hold_ms))
        assert not conn.reauth.running  # sent before the point
        await asyncio.sleep(max(0.0, conn.reauth.due_at - time.monotonic()))
        metadata = conn.request(apis.METADATA, _metadata)
        assert conn.reauth.running and not fetch.done()  # waits behind the Fetch in flight
        answers = await asyncio.gather(fetch, metadata)
        assert answers[0].error_code == 0 and answers[1].brokers
        assert conn.reauth.count == 1 and not conn.closed
        return conn, await other

    conn, sync = asyncio.run(run())
    ports = {conn.local_port, sync.sock.getsockname()[1]}
    conn.close()
    sync.close()
    first, again, ended = _auth_lines(secured, ports, baseline)
    assert (first, again, ended) == (dict.fromkeys(ports, 1), dict.fromkeys(ports, 1), [])


def _until(moment: float) -> None:  # to a point a connection drew, not a guess
    time.sleep(max(0.0, moment - time.monotonic()))


def test_an_answer_kept_during_a_reauthentication_reaches_the_groups_handler(secured):
    """The consumer group's coordinator IO: request A is answered before the point, request
    B past it re-authenticates, reading A's answer on the way, and the broker holds B. A's
    answer is in memory, not on the socket: a pump that waits on the socket alone does not
    see it (A would fail at its deadline, the coordinator lost)."""
    from oncelog import Admin, Consumer

    topic = "reauth-kept-group"
    with Admin({"bootstrap.servers": secured.bootstrap("PLAINTEXT")}) as admin:
        admin.create_topic(topic, 1, 1)
    with Consumer({**secured.librdkafka("SHORT"), "group.id": topic}) as consumer:
        group = consumer._require_group()
        group.find_coordinator()
        conn = group._coordinator_connection()
        answers: list = []
        _until(conn.reauth.due_at - 0.3)
        group._send(apis.METADATA, _metadata, time.monotonic() + TIMEOUT,
                    lambda response, error: answers.append(("A", response, error)))
        _until(conn.reauth.due_at)
        group._send(apis.FETCH, _long_poll(topic, 5000), time.monotonic() + TIMEOUT,
                    lambda response, error: answers.append(("B", response, error)))
        assert conn.reauth.count == 1
        group._pump(0)  # no waiting: A's answer is there already
        assert [(name, error) for name, _, error in answers] == [("A", None)], answers
        assert answers[0][1].brokers and not conn.closed
        conn.close()  # B is held still: the consumer need not wait for it


def test_a_blocking_drain_waits_for_each_request_until_its_own_deadline(secured):
    """Row C7: a request in flight whose answer the broker holds longer than the
    connection's timeout (a JoinGroup during a rebalance) is read within its own deadline
    when a re-authentication begins behind it, not failed at the socket's timeout."""
    from oncelog import Admin

    topic, timeout, hold_ms = "reauth-own-deadline", 1.5, 2500
    with Admin({"bootstrap.servers": secured.bootstrap("PLAINTEXT")}) as admin:
        admin.create_topic(topic, 1, 1)
    conn = BrokerConnection("127.0.0.1", secured.broker.ports["SHORT"], "own-deadline",
                            timeout, ClientSecurity.from_config(secured.librdkafka("SHORT")))
    try:
        _until(conn.reauth.due_at - 0.3)
        fetch = conn.send_only(apis.FETCH, _long_poll(topic, hold_ms),
                               deadline=time.monotonic() + TIMEOUT)
        _until(conn.reauth.due_at)  # the new request's deadline is past the held answer
        metadata = conn.send_only(apis.METADATA, _metadata,
                                  deadline=time.monotonic() + TIMEOUT)
        assert conn.reauth.count == 1 and not conn.closed
        assert [conn.receive()[0] for _ in range(2)] == [fetch, metadata]
    finally:
        conn.close()


def test_acks_0_is_not_waited_for(secured):
    """A Produce with acks=0 gets no answer: the next request's answer is its own."""
    from oncelog import Admin
    from oncelog.client.network import calls
    from oncelog.protocol.records import encode_batch

    topic = "reauth-acks-0"
    with Admin({"bootstrap.servers": secured.bootstrap("PLAINTEXT")}) as admin:
        admin.create_topic(topic, 1, 1)
    with BrokerConnection("127.0.0.1", secured.broker.ports["SHORT"], "acks-0", 2.0,
                          ClientSecurity.from_config(secured.librdkafka("SHORT"))) as conn:
        batch = encode_batch([(None, b"v", (), int(time.time() * 1000))])
        assert calls.produce(conn, topic, 0, batch, acks=0) == -1
        assert conn.call(apis.METADATA, _metadata).brokers
        assert not conn.closed


def test_what_waited_behind_the_exchange_goes_out_whatever_became_of_the_others(secured):
    """Row C5 on the asyncio connection: a waiting request cancelled meanwhile is not sent,
    one whose encoder fails gets that error as RequestNotSent (nothing of it was written: a
    producer must not take its batch for maybe stored); the request behind them goes out
    all the same."""
    from oncelog.client.network.connection import RequestNotSent

    async def run() -> list:
        conn = await AsyncBrokerConnection.open(
            "127.0.0.1", secured.broker.ports["SHORT"], "dispatch", TIMEOUT,
            ClientSecurity.from_config(secured.librdkafka("SHORT")))
        await asyncio.sleep(max(0.0, conn.reauth.due_at - time.monotonic()))
        first = conn.request(apis.METADATA, _metadata)  # begins the exchange
        assert conn.reauth.running
        conn.request(apis.METADATA, _metadata, expect_response=False).cancel()

        def broken(_version, _correlation, _client_id):
            raise ValueError("cannot encode")

        bad = conn.request_encoded(apis.METADATA, broken, lambda _version, _frame: None)
        last = conn.request(apis.METADATA, _metadata)
        try:  # bounded: stranded, they would never resolve
            return [*await asyncio.wait_for(asyncio.gather(
                first, bad, last, return_exceptions=True), 5), conn.closed]
        finally:
            conn.close()

    first, bad, last, closed = asyncio.run(run())
    assert first.brokers and last.brokers and not closed
    assert isinstance(bad, RequestNotSent) and "cannot encode" in str(bad), repr(bad)


def test_an_idempotent_producers_batch_behind_a_refused_exchange_was_not_sent(secured):
    """A Produce that waited behind a re-authentication the broker refused was never written:
    the idempotent producer treats it as not sent (it may be sent again under a new
    sequence), not as maybe stored: when it then fails, it fails with the reason, not as
    OutcomeUnknown."""
    from oncelog import Admin, Producer
    from oncelog.client.admin.admin_scram import ScramUpsertion
    from oncelog.client.network.connection import OutcomeUnknown

    user, mechanism, topic = "reauth-erin", "SCRAM-SHA-256", "reauth-not-sent"
    conf = {"bootstrap.servers": secured.bootstrap("SHORT"), "security.protocol": "sasl_plaintext",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": "first"}
    with Admin({"bootstrap.servers": secured.bootstrap("PLAINTEXT")}) as admin:
        admin.create_topic(topic, 1, 1)
        assert admin.alter_user_scram_credentials([ScramUpsertion(user, mechanism, "first")]) \
            == {user: None}
        producer = Producer({**conf, "enable.idempotence": True, "acks": "all",
                             "delivery.timeout.ms": 3000, "request.timeout.ms": 2000})
        delivered: list = []
        try:
            producer.produce(topic, b"warm", on_delivery=lambda e, m: delivered.append(e))
            producer.flush(TIMEOUT)
            assert delivered == [None]
            conns = list(producer._core.sender.connections.values())
            assert admin.alter_user_scram_credentials([ScramUpsertion(user, mechanism,
                                                                      "second")]) == {user: None}
            _until(max(conn.reauth.due_at for conn in conns))
            producer.produce(topic, b"late", on_delivery=lambda e, m: delivered.append(e))
            producer.flush(TIMEOUT)
        except Exception as exc:  # flush raises the first delivery error
            delivered.append(exc)
        finally:
            producer.close()
            admin.alter_user_scram_credentials(deletions=[(user, mechanism)])
    assert len(delivered) >= 2 and delivered[1] is not None, delivered
    assert not any(isinstance(e, OutcomeUnknown) for e in delivered), delivered


_SENTINEL_MS = 1_234_567  # replaced on the wire by a lifetime no timedelta can hold


def _sasl_plain_answers(conn: socket.socket, lifetime: datetime.timedelta):
    """Requests read from ``conn`` until it closes: ApiVersions answered as oncelog's broker
    does and SASL PLAIN accepted with a session lifetime of ``lifetime``; every other one is
    yielded as (api_key, version, correlation) for the caller to answer."""
    from oncelog.broker.apis.api_meta import api_versions_body
    from oncelog.protocol.messages import encode_response, peek_header
    from oncelog.protocol.schema import response_module

    while (head := conn.recv(4, socket.MSG_WAITALL)) and len(head) == 4:
        frame = conn.recv(int.from_bytes(head, "big"), socket.MSG_WAITALL)
        api_key, version, correlation = peek_header(frame)
        mod = response_module(api_key, version)
        if api_key == apis.API_VERSIONS_KEY:
            body = api_versions_body(version)
        elif api_key == apis.SASL_HANDSHAKE:
            body = build(mod.SaslHandshakeResponse, error_code=ErrorCode.none,
                         mechanisms=("PLAIN",))
        elif api_key == apis.SASL_AUTHENTICATE:
            body = build(mod.SaslAuthenticateResponse, error_code=ErrorCode.none,
                         error_message=None, auth_bytes=b"", session_lifetime=lifetime)
        else:
            yield api_key, version, correlation
            continue
        conn.sendall(encode_response(api_key, version, correlation, body)
                     .replace(_SENTINEL_MS.to_bytes(8, "big"), (1 << 62).to_bytes(8, "big")))


def _hostile_broker(server: socket.socket) -> None:
    """One connection: ApiVersions answered as oncelog's broker does, SASL PLAIN accepted,
    with a session lifetime of 2**62 ms (kio cannot decode it into a timedelta)."""
    conn, _ = server.accept()
    conn.settimeout(TIMEOUT)
    with conn:
        for _ in _sasl_plain_answers(conn, datetime.timedelta(milliseconds=_SENTINEL_MS)):
            break  # the client sent something past authenticating: done


def test_a_lifetime_too_large_to_decode_fails_as_a_kafka_error():
    """A broker telling a session lifetime of 2**62 ms: the answer does not decode, which the
    blocking connection and a broker's inter-broker connection report as their own errors
    (KafkaError, InterBrokerConnectFailed), the connection closed, not as a ValueError."""
    from types import SimpleNamespace

    from oncelog.broker.inter_broker_connect import (
        InterBrokerConnectFailed,
        InterBrokerSecurity,
        open_connection,
    )
    from oncelog.client.network.connection import KafkaError
    from oncelog.cluster.znodes import BrokerRegistration

    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(TIMEOUT)
        port = server.getsockname()[1]
        hostile = threading.Thread(target=_hostile_broker, args=(server,))
        hostile.start()
        with pytest.raises(KafkaError) as failed:
            BrokerConnection("127.0.0.1", port, "hostile", TIMEOUT, ClientSecurity.from_config(
                {"security.protocol": "sasl_plaintext", "sasl.mechanism": "PLAIN",
                 "sasl.username": "alice", "sasl.password": "x"}))
        hostile.join(TIMEOUT)
        assert failed.value.name() == "NETWORK_EXCEPTION"
        assert not hostile.is_alive()  # the connection was closed

        hostile = threading.Thread(target=_hostile_broker, args=(server,))
        hostile.start()
        broker = SimpleNamespace(
            broker_id=9,
            inter_broker_security=InterBrokerSecurity("SASL", "SASL_PLAINTEXT", None, "PLAIN",
                                                      "alice", "x"),
            cluster=SimpleNamespace(brokers=(BrokerRegistration(
                1, "127.0.0.1", port, None, (("SASL", "127.0.0.1", port, "SASL_PLAINTEXT"),)),)))
        with pytest.raises(InterBrokerConnectFailed):
            asyncio.run(open_connection(broker, 1))
        hostile.join(TIMEOUT)
        assert not hostile.is_alive()


def test_a_refused_reauthentication_still_delivers_the_answers_it_read(secured):
    """The consumer group's coordinator IO: request A is answered before the point; B, past
    it, re-authenticates, reading A's answer on the way, and is refused (the password
    changed). A's answer reaches A's handler; B alone fails."""
    from oncelog import Admin, Consumer
    from oncelog.client.admin.admin_scram import ScramUpsertion

    user, mechanism = "reauth-frank", "SCRAM-SHA-256"
    conf = {"bootstrap.servers": secured.bootstrap("SHORT"), "security.protocol": "sasl_plaintext",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": "first"}
    with Admin({"bootstrap.servers": secured.bootstrap("PLAINTEXT")}) as admin:
        assert admin.alter_user_scram_credentials([ScramUpsertion(user, mechanism, "first")]) \
            == {user: None}
        try:
            with Consumer({**conf, "group.id": user}) as consumer:
                group = consumer._require_group()
                group.find_coordinator()
                conn = group._coordinator_connection()
                answers: list = []
                _until(conn.reauth.due_at - 0.3)
                group._send(apis.METADATA, _metadata, time.monotonic() + TIMEOUT,
                            lambda response, error: answers.append(("A", response, error)))
                assert admin.alter_user_scram_credentials([ScramUpsertion(
                    user, mechanism, "second")]) == {user: None}
                _until(conn.reauth.due_at)
                group._send(apis.METADATA, _metadata, time.monotonic() + TIMEOUT,
                            lambda response, error: answers.append(("B", response, error)))
                assert conn.closed
        finally:
            admin.alter_user_scram_credentials(deletions=[(user, mechanism)])
    assert [(name, error is None) for name, _, error in answers] == [("A", True), ("B", False)]
    assert answers[0][1].brokers and answers[1][2].name() == "SASL_AUTHENTICATION_FAILED"


def test_an_answer_kept_during_a_reauthentication_survives_the_coordinator_moving(secured):
    """A is answered before the point; B, past it, re-authenticates, reading A's answer on
    the way, and the broker holds B. The coordinator then moves: the next send closes the
    old connection, and A, whose answer was read, gets it (before: A was told failed, a
    commit that did commit reported failed); B alone fails."""
    from oncelog import Admin, Consumer

    topic = "reauth-kept-moved"
    with Admin({"bootstrap.servers": secured.bootstrap("PLAINTEXT")}) as admin:
        admin.create_topic(topic, 1, 1)
    with Consumer({**secured.librdkafka("SHORT"), "group.id": topic}) as consumer:
        group = consumer._require_group()
        group.find_coordinator()
        conn = group._coordinator_connection()
        answers: list = []
        _until(conn.reauth.due_at - 0.3)
        group._send(apis.METADATA, _metadata, time.monotonic() + TIMEOUT,
                    lambda response, error: answers.append(("A", response, error)))
        _until(conn.reauth.due_at)
        group._send(apis.FETCH, _long_poll(topic, 5000), time.monotonic() + TIMEOUT,
                    lambda response, error: answers.append(("B", response, error)))
        assert conn.reauth.count == 1 and conn.has_buffered_answer()
        with group.lock:  # the same broker under another node id: a move for the IO
            node, host, port = group.membership.coordinator
            group.membership.on_coordinator(node + 1000, host, port)
        group._send(apis.METADATA, _metadata, time.monotonic() + TIMEOUT,
                    lambda response, error: answers.append(("C", response, error)))
        assert conn.closed
        group._pump(TIMEOUT)
    assert [(name, error is None) for name, _, error in answers] == \
        [("A", True), ("B", False), ("C", True)], answers
    assert answers[0][1].brokers


def test_a_blocking_drain_gives_up_at_the_new_requests_deadline(secured):
    """Row C7 (b): a request in flight the broker holds (a long poll, as a JoinGroup through
    a rebalance) does not hold a new request past the new one's own deadline: that one
    fails not sent, the held request and the connection go on, and the next send drains on
    (before: the new request waited for the held answer, whatever its deadline)."""
    from oncelog import Admin
    from oncelog.client.network.connection import RequestNotSent

    topic, hold_ms = "reauth-new-deadline", 1500
    with Admin({"bootstrap.servers": secured.bootstrap("PLAINTEXT")}) as admin:
        admin.create_topic(topic, 1, 1)
    conn = BrokerConnection("127.0.0.1", secured.broker.ports["SHORT"], "new-deadline",
                            TIMEOUT, ClientSecurity.from_config(secured.librdkafka("SHORT")))
    try:
        _until(conn.reauth.due_at - 0.3)
        fetch = conn.send_only(apis.FETCH, _long_poll(topic, hold_ms),
                               deadline=time.monotonic() + TIMEOUT)
        _until(conn.reauth.due_at)
        with pytest.raises(RequestNotSent):
            conn.send_only(apis.METADATA, _metadata, deadline=time.monotonic() + 0.2)
        assert conn.reauth.count == 0 and not conn.closed
        metadata = conn.send_only(apis.METADATA, _metadata)  # drains the fetch, then C3
        assert conn.reauth.count == 1 and not conn.closed
        assert [conn.receive()[0] for _ in range(2)] == [fetch, metadata]
    finally:
        conn.close()


def test_the_groups_request_not_sent_behind_a_held_answer_leaves_the_connection(secured):
    """Row C7 (b) in the consumer group's coordinator IO: A, held by the broker (a JoinGroup
    through a rebalance, a long poll here), is in flight when B, past the point with a short
    deadline, cannot wait for A's answer: B fails not sent, A and the connection go on
    (before: the connection was failed, A with it)."""
    from oncelog import Admin, Consumer
    from oncelog.client.network.connection import RequestNotSent

    topic = "reauth-group-not-sent"
    with Admin({"bootstrap.servers": secured.bootstrap("PLAINTEXT")}) as admin:
        admin.create_topic(topic, 1, 1)
    with Consumer({**secured.librdkafka("SHORT"), "group.id": topic}) as consumer:
        group = consumer._require_group()
        group.find_coordinator()
        conn = group._coordinator_connection()
        answers: list = []
        _until(conn.reauth.due_at - 0.3)
        group._send(apis.FETCH, _long_poll(topic, 1500), time.monotonic() + TIMEOUT,
                    lambda response, error: answers.append(("A", response, error)))
        _until(conn.reauth.due_at)
        group._send(apis.METADATA, _metadata, time.monotonic() + 0.2,
                    lambda response, error: answers.append(("B", response, error)))
        assert [(name, type(error)) for name, _, error in answers] == [("B", RequestNotSent)]
        assert group._conn is conn and not conn.closed
        group._pump(TIMEOUT)
        assert [(name, error) for name, _, error in answers[1:]] == [("A", None)], answers


def _trickling_broker(server: socket.socket, stop: threading.Event, connections: int) -> None:
    """ApiVersions and SASL PLAIN answered (a session lifetime of 2 s), then every other
    request answered by a frame of 1 MiB whose bytes come one per 50 ms, until ``stop``: each
    recv of the client's gets a byte within its socket timeout, the frame never ends."""
    for _ in range(connections):
        conn, _ = server.accept()
        conn.settimeout(TIMEOUT)
        with conn:
            for _, _, correlation in _sasl_plain_answers(conn, datetime.timedelta(seconds=2)):
                conn.sendall((1 << 20).to_bytes(4, "big") + correlation.to_bytes(4, "big"))
                try:
                    while not stop.wait(0.05):
                        conn.sendall(b"\0")
                except OSError:
                    pass  # the client gave up and closed
                break


def test_a_trickled_answer_holds_no_read_past_its_timeout():
    """A broker that trickles an answer (a byte well within each recv's timeout, the frame
    never complete) holds neither a call nor the drain before a re-authentication (row C7)
    past the connection's timeout: the call fails with a timeout, the new request behind the
    drain fails not sent, each with its connection closed (before: both read on for as long
    as the bytes came)."""
    from oncelog.client.network.connection import KafkaTimeout

    timeout, stop = 1.5, threading.Event()
    security = ClientSecurity.from_config({"security.protocol": "sasl_plaintext",
                                           "sasl.mechanism": "PLAIN", "sasl.username": "alice",
                                           "sasl.password": "x"})
    outcomes: list = []

    def client(port: int) -> None:
        with BrokerConnection("127.0.0.1", port, "trickled", timeout, security) as conn:
            try:
                conn.call(apis.METADATA, _metadata)
            except Exception as exc:
                outcomes.append((type(exc), conn.closed))
        with BrokerConnection("127.0.0.1", port, "trickled", timeout, security) as conn:
            conn.send_only(apis.METADATA, _metadata)  # within the timeout: no deadline
            _until(conn.reauth.due_at)
            try:
                conn.send_only(apis.METADATA, _metadata, deadline=time.monotonic() + 0.5)
            except Exception as exc:
                outcomes.append((type(exc), conn.closed))

    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(TIMEOUT)
        broker = threading.Thread(target=_trickling_broker, args=(server, stop, 2))
        broker.start()
        caller = threading.Thread(target=client, args=(server.getsockname()[1],))
        caller.start()
        caller.join(10 * timeout)  # bounded: a client still reading then never stops
        stop.set()
        caller.join(TIMEOUT)
        broker.join(TIMEOUT)
    assert outcomes == [(KafkaTimeout, True), (RequestNotSent, True)]
