"""The seeds' four sequence flows (seed 000, section 2), run against a live broker (and the
two transactional flows of txn_scenarios.py).

A low-level producer controls sequence numbers and the order of requests exactly; the
"network" is simulated in-process: a lost request is never sent, a lost response is read and
thrown away. Each run records what happened for a sequence diagram and ends with a verdict
read back from the partition: every record once, in the order produced.

Batches are the seed's: A 114-120, B 121-124, C 125-132, D 133-142, E 143-150, F 151-155. Each
record's value names its batch and original sequence (``C:127``), so the verdict can tell a
duplicate from a reordering whatever sequence a retry carried.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ..client.admin.admin import Admin
from ..client.consumer.consumer import Consumer, TopicPartition
from ..client.network import calls
from ..client.network.connection import BrokerConnection, connect
from ..protocol.records import encode_batch
from .outcome import Outcome, Step, describe_log

SEED_BATCHES = {"A": (114, 120), "B": (121, 124), "C": (125, 132), "D": (133, 142),
                "E": (143, 150), "F": (151, 155)}
# The seed's producer is mid-stream: sequences 0-113 went before A. A producer new to a
# partition must start at 0 here (rules.py rows 2b-2c), so each run first writes them.
PRELUDE = ("earlier", 0, 113)


@dataclass
class Batch:
    label: str
    first_seq: int
    count: int
    epoch: int
    values: list[str]

    @property
    def seq_text(self) -> str:
        last = self.first_seq + self.count - 1
        return f"{self.label}/{last}~{self.first_seq}"  # as the seed writes them


class LowLevelProducer:
    """An idempotent producer whose every request the scenario decides."""

    def __init__(self, conn: BrokerConnection, topic: str, outcome: Outcome) -> None:
        self.conn = conn
        self.topic = topic
        self.outcome = outcome
        self.producer_id, self.epoch = calls.init_producer_id(conn)
        self.in_flight: list[tuple[Batch, bool]] = []  # (batch, request lost)

    def seed_batch(self, label: str) -> Batch:
        first, last = SEED_BATCHES[label]
        return Batch(label, first, last - first + 1, self.epoch,
                     [f"{label}:{seq}" for seq in range(first, last + 1)])

    def prelude(self) -> None:
        label, first, last = PRELUDE
        self.send(Batch(label, first, last - first + 1, self.epoch,
                        [f"{label}:{seq}" for seq in range(first, last + 1)]))
        self.receive()

    def send(self, batch: Batch, lost: bool = False) -> None:
        self.outcome.steps.append(Step("request", f"{batch.seq_text} (epoch {batch.epoch})",
                                       lost=lost))
        if not lost:
            data = encode_batch([(None, v.encode(), (), int(time.time() * 1000))
                                 for v in batch.values], producer_id=self.producer_id,
                                producer_epoch=batch.epoch, base_sequence=batch.first_seq)
            calls.send_produce(self.conn, self.topic, 0, data)
        self.in_flight.append((batch, lost))

    def receive(self, lose: bool = False) -> tuple[Batch, ErrorCode, int]:
        """The answer to the oldest in-flight request that reached the broker."""
        while True:
            batch, lost = self.in_flight.pop(0)
            if not lost:
                break
        _, response = self.conn.receive()
        result = calls.produce_result(response)
        error = result.error_code
        if error == ErrorCode.none:
            text, tone = f"ACK {batch.label} at offset {result.base_offset}", "ok"
        elif error == ErrorCode.duplicate_sequence_number:
            text, tone = f"DUPLICATE_SEQUENCE_NUMBER for {batch.label}", "duplicate"
        else:
            text, tone = f"{error.name.upper()} for {batch.label}", "error"
        self.outcome.steps.append(Step("response", text, lost=lose, tone=tone))
        return batch, error, result.base_offset

    def bump_epoch(self, batches: list[Batch]) -> list[Batch]:
        """KIP-360, as Java's idempotent producer does it: a new epoch, sequences from 0."""
        self.epoch += 1
        resequenced = []
        seq = 0
        for b in batches:
            resequenced.append(Batch(b.label, seq, b.count, self.epoch, b.values))
            seq += b.count
        self.note("producer", f"epoch bump to {self.epoch}; " + ", ".join(
            f"{b.label} resequenced {b.first_seq}..{b.first_seq + b.count - 1}"
            for b in resequenced))
        return resequenced

    def note(self, lane: str, text: str) -> None:
        self.outcome.steps.append(Step(f"{lane}-note", text))


# --- the four flows -----------------------------------------------------------------------------

def flow_success(p: LowLevelProducer) -> None:
    """Figure 2: A, B, C in flight, then D, E; every ACK arrives."""
    for label in "ABC":
        p.send(p.seed_batch(label))
    for _ in "ABC":
        p.receive()
    for label in "DE":
        p.send(p.seed_batch(label))
    for _ in "DE":
        p.receive()


def flow_missing_acks(p: LowLevelProducer) -> None:
    """Figure 3: all five stored, the ACKs of D and E lost; their retries are duplicates."""
    batches = [p.seed_batch(label) for label in "ABCDE"]
    for b in batches:
        p.send(b)
    for label in "ABCDE":
        p.receive(lose=label in "DE")
    p.note("producer", "request.timeout.ms passes without ACKs for D and E: retry them, "
                       "same sequences")
    for b in batches[3:]:
        p.send(b)
    for _ in "DE":
        p.receive()


def flow_missing_records(p: LowLevelProducer) -> None:
    """Figure 4: C is lost on the way; D and E are out of order; bump the epoch, resend C-E."""
    batches = [p.seed_batch(label) for label in "ABCDE"]
    for b in batches:
        p.send(b, lost=b.label == "C")
    results = [p.receive() for _ in "ABDE"]
    unacked = [b for b, error, _ in results if error != ErrorCode.none]
    assert [b.label for b in unacked] == ["D", "E"], unacked
    p.note("producer", "no ACK for C (timed out), OUT_OF_ORDER for D and E")
    for b in p.bump_epoch([batches[2], *unacked]):
        p.send(b)
    for _ in "CDE":
        p.receive()


def flow_cache_missed(p: LowLevelProducer) -> None:
    """Figure 5: six in flight, A's ACK lost; A's retry is older than the 5-batch cache."""
    batches = [p.seed_batch(label) for label in "ABCDEF"]
    for b in batches:
        p.send(b)
    for label in "ABCDEF":
        p.receive(lose=label == "A")
    p.note("producer", "request.timeout.ms passes without an ACK for A: retry it")
    p.send(batches[0])
    _, error, _ = p.receive()
    if error == ErrorCode.duplicate_sequence_number:
        p.note("producer", "DUPLICATE_SEQUENCE_NUMBER means already stored: A is delivered")


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    title: str
    labels: str
    run: Callable[[LowLevelProducer], None] | None  # None: a transactional flow
    kafka_note: str = ""


SCENARIOS = {s.name: s for s in (
    Scenario("success", "Sequence flow with success (seed figure 2)", "ABCDE", flow_success),
    Scenario("missing-acks", "Sequence flow with missing ACKs (seed figure 3)", "ABCDE",
             flow_missing_acks),
    Scenario("missing-records", "Sequence flow with missing records (seed figure 4)", "ABCDE",
             flow_missing_records),
    Scenario("cache-missed", "Sequence flow with the sequence cache missed (seed figure 5)",
             "ABCDEF", flow_cache_missed,
             kafka_note="Kafka answers OUT_OF_ORDER_SEQUENCE_NUMBER to A's retry (only B-F are "
                        "cached); the producer bumps its epoch, resends A, and A is stored "
                        "twice. oncelog sees that A lies wholly below the last sequence and "
                        "answers DUPLICATE_SEQUENCE_NUMBER."),
)}
# The transactional flows (txn_scenarios.py), listed with the others.
SCENARIOS.update({
    "zombie-fencing": Scenario("zombie-fencing", "Zombie fencing: two producers with one "
                               "transactional.id (seed 004, KIP-98)", "", None),
    "abort-then-commit": Scenario("abort-then-commit", "Abort, then commit: one "
                                  "transactional producer (seed 004, KIP-98)", "", None),
    # failover.py's, on a cluster of its own (``oncelog scenario failover`` starts it)
    "failover": Scenario("failover", "Failover: the leader dies, its successor knows the last "
                         "five batches (seed 004, case 2)", "", None),
})


def run_scenario(name: str, bootstrap: str, topic: str | None = None) -> Outcome:
    scenario = SCENARIOS[name]
    if name == "failover":
        raise ValueError("failover runs on a cluster whose brokers it may kill: "
                         "chaos.failover.run_failover (oncelog scenario failover starts one)")
    if scenario.run is None:
        from .txn_scenarios import run_txn_scenario

        return run_txn_scenario(name, scenario.title, bootstrap, topic)
    topic = topic or f"scenario-{name}-{int(time.time() * 1000)}"
    outcome = Outcome(name, scenario.title, kafka_note=scenario.kafka_note)
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(topic, 1, -1)
    with connect(bootstrap, "oncelog-scenario") as conn:
        producer = LowLevelProducer(conn, topic, outcome)
        outcome.steps.append(Step("producer-note", f"producer id {producer.producer_id}, "
                                                   f"epoch {producer.epoch}"))
        producer.prelude()
        scenario.run(producer)
    outcome.offsets, outcome.log = read_log(bootstrap, topic)
    label, first, last = PRELUDE
    outcome.expected = [f"{label}:{seq}" for seq in range(first, last + 1)]
    outcome.expected += [f"{label}:{seq}" for label in scenario.labels
                         for seq in range(SEED_BATCHES[label][0], SEED_BATCHES[label][1] + 1)]
    outcome.passed, outcome.verdict = judge(outcome.log, outcome.expected)
    outcome.steps.append(Step("broker-note", f"log of {topic}-0: "
                              + describe_log(zip(outcome.offsets, outcome.log, strict=True))))
    return outcome


def read_log(bootstrap: str, topic: str) -> tuple[list[int], list[str]]:
    """The offsets and values of partition 0's records, in offset order."""
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                   "client.id": "oncelog-scenario"}) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        records = list(consumer)
    return [r.offset for r in records], [(r.value or b"").decode() for r in records]


def judge(log: list[str], expected: list[str]) -> tuple[bool, str]:
    seen: dict[str, int] = {}
    for value in log:
        seen[value] = seen.get(value, 0) + 1
    duplicates = sorted(v for v, n in seen.items() if n > 1)
    missing = [v for v in expected if v not in seen]
    batches = "".join(dict.fromkeys(v.split(":")[0] for v in expected
                                    if v.split(":")[0] in SEED_BATCHES))
    earlier = sum(v.split(":")[0] not in SEED_BATCHES for v in expected)
    if duplicates:
        return False, f"FAIL: {len(duplicates)} records stored twice ({', '.join(duplicates[:5])})"
    if missing:
        return False, f"FAIL: {len(missing)} records missing ({', '.join(missing[:5])})"
    if log != expected:
        return False, "FAIL: records stored out of order"
    return True, (f"PASS: no duplicate, no reordering: the {len(log) - earlier} records of "
                  f"batches {batches} (after {earlier} earlier ones) stored once each, in order")
