"""Running out of file descriptors (issue 28): EMFILE and ENFILE are resource errors of the
one operation that needed a descriptor, answered to its request; they never take a log
directory offline (an fsync that could not open its directory never ran)."""

from __future__ import annotations

import asyncio
import errno
import os
import resource
import time

import pytest
from support.brokers import BrokerProcess, create_topic
from support.txn_storage_helpers import Issued, accept

from oncelog.broker.apis.produce import _log_start_offset
from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.client.network import calls
from oncelog.client.network.connection import connect
from oncelog.log.log import LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.log.open_files import OPEN_FILES
from oncelog.producer_state.manager import StateLimits
from oncelog.protocol.records import decode_batch, encode_batch

LOG_DIR = "/data"
TIMESTAMP = 1_700_000_000_000


def open_partition(disk: MemoryDisk, flush_messages: int = (1 << 63) - 1) -> Partition:
    config = LogConfig(segment_bytes=200, index_interval_bytes=100,
                       flush_messages=flush_messages)
    return Partition("t", 0, "/data/t-0", config, 1 << 20, StateLimits(), Issued(),
                     log_dir=LogDir(LOG_DIR), disk=disk)


def record(i: int) -> bytes:
    return encode_batch([(None, b"%d" % i, (), TIMESTAMP)])


def _values(data: bytes) -> list[bytes]:
    found, pos = [], 0
    while pos < len(data):
        header, records = decode_batch(data, pos)
        found += [r.value for r in records]
        pos += header.size
    return found


def values(p: Partition) -> list[bytes]:
    found, offset = [], 0
    while offset < p.log.log_end_offset:
        data = p.log.read(offset, 1 << 20).records
        pos = 0
        while pos < len(data):
            header, records = decode_batch(data, pos)
            found += [r.value for r in records]
            offset = header.last_offset + 1
            pos += header.size
    return found


@pytest.mark.parametrize("spare", [0, 1, 2])
def test_a_roll_without_a_descriptor_fails_the_append_not_the_directory(spare):
    """With ``spare`` descriptors left, a roll fails at a different step: saving an
    index, creating the new segment, or the directory fsync that makes its name durable."""
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk)
    appended = []
    for i in range(3):  # the third one rolls
        p.append_records(record(i), accept)
        appended.append(b"%d" % i)
    disk.max_fds = disk.open_fds + spare
    refused = 0
    for i in range(3, 12):
        try:
            p.append_records(record(i), accept)
            appended.append(b"%d" % i)
        except OSError as exc:
            assert "offline" not in str(exc)
            refused += 1
    assert refused and not p.log_dir.offline
    disk.max_fds = None
    for i in range(12, 16):
        p.append_records(record(i), accept)
        appended.append(b"%d" % i)
    assert values(p) == appended
    p.close()
    assert values(open_partition(disk)) == appended


def test_a_flush_without_a_descriptor_fails_the_produce_not_the_directory():
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk, flush_messages=1)

    async def produce(i: int) -> None:
        result = p.append_records(record(i), accept)
        durable = p.durable(result)
        if durable is not None:
            await durable

    async def scenario() -> None:
        await produce(0)
        disk.max_fds = disk.open_fds
        with pytest.raises(OSError) as refused:
            await produce(1)
        assert "offline" not in str(refused.value)
        disk.max_fds = None
        await produce(2)

    asyncio.run(scenario())
    assert not p.log_dir.offline
    assert values(p) == [b"0", b"1", b"2"]  # 1 was written, not acknowledged: a retry dedups


def test_a_read_of_a_partition_never_written_creates_nothing():
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk)
    assert (p.high_watermark, p.last_stable_offset, p.log.log_start_offset) == (0, 0, 0)
    assert p.log.read(0, 1 << 20).records == b""
    assert p.aborted_transactions(0, 1) == [] and p.log.offset_for_timestamp(0) is None
    p.apply_retention(TIMESTAMP)
    p.flush_now()
    p.close()
    assert disk.listdir(LOG_DIR) == [] and disk.open_fds == 0 and not p.is_open
    p.append_records(record(0), accept)  # a write creates it
    assert disk.listdir(LOG_DIR) == ["t-0"] and p.high_watermark == 1


# --- a real broker under a low RLIMIT_NOFILE ---------------------------------------------

FD_LIMIT = 96


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def test_a_broker_with_more_partitions_than_descriptors_serves_them_all(tmp_path):
    """Twice as many partitions as RLIMIT_NOFILE allows descriptors: reads of partitions
    never written create nothing; every append is stored (the least recently used segment
    files are closed and reopened on demand); after a restart, retention and reads of
    every partition go on; nothing is refused, no directory goes offline."""
    broker = BrokerProcess(tmp_path / "broker", {"log.retention.check.interval.ms": "200"},
                           preexec=_low_fd_limit).start()
    partitions = 2 * FD_LIMIT
    try:
        create_topic(broker.bootstrap, "many", partitions)
        with connect(broker.bootstrap, timeout=30) as conn:
            for i in range(partitions):
                assert calls.list_offset(conn, "many", i, -1) == 0
                assert calls.fetch(conn, "many", i, 0, max_wait_ms=0) is not None
            assert not [n for n in os.listdir(broker.data_dir) if n.startswith("many-")]
            for round_ in range(2):
                for i in range(partitions):
                    batch = encode_batch([(None, b"%d" % i, (), int(time.time() * 1000))])
                    assert calls.produce(conn, "many", i, batch) == round_
        broker.restart()
        time.sleep(0.5)  # a retention pass or two over every partition
        with connect(broker.bootstrap, timeout=30) as conn:
            for i in range(partitions):
                assert calls.list_offset(conn, "many", i, -1) == 2
                found = calls.fetch(conn, "many", i, 0, max_wait_ms=0)
                assert _values(bytes(found.records)) == [b"%d" % i] * 2
    finally:
        broker.stop()
    text = broker.log_text()
    assert "OFFLINE" not in text and "Traceback" not in text and "ERROR" not in text, \
        text[-3000:]


def test_the_produce_error_path_answers_even_without_a_descriptor():
    """Issue 28 #11: the log start answered with an error was looked up through a directory
    listing, which raised EMFILE in the error path itself (the connection closed with a
    traceback instead of KAFKA_STORAGE_ERROR)."""
    disk = MemoryDisk()
    disk.makedirs("/data/t-0")  # there, but never opened
    p = open_partition(disk)
    disk.max_fds = 0
    assert _log_start_offset(p) == -1


def test_segments_beyond_the_bound_release_their_descriptors_and_reopen(monkeypatch):
    monkeypatch.setattr(OPEN_FILES, "limit", 4)
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk)  # 200-byte segments: one batch or two each
    for i in range(40):
        p.append_records(record(i), accept)
    assert len(p.log.segments) > 10
    assert disk.open_fds <= 4
    assert values(p) == [b"%d" % i for i in range(40)]  # every segment read, reopened
    assert disk.open_fds <= 4
    p.close()
    assert disk.open_fds == 0
    p = open_partition(disk)
    assert values(p) == [b"%d" % i for i in range(40)] and disk.open_fds <= 4


def test_a_start_out_of_descriptors_fails_rather_than_take_a_directory_offline(tmp_path,
                                                                               caplog):
    """EMFILE while the start scans its log directories: retried, then the start fails
    (the process cannot serve anyway); the directory is never taken offline for it, which
    would start the broker without its topics."""
    from support.compaction_config_helpers import NoProducers

    from oncelog.broker.config import BrokerConfig
    from oncelog.broker.topics import TopicManager
    from oncelog.metadata.store import LocalFileStore

    config = BrokerConfig({"log.dirs": str(tmp_path / "data")})
    store = LocalFileStore(str(tmp_path / "meta"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # none left to open
    try:
        with pytest.raises(OSError) as caught:
            TopicManager(config, store, NoProducers())
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert caught.value.errno == errno.EMFILE
    assert "OFFLINE" not in caplog.text
    assert "out of file descriptors scanning it at start" in caplog.text  # retried first
    TopicManager(config, store, NoProducers()).close()  # with descriptors: it starts
