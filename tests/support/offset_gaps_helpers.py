"""What tests besides tests/log/test_offset_gaps.py use of it."""
from __future__ import annotations

import oncelog
from support.brokers import append_on_disk
from support.record_sets import control_batch, craft_batch, data_batch

TIMEOUT = 30.0


def gappy_partition(broker) -> tuple[list[int], int]:
    """Partition gaps-0: 5 produced records (0..4), a transaction's 3 records (5..7) and its
    commit marker (8), a compacted batch spanning 9..18 with records at 9, 12 and 14 only,
    then another transaction's 2 records (19, 20) and its marker (21). Returns the offsets
    holding records and the log end offset (22)."""
    with oncelog.Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topic("gaps", 1)
    with oncelog.Producer({"bootstrap.servers": broker.bootstrap}) as producer:
        for i in range(5):
            producer.produce("gaps", b"plain-%d" % i, partition=0)
        producer.flush(TIMEOUT)
    end = append_on_disk(broker, "gaps", 0, [
        data_batch(0, [b"tx1-0", b"tx1-1", b"tx1-2"], producer_id=1000, producer_epoch=0,
                   base_sequence=0, transactional=True),
        control_batch(0, producer_id=1000),
        craft_batch(0, [(0, b"a", b"compacted-9"), (3, b"b", b"compacted-12"),
                        (5, b"c", b"compacted-14")], last_offset_delta=9),
        data_batch(0, [b"tx2-0", b"tx2-1"], producer_id=1001, producer_epoch=0,
                   base_sequence=0, transactional=True),
        control_batch(0, producer_id=1001),
    ])
    return [0, 1, 2, 3, 4, 5, 6, 7, 9, 12, 14, 19, 20], end
