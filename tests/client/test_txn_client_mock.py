"""oncelog's transactional producer against an implementation nobody here wrote: librdkafka's
mock cluster (confluent-kafka with test.mock.num.brokers), which speaks FindCoordinator v3,
InitProducerId v4, AddPartitionsToTxn / AddOffsetsToTxn / EndTxn v1 and TxnOffsetCommit v3,
and writes transaction markers.

What the mock does not do, and so is tested against oncelog's broker instead
(test_txn_client_broker.py): fencing (it hands every InitProducerId a new producer id),
read_committed (it answers Fetch without aborted transactions, up to the high watermark),
the CRC32C of its markers (it leaves them unset: the readers here use check.crcs=false), the
offsets of TxnOffsetCommit (it keeps none), and oncelog.Consumer's JoinGroup (it closes the
connection).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from confluent_kafka import Producer as MockHolder
from kio.schema.errors import ErrorCode

import oncelog
from oncelog import (
    AIOProducer,
    Consumer,
    Producer,
    ProducerFatalError,
    TopicPartition,
    TransactionAbortedError,
    TransactionStateError,
)

TIMEOUT = 20


@pytest.fixture
def mock_bootstrap():
    holder = MockHolder({"test.mock.num.brokers": 1, "log_level": 3})
    broker = next(iter(holder.list_topics(timeout=TIMEOUT).brokers.values()))
    yield f"{broker.host}:{broker.port}"
    holder.flush(1)


def read_all(bootstrap: str, topic: str, partition: int = 0) -> list[oncelog.ConsumerRecord]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                         "check.crcs": False})
    try:
        consumer.assign([(topic, partition)])
        return list(consumer)
    finally:
        consumer.close()


def test_commit_and_abort(mock_bootstrap):
    # A long linger: records go out on flush, commit or abort only.
    with Producer({"bootstrap.servers": mock_bootstrap, "transactional.id": "tx-a",
                   "linger.ms": 600_000, "delivery.timeout.ms": 700_000}) as p:
        p.init_transactions(TIMEOUT)
        p.begin_transaction()
        futures = [p.produce("a", b"c%d" % i, partition=0) for i in range(5)]
        p.commit_transaction(TIMEOUT)
        assert [f.result(0).offset for f in futures] == list(range(5))
        # An abort of records that were sent: they stay in the log, marked aborted.
        p.begin_transaction()
        sent = p.produce("a", b"aborted", partition=0)
        p.flush(TIMEOUT)
        p.abort_transaction(TIMEOUT)
        assert sent.result(0).offset == 6  # after the commit marker
        # An abort of records not sent yet: they fail, never sent.
        p.begin_transaction()
        held = p.produce("a", b"never", partition=0)
        p.abort_transaction(TIMEOUT)
        assert isinstance(held.exception(TIMEOUT), TransactionAbortedError)
        metrics = p.metrics()
    records = read_all(mock_bootstrap, "a")
    assert [r.value for r in records] == [b"c0", b"c1", b"c2", b"c3", b"c4", b"aborted"]
    assert all(r.is_transactional and r.producer_id == records[0].producer_id
               for r in records)
    assert metrics["record-send-total"] == 6 and metrics["record-error-total"] == 1


def test_abort_then_retry_then_commit_across_partitions(mock_bootstrap):
    with Producer({"bootstrap.servers": mock_bootstrap, "transactional.id": "tx-b"}) as p:
        p.init_transactions(TIMEOUT)
        for attempt in ("first", "retry"):
            p.begin_transaction()
            for partition in range(3):
                p.produce("b", attempt.encode(), partition=partition)
            p.flush(TIMEOUT)
            if attempt == "first":
                p.abort_transaction(TIMEOUT)
            else:
                p.commit_transaction(TIMEOUT)
        assert p._core.txn.state.name == "READY"
    p_admin = MockHolder({"bootstrap.servers": mock_bootstrap})
    assert len(p_admin.list_topics("b", timeout=TIMEOUT).topics["b"].partitions) >= 3
    for partition in range(3):
        assert [r.value for r in read_all(mock_bootstrap, "b", partition)] == [b"first",
                                                                               b"retry"]


def test_send_offsets_to_transaction_commits_a_groups_offsets(mock_bootstrap):
    """Consume-transform-produce with assigned partitions (the group's generation -1, no
    member; a subscribed member's generation is tested against oncelog's broker, as the mock
    closes the connection on oncelog.Consumer's JoinGroup)."""
    with Producer({"bootstrap.servers": mock_bootstrap}) as seed:
        for i in range(4):
            seed.produce("in", b"%d" % i, partition=0)
    consumer = Consumer({"bootstrap.servers": mock_bootstrap, "group.id": "copier",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "check.crcs": False})
    try:
        with Producer({"bootstrap.servers": mock_bootstrap, "transactional.id": "tx-c"}) as p:
            p.init_transactions(TIMEOUT)
            consumer.assign([("in", 0)])
            copied = list(consumer)
            assert [r.value for r in copied] == [b"0", b"1", b"2", b"3"]
            p.begin_transaction()
            for record in copied:
                p.produce("out", record.value, partition=0)
            group = consumer.consumer_group_metadata()
            assert group == oncelog.GroupMetadata("copier", -1, "", None)
            # The mock checks the partitions (UNKNOWN_TOPIC_OR_PARTITION for a topic it does
            # not have) but keeps no offsets: librdkafka's own transactional producer finds
            # none committed after it either. Committed offsets are checked against
            # oncelog's broker.
            p.send_offsets_to_transaction({TopicPartition("in", 0): 4}, group, TIMEOUT)
            p.commit_transaction(TIMEOUT)
    finally:
        consumer.close()
    assert [r.value for r in read_all(mock_bootstrap, "out")] == [b"0", b"1", b"2", b"3"]


def test_aio_producer_transactions(mock_bootstrap):
    async def main() -> list[int]:
        async with AIOProducer({"bootstrap.servers": mock_bootstrap,
                                "transactional.id": "tx-d"}) as p:
            await p.init_transactions(TIMEOUT)
            p.begin_transaction()
            aborted = await p.send("d", b"x", partition=0)
            await p.flush()
            await p.abort_transaction(TIMEOUT)
            p.begin_transaction()
            committed = [await p.send("d", b"y%d" % i, partition=0) for i in range(3)]
            await p.commit_transaction(TIMEOUT)
            return [(await aborted).offset] + [(await f).offset for f in committed]

    offsets = asyncio.run(asyncio.wait_for(main(), 3 * TIMEOUT))
    assert offsets == [0, 2, 3, 4]  # the abort marker at 1


def test_calls_out_of_order_are_refused_with_a_state_error(mock_bootstrap):
    with Producer({"bootstrap.servers": mock_bootstrap, "transactional.id": "tx-e"}) as p:
        with pytest.raises(TransactionStateError):
            p.produce("e", b"before init")
        with pytest.raises(TransactionStateError):
            p.begin_transaction()
        p.init_transactions(TIMEOUT)
        with pytest.raises(TransactionStateError) as raised:
            p.produce("e", b"outside a transaction")
        assert not raised.value.is_fatal() and not raised.value.txn_requires_abort()
        with pytest.raises(TransactionStateError):
            p.commit_transaction(TIMEOUT)
        with pytest.raises(TransactionStateError):
            p.init_transactions(TIMEOUT)
        p.begin_transaction()
        with pytest.raises(TransactionStateError):
            p.begin_transaction()
        p.produce("e", b"inside")
        p.commit_transaction(TIMEOUT)
    with Producer({"bootstrap.servers": mock_bootstrap}) as plain:
        with pytest.raises(TransactionStateError):
            plain.begin_transaction()


def test_two_phase_commit_needs_init_producer_id_v6(mock_bootstrap):
    """The mock speaks InitProducerId v4: two-phase commit (KIP-939) is refused, fatally,
    rather than run without the coordinator knowing."""
    with Producer({"bootstrap.servers": mock_bootstrap, "transactional.id": "tx-f",
                   "transaction.two.phase.commit.enable": True}) as p:
        with pytest.raises(ProducerFatalError) as raised:
            p.init_transactions(TIMEOUT)
        assert raised.value.error == ErrorCode.unsupported_version
        assert "KIP-939" in str(raised.value)
        with pytest.raises(ProducerFatalError):
            p.begin_transaction()


def test_metrics_and_stats_cb(mock_bootstrap):
    seen: list[dict] = []
    with Producer({"bootstrap.servers": mock_bootstrap, "statistics.interval.ms": 50,
                   "stats_cb": lambda text: seen.append(json.loads(text))}) as p:
        for i in range(20):
            p.produce("m", b"%d" % i, partition=0)
        p.flush(TIMEOUT)
        deadline = time.monotonic() + TIMEOUT
        while not any(s["metrics"]["record-send-total"] == 20 for s in seen) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        metrics = p.metrics()
    assert metrics["record-send-total"] == 20 and metrics["request-total"] >= 1
    assert metrics["request-latency-avg"] > 0 and metrics["batch-size-avg"] > 0
    assert metrics["record-error-total"] == 0
    assert seen[-1]["type"] == "producer" and seen[-1]["metrics"]["record-send-total"] == 20
    consumed: list[dict] = []
    consumer = Consumer({"bootstrap.servers": mock_bootstrap, "auto.offset.reset": "earliest",
                         "statistics.interval.ms": 1,
                         "stats_cb": lambda text: consumed.append(json.loads(text))})
    try:
        consumer.assign([("m", 0)])
        records = []
        deadline = time.monotonic() + TIMEOUT
        while len(records) < 20 and time.monotonic() < deadline:
            records += consumer.poll(0.2)
        time.sleep(0.01)
        consumer.poll(0)
        snapshot = consumer.metrics()
    finally:
        consumer.close()
    assert snapshot["records-consumed-total"] == 20 and snapshot["records-lag-max"] == 0
    assert snapshot["fetch-total"] >= 1 and consumed[-1]["type"] == "consumer"
