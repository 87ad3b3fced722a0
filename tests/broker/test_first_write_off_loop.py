"""A partition's first write creates its log (directory, partition.metadata, the first
segment, each made durable with an fsync): tens of milliseconds a partition, done in a
worker thread (Partition.open_off_loop) so that a producer spreading over many fresh
partitions never stalls the broker's other clients. Before, each open ran on the event
loop: 1,000 fresh partitions froze every connection for 16 s.

The stall is asserted as a ratio measured side by side in one run: the longest ApiVersions
round trip of a second connection while the spread runs, to its median round trip when the
broker is idle."""

from __future__ import annotations

import asyncio
import datetime
import statistics
import threading
import time
import uuid

import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from support.brokers import BrokerProcess, create_topic
from support.raw_wire import connect, read_frame
from support.txn_storage_helpers import Issued, accept

from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.client.network import calls
from oncelog.client.network.connection import KafkaError
from oncelog.client.network.connection import connect as client_connect
from oncelog.log.log import LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.producer_state.manager import StateLimits
from oncelog.protocol import api_versions as apis
from oncelog.protocol.messages import decode_response, encode_request
from oncelog.protocol.records import encode_batch
from oncelog.protocol.schema import build

API_VERSIONS = 18
PARTITIONS = 300
WRITERS = 3  # connections, each one Produce writing to its share of the partitions
IDLE_PROBES = 100
SLOW_OPEN_MS = 20
# Each open on the loop stalled the probe, and a request writing to 100 fresh partitions
# 100 opens in a row: the worst stall was 4.8-7.5 s against an idle round trip under 1 ms,
# a ratio of 10,000-20,000. Off the loop the ratio is 30-150, up to 450 on a loaded 2-core
# machine (its worst stalls of 75-150 ms are the scheduler's: the same with 1, 2 or 6
# opening threads).
MAX_STALL_RATIO = 1000


def _round_trip(sock, correlation_id: int) -> float:
    started = time.perf_counter()
    sock.sendall(encode_request(API_VERSIONS, 0, correlation_id, "probe", ApiVersionsRequest()))
    got, _ = decode_response(API_VERSIONS, 0, read_frame(sock))
    assert got == correlation_id
    return time.perf_counter() - started


def _spread(bootstrap: str, indexes: range, errors: list) -> None:
    """One Produce request writing the first record of each partition of ``indexes``."""
    batch = encode_batch([(None, b"first", (), 1_700_000_000_000)])

    def make(mod, version):
        return build(mod.ProduceRequest, transactional_id=None, acks=1,
                     timeout=datetime.timedelta(seconds=60), topic_data=(build(
                         mod.TopicProduceData, name="spread", partition_data=tuple(
                             build(mod.PartitionProduceData, index=i, records=batch)
                             for i in indexes)),))

    with client_connect(bootstrap, timeout=60) as conn:
        response = conn.call(apis.PRODUCE, make)
    errors += [p.error_code for t in response.responses for p in t.partition_responses]


def test_first_writes_to_many_partitions_do_not_stall_other_clients(tmp_path):
    # The disk as slow as the benchmark's was busy (an open: 16-22 ms, mostly fsyncs), one
    # open's fsync made to take 20 ms: an idle disk's 1-2 ms opens would hide the stall.
    # Killed, not stopped, at the end: a clean stop of 300 logs is not what is tested here.
    broker = BrokerProcess(tmp_path / "spread", env={
        "ONCELOG_DISK_FAULTS": f"fsync:partition.metadata.tmp:0:SLOW{SLOW_OPEN_MS}"}).start()
    try:
        _spread_while_probing(broker)
        assert "Traceback" not in broker.log_text(), broker.log_text()
    finally:
        broker.kill()


def _spread_while_probing(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "spread", PARTITIONS)
    with connect(broker) as probe:
        probe.settimeout(60)
        for i in range(10):  # warm: the connection, the handler's first run
            _round_trip(probe, i)
        idle = statistics.median(_round_trip(probe, 100 + i) for i in range(IDLE_PROBES))
        errors: list = []
        share = -(-PARTITIONS // WRITERS)
        writers = [threading.Thread(target=_spread, args=(
            broker.bootstrap, range(w * share, min(PARTITIONS, (w + 1) * share)), errors))
            for w in range(WRITERS)]
        started = time.perf_counter()
        for w in writers:
            w.start()
        stalls = []
        while any(w.is_alive() for w in writers) and time.perf_counter() - started < 60:
            stalls.append(_round_trip(probe, 1000 + len(stalls)))
        for w in writers:
            w.join(60)
        spread = time.perf_counter() - started
    assert errors == [0] * PARTITIONS
    worst = max(stalls)
    print(f"{PARTITIONS} first writes in {spread:.2f} s; ApiVersions idle {idle * 1e3:.2f} ms, "
          f"worst during the spread {worst * 1e3:.1f} ms over {len(stalls)} probes: "
          f"ratio {worst / idle:.0f}")
    assert worst / idle < MAX_STALL_RATIO


# --- a failure to open, in the worker thread ------------------------------------------------

RECORD = encode_batch([(None, b"first", (), 1_700_000_000_000)])


def _partition(disk: MemoryDisk) -> Partition:
    return Partition("t", 0, "/data/t-0", LogConfig(), 1 << 20, StateLimits(), Issued(),
                     log_dir=LogDir("/data"), disk=disk, topic_id=uuid.uuid4())


def test_concurrent_openers_share_one_opening_and_a_failed_one_leaves_nothing_open():
    disk = MemoryDisk()
    disk.makedirs("/data")
    p = _partition(disk)

    async def openers(n: int) -> list:
        return await asyncio.gather(*(p.open_off_loop() for _ in range(n)),
                                    return_exceptions=True)

    disk.fail("write", path_suffix="partition.metadata.tmp")  # one write fails, once
    failed = asyncio.run(openers(3))
    assert [type(e) for e in failed] == [OSError] * 3  # one opening, its error to all
    assert not p.is_open and not p.opening and not p.log_dir.offline
    assert asyncio.run(openers(3)) == [None] * 3  # the fault gone, the next opening works
    assert p.is_open and p.append_records(RECORD, accept).base_offset == 0
    p.close()

    disk = MemoryDisk()
    disk.makedirs("/data")
    p = _partition(disk)
    disk.fail("fsync_dir", path_suffix="t-0")  # the directory fails
    failed = asyncio.run(openers(2))
    assert all("offline" in str(e) for e in failed), failed
    assert not p.is_open and p.log_dir.offline
    with pytest.raises(OSError, match="offline"):
        p.append_records(RECORD, accept)


def test_a_first_write_whose_open_fails_is_answered_kafka_storage_error(tmp_path):
    """partition.metadata cannot be written (the worker thread's open fails): the produce is
    answered KAFKA_STORAGE_ERROR, the half-made log is never used (a read of it fails the
    same way), and the broker serves everyone else."""
    broker = BrokerProcess(tmp_path / "faulty", env={
        "ONCELOG_DISK_FAULTS": "write:partition.metadata.tmp:0:EIO"}).start()
    try:
        create_topic(broker.bootstrap, "faulty", 2)
        with client_connect(broker.bootstrap, timeout=30) as conn:
            for _ in range(2):  # a retry opens again, and fails again
                with pytest.raises(KafkaError) as refused:
                    calls.produce(conn, "faulty", 0, RECORD)
                assert refused.value.error == ErrorCode.kafka_storage_error
            with pytest.raises(KafkaError) as unread:
                calls.fetch(conn, "faulty", 0, 0, max_wait_ms=0)
            assert unread.value.error == ErrorCode.kafka_storage_error
        with connect(broker) as probe:
            _round_trip(probe, 1)
        assert "writing the log failed" in broker.log_text()
    finally:
        code = broker.stop()
    assert code == 0 and "Traceback" not in broker.log_text(), broker.log_text()
