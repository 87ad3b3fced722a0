"""What tests besides tests/e2e/test_txn_clients.py use of it."""
from __future__ import annotations

import asyncio
import time

import kafka
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition

from oncelog.client.network.connection import BrokerConnection
from support.brokers import BrokerProcess

TIMEOUT = 60.0


TOPIC = "txn"


PARTITIONS = 2


def transactional(bootstrap: str, txn_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                         "linger.ms": 5, "transaction.timeout.ms": 60_000})
    producer.init_transactions(TIMEOUT)
    return producer


def send(producer: Producer, prefix: str, count: int) -> None:
    for i in range(count):
        producer.produce(TOPIC, value=b"%s%d" % (prefix.encode(), i), partition=i % PARTITIONS)
    assert producer.flush(TIMEOUT) == 0


def connect(broker: BrokerProcess) -> BrokerConnection:
    return BrokerConnection("127.0.0.1", broker.port, client_id="txn-test", timeout=30)


def read_committed_confluent(bootstrap: str, until: dict[int, int]) -> list[tuple]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "rc-confluent",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.assign([CTopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    found = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            positions = {tp.partition: tp.offset for tp in consumer.position(
                [CTopicPartition(TOPIC, p) for p in range(PARTITIONS)])}
            if all(positions[p] >= until[p] for p in until):
                break
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                found.append((msg.partition(), msg.offset(), msg.value()))
    finally:
        consumer.close()
    return found


def read_committed_kafka_python(bootstrap: str, until: dict[int, int]) -> list[tuple]:
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                   isolation_level="read_committed", group_id=None)
    parts = [kafka.TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    found = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            if all(consumer.position(tp) >= until[tp.partition] for tp in parts):
                break
            for tp, records in consumer.poll(timeout_ms=500).items():
                found += [(tp.partition, r.offset, r.value) for r in records]
    finally:
        consumer.close()
    return found


def read_committed_aiokafka(bootstrap: str, until: dict[int, int]) -> list[tuple]:
    async def run():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                    isolation_level="read_committed")
        await asyncio.wait_for(consumer.start(), TIMEOUT)
        parts = [AioTopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        found = []
        deadline = time.monotonic() + TIMEOUT
        try:
            while time.monotonic() < deadline:
                positions = {tp.partition: await consumer.position(tp) for tp in parts}
                if all(positions[p] >= until[p] for p in until):
                    break
                batches = await consumer.getmany(timeout_ms=500)
                for tp, records in batches.items():
                    found += [(tp.partition, r.offset, r.value) for r in records]
        finally:
            await consumer.stop()
        return found

    return asyncio.run(run())


READERS = {"confluent-kafka": read_committed_confluent,
           "kafka-python": read_committed_kafka_python,
           "aiokafka": read_committed_aiokafka}


def expect(prefixes: str, per_prefix: int) -> set[bytes]:
    return {b"%s%d" % (p.encode(), i) for p in prefixes for i in range(per_prefix)}


def assert_read_committed(bootstrap: str, until: dict[int, int], wanted: set[bytes]) -> None:
    for name, reader in READERS.items():
        found = reader(bootstrap, until)
        values = [v for _, _, v in found]
        assert len(values) == len(set(values)), f"{name} read a record twice"
        assert set(values) == wanted, (name, sorted(set(values) ^ wanted))
        assert all(offset < until[p] for p, offset, _ in found), f"{name} read past the LSO"
