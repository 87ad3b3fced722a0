"""A broker's clean shutdown in cluster mode closes its replicas' logs several at a time
(replica_manager.py's _close_logs: closing is mostly fsyncs, and one after another on the
event loop 1,000 replicas took 25 s of a controlled shutdown), and every one of them is
closed as a clean shutdown closes it: its clean-shutdown marker written, its records there
after the restart."""

from __future__ import annotations

import re

import pytest
from support.brokers import BrokerProcess, read_to_end

from oncelog.client.admin.admin import Admin
from oncelog.log.log import CLEAN_SHUTDOWN_FILE

pytestmark = pytest.mark.xdist_group("zookeeper")

TOPIC = "closed-together"
PARTITIONS = 24


def test_the_replicas_logs_are_closed_together_and_clean(zookeeper, tmp_path):
    from confluent_kafka import Producer

    broker = BrokerProcess(tmp_path / "broker", {
        "broker.id": "1", "zookeeper.connect": zookeeper.chroot("closed"),
        "zookeeper.session.timeout.ms": "4000"}).start()
    try:
        with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
            admin.create_topic(TOPIC, PARTITIONS, 1)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
        for p in range(PARTITIONS):
            producer.produce(TOPIC, f"record {p}".encode(), partition=p)
        assert producer.flush(30) == 0
        assert broker.stop() == 0, broker.log_text()
        closed = re.findall(r"closed (\d+) replica logs on (\d+) threads", broker.log_text())
        assert closed and int(closed[-1][0]) == PARTITIONS and int(closed[-1][1]) > 1, \
            broker.log_text()[-3000:]
        for p in range(PARTITIONS):
            assert (tmp_path / "broker" / f"{TOPIC}-{p}" / CLEAN_SHUTDOWN_FILE).exists(), p
        broker.start()
        found = read_to_end(broker.bootstrap, TOPIC, PARTITIONS)
        assert {p: [v for _, v in records] for p, records in found.items()} == {
            p: [f"record {p}".encode()] for p in range(PARTITIONS)}
        assert "Traceback" not in broker.log_text(), broker.log_text()
    finally:
        if broker.alive:
            broker.stop()
