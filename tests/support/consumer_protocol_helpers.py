"""What tests besides tests/e2e/test_consumer_protocol.py use of it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from confluent_kafka import (
    Consumer,
    Producer,
    TopicPartition,
)

from oncelog.client.network.connection import connect
from oncelog.protocol import api_versions as apis

SESSION_MS = 3000


SETTINGS = {
    "group_consumer_min_session_timeout_ms": 1000,
    "group_consumer_session_timeout_ms": SESSION_MS,
    "group_consumer_min_heartbeat_interval_ms": 100,
    "group_consumer_heartbeat_interval_ms": 300,
    "group_initial_rebalance_delay_ms": 0,
}


WAIT = 30.0


MEMBER_SCRIPT = Path(__file__).with_name("consumer_member.py")


class Member:
    """A group consumer in its own process (tests/support/consumer_member.py) and what it
    reported."""

    def __init__(self, bootstrap: str, group: str, topic: str, name: str,
                 protocol: str = "consumer", instance_id: str = "") -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, str(MEMBER_SCRIPT), bootstrap, group, topic, name, protocol,
             instance_id],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.events: list[dict] = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self.changed:
                self.events.append(json.loads(line))
                self.changed.notify_all()

    def wait_for(self, condition, what: str, timeout: float = WAIT):
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                result = condition(self)
                if result:
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.name}: no {what} within {timeout}s; "
                                         f"events: {self.events[-20:]}")
                self.changed.wait(min(left, 0.5))

    def assignment(self) -> set[int]:
        held: set[int] = set()
        for e in list(self.events):
            if e["ev"] == "assign":
                held |= set(e["parts"])
            elif e["ev"] in ("revoke", "lost"):
                held -= set(e["parts"])
        return held

    def revoked(self, since: int = 0) -> set[int]:
        return {p for e in self.events[since:] if e["ev"] in ("revoke", "lost")
                for p in e["parts"]}

    def records(self) -> set[tuple[int, int]]:
        return {(e["p"], e["o"]) for e in list(self.events) if e["ev"] == "rec"}

    def command(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def commit(self) -> dict[int, int]:
        count = sum(1 for e in self.events if e["ev"] == "committed")
        self.command("commit")
        event = self.wait_for(lambda m: [e for e in m.events if e["ev"] == "committed"][count:],
                              "commit")
        return {int(p): o for p, o in event[0]["parts"].items()}

    def close(self) -> None:
        self.command("close")
        self.proc.wait(WAIT)
        assert self.proc.returncode == 0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(WAIT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(WAIT)


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(per_partition):
        for p in range(partitions):
            producer.produce(topic, f"{p}-{i}".encode(), partition=p)
    assert producer.flush(WAIT) == 0


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "offsets-probe"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)}
    finally:
        consumer.close()


def all_records(ends: dict[int, int]) -> set[tuple[int, int]]:
    return {(p, o) for p, end in ends.items() for o in range(end)}


def wait_shared(group: list[Member], partitions: int, what: str) -> None:
    """Until the members' assignments split the topic between them, each holding some."""
    def split(_):
        held = [m.assignment() for m in group]
        return (sum(len(h) for h in held) == partitions and set().union(*held) ==
                set(range(partitions)) and all(held))
    group[0].wait_for(split, what)


def wait_consumed(group: list[Member], ends: dict[int, int]) -> None:
    wanted = all_records(ends)
    group[0].wait_for(lambda _: wanted <= set().union(*(m.records() for m in group)),
                      "every record consumed")


def raw(bootstrap: str):
    conn = connect(bootstrap)
    conn.versions[apis.CONSUMER_GROUP_HEARTBEAT] = 1
    conn.versions[apis.CONSUMER_GROUP_DESCRIBE] = 1
    return conn
