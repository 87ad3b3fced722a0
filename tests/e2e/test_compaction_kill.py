"""kill -9 of a broker while its log cleaner compacts a topic, again and again: after each
restart confluent-kafka reads every key's latest acknowledged value at its offset, and only
records that were acknowledged, each at its own offset.

Each round writes a few megabytes of incompressible records over 200 keys; the cleaner, which
shares the event loop with the produce requests, is still working through them after the
last acknowledgement. The kill comes when a clean's files appear (a ``.cleaned`` segment
being written, a ``.swap`` manifest being completed), a random few milliseconds in; what
the kill left behind is printed and at least one kill must have cut a clean short."""

from __future__ import annotations

import os
import random
import time

from confluent_kafka import Producer
from support.brokers import read_to_end
from support.compaction_clients_helpers import TOPIC, create_compacted, produce

SEED = 1306
ROUNDS = 5
KEYS = 200
TIMEOUT = 30.0


def during_a_clean(partition_dir, rng: random.Random) -> None:
    """Return while a clean is writing or swapping a segment (its files are there), a
    random few milliseconds into it; or after a random wait if none is seen in time."""
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        if any(name.endswith((".cleaned", ".swap")) for name in os.listdir(partition_dir)):
            time.sleep(rng.random() * 0.02)
            return
        time.sleep(0.0005)


def test_kill_9_during_cleaning_loses_no_acknowledged_record(start_broker):
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    broker = start_broker(log_cleaner_backoff_ms=10)
    create_compacted(broker.bootstrap, **{"internal.segment.bytes": "262144",
                                          "min.cleanable.dirty.ratio": "0.5"})
    partition_dir = broker.data_dir / f"{TOPIC}-0"
    acked: dict[int, tuple[bytes, bytes]] = {}  # offset -> (key, value)
    hits = []
    for round_ in range(ROUNDS):
        producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                             "linger.ms": 5, "compression.type": rng.choice(["none", "lz4"])})
        records = [(b"k%03d" % rng.randrange(KEYS), b"r%d-%d-" % (round_, i) + rng.randbytes(150))
                   for i in range(30_000)]
        offsets = produce(producer, records)
        acked.update(zip(offsets, records, strict=True))
        during_a_clean(partition_dir, rng)
        broker.kill()
        hits.append(sorted(n for n in os.listdir(partition_dir)
                           if n.endswith((".cleaned", ".swap"))))
        broker.start()
        found = read_to_end(broker.bootstrap, TOPIC, timeout=TIMEOUT)[0]
        latest = {}
        for offset in sorted(acked):
            latest[acked[offset][0]] = offset
        read_offsets = [offset for offset, _ in found]
        assert read_offsets == sorted(read_offsets)
        for offset, value in found:
            assert acked[offset][1] == value, offset
        assert set(latest.values()) <= set(read_offsets), "a latest value is lost"
    print("files a kill left behind, each round:", hits)
    assert any(hits), "no kill came during a clean"
    assert "Traceback" not in broker.log_text()
