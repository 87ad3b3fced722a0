"""oncelog.Consumer group members for the tests of both group protocols
(test_consumer_groups_client.py, test_consumer_protocol_client.py): records produced with
confluent-kafka, members that record what they read and what they were given, and the waits
on them."""

from __future__ import annotations

import time
from collections import Counter

from confluent_kafka import Producer

from oncelog import Consumer, TopicPartition

WAIT = 60.0  # bound of every wait below (conditions, not sleeps)
TOPIC = "orders"


def produce(bootstrap: str, first: int, count: int, topic: str = TOPIC,
            partitions: int = 6) -> list[bytes]:
    """``count`` records with values first..first+count-1, spread over the partitions."""
    failed = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    values = [b"%d" % i for i in range(first, first + count)]
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=(first + i) % partitions,
                         on_delivery=lambda error, _: error and failed.append(error))
    assert producer.flush(30) == 0 and not failed, failed
    return values


class Member:
    """One oncelog consumer of the group and what happened to it; subclasses name the
    configuration of their protocol in ``BASE``."""

    BASE: dict = {}

    def __init__(self, bootstrap: str, group: str, topics=(TOPIC,), **config) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "auto.offset.reset": "earliest", **self.BASE, **config})
        self.values: list[bytes] = []
        self.events: list[tuple[str, frozenset]] = []
        self.consumer.subscribe(list(topics), on_assign=self._event("assign"),
                                on_revoke=self._event("revoke"), on_lost=self._event("lost"))
        self.closed = False

    def _event(self, kind):
        def record(consumer, partitions):
            self.events.append((kind, frozenset(partitions)))
        return record

    def poll(self) -> None:
        if not self.closed:
            self.values += [r.value for r in self.consumer.poll(0.05)]

    @property
    def assignment(self) -> set[TopicPartition]:
        return set(self.consumer.assignment())

    @property
    def settled(self) -> bool:
        group = self.consumer._group
        membership = group.membership
        # Only the classic protocol's membership can be stable and still owe a rejoin, or be
        # stable before poll() gave the consumer its assignment: a SyncGroup answer read by
        # the heartbeat thread, or after poll()'s wait ran out, is applied (and on_assign
        # run) by the next poll().
        return not self.closed and membership.stable and \
            not getattr(membership, "rejoin_needed", False) and \
            getattr(group, "_change", None) is None

    def close(self) -> None:
        self.consumer.close()
        self.closed = True


def poll_until(members, condition, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        for m in members:
            m.poll()


def partitions(topic=TOPIC, n=6) -> set[TopicPartition]:
    return {TopicPartition(topic, p) for p in range(n)}


def split_evenly(members, total=6) -> bool:
    """The live members are settled and hold ``total`` partitions between them, evenly
    (all 6 unless other members hold the rest)."""
    live = [m for m in members if not m.closed]
    if not all(m.settled for m in live):
        return False
    sets = [m.assignment for m in live]
    return sum(len(s) for s in sets) == len(set().union(*sets)) == total \
        and max(map(len, sets)) - min(map(len, sets)) <= 1


def consumed(members) -> Counter:
    return Counter(v for m in members for v in m.values)
