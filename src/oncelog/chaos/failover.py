"""Seed 004, case 2, as a scenario: the leader of a partition dies and exactly-once holds.

Run against a cluster the caller owns (``Cluster``: it can kill, pause, resume and start each
broker; ``oncelog scenario failover`` starts ZooKeeper and three brokers for it). An
idempotent producer whose every request the flow decides writes the seed's batches A-E to a
topic with replication factor 3 and ``min.insync.replicas`` 2 (acks=all: every follower has
them, and built its producer state from them). Then the followers are paused, batch X goes
to the leader alone (its acks=all answer times out: stored there, never acknowledged), and
the leader is killed (``kill -9``); the followers resume. The controller elects a new leader
from the ISR at the next leader epoch. The producer, which never heard the answers of its
last five batches, retries them there: each is answered with its original offset, because
the new leader's producer state knows them. X's retry is stored once, then Y. The old leader
comes back as a follower, truncates the X only it had (epoch e ends before it, says
OffsetForLeaderEpoch) and fetches the new leader's log. Read back: every record once, in
order.
"""

from __future__ import annotations

import time
from typing import Protocol

from kio.schema.errors import ErrorCode

from ..client.admin.admin import Admin
from ..client.network import calls
from ..client.network.connection import BrokerConnection, KafkaError, connect
from ..protocol import api_versions as apis
from ..protocol.records import encode_batch
from ..protocol.schema import build
from .outcome import Outcome, Step, describe_log
from .scenarios import PRELUDE, SCENARIOS, SEED_BATCHES, judge, read_log

TIMEOUT_S = 30.0
FETCH_WAIT_S = 0.1  # the brokers' replica.fetch.wait.max.ms that Cluster promises
RETRIABLE = (ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available,
             ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch,
             ErrorCode.not_enough_replicas, ErrorCode.request_timed_out)


class Cluster(Protocol):
    """What the flow needs of the cluster it runs on."""

    ids: list[int]

    def bootstrap(self, broker_id: int) -> str: ...
    def kill(self, broker_id: int) -> None: ...
    def pause(self, broker_id: int) -> None: ...
    def resume(self, broker_id: int) -> None: ...
    def start(self, broker_id: int) -> None: ...
    def log_text(self, broker_id: int) -> str: ...


def _wait(condition, what: str, timeout: float = TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"not within {timeout:.0f}s: {what}")


def leader_of(bootstrap: str, topic: str) -> tuple[int, int, tuple[int, ...]] | None:
    """(leader, leader epoch, ISR) of partition 0 in one broker's Metadata; None while it
    has none or the broker does not answer."""
    def make(mod, version):
        return build(mod.MetadataRequest,
                     topics=(build(mod.MetadataRequestTopic, name=topic, topic_id=None),),
                     allow_auto_topic_creation=False,
                     include_cluster_authorized_operations=False,
                     include_topic_authorized_operations=False)

    try:
        with connect(bootstrap, "oncelog-scenario", timeout=5) as conn:
            answer = conn.call(apis.METADATA, make)
    except (KafkaError, OSError):
        return None
    for t in answer.topics:
        for p in t.partitions:
            if t.name == topic and p.partition_index == 0 and p.leader_id >= 0:
                return p.leader_id, p.leader_epoch, tuple(p.isr_nodes)
    return None


class _Producer:
    """The seed's idempotent producer: fixed producer id and epoch, sequences it chooses."""

    def __init__(self, topic: str, outcome: Outcome) -> None:
        self.topic, self.outcome = topic, outcome
        self.conn: BrokerConnection | None = None
        self.producer_id, self.epoch = -1, -1

    def to(self, bootstrap: str) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = connect(bootstrap, "oncelog-scenario", timeout=TIMEOUT_S)
        if self.producer_id < 0:
            self.producer_id, self.epoch = calls.init_producer_id(self.conn)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()

    def batch(self, label: str, first: int, last: int) -> tuple[str, int, bytes]:
        values = [f"{label}:{seq}".encode() for seq in range(first, last + 1)]
        return label, first, encode_batch(
            [(None, v, (), int(time.time() * 1000)) for v in values],
            producer_id=self.producer_id, producer_epoch=self.epoch, base_sequence=first)

    def send(self, batch: tuple[str, int, bytes], note: str = "",
             timeout_ms: int = 30_000) -> tuple[ErrorCode, int]:
        label, first, data = batch
        self.outcome.steps.append(Step("request", f"{label} seq {first}+ (acks=all){note}"))
        assert self.conn is not None
        calls.send_produce(self.conn, self.topic, 0, data, timeout_ms=timeout_ms)
        _, response = self.conn.receive()
        result = calls.produce_result(response)
        if result.error_code == ErrorCode.none:
            text, tone = f"ACK {label} at offset {result.base_offset}", "ok"
        else:
            text, tone = f"{result.error_code.name.upper()} for {label}", "error"
        self.outcome.steps.append(Step("response", text, tone=tone))
        return result.error_code, result.base_offset


def run_failover(cluster: Cluster, topic: str | None = None) -> Outcome:
    topic = topic or f"scenario-failover-{int(time.time() * 1000)}"
    outcome = Outcome("failover", SCENARIOS["failover"].title)
    note = outcome.steps.append
    everyone = ",".join(cluster.bootstrap(b) for b in cluster.ids)
    with Admin({"bootstrap.servers": everyone}) as admin:
        admin.create_topic(topic, 1, 3, configs={"min.insync.replicas": "2"})
    leader, epoch, isr = _wait(
        lambda: (s := leader_of(everyone, topic)) and len(s[2]) == 3 and s,
        f"{topic}-0 led with an ISR of three")
    note(Step("broker-note", f"{topic}-0: leader broker {leader} at leader epoch {epoch}, "
                             f"ISR {list(isr)}; min.insync.replicas 2"))
    producer = _Producer(topic, outcome)
    try:
        producer.to(cluster.bootstrap(leader))
        note(Step("producer-note", f"producer id {producer.producer_id}, epoch "
                                   f"{producer.epoch}"))
        label, first, last = PRELUDE
        offsets: dict[str, int] = {}
        for batch in [producer.batch(label, first, last)] + [
                producer.batch(b, *SEED_BATCHES[b]) for b in "ABCDE"]:
            error, offset = _until_answered(producer, batch, cluster, leader)
            offsets[batch[0]] = offset
        note(Step("broker-note", "acks=all: both followers hold A-E, and built their "
                                 "producer state from them as they replicated"))

        followers = [b for b in isr if b != leader]
        for b in followers:
            cluster.pause(b)
        try:
            # a fetch each follower had waiting is answered (empty) within its max wait,
            # into the paused follower's socket: after that, nothing carries X to it (ten
            # times the wait: a loaded leader answers late)
            time.sleep(FETCH_WAIT_S * 10)
            x = producer.batch("X", 151, 154)
            error, _ = producer.send(x, " - followers paused", timeout_ms=500)
            note(Step("broker-note", f"broker {leader} stored X alone: {error.name.upper()}, "
                                     "never acknowledged"))
            cluster.kill(leader)
            note(Step("broker-note", f"kill -9 broker {leader} (the leader)"))
        finally:
            for b in followers:
                cluster.resume(b)
        survivors = ",".join(cluster.bootstrap(b) for b in followers)
        new, new_epoch, new_isr = _wait(
            lambda: (s := leader_of(survivors, topic)) and s[0] != leader and s,
            "a new leader elected by the controller")
        note(Step("broker-note", f"the controller elected broker {new} at leader epoch "
                                 f"{new_epoch} (ISR {list(new_isr)})"))
        producer.to(cluster.bootstrap(new))
        note(Step("producer-note", "no answer heard for A-E (say): retry them, same "
                                   "sequences, on the new leader"))
        same = 0
        for b in "ABCDE":
            _, offset = _until_answered(producer, producer.batch(b, *SEED_BATCHES[b]),
                                        cluster, new, " (retry)")
            same += offset == offsets[b]
        note(Step("broker-note", f"{same} of 5 retries answered with their original offsets: "
                                 f"broker {new}'s producer state knows the last 5 batches"))
        _until_answered(producer, producer.batch("X", 151, 154), cluster, new, " (retry)")
        _until_answered(producer, producer.batch("Y", 155, 159), cluster, new)
    finally:
        producer.close()

    cluster.start(leader)
    _wait(lambda: (s := leader_of(everyone, topic)) and leader in s[2],
          f"broker {leader} back in the ISR")
    truncated = _truncation(cluster.log_text(leader), topic)
    note(Step("broker-note", f"broker {leader} back as a follower of broker {new}: "
                             + (truncated or "nothing to truncate")))
    note(Step("broker-note", f"broker {leader} caught up with broker {new}'s log and is in "
                             "the ISR again"))

    outcome.offsets, outcome.log = read_log(everyone, topic)
    outcome.expected = [f"{label}:{seq}" for seq in range(first, last + 1)]
    outcome.expected += [f"{b}:{seq}" for b in "ABCDE"
                         for seq in range(SEED_BATCHES[b][0], SEED_BATCHES[b][1] + 1)]
    outcome.expected += [f"X:{seq}" for seq in range(151, 155)]
    outcome.expected += [f"Y:{seq}" for seq in range(155, 160)]
    outcome.passed, outcome.verdict = judge(outcome.log, outcome.expected)
    if outcome.passed and same < 5:
        outcome.passed = False
        outcome.verdict = f"FAIL: only {same} of 5 retries got their original offsets"
    if outcome.passed:
        outcome.verdict = (f"PASS: exactly once across the failover: the {len(outcome.log)} "
                           "records (the earlier ones, A-E, X, Y) stored once each, in "
                           "order; 5 of 5 retries answered with their original offsets")
    note(Step("broker-note", f"log of {topic}-0: "
                             + describe_log(zip(outcome.offsets, outcome.log, strict=True))))
    return outcome


def _until_answered(producer: _Producer, batch, cluster: Cluster, leader: int,
                    note: str = "") -> tuple[ErrorCode, int]:
    """Send until acknowledged: a leader that has not taken its new state yet answers a
    retriable error (a producer retries those), for at most TIMEOUT_S."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        error, offset = producer.send(batch, note)
        if error == ErrorCode.none:
            return error, offset
        if error not in RETRIABLE or time.monotonic() > deadline:
            raise KafkaError(error, f"producing {batch[0]} to broker {leader}")
        time.sleep(0.1)
        producer.to(cluster.bootstrap(leader))


def _truncation(log_text: str, topic: str) -> str | None:
    for line in log_text.splitlines():
        if f"{topic}-0: truncating from" in line:
            return line.split(f"{topic}-0: ", 1)[1]
    return None

