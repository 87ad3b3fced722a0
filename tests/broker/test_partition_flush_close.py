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
