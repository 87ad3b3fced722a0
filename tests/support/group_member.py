"""A group consumer of a real Kafka client in its own process, for tests that kill it.

    python tests/support/group_member.py CLIENT BOOTSTRAP GROUP TOPIC ASSIGNOR SESSION_MS SECONDS

CLIENT is confluent, kafka-python or aiokafka. It prints, flushed, one line per event:
``R partition offset`` for each record consumed, ``C partition offset`` for each position
whose commit the broker acknowledged (a synchronous commit after every batch, so what was
consumed and not committed is at most the last batch before each rebalance: a failed commit
is made good by the next one only while the assignment lasts), ``A n`` when it holds n
partitions (confluent: ``A 0`` when its partitions are revoked and ``A n`` when n are
assigned, at every rebalance; the others when the number changes).
It stops on SIGTERM (closing the consumer: leaving the group) or after SECONDS.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time

stopping = False


def _stop(*_: object) -> None:
    global stopping
    stopping = True


def out(*fields: object) -> None:
    print(*fields, flush=True)


def report(batches: dict) -> dict[int, int]:
    """Print the records of a kafka-python / aiokafka poll; the last offset per partition."""
    last: dict[int, int] = {}
    for tp, records in batches.items():
        for r in records:
            out("R", tp.partition, r.offset)
            last[tp.partition] = r.offset
    return last


def committed(last: dict[int, int]) -> None:
    for partition, offset in last.items():
        out("C", partition, offset + 1)


def confluent(bootstrap: str, group: str, topic: str, assignor: str, session_ms: int,
              deadline: float) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "partition.assignment.strategy": assignor,
                         "session.timeout.ms": session_ms, "heartbeat.interval.ms": 300})
    consumer.subscribe([topic], on_assign=lambda c, ps: out("A", len(ps)),
                       on_revoke=lambda c, ps: out("A", 0))
    while not stopping and time.monotonic() < deadline:
        messages = consumer.consume(200, 0.2)
        last: dict[int, int] = {}
        for m in messages:
            if m.error() is None:
                out("R", m.partition(), m.offset())
                last[m.partition()] = m.offset()
        if last:
            try:
                consumer.commit(asynchronous=False)
            except Exception as exc:  # a rebalance under way: the window stays uncommitted
                out("E", exc)
                continue
            committed(last)
    consumer.close()


def kafka_python_subscribe(consumer, topic: str, deadline: float) -> None:
    """Subscribe a kafka-python consumer to ``topic`` and return once it knows the topic's
    partitions, before its first poll (the only place it joins).

    Subscribed and polled at once, it joins before it has the topic's metadata (it asks for it
    retry_backoff_ms after bootstrap); as leader it then assigns nothing, and the metadata
    arriving afterwards starts a rebalance that kafka-python 3.0 does not count as pending
    (Java fixed the same in KAFKA-9815 and checks rejoinNeededOrPending): if a poll times out
    while that rebalance's SyncGroup is in flight, its answer is never applied and the member
    sits without partitions and without heartbeats. Against Kafka exactly the same. Knowing
    the partitions first, the first assignment is complete and the metadata never changes it.
    Subscribing before waiting matters: the coordinator snapshots metadata for what it is
    subscribed to, when metadata arrives."""
    consumer.subscribe([topic])
    while not consumer.partitions_for_topic(topic):  # blocks on a metadata fetch when unknown
        assert time.monotonic() < deadline, f"kafka-python: no partitions of {topic}"


def kafka_python(bootstrap: str, group: str, topic: str, assignor: str, session_ms: int,
                 deadline: float) -> None:
    from kafka import KafkaConsumer
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    strategy = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             partition_assignment_strategy=[strategy[assignor]],
                             session_timeout_ms=session_ms, heartbeat_interval_ms=300)
    kafka_python_subscribe(consumer, topic, deadline)
    held = -1
    while not stopping and time.monotonic() < deadline:
        batches = consumer.poll(timeout_ms=200)
        if len(consumer.assignment()) != held:
            held = len(consumer.assignment())
            out("A", held)
        last = report(batches)
        if last:
            try:
                consumer.commit()
            except Exception as exc:
                out("E", exc)
                continue
            committed(last)
    consumer.close()


def aiokafka(bootstrap: str, group: str, topic: str, assignor: str, session_ms: int,
             deadline: float) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    strategy = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}

    async def run() -> None:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    partition_assignment_strategy=(strategy[assignor],),
                                    session_timeout_ms=session_ms, heartbeat_interval_ms=300)
        await consumer.start()
        held = -1
        try:
            while not stopping and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=200)
                if len(consumer.assignment()) != held:
                    held = len(consumer.assignment())
                    out("A", held)
                last = report(batches)
                if last:
                    try:
                        await consumer.commit()
                    except Exception as exc:
                        out("E", exc)
                        continue
                    committed(last)
        finally:
            await consumer.stop()

    asyncio.run(run())


def main() -> None:
    client, bootstrap, group, topic, assignor, session_ms, seconds = sys.argv[1:8]
    signal.signal(signal.SIGTERM, _stop)
    deadline = time.monotonic() + float(seconds)
    run = {"confluent": confluent, "kafka-python": kafka_python, "aiokafka": aiokafka}[client]
    run(bootstrap, group, topic, assignor, int(session_ms), deadline)
    out("X")


if __name__ == "__main__":
    main()
