"""Offsets committed inside transactions (TxnOffsetCommit) against plain OffsetCommits,
deletions and markers, on a real broker with real clients (kafka-python's transactional
producer, confluent-kafka's consumer), before and after a restart and a clean of
``__consumer_offsets``.

Kafka's rules (OffsetMetadataManager): a transactional offset takes effect at its COMMIT
marker only if its record is newer in the log than the committed one; a plain tombstone of
an offset (DeleteTopics, DeleteGroups, OffsetDelete) drops the pending transactional offsets
of that partition too.
"""

from __future__ import annotations

import time

import kafka
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from support.brokers import create_topic
from support.compaction_clients_helpers import wait_until_cleaned

TIMEOUT = 30
TOPIC = "t"


def txn_producer(bootstrap: str, txn_id: str) -> kafka.KafkaProducer:
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id,
                                   request_timeout_ms=TIMEOUT * 1000)
    producer.init_transactions()
    return producer


def txn_offset(producer: kafka.KafkaProducer, group: str, offset: int,
               topic: str = TOPIC) -> None:
    producer.begin_transaction()
    producer.send_offsets_to_transaction(
        {kafka.TopicPartition(topic, 0): kafka.structs.OffsetAndMetadata(offset, "", -1)},
        group)


def plain_commit(bootstrap: str, group: str, offset: int, topic: str = TOPIC) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def committed(bootstrap: str, group: str, topic: str = TOPIC) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        return consumer.committed([TopicPartition(topic, 0)], timeout=TIMEOUT)[0].offset
    finally:
        consumer.close()


def test_a_committed_txn_offset_does_not_overwrite_a_later_plain_commit(start_broker):
    """Defect 5: TxnOffsetCommit 10, OffsetCommit 20, EndTxn commit: the group stays at
    20, in memory, after a restart, and after a clean of __consumer_offsets and a kill."""
    broker = start_broker(log_cleaner_backoff_ms=50, offsets_topic_num_partitions=1,
                          offsets_topic_segment_bytes=4096)
    create_topic(broker.bootstrap, TOPIC)
    producer = txn_producer(broker.bootstrap, "tx-5")
    txn_offset(producer, "g5", 10)
    plain_commit(broker.bootstrap, "g5", 20)
    producer.commit_transaction()
    assert committed(broker.bootstrap, "g5") == 20
    # ... and the other way round: a transactional offset newer than the plain one wins.
    plain_commit(broker.bootstrap, "g5b", 20)
    txn_offset(producer, "g5b", 30)
    producer.commit_transaction()
    assert committed(broker.bootstrap, "g5b") == 30
    # An aborted transactional offset newer than the plain commit changes nothing.
    txn_offset(producer, "g5c", 40)
    plain_commit(broker.bootstrap, "g5c", 20)
    producer.abort_transaction()
    plain_commit(broker.bootstrap, "g5d", 20)
    txn_offset(producer, "g5d", 50)
    producer.abort_transaction()
    producer.close()
    broker.restart()
    expected = {"g5": 20, "g5b": 30, "g5c": 20, "g5d": 20}
    assert {g: committed(broker.bootstrap, g) for g in expected} == expected
    # Roll and clean __consumer_offsets (other keys' commits fill segments), then kill.
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "filler",
                         "enable.auto.commit": False})
    try:
        for offset in range(1, 201):
            consumer.commit(offsets=[TopicPartition(TOPIC, 0, offset)], asynchronous=False)
    finally:
        consumer.close()
    wait_until_cleaned(broker, broker.data_dir / "__consumer_offsets-0")
    broker.kill()
    broker.start()
    assert {g: committed(broker.bootstrap, g) for g in expected} == expected


def test_pending_txn_offsets_go_with_their_deleted_topic(start_broker):
    """Defect 7: a transaction's offsets for a topic deleted before its COMMIT marker are
    not re-added by the marker: the topic created again has no committed offset."""
    broker = start_broker()
    create_topic(broker.bootstrap, TOPIC)
    producer = txn_producer(broker.bootstrap, "tx-7")
    txn_offset(producer, "g7", 10)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics([TOPIC])[TOPIC].result(TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while TOPIC in admin.list_topics(timeout=TIMEOUT).topics:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    producer.commit_transaction()
    create_topic(broker.bootstrap, TOPIC)
    assert committed(broker.bootstrap, "g7") < 0
    producer.close()
    broker.restart()
    assert committed(broker.bootstrap, "g7") < 0


def test_pending_txn_offsets_go_with_deleted_groups_and_offsets(start_broker):
    """Defect 7's suspects: DeleteGroups and OffsetDelete drop a transaction's pending
    offsets of the group too, so its COMMIT marker brings nothing back."""
    broker = start_broker()
    create_topic(broker.bootstrap, TOPIC)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    producer = txn_producer(broker.bootstrap, "tx-7b")
    # DeleteGroups of a group that has only a pending transactional offset.
    plain_commit(broker.bootstrap, "g7b", 5)
    txn_offset(producer, "g7b", 10)
    admin.delete_consumer_groups(["g7b"])["g7b"].result(TIMEOUT)
    producer.commit_transaction()
    assert committed(broker.bootstrap, "g7b") < 0
    # OffsetDelete (kafka-python's admin: confluent-kafka has no OffsetDelete call).
    plain_commit(broker.bootstrap, "g7c", 5)
    txn_offset(producer, "g7c", 10)
    kadmin = kafka.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        result = kadmin.delete_group_offsets("g7c", [kafka.TopicPartition(TOPIC, 0)])
    finally:
        kadmin.close()
    assert all(error.errno == 0 for error in result.values()), result
    producer.commit_transaction()
    assert committed(broker.bootstrap, "g7c") < 0
    producer.close()
    broker.restart()
    assert committed(broker.bootstrap, "g7b") < 0
    assert committed(broker.bootstrap, "g7c") < 0


def test_write_txn_markers_from_outside_decides_pending_offsets(start_broker):
    """Suspected, shown: a WriteTxnMarkers request (what a transaction coordinator on
    another broker sends) to __consumer_offsets decides the transaction's offsets in
    memory at once, as the reload after a restart decides them from the log."""
    from support import txn_wire

    from oncelog.client.network.connection import BrokerConnection
    from oncelog.coordinator.internal_log import partition_for

    broker = start_broker(offsets_topic_num_partitions=3)
    create_topic(broker.bootstrap, TOPIC)
    conn = BrokerConnection("127.0.0.1", broker.port)
    try:
        error, pid, epoch = txn_wire.init_producer_id(conn, "tx-outside")
        assert error is txn_wire.E.none
        assert txn_wire.add_offsets(conn, "tx-outside", pid, epoch, "g3") is txn_wire.E.none
        assert txn_wire.txn_offset_commit(conn, "tx-outside", pid, epoch, "g3", TOPIC,
                                          {0: 10}) == [txn_wire.E.none]
        marker_at = ("__consumer_offsets", partition_for("g3", 3))
        assert txn_wire.write_marker(conn, pid, epoch, True, 0, [marker_at]) == [
            txn_wire.E.none]
    finally:
        conn.close()
    assert committed(broker.bootstrap, "g3") == 10
    broker.restart()
    assert committed(broker.bootstrap, "g3") == 10
