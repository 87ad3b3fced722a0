"""Quotas and connection limits on a real broker, with clients we did not write: a
confluent-kafka producer over its producer_byte_rate is held near the quota (and told so in
throttle_time_ms) while another client id keeps its throughput; AlterClientQuotas and
DescribeClientQuotas encoded by kafka-python; max.connections.per.ip closing the extra
connection of one address while the others are served; an idle connection closed after
connections.max.idle.ms.

One broker for the module, with quota.window.num=2 (a new client's burst is one window of
its quota, not Kafka's ten, so a few seconds show the steady rate), max.connections.per.ip=2
for every address but 127.0.0.1 (the clients' own), and connections.max.idle.ms=1500.
"""

from __future__ import annotations

import datetime
import socket
import struct
import threading
import time
import urllib.request
import uuid

import pytest
from confluent_kafka import Producer
from kafka.protocol.admin.client_quotas import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)
from support.brokers import BrokerProcess, create_topic

from oncelog.client.network.connection import connect
from oncelog.protocol import api_versions as apis
from oncelog.protocol.schema import build

IO_TIMEOUT = 20.0
QUOTA = 200_000  # bytes per second
IDLE_MS = 1500


@pytest.fixture(scope="module")
def qbroker(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("quotas") / "broker", {
        "quota.window.num": "2", "max.connections.per.ip": "2",
        "max.connections.per.ip.overrides": "127.0.0.1:1000",
        "connections.max.idle.ms": str(IDLE_MS)}).start()
    yield broker
    assert broker.stop() == 0
    assert "Traceback" not in broker.log_text(), broker.log_text()


def _exchange(port: int, request, response_cls, version: int, source: str = "127.0.0.1"):
    request.with_header(correlation_id=7, client_id="quota-admin")
    with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT,
                                  source_address=(source, 0)) as sock:
        sock.sendall(request.encode(version=version, header=True, framed=True))
        (size,) = struct.unpack(">i", _recv(sock, 4))
        return response_cls.decode(_recv(sock, size), version=version, header=True)


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed by the broker")
        buf += chunk
    return bytes(buf)


def _alter(port, entries, validate_only=False, version=1):
    request = AlterClientQuotasRequest(version=version, validate_only=validate_only, entries=[
        AlterClientQuotasRequest.EntryData(
            entity=[AlterClientQuotasRequest.EntryData.EntityData(entity_type=t, entity_name=n)
                    for t, n in entity],
            ops=[AlterClientQuotasRequest.EntryData.OpData(key=k, value=float(v or 0),
                                                          remove=v is None)
                 for k, v in ops])
        for entity, ops in entries])
    answer = _exchange(port, request, AlterClientQuotasResponse, version)
    return [(e.error_code, e.error_message) for e in answer.entries]


def _describe(port, components, strict=False, version=1):
    request = DescribeClientQuotasRequest(version=version, strict=strict, components=[
        DescribeClientQuotasRequest.ComponentData(entity_type=t, match_type=m, match=n)
        for t, m, n in components])
    answer = _exchange(port, request, DescribeClientQuotasResponse, version)
    entries = {tuple((e.entity_type, e.entity_name) for e in entry.entity):
               {v.key: v.value for v in entry.values} for entry in answer.entries or ()}
    return answer.error_code, entries


def test_alter_and_describe_client_quotas(qbroker):
    port = qbroker.port
    c = ("client-id", "admin-test")
    # validate_only checks and changes nothing
    assert _alter(port, [([c], [("producer_byte_rate", 4096)])], validate_only=True) == \
        [(0, None)]
    assert _describe(port, [("client-id", 0, "admin-test")]) == (0, {})
    results = _alter(port, [
        ([c], [("producer_byte_rate", 4096), ("request_percentage", 12.5)]),
        ([("user", None), ("client-id", None)], [("consumer_byte_rate", 1 << 20)]),
        ([("user", "x"), ("ip", "1.2.3.4")], [("producer_byte_rate", 1)]),  # bad combination
        ([("client-id", "other")], [("no_such_key", 5)]),  # unknown key
        ([("client-id", "other")], [("producer_byte_rate", -1)]),  # bad value
    ], version=0)
    assert [code for code, _ in results] == [0, 0, 42, 42, 42]  # INVALID_REQUEST
    assert "Invalid configuration key no_such_key" in results[3][1]
    code, found = _describe(port, [("client-id", 0, "admin-test")])
    assert code == 0
    assert found == {(("client-id", "admin-test"),): {"producer_byte_rate": 4096.0,
                                                       "request_percentage": 12.5}}
    code, found = _describe(port, [("user", 1, None)], strict=True, version=0)
    assert found == {}  # strict: the default user entity also names a client id
    code, found = _describe(port, [("user", 1, None)])
    assert found == {(("client-id", None), ("user", None)): {"consumer_byte_rate": 1048576.0}}
    assert _describe(port, [("topic", 2, None)])[0] == 35  # UNSUPPORTED_VERSION
    # removing keys; the entity goes with its last key
    assert _alter(port, [([c], [("producer_byte_rate", None), ("request_percentage", None)]),
                         ([("user", None), ("client-id", None)],
                          [("consumer_byte_rate", None)])]) == [(0, None), (0, None)]
    assert _describe(port, [])[1] == {}


def test_a_producer_over_its_quota_is_held_near_it_and_others_are_not(qbroker):
    create_topic(qbroker.bootstrap, "quota-flood")
    assert _alter(qbroker.port, [([("client-id", "flooder")],
                                  [("producer_byte_rate", QUOTA)])]) == [(0, None)]
    duration = 4.0
    measured_from = 1.5  # past the first window's burst
    results: dict[str, dict] = {}
    start = threading.Barrier(2)

    def produce(client_id: str) -> None:
        throttles: list[int] = []
        delivered: list[tuple[float, int]] = []
        producer = Producer({
            "bootstrap.servers": qbroker.bootstrap, "client.id": client_id,
            "linger.ms": 5, "batch.size": 16384, "queue.buffering.max.kbytes": 512,
            "throttle_cb": lambda event: throttles.append(event.throttle_time)})

        def done(err, msg) -> None:
            if err is None:
                delivered.append((time.monotonic(), len(msg.value())))

        value = b"x" * 1000
        producer.produce("quota-flood", value, on_delivery=done)
        producer.flush(IO_TIMEOUT)  # connected and the topic known before the clock starts
        delivered.clear()
        start.wait(IO_TIMEOUT)
        t0 = time.monotonic()
        while time.monotonic() - t0 < duration:
            try:
                producer.produce("quota-flood", value, on_delivery=done)
            except BufferError:
                producer.poll(0.01)
                continue
            producer.poll(0)
        producer.poll(0)
        producer.purge()
        producer.flush(IO_TIMEOUT)
        steady = sum(n for t, n in delivered if t0 + measured_from <= t < t0 + duration)
        results[client_id] = {"rate": steady / (duration - measured_from),
                              "throttles": throttles}

    threads = [threading.Thread(target=produce, args=(name,)) for name in ("flooder", "free")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(IO_TIMEOUT * 3)
    flooder, free = results["flooder"], results["free"]
    ratio = flooder["rate"] / QUOTA
    print(f"flooder {flooder['rate']:.0f} B/s = {ratio:.2f} of its quota; free client "
          f"{free['rate']:.0f} B/s = {free['rate'] / flooder['rate']:.1f}x the flooder; "
          f"throttle times seen {sorted(flooder['throttles'])[-3:]}")
    assert 0.5 <= ratio <= 1.5
    assert flooder["throttles"] and max(flooder["throttles"]) > 0
    assert not free["throttles"]
    assert free["rate"] >= 5 * QUOTA
    assert _metric(qbroker, "oncelog_throttled_answers_total") > 0


def test_max_connections_per_ip_closes_the_extra_one(qbroker):
    port = qbroker.port
    with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT,
                                  source_address=("127.0.0.2", 0)) as one, \
            socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT,
                                     source_address=("127.0.0.2", 0)) as two:
        with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT,
                                      source_address=("127.0.0.2", 0)) as three:
            assert three.recv(1) == b""  # closed at accept
        # the two first still serve, and so does another address
        for sock in (one, two):
            _api_versions(sock)
        assert _describe(port, [])[0] == 0
        with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT,
                                      source_address=("127.0.0.3", 0)) as other:
            _api_versions(other)
    assert "already has max.connections.per.ip (2) connections" in qbroker.log_text()
    assert _metric(qbroker, "oncelog_connections_refused_total") >= 1


def _metric(broker, name: str) -> float:
    with urllib.request.urlopen(broker.metrics_url, timeout=IO_TIMEOUT) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def _api_versions(sock: socket.socket) -> None:
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

    request = ApiVersionsRequest(version=0)
    request.with_header(correlation_id=1, client_id="limits")
    sock.sendall(request.encode(version=0, header=True, framed=True))
    (size,) = struct.unpack(">i", _recv(sock, 4))
    assert ApiVersionsResponse.decode(_recv(sock, size), version=0, header=True).error_code == 0


def test_an_idle_connection_is_closed(qbroker):
    """The idle one is closed after connections.max.idle.ms, while one that sends a request
    every tenth of that time all along stays open."""
    busy = connect(qbroker.bootstrap, client_id="busy")
    try:
        with socket.create_connection(("127.0.0.1", qbroker.port),
                                      timeout=IO_TIMEOUT) as sock:
            _api_versions(sock)
            started = time.monotonic()
            sock.settimeout(IDLE_MS / 10_000)  # the busy client's pace
            while True:
                assert time.monotonic() - started < IO_TIMEOUT, "the idle one stays open"
                try:
                    assert sock.recv(1) == b""  # closed by the broker
                    break
                except TimeoutError:
                    _busy_call(busy)
            idle = time.monotonic() - started
        _busy_call(busy)  # still served
    finally:
        busy.close()
    print(f"idle connection closed after {idle:.2f} s (connections.max.idle.ms={IDLE_MS})")
    assert IDLE_MS / 1000 <= idle + 0.05


def _busy_call(conn) -> None:
    conn.call(apis.API_VERSIONS_KEY, lambda mod, v: mod.ApiVersionsRequest(
        client_software_name="t", client_software_version="1"))


def _fetch(conn, topic: str):
    def make(mod, version):  # build: the fields this version has
        partition = build(mod.FetchPartition, partition=0, current_leader_epoch=-1,
                          fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
                          partition_max_bytes=1 << 20)
        return build(mod.FetchRequest, replica_id=-1, max_wait=datetime.timedelta(0),
                     min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
                     session_epoch=-1, topics=(build(mod.FetchTopic, topic=topic,
                                                     topic_id=uuid.UUID(int=0),
                                                     partitions=(partition,)),),
                     forgotten_topics_data=(), rack_id="")
    answer = conn.call(apis.FETCH, make)
    size = sum(len(p.records or b"") for t in answer.responses for p in t.partitions)
    return size, answer.throttle_time.total_seconds() * 1000


def test_a_consumer_over_its_quota_gets_an_empty_answer_and_a_throttle(qbroker):
    create_topic(qbroker.bootstrap, "quota-reads")
    producer = Producer({"bootstrap.servers": qbroker.bootstrap})
    for _ in range(10):  # ten batches of one record
        producer.produce("quota-reads", b"r" * 1000)
        assert producer.flush(IO_TIMEOUT) == 0
    assert _alter(qbroker.port, [([("client-id", "reader")], [("consumer_byte_rate", 25_000)]),
                                 ([("client-id", "capped")], [("consumer_byte_rate", 3_000)])]
                  ) == [(0, None), (0, None)]
    reader = connect(qbroker.bootstrap, client_id="reader")
    other = connect(qbroker.bootstrap, client_id="other-reader")
    try:
        answers = [_fetch(reader, "quota-reads")]
        while answers[-1][1] == 0 and len(answers) < 50:
            answers.append(_fetch(reader, "quota-reads"))
        first = answers[0][0]
        assert first > 10_000 and answers[1] == (first, 0)  # within the quota: served
        assert answers[-1][0] == 0 and answers[-1][1] > 0  # over it: empty, throttled
        assert _fetch(other, "quota-reads") == (first, 0)
        # a fetch reads at most what the quota allows over the span but one window (Kafka's
        # getMaxValueInQuotaWindow): served, not throttled forever for asking much
        capped = connect(qbroker.bootstrap, client_id="capped")
        size, throttle = _fetch(capped, "quota-reads")
        capped.close()
        assert 0 < size <= 3_000 and throttle == 0
    finally:
        reader.close()
        other.close()


def test_a_client_over_its_request_percentage_is_throttled_within_a_window(qbroker):
    assert _alter(qbroker.port, [([("client-id", "chatty")],
                                  [("request_percentage", 0.01)])]) == [(0, None)]
    chatty = connect(qbroker.bootstrap, client_id="chatty")
    try:
        for _ in range(200):
            answer = chatty.call(apis.METADATA, lambda mod, v: build(
                mod.MetadataRequest, topics=(), allow_auto_topic_creation=False,
                include_topic_authorized_operations=False))
            throttle = answer.throttle_time.total_seconds() * 1000
            if throttle:
                break
        assert 0 < throttle <= 1000  # the request quota's bound: one window
    finally:
        chatty.close()


def test_the_cli_sets_and_shows_quotas_as_kafka_configs_does(qbroker, capsys):
    from oncelog.cli.main import main

    def configs(*args: str) -> int:
        return main(["configs", *args, "--bootstrap-server", qbroker.bootstrap])

    assert configs("alter", "--entity-type", "clients", "--entity-name", "cli-client",
                   "--add-config", "producer_byte_rate=1024,consumer_byte_rate=2048") == 0
    assert configs("--alter", "--user", "alice", "--client-defaults",
                   "--add-config", "request_percentage=50") == 0
    assert configs("alter", "--entity-type", "clients", "--entity-name", "cli-client",
                   "--add-config", "bogus_rate=1") == 1
    assert _describe(qbroker.port, [("client-id", 0, "cli-client")], strict=True)[1] == {
        (("client-id", "cli-client"),): {"producer_byte_rate": 1024.0,
                                         "consumer_byte_rate": 2048.0}}
    capsys.readouterr()
    assert configs("describe", "--entity-type", "users") == 0  # users alone (Kafka's
    assert capsys.readouterr().out == ""                          # containsOnly filter)
    assert configs("describe", "--user", "alice", "--client-defaults") == 0
    assert capsys.readouterr().out.splitlines() == [
        "Quota configs for user-principal 'alice', the default client-id are "
        "request_percentage=50.0"]
    assert configs("alter", "--entity-type", "clients", "--entity-name", "cli-client",
                   "--delete-config", "producer_byte_rate,consumer_byte_rate") == 0
    assert configs("alter", "--user", "alice", "--client-defaults",
                   "--delete-config", "request_percentage") == 0
    assert _describe(qbroker.port, [("client-id", 0, "cli-client")])[1] == {}
    assert _describe(qbroker.port, [("user", 0, "alice")])[1] == {}


def test_an_address_over_its_connection_creation_rate_is_held_then_closed(qbroker):
    assert _alter(qbroker.port, [([("ip", "127.0.0.4")],
                                  [("connection_creation_rate", 1)])]) == [(0, None)]
    try:
        with socket.create_connection(("127.0.0.1", qbroker.port), timeout=IO_TIMEOUT,
                                      source_address=("127.0.0.4", 0)) as first:
            _api_versions(first)  # within the rate: served
            with socket.create_connection(("127.0.0.1", qbroker.port), timeout=IO_TIMEOUT,
                                          source_address=("127.0.0.4", 0)) as second:
                started = time.monotonic()
                with pytest.raises(ConnectionError):
                    _api_versions(second)  # never answered: closed after its throttle
                held = time.monotonic() - started
            _api_versions(first)
        print(f"second connection held {held:.2f} s, then closed")
        assert held <= 1.0 + 0.5  # at most one window (quota.window.size.seconds)
    finally:
        assert _alter(qbroker.port, [([("ip", "127.0.0.4")],
                                      [("connection_creation_rate", None)])]) == [(0, None)]


def test_max_connections_set_while_running_closes_connections_past_it(qbroker):
    """max.connections is dynamic (as Kafka's): set to what is open plus one, the next
    connection is served and one of those after it is closed at accept."""
    from oncelog.client.admin.admin import Admin
    from oncelog.client.admin.admin_configs import AlterConfigOp, ConfigResource

    cluster_default = ConfigResource("brokers", "")
    with Admin({"bootstrap.servers": qbroker.bootstrap}) as admin:
        admin.describe_configs([cluster_default])  # the admin's connections, all open first
        limit = int(_metric(qbroker, "oncelog_connections")) + 1
        assert admin.incremental_alter_configs(
            {cluster_default: [AlterConfigOp("max.connections", "SET", str(limit))]}
        ) == {cluster_default: None}
        opened = []
        try:
            refused = False
            for _ in range(10):  # connections of earlier tests may still be closing
                sock = socket.create_connection(("127.0.0.1", qbroker.port),
                                                timeout=IO_TIMEOUT)
                opened.append(sock)
                try:
                    _api_versions(sock)
                except ConnectionError:
                    refused = True
                    break
            assert refused and len(opened) >= 2
            _api_versions(opened[0])  # the ones within the limit still serve
        finally:
            for sock in opened:
                sock.close()
            assert admin.incremental_alter_configs(
                {cluster_default: [AlterConfigOp("max.connections", "DELETE")]}
            ) == {cluster_default: None}
    assert "already has max.connections (" in qbroker.log_text()
