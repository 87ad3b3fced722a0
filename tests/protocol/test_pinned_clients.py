"""kafka-python pinned to a broker version (``api_version``), as deployments pin it: it then
sends that version's request table without asking ApiVersions, so the broker must serve
every version Kafka served then. Produce, consume, a consumer group (subscribe + commit) and
a transaction, end to end, for Kafka 2.8, 3.8 and 4.1's tables; and the admin client.
"""

from __future__ import annotations

import time

import kafka
import kafka.admin
import pytest
from support.group_member import kafka_python_subscribe

TIMEOUT = 30.0
PINNED = [(2, 8, 0), (3, 8, 0), (4, 1, 0)]


def _name(version: tuple[int, int, int]) -> str:
    return "v" + "".join(map(str, version))


@pytest.mark.parametrize("version", PINNED, ids=_name)
def test_pinned_kafka_python_end_to_end(broker, version):
    topic = f"pinned-{_name(version)}"
    common = {"bootstrap_servers": broker.bootstrap, "api_version": version,
              "request_timeout_ms": int(TIMEOUT * 1000)}
    admin = kafka.admin.KafkaAdminClient(**common)
    try:
        admin.create_topics([kafka.admin.NewTopic(topic, 2, 1)])
        assert topic in admin.list_topics()
    finally:
        admin.close()

    producer = kafka.KafkaProducer(max_block_ms=int(TIMEOUT * 1000), **common)
    try:
        sent = [producer.send(topic, value=b"plain-%d" % i, partition=i % 2) for i in range(6)]
        producer.flush(TIMEOUT)
        assert all(f.get(TIMEOUT).offset >= 0 for f in sent)
    finally:
        producer.close(TIMEOUT)

    txn = kafka.KafkaProducer(transactional_id=f"tx-{_name(version)}",
                              max_block_ms=int(TIMEOUT * 1000), **common)
    try:
        txn.init_transactions()
        txn.begin_transaction()
        for i in range(4):
            txn.send(topic, value=b"committed-%d" % i, partition=i % 2)
        txn.commit_transaction()
        txn.begin_transaction()
        txn.send(topic, value=b"aborted", partition=0)
        txn.flush(TIMEOUT)
        txn.abort_transaction()
    finally:
        txn.close(TIMEOUT)

    group = f"group-{_name(version)}"
    consumer = kafka.KafkaConsumer(group_id=group, enable_auto_commit=False,
                                   auto_offset_reset="earliest",
                                   isolation_level="read_committed", **common)
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + TIMEOUT
        kafka_python_subscribe(consumer, topic, deadline)  # see there: kafka-python's race
        while len(got) < 10 and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                got += [m.value for m in batch]
        consumer.commit()
        committed = {p: consumer.committed(kafka.TopicPartition(topic, p)) for p in (0, 1)}
    finally:
        consumer.close()
    assert sorted(got) == sorted([b"plain-%d" % i for i in range(6)]
                                 + [b"committed-%d" % i for i in range(4)])
    # Each partition's commit is past the records read (and the transaction markers).
    assert all(offset is not None and offset >= 5 for offset in committed.values()), committed


def test_pinned_admin_lists_topics(broker):
    admin = kafka.admin.KafkaAdminClient(bootstrap_servers=broker.bootstrap,
                                         api_version=(4, 1, 0),
                                         request_timeout_ms=int(TIMEOUT * 1000))
    try:
        admin.create_topics([kafka.admin.NewTopic("listed", 1, 1)])
        assert "listed" in admin.list_topics()
    finally:
        admin.close()
