"""What tests besides tests/audit/test_audit_transactions.py use of it."""
from __future__ import annotations

from confluent_kafka import Producer
from kio.schema.errors import ErrorCode as E

from oncelog.client.network.connection import BrokerConnection
from support.audit_helpers import produce
from support.brokers import create_topic
from support.txn_wire import (
    add_partitions,
    init_producer_id,
    produce_txn,
    wait_settled,
    write_marker,
)

TIMEOUT = 30.0


PARTITIONS = 3


def transactions_by_confluent(bootstrap: str, topic: str) -> tuple[dict[str, int], Producer]:
    """Committed and aborted transactions over 3 partitions, idempotent records beside them,
    and one transaction left open at the end; returns how many records of each kind, and the
    producer (the caller aborts its open transaction)."""
    create_topic(bootstrap, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-tx",
                         "linger.ms": 5, "transaction.timeout.ms": 60_000})
    producer.init_transactions(TIMEOUT)
    counts = {"committed": 0, "aborted": 0, "open": 0}
    for round_, outcome in enumerate(["committed", "aborted", "committed", "aborted",
                                      "committed", "open"]):
        producer.begin_transaction()
        for i in range(30):
            producer.produce(topic, value=b"%s-%d-%d" % (outcome.encode(), round_, i),
                             partition=i % PARTITIONS)
        counts[outcome] += 30
        assert producer.flush(TIMEOUT) == 0  # abort_transaction drops what is not sent yet
        if outcome == "committed":
            producer.commit_transaction(TIMEOUT)
        elif outcome == "aborted":
            producer.abort_transaction(TIMEOUT)
        if round_ == 2:
            produce(bootstrap, topic, [(p, b"plain-%d" % p) for p in range(PARTITIONS)],
                    **{"enable.idempotence": True})
    return counts, producer


def torn_topic(bootstrap: str, topic: str) -> None:
    """One transaction over 3 partitions whose markers say COMMIT on 0 and 1, ABORT on 2, as a
    broker that lost its coordinator's decision would write them; then a clean one."""
    create_topic(bootstrap, topic, PARTITIONS)
    parts = [(topic, p) for p in range(PARTITIONS)]
    coordinator_epoch = 0  # a single broker's coordinator: __transaction_state led at epoch 0
    with BrokerConnection("127.0.0.1", int(bootstrap.rsplit(":", 1)[1]),
                          client_id="torn", timeout=TIMEOUT) as conn:
        _, pid, epoch = init_producer_id(conn, f"{topic}-tx")
        assert set(add_partitions(conn, f"{topic}-tx", pid, epoch, parts).values()) == {E.none}
        for p in range(PARTITIONS):
            assert produce_txn(conn, f"{topic}-tx", topic, p, pid, epoch, 0,
                               [b"torn-%d-%d" % (p, i) for i in range(p + 1)]) is E.none
        assert write_marker(conn, pid, epoch, True, coordinator_epoch, parts[:2]) == [E.none] * 2
        assert write_marker(conn, pid, epoch, False, coordinator_epoch, parts[2:]) == [E.none]
        wait_settled(conn, topic, PARTITIONS)
