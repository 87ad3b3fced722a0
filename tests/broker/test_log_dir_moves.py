"""Moving a partition between two log directories of one broker (AlterReplicaLogDirs):
online while an idempotent producer writes, and crash-safe: a broker killed (SIGKILL) at
each point of the move starts again with exactly one complete copy of the partition, in
the directory the commit decided, holding everything acknowledged exactly once.

The kill points are the broker's own (ONCELOG_LOG_DIR_MOVE_CRASH, see
broker/log_dir_moves.py), so each run dies at the same moment of the move.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from confluent_kafka import Producer
from kafka.admin import KafkaAdminClient
from kafka.errors import LogDirNotFoundError, NoError, UnknownTopicOrPartitionError
from support.brokers import START_TIMEOUT, BrokerProcess, create_topic, read_to_end

from oncelog.client.admin.admin import Admin

TOPIC = "moving"


def jbod_broker(tmp_path, env=None, **settings) -> tuple[BrokerProcess, str, str]:
    a, b = tmp_path / "a", tmp_path / "b"
    broker = BrokerProcess(a, {"log.dirs": f"{a},{b}", "log.internal.segment.bytes": "16384",
                               **settings}, env=env).start()
    return broker, str(a), str(b)


def produce(bootstrap: str, first: int, count: int, partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5, "batch.size": 4096})
    failed = []
    for i in range(first, first + count):
        producer.produce(TOPIC, value(i), partition=partition,
                         on_delivery=lambda err, msg: err and failed.append(err))
    assert producer.flush(START_TIMEOUT) == 0 and not failed, failed


def values(bootstrap: str, partitions: int = 1) -> list[bytes]:
    return [v for _, v in read_to_end(bootstrap, TOPIC, partitions)[0]]


def value(i: int) -> bytes:
    return (b"value-%06d" % i).ljust(100, b".")


def expected(count: int) -> list[bytes]:
    return [value(i) for i in range(count)]


def where(bootstrap: str, partition: int = 0) -> list[tuple[str, bool]]:
    """(directory, is future) of each copy of the partition DescribeLogDirs shows."""
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        (dirs,) = admin.describe_log_dirs({TOPIC: [partition]}).values()
    return sorted((d.path, r.is_future) for d in dirs for r in d.replicas)


def wait_until_in(bootstrap: str, directory: str, partition: int = 0) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while where(bootstrap, partition) != [(directory, False)]:
        assert time.monotonic() < deadline, f"not moved: {where(bootstrap, partition)}"
        time.sleep(0.05)


def on_disk(*dirs: str) -> dict[str, list[str]]:
    """What each log directory holds of the topic: partition, future and deleted dirs."""
    return {d: sorted(n for n in os.listdir(d) if n.startswith(TOPIC)) for d in dirs}


def test_a_partition_moves_online_while_an_idempotent_producer_writes(tmp_path):
    broker, a, b = jbod_broker(tmp_path)
    try:
        create_topic(broker.bootstrap, TOPIC, 2)  # moving-0 in a, moving-1 in b
        assert where(broker.bootstrap) == [(a, False)]
        produce(broker.bootstrap, 0, 3000)
        producer = Producer({"bootstrap.servers": broker.bootstrap,
                             "enable.idempotence": True, "linger.ms": 2})
        delivered, failed, stop = [], [], threading.Event()

        def keep_producing() -> None:
            i = 3000
            while not stop.is_set() and i < 200_000:
                producer.produce(TOPIC, value(i), partition=0, on_delivery=lambda e, m:
                                 failed.append(e) if e else delivered.append(m.value()))
                producer.poll(0)
                i += 1
                if i % 200 == 0:
                    producer.flush(START_TIMEOUT)

        writer = threading.Thread(target=keep_producing)
        writer.start()
        try:
            admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
            try:
                assert admin.alter_replica_log_dirs({(TOPIC, 0, 0): b}) == \
                    {(TOPIC, 0, 0): NoError}
                wait_until_in(broker.bootstrap, b)
                assert admin.alter_replica_log_dirs({(TOPIC, 0, 0): a}) == \
                    {(TOPIC, 0, 0): NoError}
                wait_until_in(broker.bootstrap, a)
                # bad input: an unknown directory, an unknown partition
                assert admin.alter_replica_log_dirs({(TOPIC, 1, 0): "/no/such/dir"}) == \
                    {(TOPIC, 1, 0): LogDirNotFoundError}
                assert admin.alter_replica_log_dirs({(TOPIC, 9, 0): b}) == \
                    {(TOPIC, 9, 0): UnknownTopicOrPartitionError}
            finally:
                admin.close()
        finally:
            stop.set()
            writer.join(60)
            assert producer.flush(START_TIMEOUT) == 0
        assert not failed, failed[:3]
        assert len(delivered) > 0
        assert values(broker.bootstrap, 2) == expected(3000 + len(delivered))
        # moving-1 (placed in b) was never written: reading it created nothing
        assert on_disk(a, b) == {a: [f"{TOPIC}-0"], b: []}
        log = broker.log_text()
        assert "LOG_DIR_NOT_FOUND" in log or "is not one of this broker's log.dirs" in log
        broker.restart()
        assert where(broker.bootstrap) == [(a, False)]
        assert values(broker.bootstrap, 2) == expected(3000 + len(delivered))
    finally:
        if broker.alive:
            broker.stop()
    assert "Traceback" not in broker.log_text(), broker.log_text()


@pytest.mark.parametrize(("point", "lands_in"), [
    ("copying", "a"), ("copied", "a"), ("committed", "b"), ("renamed", "b")])
def test_a_kill_at_any_point_of_a_move_leaves_exactly_one_complete_copy(tmp_path, point,
                                                                        lands_in):
    broker, a, b = jbod_broker(tmp_path, env={"ONCELOG_LOG_DIR_MOVE_CRASH": point})
    try:
        create_topic(broker.bootstrap, TOPIC, 1)
        produce(broker.bootstrap, 0, 2000)  # several segments of 16 KiB
        assert len([n for n in os.listdir(os.path.join(a, f"{TOPIC}-0"))
                    if n.endswith(".log")]) > 3
        with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
            assert admin.alter_replica_log_dirs({(TOPIC, 0): b}) == {(TOPIC, 0): 0}
        assert broker.proc is not None
        broker.proc.wait(START_TIMEOUT)  # it killed itself at the point
        assert broker.proc.returncode == -9
        broker.proc = None
        leftovers = on_disk(a, b)
        assert any(n.endswith(("-future", "-delete")) for ns in leftovers.values() for n in ns)
        broker.env = {}
        broker.start()
        target = {"a": a, "b": b}[lands_in]
        assert where(broker.bootstrap) == [(target, False)]
        other = b if target == a else a
        assert on_disk(a, b) == {target: [f"{TOPIC}-0"], other: []}, leftovers
        assert values(broker.bootstrap) == expected(2000)
        produce(broker.bootstrap, 2000, 100)  # producer state came along: a new producer
        assert values(broker.bootstrap) == expected(2100)
    finally:
        if broker.alive:
            broker.stop()
    text = broker.log_text()
    assert "Traceback" not in text, text
    assert "killing the broker here" in text


def test_describe_log_dirs_shows_a_move_under_way_as_a_future_replica(tmp_path):
    gate = tmp_path / "gate"
    gate.touch()
    broker, a, b = jbod_broker(tmp_path, env={"ONCELOG_LOG_DIR_MOVE_GATE": str(gate)})
    try:
        create_topic(broker.bootstrap, TOPIC, 1)
        produce(broker.bootstrap, 0, 1000)
        with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
            assert admin.alter_replica_log_dirs({(TOPIC, 0): b}) == {(TOPIC, 0): 0}
        deadline = time.monotonic() + START_TIMEOUT
        while where(broker.bootstrap) != [(a, False), (b, True)]:
            assert time.monotonic() < deadline, where(broker.bootstrap)
            time.sleep(0.05)
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        try:
            (shown,) = admin.describe_log_dirs({TOPIC: [0]})
        finally:
            admin.close()
        future = [p for d in shown["log_dirs"] if d["log_dir"] == b for t in d["topics"]
                  for p in t["partitions"]]
        assert len(future) == 1 and future[0]["is_future_key"]
        assert 0 < future[0]["partition_size"] and future[0]["offset_lag"] == 1000
        produce(broker.bootstrap, 1000, 50)  # the partition serves during the move
        gate.unlink()
        wait_until_in(broker.bootstrap, b)
        assert values(broker.bootstrap) == expected(1050)
    finally:
        if broker.alive:
            broker.stop()
    assert "Traceback" not in broker.log_text(), broker.log_text()


def test_a_clean_stop_during_a_move_stops_it_and_the_next_start_removes_the_copy(tmp_path):
    gate = tmp_path / "gate"
    gate.touch()
    broker, a, b = jbod_broker(tmp_path, env={"ONCELOG_LOG_DIR_MOVE_GATE": str(gate)})
    try:
        create_topic(broker.bootstrap, TOPIC, 1)
        produce(broker.bootstrap, 0, 500)
        with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
            admin.alter_replica_log_dirs({(TOPIC, 0): b})
        deadline = time.monotonic() + START_TIMEOUT
        while where(broker.bootstrap) != [(a, False), (b, True)]:
            assert time.monotonic() < deadline, where(broker.bootstrap)
            time.sleep(0.05)
        assert broker.stop() == 0  # not held by the copy waiting at the gate
        broker.env = {}
        broker.start()
        assert on_disk(a, b) == {a: [f"{TOPIC}-0"], b: []}
        assert values(broker.bootstrap) == expected(500)
    finally:
        if broker.alive:
            broker.stop()
    assert "Traceback" not in broker.log_text(), broker.log_text()


def test_a_move_whose_copy_cannot_be_made_durable_leaves_the_partition_where_it_was(tmp_path):
    # every fsync of the copy's first segment fails: the move is given up before its commit
    broker, a, b = jbod_broker(tmp_path, env={
        "ONCELOG_DISK_FAULTS": "fsync:-future/00000000000000000000.log:0:EIO"})
    try:
        create_topic(broker.bootstrap, TOPIC, 1)
        produce(broker.bootstrap, 0, 500)
        with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
            assert admin.alter_replica_log_dirs({(TOPIC, 0): b}) == {(TOPIC, 0): 0}
        deadline = time.monotonic() + START_TIMEOUT
        while f"moving {TOPIC}-0 to {b} failed" not in broker.log_text():
            assert time.monotonic() < deadline, broker.log_text()
            time.sleep(0.05)
        assert "(injected)" in broker.log_text()
        assert where(broker.bootstrap) == [(a, False)]
        produce(broker.bootstrap, 500, 50)
        assert on_disk(a, b) == {a: [f"{TOPIC}-0"], b: []}
        broker.restart()
        assert values(broker.bootstrap) == expected(550)
    finally:
        if broker.alive:
            broker.stop()
    assert "Traceback" not in broker.log_text(), broker.log_text()
