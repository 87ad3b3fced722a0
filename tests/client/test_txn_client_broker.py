"""oncelog's transactional Producer and read_committed Consumer against oncelog's broker (a
subprocess): commit and abort, abort then retry then commit, consume-transform-produce with a
group's offsets in the transaction, zombie fencing, transaction version 2's epoch per
transaction, and read_committed readers (ours and confluent-kafka's) that agree, never see an
aborted record and stop at the last stable offset."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import TopicPartition as ConfluentTP
from support.brokers import create_topic
from support.txn_client_broker_helpers import TIMEOUT, read_committed, txn_producer

from oncelog import (
    Consumer,
    Producer,
    ProducerFatalError,
    TopicPartition,
    TransactionAbortableError,
)


def confluent_read_committed(bootstrap: str, topic: str, partition: int, end: int
                             ) -> list[bytes]:
    consumer = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": "checker",
                                  "isolation.level": "read_committed",
                                  "enable.auto.commit": False})
    values: list[bytes] = []
    try:
        consumer.assign([ConfluentTP(topic, partition, 0)])
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                values.append(message.value())
            position = consumer.position([ConfluentTP(topic, partition)])[0].offset
            if position >= end:
                break
    finally:
        consumer.close()
    return values


def test_commit_abort_retry_and_readers_agree(broker):
    create_topic(broker.bootstrap, "t", 2)
    with txn_producer(broker.bootstrap, "tx-1") as p:
        epoch = p._core.idem.epoch
        p.begin_transaction()
        for i in range(3):
            p.produce("t", b"committed-%d" % i, partition=i % 2)
        p.commit_transaction(TIMEOUT)
        p.begin_transaction()
        for i in range(3):
            p.produce("t", b"aborted-%d" % i, partition=i % 2)
        p.flush(TIMEOUT)  # stored, then aborted
        p.abort_transaction(TIMEOUT)
        p.begin_transaction()  # the same records again, committed this time
        for i in range(3):
            p.produce("t", b"retried-%d" % i, partition=i % 2)
        p.commit_transaction(TIMEOUT)
        # Transaction version 2 (KIP-890): a new epoch after every transaction.
        assert p._core.idem.epoch > epoch
        assert p.metrics()["epoch-bump-total"] >= 1
    ours = read_committed(broker.bootstrap, "t", 0) + read_committed(broker.bootstrap, "t", 1)
    assert sorted(ours) == sorted([b"committed-%d" % i for i in range(3)]
                                  + [b"retried-%d" % i for i in range(3)])
    consumer = Consumer({"bootstrap.servers": broker.bootstrap})
    try:
        consumer.assign([("t", 0), ("t", 1)])
        ends = [consumer.watermarks(TopicPartition("t", p))[1] for p in (0, 1)]
    finally:
        consumer.close()
    theirs = (confluent_read_committed(broker.bootstrap, "t", 0, ends[0])
              + confluent_read_committed(broker.bootstrap, "t", 1, ends[1]))
    assert sorted(theirs) == sorted(ours)


def test_read_committed_stops_at_the_last_stable_offset(broker):
    create_topic(broker.bootstrap, "lso")
    with Producer({"bootstrap.servers": broker.bootstrap}) as plain:
        plain.produce("lso", b"before").result(TIMEOUT)
    with txn_producer(broker.bootstrap, "tx-open") as p:
        p.begin_transaction()
        p.produce("lso", b"open").result(TIMEOUT)
        with Producer({"bootstrap.servers": broker.bootstrap}) as plain:
            plain.produce("lso", b"after the open one").result(TIMEOUT)
        consumer = Consumer({"bootstrap.servers": broker.bootstrap,
                             "auto.offset.reset": "earliest",
                             "isolation.level": "read_committed"})
        try:
            consumer.assign([("lso", 0)])
            assert [r.value for r in consumer] == [b"before"]
            assert consumer.position(TopicPartition("lso", 0)) == 1  # the LSO
            assert consumer.watermarks(TopicPartition("lso", 0))[1] == 1
            p.commit_transaction(TIMEOUT)
            assert [r.value for r in consumer] == [b"open", b"after the open one"]
            assert consumer.metrics()["records-lag-max"] == 0
        finally:
            consumer.close()


def test_consume_transform_produce_commits_offsets_with_the_output(broker):
    create_topic(broker.bootstrap, "input", 2)
    with Producer({"bootstrap.servers": broker.bootstrap}) as seed:
        for i in range(10):
            seed.produce("input", b"%d" % i, partition=i % 2)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "copier",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    try:
        with txn_producer(broker.bootstrap, "copier-1") as p:
            consumer.subscribe(["input"])
            copied = []
            deadline = time.monotonic() + TIMEOUT
            while len(copied) < 10 and time.monotonic() < deadline:
                copied += consumer.poll(0.2)
            assert len(copied) == 10
            group = consumer.consumer_group_metadata()
            assert group.generation_id >= 1 and group.member_id
            offsets = {TopicPartition("input", part): 5 for part in (0, 1)}
            # An aborted copy leaves the group's offsets where they were.
            p.begin_transaction()
            for record in copied:
                p.produce("output", record.value.upper(), partition=0)
            p.send_offsets_to_transaction(offsets, group, TIMEOUT)
            p.abort_transaction(TIMEOUT)
            assert consumer.committed(list(offsets)) == {tp: None for tp in offsets}
            p.begin_transaction()
            for record in copied:
                p.produce("output", record.value.upper(), partition=0)
            p.send_offsets_to_transaction(offsets, group, TIMEOUT)
            p.commit_transaction(TIMEOUT)
            # The coordinator answers EndTxn once the commit is decided and writes the
            # markers after (as Kafka's): the offsets become committed with their marker.
            deadline = time.monotonic() + TIMEOUT
            while True:
                committed = consumer.committed(list(offsets))
                found = {tp: c.offset if c else None for tp, c in committed.items()}
                if found == offsets or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert found == offsets
    finally:
        consumer.close()
    assert sorted(read_committed(broker.bootstrap, "output")) == sorted(
        r.value.upper() for r in copied)


def test_send_offsets_with_a_stale_generation_is_abortable(broker):
    """KIP-447: a member that is no longer in the group's generation cannot commit."""
    create_topic(broker.bootstrap, "in2")
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g2",
                         "enable.auto.commit": False})
    try:
        consumer.subscribe(["in2"])
        deadline = time.monotonic() + TIMEOUT
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.2)
        group = consumer.consumer_group_metadata()
        stale = type(group)(group.group_id, group.generation_id + 5, group.member_id,
                            group.group_instance_id)
        with txn_producer(broker.bootstrap, "tx-stale") as p:
            p.begin_transaction()
            p.produce("out2", b"x")
            with pytest.raises(TransactionAbortableError) as raised:
                p.send_offsets_to_transaction({TopicPartition("in2", 0): 1}, stale, TIMEOUT)
            assert raised.value.txn_requires_abort()
            with pytest.raises(TransactionAbortableError):
                p.commit_transaction(TIMEOUT)
            p.abort_transaction(TIMEOUT)
            p.begin_transaction()
            p.produce("out2", b"y")
            p.commit_transaction(TIMEOUT)
    finally:
        consumer.close()
    assert read_committed(broker.bootstrap, "out2") == [b"y"]


def test_zombie_fencing(broker):
    """Two producers with one transactional id: the newer one's init_transactions fences the
    older, whose transaction is aborted; the older gets a fatal error, and nothing of its
    transaction becomes visible."""
    create_topic(broker.bootstrap, "z", 2)
    zombie = txn_producer(broker.bootstrap, "tx-z")
    try:
        zombie.begin_transaction()
        zombie.produce("z", b"zombie-0", partition=0)
        zombie.flush(TIMEOUT)  # stored, in an open transaction
        with txn_producer(broker.bootstrap, "tx-z") as successor:
            assert successor._core.idem.producer_id == zombie._core.idem.producer_id
            assert successor._core.idem.epoch > zombie._core.idem.epoch
            zombie.produce("z", b"zombie-1", partition=1)  # a partition not yet added
            with pytest.raises(ProducerFatalError) as raised:
                zombie.commit_transaction(TIMEOUT)
            assert raised.value.is_fatal()
            with pytest.raises(ProducerFatalError):
                zombie.begin_transaction()
            with pytest.raises(ProducerFatalError):
                zombie.produce("z", b"zombie-2")
            successor.begin_transaction()
            successor.produce("z", b"successor", partition=0)
            successor.commit_transaction(TIMEOUT)
    finally:
        zombie.close(1)
    assert read_committed(broker.bootstrap, "z", 0) == [b"successor"]
    assert read_committed(broker.bootstrap, "z", 1) == []
