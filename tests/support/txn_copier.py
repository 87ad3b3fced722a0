"""A consume-transform-produce copier in transactions, run as its own process so that a test
can SIGKILL it (test_txn_copier.py): partition p of the input goes to partition p of the
output, each value prefixed with b"copied:", and the consumer's offsets commit in the same
transaction as the records.

    python txn_copier.py CLIENT BOOTSTRAP INPUT OUTPUT GROUP TXN_ID END0,END1,... [GATE]

CLIENT is confluent or oncelog. GATE, a file holding a number of records, holds the copier
back: it starts no transaction while its committed position (summed over partitions) is at or
past that number, so a test can be sure a fault lands before the copier is done.

The copier stops with exit code 0 once its committed position
in every partition has reached ENDp; on an error that needs the transaction aborted it exits
3 (the test starts it again, and the new instance's init_transactions aborts what was open);
on a fatal error (a fenced producer, say) it exits 2. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

BATCH = 500
RUN_LIMIT = 600.0  # seconds; a copier that runs longer is stuck
CALL_TIMEOUT = 30.0
# send_offsets_to_transaction's own timeout: a few round trips (FindCoordinator, AddOffsetsToTxn,
# TxnOffsetCommit), well under a second even on a busy machine. Its watchdog fires 2 s after
# it: librdkafka hangs in this call after a broker restart (below), and the confluent run of
# test_txn_copier.py spent 35 s in each such hang, 70 of its 85 s, with the watchdog at
# CALL_TIMEOUT + 5.
OFFSETS_TIMEOUT = 8.0


@contextlib.contextmanager
def watchdog(seconds: float):
    """librdkafka's send_offsets_to_transaction() can block past its timeout when the group
    coordinator goes down during the call (confluentinc/librdkafka#5456, open): its
    coordinator requests never check their timeout; seen here after a broker restart, the
    group coordinator's broker thread left in TRY_CONNECT (debug=eos,broker), as in
    confluentinc/librdkafka#5511. An application guards it as this one does: the process
    exits (code 3, as for an abortable error) and the next instance's init_transactions
    fences and aborts what was open."""
    timer = threading.Timer(seconds, lambda: os._exit(3))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def wait_for_gate(gate: str | None, committed: dict[int, int], deadline: float) -> None:
    while gate is not None and time.monotonic() < deadline:
        try:
            limit = int(open(gate).read())
        except (OSError, ValueError):  # the test replaces the file by renaming: never torn
            limit = 0
        if sum(max(0, offset) for offset in committed.values()) < limit:
            return
        time.sleep(0.02)


def transform(value: bytes) -> bytes:
    return b"copied:" + value


def copy_with_confluent(bootstrap: str, source: str, target: str, group: str, txn_id: str,
                        ends: list[int], gate: str | None) -> int:
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    parts = [TopicPartition(source, p) for p in range(len(ends))]
    consumer.assign(parts)  # without offsets: from the group's committed ones
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                         "linger.ms": 5, "transaction.timeout.ms": 60_000})

    def retrying(call, *args, guard: float = CALL_TIMEOUT + 5) -> None:
        deadline = time.monotonic() + CALL_TIMEOUT * 2
        while True:
            try:
                with watchdog(guard):
                    call(*args)
                return
            except KafkaException as exc:
                error = exc.args[0]
                print(f"{getattr(call, '__name__', call)}: {error}", file=sys.stderr, flush=True)
                if error.fatal():
                    raise SystemExit(2) from exc
                if error.txn_requires_abort():
                    raise SystemExit(3) from exc
                if not error.retriable() or time.monotonic() > deadline:
                    raise SystemExit(3) from exc
                time.sleep(0.1)

    retrying(producer.init_transactions, CALL_TIMEOUT)
    committed = {tp.partition: tp.offset for tp in consumer.committed(parts, CALL_TIMEOUT)}
    deadline = time.monotonic() + RUN_LIMIT
    while time.monotonic() < deadline:
        if all(committed.get(p, -1) >= end for p, end in enumerate(ends)):
            return 0
        wait_for_gate(gate, committed, deadline)
        messages = [m for m in consumer.consume(BATCH, 0.5) if m.error() is None]
        if not messages:
            continue
        retrying(producer.begin_transaction)
        for m in messages:
            producer.produce(target, key=m.key(), value=transform(m.value()),
                             partition=m.partition())
        positions = [tp for tp in consumer.position(parts) if tp.offset >= 0]
        retrying(producer.send_offsets_to_transaction, positions,
                 consumer.consumer_group_metadata(), OFFSETS_TIMEOUT, guard=OFFSETS_TIMEOUT + 2)
        retrying(producer.commit_transaction, CALL_TIMEOUT)
        committed.update({tp.partition: tp.offset for tp in positions})
    return 4


def copy_with_oncelog(bootstrap: str, source: str, target: str, group: str, txn_id: str,
                      ends: list[int], gate: str | None) -> int:
    from oncelog import Consumer, KafkaError, Producer, TopicPartition

    def retrying(call, *args):
        deadline = time.monotonic() + CALL_TIMEOUT * 2
        while True:
            try:
                return call(*args)
            except KafkaError as exc:
                print(f"{getattr(call, '__name__', call)}: {exc!r}", file=sys.stderr, flush=True)
                if exc.is_fatal():
                    raise SystemExit(2) from exc
                if exc.txn_requires_abort():
                    raise SystemExit(3) from exc
                if not exc.is_retriable() or time.monotonic() > deadline:
                    raise SystemExit(3) from exc
                time.sleep(0.1)

    # Unlike confluent-kafka's, oncelog's Consumer connects as it is made: a copier started
    # while the broker is down retries that too.
    consumer = retrying(Consumer, {"bootstrap.servers": bootstrap, "group.id": group,
                                   "isolation.level": "read_committed",
                                   "enable.auto.commit": False,
                                   "auto.offset.reset": "earliest"})
    parts = [TopicPartition(source, p) for p in range(len(ends))]
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                         "linger.ms": 5, "transaction.timeout.ms": 60_000})
    retrying(producer.init_transactions, CALL_TIMEOUT)
    found = retrying(consumer.committed, parts, CALL_TIMEOUT)
    committed = {tp.partition: c.offset for tp, c in found.items() if c is not None}
    consumer.assign(parts)  # without offsets: from the group's committed ones
    deadline = time.monotonic() + RUN_LIMIT
    while time.monotonic() < deadline:
        if all(committed.get(p, -1) >= end for p, end in enumerate(ends)):
            return 0
        wait_for_gate(gate, committed, deadline)
        records = retrying(consumer.poll, 0.5, BATCH)
        if not records:
            continue
        retrying(producer.begin_transaction)
        for r in records:
            producer.produce(target, transform(r.value), key=r.key, partition=r.partition)
        positions = {tp: retrying(consumer.position, tp) for tp in parts}
        retrying(producer.send_offsets_to_transaction, positions,
                 consumer.consumer_group_metadata(), CALL_TIMEOUT)
        retrying(producer.commit_transaction, CALL_TIMEOUT)
        committed.update({tp.partition: offset for tp, offset in positions.items()})
    return 4


def main(argv: list[str]) -> int:
    client, bootstrap, source, target, group, txn_id, ends, *rest = argv
    end_offsets = [int(e) for e in ends.split(",")]
    gate = rest[0] if rest else None
    if client == "confluent":
        return copy_with_confluent(bootstrap, source, target, group, txn_id, end_offsets, gate)
    if client == "oncelog":
        return copy_with_oncelog(bootstrap, source, target, group, txn_id, end_offsets, gate)
    raise SystemExit(f"unknown client {client!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
