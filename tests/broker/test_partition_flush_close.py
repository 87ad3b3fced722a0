"""A partition's flush futures across a close (broker/partition.py): a close answers the
flush asked for before it, and no write after it is handed that answer."""

from __future__ import annotations

import asyncio
import uuid

from support.txn_storage_helpers import Issued, accept

from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.log.log import LogConfig
from oncelog.producer_state.manager import StateLimits
from oncelog.protocol.records import encode_batch

WAIT_S = 10.0


def _record(value: bytes) -> bytes:
    return encode_batch([(None, value, (), 1_700_000_000_000)])


def test_a_flush_answered_by_a_close_is_not_handed_to_a_write_after_it(tmp_path):
    """Left behind done in the partition, the flush a close answered was handed to the next
    write's durable() after a reopening within the same turn: acknowledged before its
    fsync."""
    p = Partition("t", 0, str(tmp_path / "t-0"), LogConfig(), 1 << 20, StateLimits(),
                  Issued(), log_dir=LogDir(str(tmp_path)), topic_id=uuid.uuid4())
    p.append_records(_record(b"a"), accept)

    async def scenario() -> None:
        asked = p._request_flush()
        p.close()
        assert asked.done()
        p.append_records(_record(b"b"), accept)  # opened again
        again = p._request_flush()
        assert not again.done()
        await asyncio.wait_for(again, WAIT_S)
        p.close()

    asyncio.run(scenario())


def test_the_active_segment_is_written_back_every_32_mib_and_afresh_after_a_roll(tmp_path):
    """So that the fsync sealing a segment at its roll (on the event loop) finds little left
    to write (OsDisk.write_back; 277 ms for a dirty 1 GiB segment here, 9 ms with these):
    each write-back asks for the bytes appended since the last, in a worker, one at a time;
    a new segment starts from its beginning. Appends without a loop (tools) ask none."""
    from oncelog.log import disk as disks
    from oncelog.log.disk import OsDisk

    assert disks._sync_file_range() is not None  # Linux has it: not skipped unnoticed

    class Recording(OsDisk):
        def __init__(self) -> None:
            self.asked: list[tuple[str, int, int]] = []

        def write_back(self, path: str, offset: int, length: int) -> None:
            self.asked.append((path.rsplit("/", 1)[-1], offset, length))
            super().write_back(path, offset, length)

    disk = Recording()
    p = Partition("t", 0, str(tmp_path / "t-0"), LogConfig(segment_bytes=80 << 20), 4 << 20,
                  StateLimits(), Issued(), log_dir=LogDir(str(tmp_path)), topic_id=uuid.uuid4(),
                  disk=disk)
    batch = _record(b"v" * (1 << 20))
    p.append_records(batch, accept)  # no loop: nothing asked
    assert disk.asked == []

    async def scenario() -> None:
        for _ in range(120):  # 120 MiB: a roll at 80
            p.append_records(batch, accept)
            while p._writing_back:
                await asyncio.sleep(0.001)
        p.close()

    asyncio.run(asyncio.wait_for(scenario(), WAIT_S))
    segments = sorted({name for name, _, _ in disk.asked})
    assert len(segments) == 2, disk.asked
    first = [(o, n) for name, o, n in disk.asked if name == segments[0]]
    assert [o for o, _ in first] == [0, first[0][1]] and all(n >= 32 << 20 for _, n in first)
    assert [o for name, o, _ in disk.asked if name == segments[1]] == [0]
