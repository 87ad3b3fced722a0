"""Zombie fencing end to end and the transaction APIs' answers to bad input.

Zombies: two producers with one transactional.id; once the second has initialised, the
first's produce, AddPartitions, AddOffsets, TxnOffsetCommit and EndTxn are refused with
PRODUCER_FENCED or INVALID_PRODUCER_EPOCH (confluent-kafka's producer sees a fatal error) and
nothing of its transaction reaches read_committed readers of confluent-kafka, kafka-python
and aiokafka, nor the group's offsets.

Bad input (crafted requests; what test_transaction_coordinator.py checks on the coordinator
alone is checked here over the wire, with "nothing stored" read back from the broker): a
transaction timeout over transaction.max.timeout.ms, EndTxn without a transaction,
AddPartitions for an unknown topic, a transactional batch without AddPartitions (KIP-890 part
1), a batch with a wrong epoch, markers from a coordinator that is not the current one and
with a wrong producer epoch on an open transaction.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import KafkaError as CKafkaError
from confluent_kafka import TopicPartition as CTopicPartition
from kio.schema.errors import ErrorCode as E
from support.brokers import BrokerProcess, create_topic
from support.txn_clients_helpers import (
    PARTITIONS,
    TOPIC,
    assert_read_committed,
    connect,
    expect,
    send,
    transactional,
)
from support.txn_wire import (
    NOW_MS,
    add_offsets,
    add_partitions,
    end_txn,
    init_producer_id,
    latest_offsets,
    list_txns,
    produce_txn,
    txn_offset_commit,
    wait_settled,
    write_marker,
)
from support.waits import wait_for

from oncelog.client.network import calls
from oncelog.protocol import api_versions as apis
from oncelog.protocol.records import encode_batch
from oncelog.protocol.schema import build

TIMEOUT = 60.0
FENCED = {E.producer_fenced, E.invalid_producer_epoch}
CK_FENCED = {CKafkaError._FENCED, CKafkaError.PRODUCER_FENCED,
             CKafkaError.INVALID_PRODUCER_EPOCH}


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess(tmp_path / "data", {"group.initial.rebalance.delay.ms": "0",
                                          "transaction.max.timeout.ms": "60000"}).start()
    try:
        create_topic(b.bootstrap, TOPIC, PARTITIONS)
        yield b
    finally:
        b.kill()


def committed_offsets(bootstrap: str, group: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        got = consumer.committed([CTopicPartition(TOPIC, p) for p in range(PARTITIONS)],
                                 timeout=TIMEOUT)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in got}


def test_a_zombie_confluent_producer_is_fenced_and_nothing_of_it_is_visible(broker):
    group = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "zombie-group",
                      "enable.auto.commit": False})
    try:
        errors: list = []
        zombie = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id":
                           "shared-id", "linger.ms": 5, "error_cb": errors.append})
        zombie.init_transactions(TIMEOUT)
        zombie.begin_transaction()
        send(zombie, "z", 6)  # stored, in a transaction the new instance will abort
        successor = transactional(broker.bootstrap, "shared-id")

        zombie.produce(TOPIC, value=b"late", partition=0)
        try:  # confluent-kafka raises a fatal error from the flush (or hands it to error_cb)
            zombie.flush(TIMEOUT)
        except KafkaException as exc:
            errors.append(exc.args[0])
        assert any(e.fatal() and e.code() in CK_FENCED for e in errors), errors
        with pytest.raises(KafkaException) as offsets_error:
            zombie.send_offsets_to_transaction(
                [CTopicPartition(TOPIC, 0, 99), CTopicPartition(TOPIC, 1, 99)],
                group.consumer_group_metadata(), TIMEOUT)
        assert offsets_error.value.args[0].code() in CK_FENCED
        with pytest.raises(KafkaException) as commit_error:
            zombie.commit_transaction(TIMEOUT)
        assert commit_error.value.args[0].code() in CK_FENCED
        assert commit_error.value.args[0].fatal()

        successor.begin_transaction()
        send(successor, "s", 6)
        successor.send_offsets_to_transaction(
            [CTopicPartition(TOPIC, 0, 7), CTopicPartition(TOPIC, 1, 7)],
            group.consumer_group_metadata(), TIMEOUT)
        successor.commit_transaction(TIMEOUT)
        with connect(broker) as conn:
            end = wait_settled(conn, TOPIC, PARTITIONS)
        assert_read_committed(broker.bootstrap, end, expect("s", 6))
        assert committed_offsets(broker.bootstrap, "zombie-group") == {0: 7, 1: 7}
        for producer in (zombie, successor):
            producer.flush(1)
    finally:
        group.close()


def test_every_call_of_a_zombie_is_refused_on_the_wire(broker):
    """The same with crafted requests, so that each API's own answer is seen (a client stops
    at its first fatal error)."""
    with connect(broker) as conn:
        error, pid, old = init_producer_id(conn, "raw-zombie")
        assert error is E.none
        assert set(add_partitions(conn, "raw-zombie", pid, old, [(TOPIC, 0)]).values()) == \
            {E.none}
        assert produce_txn(conn, "raw-zombie", TOPIC, 0, pid, old, 0, [b"z0", b"z1"]) is E.none
        assert add_offsets(conn, "raw-zombie", pid, old, "raw-group") is E.none
        error, pid2, new = init_producer_id(conn, "raw-zombie")  # aborts the open one
        assert (error, pid2) == (E.none, pid) and new > old
        assert produce_txn(conn, "raw-zombie", TOPIC, 0, pid, old, 2, [b"z2"]) in FENCED
        assert set(add_partitions(conn, "raw-zombie", pid, old, [(TOPIC, 1)]).values()) \
            <= FENCED
        assert add_offsets(conn, "raw-zombie", pid, old, "raw-group") in FENCED
        assert set(txn_offset_commit(conn, "raw-zombie", pid, old, "raw-group", TOPIC,
                                     {0: 5})) <= FENCED
        assert end_txn(conn, "raw-zombie", pid, old, True)[0] in FENCED
        # The new instance goes on at its epoch.
        assert add_partitions(conn, "raw-zombie", pid, new, [(TOPIC, 1)]) == \
            {(TOPIC, 1): E.none}
        assert end_txn(conn, "raw-zombie", pid, new, False)[0] is E.none
        # Partition 1 holds no record of the aborted transaction, so its last stable offset
        # equals its end before the marker is written too (the coordinator writes markers
        # after it answers EndTxn): wait for the marker, then for everything settled (a
        # fresh-clone run read 0 here).
        wait_for(lambda: latest_offsets(conn, TOPIC, PARTITIONS, 0)[1] >= 1, TIMEOUT,
                 "the abort marker on partition 1")
        end = wait_settled(conn, TOPIC, PARTITIONS)
        assert end[1] == 1  # only the new instance's abort marker
    assert_read_committed(broker.bootstrap, end, set())
    assert committed_offsets(broker.bootstrap, "raw-group") == {0: -1001, 1: -1001}


def test_bad_transactional_requests_get_kafkas_errors_and_store_nothing(broker):
    with connect(broker) as conn:
        # A timeout over transaction.max.timeout.ms: refused, no transactional id kept.
        error, _, _ = init_producer_id(conn, "too-long", timeout_ms=120_000)
        assert error is E.invalid_transaction_timeout
        assert "too-long" not in list_txns(conn)

        error, pid, epoch = init_producer_id(conn, "bad")
        assert error is E.none
        # EndTxn without a transaction.
        assert end_txn(conn, "bad", pid, epoch, True)[0] is E.invalid_txn_state
        # (An abort there is allowed under transaction version 2, to bump the epoch.)
        # AddPartitions naming an unknown topic: nothing of the request is added.
        assert add_partitions(conn, "bad", pid, epoch, [(TOPIC, 0), ("no-such-topic", 0)]) == \
            {(TOPIC, 0): E.operation_not_attempted, ("no-such-topic", 0):
             E.unknown_topic_or_partition}
        assert list_txns(conn)["bad"] == "Empty"
        # A transactional batch without AddPartitions (KIP-890 part 1): refused.
        assert produce_txn(conn, "bad", TOPIC, 0, pid, epoch, 0, [b"stray"]) is \
            E.invalid_txn_state
        assert produce_txn(conn, None, TOPIC, 0, pid, epoch, 0, [b"stray"]) is \
            E.invalid_txn_state  # nor without its transactional id
        assert latest_offsets(conn, TOPIC, PARTITIONS, 0) == {0: 0, 1: 0}

        # An open transaction on partition 0; batches with a wrong epoch are refused.
        assert add_partitions(conn, "bad", pid, epoch, [(TOPIC, 0)]) == {(TOPIC, 0): E.none}
        assert produce_txn(conn, "bad", TOPIC, 0, pid, epoch + 1, 0, [b"ahead"]) is not E.none
        assert produce_txn(conn, "bad", TOPIC, 0, pid, epoch, 0, [b"a", b"b"]) is E.none
        assert produce_txn(conn, "bad", TOPIC, 1, pid, epoch, 0, [b"other"]) is \
            E.invalid_txn_state  # partition 1 was not added
        # Commit it, so that the partition knows this producer's coordinator epoch.
        error, next_epoch = end_txn(conn, "bad", pid, epoch, True)
        assert error is E.none
        seq = 0 if next_epoch != epoch else 2  # a bumped epoch (KIP-890 part 2) starts at 0
        epoch = next_epoch
        end = wait_settled(conn, TOPIC, PARTITIONS)
        assert end == {0: 3, 1: 0}  # two records and the marker

        # A second transaction, left open: markers not from the current coordinator, or for
        # an older producer epoch, are refused and change nothing.
        assert add_partitions(conn, "bad", pid, epoch, [(TOPIC, 0)]) == {(TOPIC, 0): E.none}
        assert produce_txn(conn, "bad", TOPIC, 0, pid, epoch, seq, [b"open"]) is E.none
        known = conn.call(apis.DESCRIBE_PRODUCERS, lambda mod, v: build(
            mod.DescribeProducersRequest, topics=(build(
                mod.TopicRequest, name=TOPIC, partition_indexes=(0,)),)))
        entry = known.topics[0].partitions[0].active_producers[0]
        assert entry.current_txn_start_offset == 3
        assert write_marker(conn, pid, epoch, True, entry.coordinator_epoch - 1,
                            [(TOPIC, 0)]) == [E.transaction_coordinator_fenced]
        assert write_marker(conn, pid, epoch - 1, True, entry.coordinator_epoch,
                            [(TOPIC, 0)]) == [E.invalid_producer_epoch]
        assert latest_offsets(conn, TOPIC, PARTITIONS, 0) == {0: 4, 1: 0}
        assert latest_offsets(conn, TOPIC, PARTITIONS, 1) == {0: 3, 1: 0}
        assert list_txns(conn)["bad"] == "Ongoing"
        # The real coordinator aborts it.
        assert end_txn(conn, "bad", pid, epoch, False)[0] is E.none
        assert wait_settled(conn, TOPIC, PARTITIONS) == {0: 5, 1: 0}
        # A plain record in partition 1: confluent-kafka reports no position in a partition
        # it read nothing from, and the readers below wait for their positions.
        calls.produce(conn, TOPIC, 1, encode_batch([(None, b"plain", (), NOW_MS)]))
        end = wait_settled(conn, TOPIC, PARTITIONS)
    assert_read_committed(broker.bootstrap, end, {b"a", b"b", b"plain"})

