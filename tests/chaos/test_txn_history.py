"""A history checker in the manner of Jepsen's Kafka checker, over a randomised concurrent
transactional workload through the chaos proxy.

Several confluent-kafka transactional producers, each in its own thread, write transactions
of a few records to a few partitions through `oncelog chaos proxy` (lost answers, cut
connections, delays on Produce, AddPartitionsToTxn and EndTxn), and commit or abort at random.
Each transaction's outcome is what the client was told: committed, aborted, or unknown (the
client gave up, or its producer died). Then a read_committed reader reads everything, and the
history must have

- no aborted reads: no record of an aborted or never-committed transaction is visible;
- no lost writes: every record of a transaction whose commit was acknowledged is visible;
- no torn transactions: a transaction is visible in every partition it wrote or in none (none
  only if its outcome was not a commit);
- no duplicates.

The seed is ONCELOG_TXN_HISTORY_SEED (default 14) and is printed; the workload is bounded by
a deadline.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

from confluent_kafka import KafkaException, Producer
from support.brokers import BrokerProcess, create_topic
from support.txn_copier_helpers import read_committed

from oncelog.chaos.proxy import ChaosProxy
from oncelog.chaos.rules import Action, Rule
from oncelog.protocol import api_versions as apis

SEED = int(os.environ.get("ONCELOG_TXN_HISTORY_SEED", "14"))
PRODUCERS = 3
TRANSACTIONS = 12  # per producer
PARTITIONS = 4
TOPIC = "history"
DEADLINE = 90.0
CALL_TIMEOUT = 20.0


def faults(rng: random.Random) -> list[Rule]:
    """Rules firing on random occurrences of the transactional APIs' requests."""
    def some(count: int, upto: int) -> frozenset[int]:
        return frozenset(rng.sample(range(2, upto), count))

    return [
        Rule(Action.DROP_RESPONSE, apis.PRODUCE, some(4, 80)),
        Rule(Action.CUT_AFTER_REQUEST, apis.PRODUCE, some(3, 80)),
        Rule(Action.DELAY_REQUEST, apis.PRODUCE, some(4, 80), delay_ms=rng.randint(200, 1500)),
        Rule(Action.DROP_RESPONSE, apis.END_TXN, some(2, 30)),
        Rule(Action.CUT_AFTER_REQUEST, apis.END_TXN, some(2, 30)),
        Rule(Action.DELAY_RESPONSE, apis.END_TXN, some(2, 30), delay_ms=rng.randint(200, 1500)),
        Rule(Action.DROP_RESPONSE, apis.ADD_PARTITIONS_TO_TXN, some(2, 30)),
        Rule(Action.CUT_AFTER_REQUEST, apis.ADD_PARTITIONS_TO_TXN, some(2, 30)),
    ]


class Worker:
    """One transactional.id: its transactions (records written, outcome)."""

    def __init__(self, index: int, bootstrap: str, seed: int) -> None:
        self.index = index
        self.bootstrap = bootstrap
        self.rng = random.Random(seed)
        self.history: list[tuple[list[tuple[int, bytes]], str]] = []
        self.failure: BaseException | None = None

    def producer(self) -> Producer:
        producer = Producer({"bootstrap.servers": self.bootstrap,
                             "transactional.id": f"history-{self.index}", "linger.ms": 2,
                             "socket.timeout.ms": 2000, "request.timeout.ms": 2000,
                             "retry.backoff.ms": 50, "transaction.timeout.ms": 10_000,
                             "message.timeout.ms": 10_000, "error_cb": lambda e: None})
        producer.init_transactions(CALL_TIMEOUT)
        return producer

    def run(self, deadline: float) -> None:
        try:
            producer = self.producer()
            for t in range(TRANSACTIONS):
                if time.monotonic() > deadline:
                    return
                parts = self.rng.sample(range(PARTITIONS), self.rng.randint(1, 3))
                records = [(p, b"w%d-t%d-r%d" % (self.index, t, i))
                           for i, p in enumerate(parts * self.rng.randint(1, 2))]
                commit = self.rng.random() < 0.7
                outcome = self.transaction(producer, records, commit)
                self.history.append((records, outcome))
                if outcome == "unknown":  # a new instance fences the old and settles it
                    producer = self.producer()
        except BaseException as exc:  # reported by the test
            self.failure = exc

    def transaction(self, producer: Producer, records: list[tuple[int, bytes]],
                    commit: bool) -> str:
        try:
            producer.begin_transaction()
            for partition, value in records:
                producer.produce(TOPIC, value=value, partition=partition)
            if not commit:
                producer.abort_transaction(CALL_TIMEOUT)
                return "aborted"
            for _ in range(5):
                try:
                    producer.commit_transaction(CALL_TIMEOUT)
                    return "committed"
                except KafkaException as exc:
                    if not exc.args[0].retriable():
                        raise
            return "unknown"
        except KafkaException as exc:
            error = exc.args[0]
            if error.txn_requires_abort():
                try:
                    producer.abort_transaction(CALL_TIMEOUT)
                    return "aborted"
                except KafkaException:
                    return "unknown"
            return "unknown"


def check(history: list[tuple[list[tuple[int, bytes]], str]],
          seen: dict[int, list[bytes]]) -> dict[str, list]:
    where = {v: p for p, values in seen.items() for v in values}
    counts = Counter(v for values in seen.values() for v in values)
    anomalies: dict[str, list] = {"aborted read": [], "lost write": [], "torn": [],
                                  "duplicate": [v for v, n in counts.items() if n > 1],
                                  "wrong partition": [], "unknown record": []}
    written = set()
    for records, outcome in history:
        visible = [(p, v) for p, v in records if v in where]
        written |= {v for _, v in records}
        anomalies["wrong partition"] += [v for p, v in visible if where[v] != p]
        if outcome == "aborted" and visible:
            anomalies["aborted read"].append((records, visible))
        if outcome == "committed" and len(visible) < len(records):
            anomalies["lost write"].append((records, visible))
        if visible and len(visible) < len(records):
            anomalies["torn"].append((records, visible))
    anomalies["unknown record"] = [v for v in where if v not in written]
    return anomalies


def test_concurrent_transactions_through_faults_have_no_anomalies(tmp_path):
    print(f"ONCELOG_TXN_HISTORY_SEED={SEED}")
    rng = random.Random(SEED)
    broker = BrokerProcess(tmp_path / "data", {"transaction.max.timeout.ms": "60000"})
    broker.start()
    try:
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        with ChaosProxy(("127.0.0.1", broker.port)) as proxy:
            for rule in faults(rng):
                proxy.add_rule(rule)
            workers = [Worker(i, proxy.bootstrap, rng.randrange(2**32))
                       for i in range(PRODUCERS)]
            deadline = time.monotonic() + DEADLINE
            threads = [threading.Thread(target=w.run, args=(deadline,)) for w in workers]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(DEADLINE + 2 * CALL_TIMEOUT + 30)
            assert not any(t.is_alive() for t in threads), "a worker hung"
            fired = Counter(e.what for e in proxy.events if e.what != "forwarded")
        for w in workers:
            assert w.failure is None, f"worker {w.index}: {w.failure!r}"
        history = [entry for w in workers for entry in w.history]
        outcomes = Counter(outcome for _, outcome in history)
        print(f"faults fired {dict(fired)}; outcomes {dict(outcomes)}")
        assert len(history) == PRODUCERS * TRANSACTIONS, "the workload ran out of time"
        assert outcomes["committed"] and outcomes["aborted"] and sum(fired.values())

        seen = read_committed(broker.bootstrap, TOPIC)
        anomalies = check(history, seen)
        assert all(not found for found in anomalies.values()), \
            {kind: found[:5] for kind, found in anomalies.items() if found}
    finally:
        broker.kill()
