"""Kafka's own bar for transactions (its system test, on one broker): a consume-transform-
produce copier (txn_copier.py, its own process) moves an input topic of 4 partitions to an
output topic in transactions while it is SIGKILLed and started again under the same
transactional.id, and the broker is kill -9ed and restarted. At the end a read_committed
reader of the output sees exactly the input, in order per partition, nothing twice, nothing
missing, and the group's committed offsets are the input's end.

ONCELOG_TXN_COPY_RECORDS sets the number of records (default 20,000, to keep the test well
under a minute on two cores); the issue's full run is

    ONCELOG_TXN_COPY_RECORDS=100000 .venv/bin/python -m pytest -q tests/e2e/test_txn_copier.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from support.brokers import BrokerProcess, create_topic
from support.txn_clients_helpers import connect
from support.txn_copier_helpers import PARTITIONS, RECORDS, WAIT, read_committed
from support.txn_wire import latest_offsets

COPIER = Path(__file__).parents[1] / "support" / "txn_copier.py"
# When the output has grown past each fraction of the input, what is killed.
FAULTS = [(0.10, "copier"), (0.20, "broker"), (0.30, "copier"), (0.40, "both"),
          (0.55, "copier"), (0.65, "broker"), (0.80, "copier")]
# How far past the next fault's mark the copier may run before it waits for the fault.
GATE_AHEAD = 0.05


class Copier:
    def __init__(self, client: str, bootstrap: str, ends: dict[int, int], gate: Path) -> None:
        self.gate = gate
        self.hold_at(FAULTS[0][0] + GATE_AHEAD)
        self.args = [sys.executable, str(COPIER), client, bootstrap, "input", "output",
                     "copier-group", "copier-txn",
                     ",".join(str(ends[p]) for p in range(PARTITIONS)), str(gate)]
        self.exits: list[int] = []
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL,
                                     env={**os.environ,  # tests/conftest.py's first
                                          "PYTHONPATH": os.pathsep.join(
                                              [os.environ["PYTHONPATH"], *sys.path])})

    def hold_at(self, fraction: float) -> None:
        """The copier starts no transaction past this fraction of the input, so the next
        fault cannot miss it however fast it copies."""
        staged = self.gate.with_suffix(".new")
        staged.write_text(str(int(fraction * RECORDS)))
        staged.replace(self.gate)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)
        self.exits.append(-9)
        self.start()

    def poll(self) -> bool:
        """True once the copier finished; one that stopped on an error is started again."""
        assert self.proc is not None
        code = self.proc.poll()
        if code is None:
            return False
        self.exits.append(code)
        if code == 0:
            return True
        assert len(self.exits) < 60, f"the copier keeps failing: exit codes {self.exits}"
        self.start()
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def fill_input(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 20})
    for i in range(RECORDS):
        producer.produce("input", key=b"k%d" % i, value=b"%d" % i, partition=i % PARTITIONS)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(WAIT) == 0


def committed_offsets(bootstrap: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "copier-group",
                         "enable.auto.commit": False})
    try:
        got = consumer.committed([CTopicPartition("input", p) for p in range(PARTITIONS)],
                                 timeout=WAIT)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in got}


@pytest.mark.parametrize("client", ["confluent", "oncelog"])
def test_copier_killed_and_broker_killed_copies_exactly_once(tmp_path, client):
    broker = BrokerProcess(tmp_path / "data", {"group.initial.rebalance.delay.ms": "0"})
    broker.start()
    copier = None
    try:
        create_topic(broker.bootstrap, "input", PARTITIONS)
        create_topic(broker.bootstrap, "output", PARTITIONS)
        fill_input(broker.bootstrap)
        with connect(broker) as conn:
            ends = latest_offsets(conn, "input", PARTITIONS, 0)
        assert sum(ends.values()) == RECORDS
        copier = Copier(client, broker.bootstrap, ends, tmp_path / "gate")
        deadline = time.monotonic() + WAIT
        faults = list(FAULTS)
        while not copier.poll():
            assert time.monotonic() < deadline, f"not copied in {WAIT}s: {copier.exits}"
            if faults:
                with connect(broker) as conn:
                    grown = sum(latest_offsets(conn, "output", PARTITIONS, 0).values())
                if grown >= faults[0][0] * RECORDS:
                    _, what = faults.pop(0)
                    copier.hold_at(faults[0][0] + GATE_AHEAD if faults else 1.0)
                    if what in ("copier", "both"):
                        copier.kill()
                    if what in ("broker", "both"):
                        broker.restart(clean=False)
            time.sleep(0.05)
        assert not faults, f"the copier finished before every fault: {faults} left"
        print(f"{RECORDS} records, copier exits {copier.exits}")

        copied = read_committed(broker.bootstrap, "output")
        original = read_committed(broker.bootstrap, "input")
        for p in range(PARTITIONS):
            wanted = [b"copied:" + v for v in original[p]]
            assert len(copied[p]) == len(set(copied[p])), f"duplicates in partition {p}"
            assert copied[p] == wanted, (p, len(copied[p]), len(wanted))
        assert committed_offsets(broker.bootstrap) == ends
    finally:
        if copier is not None:
            copier.stop()
        broker.kill()
