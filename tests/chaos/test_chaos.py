"""The chaos proxy's rules, the seeds' four flows, and real clients through faults."""

import socket
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from support.broker_forks import run_oncelog
from support.brokers import create_topic

import oncelog
from oncelog.chaos.diagram import render_html
from oncelog.chaos.proxy import ChaosProxy
from oncelog.chaos.rules import Action, Rule
from oncelog.chaos.scenarios import SCENARIOS, run_scenario
from oncelog.client.network.connection import connect
from oncelog.protocol import api_versions as apis


@pytest.fixture
def proxy(broker):
    with ChaosProxy(("127.0.0.1", broker.port)) as p:
        yield p


def read_values(bootstrap: str, topic: str, partition: int = 0) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, partition, 0)])
    values = []
    try:
        for _ in range(1000):
            msg = consumer.poll(10)
            assert msg is not None, f"timed out after {len(values)} records"
            if msg.error():
                break  # partition EOF
            values.append(msg.value())
    finally:
        consumer.close()
    return values


def faulty_producer(bootstrap: str) -> Producer:
    """One record per request, short timeouts: each rule hits exactly one record."""
    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                     "batch.num.messages": 1, "linger.ms": 0, "socket.timeout.ms": 2000,
                     "request.timeout.ms": 2000, "message.timeout.ms": 60000,
                     "retry.backoff.ms": 50})


def produce_all(producer: Producer, topic: str, n: int) -> list:
    reports = []
    for i in range(n):
        producer.produce(topic, value=b"%d" % i, partition=0,
                         on_delivery=lambda err, msg: reports.append(err))
    assert producer.flush(60) == 0
    return reports


# --- rules ----------------------------------------------------------------------------------

def test_rule_parsing():
    rule = Rule.parse(Action.DROP_RESPONSE, "produce:3,4")
    assert (rule.api_key, rule.occurrences, rule.topic) == (apis.PRODUCE, {3, 4}, None)
    rule = Rule.parse(Action.DELAY_REQUEST, "fetch[orders-2]:1=1500")
    assert (rule.topic, rule.partition, rule.delay_ms) == ("orders", 2, 1500)
    assert rule.describe() == "delay-request fetch[orders-2]:1=1500"
    for action, spec, message in [
        (Action.DROP_REQUEST, "nope:1", "unknown API 'nope'"),
        (Action.DROP_REQUEST, "produce", "expected API"),
        (Action.DELAY_RESPONSE, "produce:1", "needs =MILLIS"),
        (Action.DROP_RESPONSE, "produce:1=5", "takes no =MILLIS"),
        (Action.EMPTY_RESPONSE, "produce:1", "only for fetch"),
    ]:
        with pytest.raises(ValueError, match=message):
            Rule.parse(action, spec)


def test_metadata_points_clients_at_the_proxy(broker, proxy):
    metadata = AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(timeout=10)
    assert [(b.host, b.port) for b in metadata.brokers.values()] == [proxy.address]


def test_drop_request_is_never_seen_by_the_broker(broker, proxy):
    create_topic(broker.bootstrap, "dropped")
    proxy.add_rule(Rule.parse(Action.DROP_REQUEST, "produce:2"))
    produce_all(faulty_producer(proxy.bootstrap), "dropped", 4)
    assert read_values(broker.bootstrap, "dropped") == [b"0", b"1", b"2", b"3"]
    assert [e.what for e in proxy.events if e.what == "drop-request"] == ["drop-request"]


def test_dropped_response_and_cut_connection_are_retried_without_duplicates(broker, proxy):
    create_topic(broker.bootstrap, "lost-acks")
    proxy.add_rule(Rule.parse(Action.DROP_RESPONSE, "produce:2,3"))
    proxy.add_rule(Rule.parse(Action.CUT_AFTER_REQUEST, "produce:6"))
    reports = produce_all(faulty_producer(proxy.bootstrap), "lost-acks", 8)
    assert reports == [None] * 8
    assert read_values(broker.bootstrap, "lost-acks") == [b"%d" % i for i in range(8)]
    fired = [e.what for e in proxy.events if e.what != "forwarded"]
    assert fired == ["drop-response", "drop-response", "cut-after-request"]


def test_duplicated_request_is_stored_once(broker, proxy):
    create_topic(broker.bootstrap, "twice")
    proxy.add_rule(Rule.parse(Action.DUPLICATE_REQUEST, "produce:1,3"))
    produce_all(faulty_producer(proxy.bootstrap), "twice", 4)
    assert read_values(broker.bootstrap, "twice") == [b"0", b"1", b"2", b"3"]
    assert sum(e.what == "ate duplicate's answer" for e in proxy.events) == 2


def test_delays_hold_frames(broker, proxy):
    proxy.add_rule(Rule.parse(Action.DELAY_RESPONSE, "api-versions:1=400"))
    proxy.add_rule(Rule.parse(Action.DELAY_REQUEST, "metadata:1=300"))
    start = time.monotonic()
    with connect(proxy.bootstrap) as conn:  # negotiates versions through the delayed answer
        assert conn.versions
    assert time.monotonic() - start >= 0.4
    kinds = [e.what for e in proxy.events if e.what.startswith("delay")]
    assert kinds == ["delay-response"]


def test_empty_fetch_answers_keep_their_offsets_and_are_read_past(broker, proxy):
    """Fetch answers emptied of their records: librdkafka and oncelog.Consumer just fetch
    again and read everything."""
    create_topic(broker.bootstrap, "emptied")
    produce_all(faulty_producer(broker.bootstrap), "emptied", 4)
    proxy.add_rule(Rule.parse(Action.EMPTY_RESPONSE, "fetch:1,2,3"))
    assert read_values(proxy.bootstrap, "emptied") == [b"0", b"1", b"2", b"3"]
    with oncelog.Consumer({"bootstrap.servers": proxy.bootstrap,
                           "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([oncelog.TopicPartition("emptied", 0)])
        proxy.add_rule(Rule.parse(Action.EMPTY_RESPONSE, "fetch:1,2,3"))
        assert [r.value for r in consumer] == [b"0", b"1", b"2", b"3"]
    assert [e.what for e in proxy.events].count("empty-response") == 6


def test_partition_filter_counts_only_that_partition(broker, proxy):
    create_topic(broker.bootstrap, "two", partitions=2)
    proxy.add_rule(Rule.parse(Action.DROP_REQUEST, "produce[two-1]:1"))
    producer = faulty_producer(proxy.bootstrap)
    for partition in (0, 0, 1, 1):
        producer.produce("two", value=b"p%d" % partition, partition=partition)
    assert producer.flush(60) == 0
    assert read_values(broker.bootstrap, "two", 0) == [b"p0", b"p0"]
    assert read_values(broker.bootstrap, "two", 1) == [b"p1", b"p1"]
    assert [e.what for e in proxy.events].count("drop-request") == 1


# --- the seeds' flows -----------------------------------------------------------------------

# failover kills brokers of a cluster of its own: tests/cluster/test_failover_scenario.py
@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != "failover"])
def test_seed_flow(broker, name, tmp_path):
    outcome = run_scenario(name, broker.bootstrap)
    assert outcome.passed, outcome.verdict
    assert outcome.log == outcome.expected
    page = render_html(outcome)
    assert "<svg" in page and outcome.verdict in page
    if name in ("missing-acks", "missing-records", "cache-missed"):
        assert any(step.lost for step in outcome.steps)
    if name == "cache-missed":
        assert any(step.tone == "duplicate" for step in outcome.steps)
    if name == "missing-records":
        assert any("epoch bump" in step.text for step in outcome.steps)


def test_scenario_command(broker, tmp_path):
    out = tmp_path / "flow.html"
    result = run_oncelog("scenario", "cache-missed", "--bootstrap-server", broker.bootstrap,
                         "--out", str(out), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("cache-missed: PASS: no duplicate, no reordering")
    assert "<svg" in out.read_text()
    listed = run_oncelog("scenario", "--list", timeout=60)
    assert listed.stdout.split()[::1][0] == "success"
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == list(SCENARIOS)


# --- flows 2 and 3 with confluent-kafka through the proxy ------------------------------------

def test_flow_missing_acks_with_confluent_kafka(broker, proxy):
    """Five batches A-E in flight, the ACKs of D and E lost: stored once each."""
    create_topic(broker.bootstrap, "flow2")
    proxy.add_rule(Rule.parse(Action.DROP_RESPONSE, "produce:4,5"))
    assert produce_all(faulty_producer(proxy.bootstrap), "flow2", 5) == [None] * 5
    assert read_values(broker.bootstrap, "flow2") == [b"0", b"1", b"2", b"3", b"4"]


def test_flow_missing_records_with_confluent_kafka(broker, proxy):
    """Batch C lost on the way, D and E out of order: all five once, in order."""
    create_topic(broker.bootstrap, "flow3")
    proxy.add_rule(Rule.parse(Action.DROP_REQUEST, "produce:3"))
    assert produce_all(faulty_producer(proxy.bootstrap), "flow3", 5) == [None] * 5
    assert read_values(broker.bootstrap, "flow3") == [b"0", b"1", b"2", b"3", b"4"]


# --- the command line -----------------------------------------------------------------------

def test_proxy_command_serves_until_stopped(broker):
    proc = subprocess.Popen(
        [sys.executable, "-m", "oncelog", "chaos", "proxy", "--upstream", broker.bootstrap,
         "--drop-response", "produce:1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("chaos proxy listening on 127.0.0.1:"), line
        address = line.split()[4].rstrip(",")
        host, port = address.split(":")
        with socket.create_connection((host, int(port)), timeout=10):
            pass
        assert "rule: drop-response produce:1" in proc.stdout.readline()
    finally:
        proc.terminate()
        assert proc.wait(20) == 0


def test_proxy_command_refuses_bad_rules():
    result = subprocess.run(
        [sys.executable, "-m", "oncelog", "chaos", "proxy", "--upstream", "127.0.0.1:1",
         "--drop-response", "produce"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "expected API" in result.stderr
