"""What tests besides tests/e2e/test_txn_copier.py use of it."""
from __future__ import annotations

import os

from support.txn_cluster import read_committed as read_to_end

RECORDS = int(os.environ.get("ONCELOG_TXN_COPY_RECORDS", "20000"))


PARTITIONS = 4


WAIT = 120.0 * max(1.0, RECORDS / 20_000)


def read_committed(bootstrap: str, topic: str) -> dict[int, list[bytes]]:
    """Every value a read_committed confluent-kafka reader returns, per partition, until it
    reports the end of each partition."""
    return read_to_end(bootstrap, topic, PARTITIONS, WAIT)
