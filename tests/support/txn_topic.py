"""A partition written by confluent-kafka's transactional producer for the read_committed
tests (TopicReader, the Spark source): committed, aborted, and one still-open transaction
followed by more committed records."""

from __future__ import annotations

from confluent_kafka import Producer

import oncelog

TIMEOUT = 180.0  # seconds: the bound on any single wait


def names(prefix: str, count: int) -> list[bytes]:
    return [b"%s%d" % (prefix.encode(), i) for i in range(count)]


COMMITTED = names("c", 20)  # in offset order
BEFORE_OPEN = COMMITTED[:15]  # what read_committed reads while the open transaction is
ABORTED = names("a", 5)
OPEN = names("o", 3)


def transactional(bootstrap: str, transactional_id: str) -> Producer:
    # A transaction timeout well past any test's, so the open one stays open until committed.
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "linger.ms": 5, "transaction.timeout.ms": 600_000})
    producer.init_transactions(TIMEOUT)
    return producer


def transaction(producer: Producer, topic: str, values: list[bytes], commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value=value, key=value[:1], partition=0)
    assert producer.flush(TIMEOUT) == 0  # in the log (an abort drops what was not sent)
    if commit:
        producer.commit_transaction(TIMEOUT)
    else:
        producer.abort_transaction(TIMEOUT)


def write(bootstrap: str, topic: str) -> Producer:
    """Partition 0 of a new ``topic``: c0-c9 committed, a0-a4 aborted, c10-c14 committed,
    o0-o2 in a transaction left open, then c15-c19 committed, so the last stable offset is
    o0's. Returns the producer of the open transaction (commit it to move the LSO on)."""
    with oncelog.Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(topic, 1)
    first = transactional(bootstrap, f"{topic}-first")
    transaction(first, topic, COMMITTED[:10], commit=True)
    transaction(first, topic, ABORTED, commit=False)
    transaction(first, topic, COMMITTED[10:15], commit=True)
    open_one = transactional(bootstrap, f"{topic}-open")
    open_one.begin_transaction()
    for value in OPEN:
        open_one.produce(topic, value=value, partition=0)
    assert open_one.flush(TIMEOUT) == 0
    transaction(first, topic, COMMITTED[15:], commit=True)
    return open_one
