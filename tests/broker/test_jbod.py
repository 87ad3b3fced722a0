"""Several log directories on one broker (JBOD, ``log.dirs=a,b``): partitions spread across
them at creation and found again at restart; one directory failing takes only its own
partitions offline (KAFKA_STORAGE_ERROR, an offline replica in Metadata, its own
``oncelog_log_dir_offline`` gauge, an ERROR line) while the other serves on, and a restart
recovers it; a full directory (a real tmpfs filled to ENOSPC) refuses what it cannot hold
(appends, a partition moved into it) and leaves the other directory serving.
"""

from __future__ import annotations

import os
import time
import urllib.request

import pytest
from confluent_kafka import Producer
from kafka.admin import KafkaAdminClient
from kio.schema.errors import ErrorCode
from support.broker_forks import run_oncelog
from support.brokers import START_TIMEOUT, BrokerProcess, create_topic, read_to_end
from support.full_disk_helpers import fill_up, small_tmpfs

from oncelog.client.admin.admin import Admin

TOPIC = "spread"


def metrics(broker) -> str:
    with urllib.request.urlopen(broker.metrics_url, timeout=10) as answer:
        return answer.read().decode()


def produce(bootstrap: str, partition: int, values: list[bytes],
            timeout_ms: int = 20_000) -> tuple[list[bytes], list]:
    """Each value to the partition, one at a time; (delivered, errors)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 0, "message.timeout.ms": timeout_ms})
    delivered, failed = [], []
    for value in values:
        producer.produce(TOPIC, value, partition=partition, on_delivery=lambda err, msg:
                         failed.append(err) if err else delivered.append(msg.value()))
        producer.flush(timeout_ms / 1000 + 5)
        if len(failed) >= 2:
            break
    assert producer.flush(START_TIMEOUT) == 0
    return delivered, failed


def placement(bootstrap: str) -> dict[str, tuple[ErrorCode | None, set[str]]]:
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        (dirs,) = admin.describe_log_dirs().values()
    return {d.path: (d.error, {f"{r.topic}-{r.partition}" for r in d.replicas
                               if r.topic == TOPIC}) for d in dirs}


def offline_replicas(bootstrap: str) -> dict[int, list[int]]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        (topic,) = admin.describe_topics([TOPIC])
    finally:
        admin.close()
    return {p["partition_index"]: p["offline_replicas"] for p in topic["partitions"]}


def test_one_failed_directory_takes_only_its_partitions_offline(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    settings = {"log.dirs": f"{a},{b}", "log.flush.interval.messages": "1"}
    broker = BrokerProcess(a, settings).start()
    try:
        create_topic(broker.bootstrap, TOPIC, 4)
        spread = {str(a): (None, {f"{TOPIC}-0", f"{TOPIC}-2"}),
                  str(b): (None, {f"{TOPIC}-1", f"{TOPIC}-3"})}
        assert placement(broker.bootstrap) == spread
        broker.restart()  # found again where they were
        assert placement(broker.bootstrap) == spread

        # every fsync of spread-1's first segment (in b) fails after 3 good ones
        broker.stop()
        broker.env = {"ONCELOG_DISK_FAULTS": f"fsync:{TOPIC}-1/00000000000000000000.log:3:EIO"}
        broker.start()
        before_a, _ = produce(broker.bootstrap, 0, [b"a-%02d" % i for i in range(5)])
        delivered_b, failed_b = produce(broker.bootstrap, 1, [b"b-%02d" % i for i in range(20)],
                                        timeout_ms=3000)
        assert delivered_b and failed_b
        text = broker.log_text()
        assert f"log directory {b} is now OFFLINE" in text and " ERROR " in text
        shown = metrics(broker)
        assert f'oncelog_log_dir_offline{{path="{a}"}} 0' in shown
        assert f'oncelog_log_dir_offline{{path="{b}"}} 1' in shown
        assert placement(broker.bootstrap) == {str(a): spread[str(a)],
                                               str(b): (ErrorCode.kafka_storage_error, set())}
        assert offline_replicas(broker.bootstrap) == {0: [], 1: [0], 2: [], 3: [0]}
        # the other directory serves on; the failed one's partitions answer the error
        after_a, failed_a = produce(broker.bootstrap, 2, [b"c-%02d" % i for i in range(5)])
        assert len(after_a) == 5 and not failed_a
        _, failed_3 = produce(broker.bootstrap, 3, [b"d"], timeout_ms=2000)
        assert failed_3
        with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
            errors = admin.alter_replica_log_dirs({(TOPIC, 0): str(b), (TOPIC, 1): str(a)})
        assert errors == {(TOPIC, 0): ErrorCode.kafka_storage_error,
                          (TOPIC, 1): ErrorCode.kafka_storage_error}

        broker.stop()  # the restart recovers the directory
        broker.env = {}
        broker.start()
        assert placement(broker.bootstrap) == spread
        assert f'oncelog_log_dir_offline{{path="{b}"}} 0' in metrics(broker)
        stored = read_to_end(broker.bootstrap, TOPIC, 4)
        assert [v for _, v in stored[0]] == before_a
        assert [v for _, v in stored[2]] == after_a
        assert [v for _, v in stored[1]][:len(delivered_b)] == delivered_b  # all acknowledged
        assert len(set(v for _, v in stored[1])) == len(stored[1])
        more, _ = produce(broker.bootstrap, 1, [b"again"])
        assert more == [b"again"]
    finally:
        if broker.alive:
            broker.stop()
    assert "Traceback" not in broker.log_text(), broker.log_text()


def test_a_full_directory_refuses_what_it_cannot_hold_and_the_other_serves(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    with small_tmpfs(b, "1m"):
        broker = BrokerProcess(a, {"log.dirs": f"{a},{b}"}).start()
        try:
            create_topic(broker.bootstrap, TOPIC, 2)  # spread-0 in a, spread-1 in b
            big = [b"%04d" % i + b"x" * 20_000 for i in range(40)]  # 800 KB
            in_a, failed = produce(broker.bootstrap, 0, big)
            assert len(in_a) == 40 and not failed
            fill_up(b / "filler")
            _, failed = produce(broker.bootstrap, 1, [b"y" * 1000], timeout_ms=3000)
            assert failed
            # a move into the full directory fails and leaves the partition where it was
            with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
                assert admin.alter_replica_log_dirs({(TOPIC, 0): str(b)}) == \
                    {(TOPIC, 0): ErrorCode.none}
            deadline = time.monotonic() + START_TIMEOUT
            while f"moving {TOPIC}-0 to {b} failed" not in broker.log_text():
                assert time.monotonic() < deadline, broker.log_text()
                time.sleep(0.05)
            assert not [n for n in os.listdir(b) if n.endswith("-future")]
            assert placement(broker.bootstrap)[str(a)] == (None, {f"{TOPIC}-0"})
            more, failed = produce(broker.bootstrap, 0, [b"still-serving"])
            assert more == [b"still-serving"] and not failed
            # room again: the move goes through
            os.unlink(b / "filler")
            with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
                admin.alter_replica_log_dirs({(TOPIC, 0): str(b)})
            deadline = time.monotonic() + START_TIMEOUT
            while placement(broker.bootstrap)[str(b)] != (None, {f"{TOPIC}-0", f"{TOPIC}-1"}):
                assert time.monotonic() < deadline, placement(broker.bootstrap)
                time.sleep(0.05)
            broker.restart()
            stored = read_to_end(broker.bootstrap, TOPIC, 2)
            assert [v for _, v in stored[0]] == [*in_a, b"still-serving"]
        finally:
            if broker.alive:
                broker.stop()
    assert "Traceback" not in broker.log_text(), broker.log_text()


@pytest.mark.parametrize("dirs", ["{a},{a}", "{a},,{b}"])
def test_bad_log_dirs_are_refused_before_starting(tmp_path, dirs):
    value = dirs.format(a=tmp_path / "a", b=tmp_path / "b")
    result = run_oncelog("broker", "--set", f"log.dirs={value}", timeout=60)
    assert result.returncode == 2 and "log.dirs:" in result.stderr


def test_a_partition_is_found_again_by_its_topic_id_beside_an_older_copy(tmp_path):
    """A directory of the same name in another log directory, from an older topic of that
    name, is set aside as a stray; the partition opens the copy that names its topic id."""
    import shutil
    import uuid

    from oncelog.log import partition_metadata
    from oncelog.log.disk import OS_DISK

    a, b = tmp_path / "a", tmp_path / "b"
    broker = BrokerProcess(a, {"log.dirs": f"{a},{b}"}).start()
    try:
        create_topic(broker.bootstrap, TOPIC, 1)  # spread-0 in a
        stored, _ = produce(broker.bootstrap, 0, [b"kept-%d" % i for i in range(5)])
        broker.stop()
        shutil.move(a / f"{TOPIC}-0", b / f"{TOPIC}-0")  # the real one, now in b
        older = a / f"{TOPIC}-0"  # found first (a comes first in log.dirs)
        older.mkdir()
        (older / "00000000000000000000.log").write_bytes(b"")
        partition_metadata.write(OS_DISK, str(older), uuid.uuid4())
        broker.start()
        assert placement(broker.bootstrap)[str(b)] == (None, {f"{TOPIC}-0"})
        assert [v for _, v in read_to_end(broker.bootstrap, TOPIC)[0]] == stored
        assert [n for n in os.listdir(a) if n.endswith("-stray")]
        assert "belongs to no topic of this broker" in broker.log_text()
    finally:
        if broker.alive:
            broker.stop()
    assert "Traceback" not in broker.log_text(), broker.log_text()


def test_partitions_added_later_spread_too(tmp_path):
    from confluent_kafka.admin import AdminClient, NewPartitions

    a, b = tmp_path / "a", tmp_path / "b"
    broker = BrokerProcess(a, {"log.dirs": f"{a},{b}"}).start()
    try:
        create_topic(broker.bootstrap, TOPIC, 1)  # spread-0 in a
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_partitions([NewPartitions(TOPIC, 4)])[TOPIC].result(START_TIMEOUT)
        assert placement(broker.bootstrap) == {
            str(a): (None, {f"{TOPIC}-0", f"{TOPIC}-2"}),
            str(b): (None, {f"{TOPIC}-1", f"{TOPIC}-3"})}
    finally:
        if broker.alive:
            broker.stop()
    assert "Traceback" not in broker.log_text(), broker.log_text()
