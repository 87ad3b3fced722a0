"""A topic-to-topic copy job that can be killed anywhere and never writes a record twice.

Seed 001's "Transitivity": the job saves, together and atomically, its input positions and
its producer's identity (``producer.checkpoint()``). Restarted, it resumes both: it reads from
the saved positions and produces as the same producer, continuing the same sequence numbers,
with deterministic batching, so whatever it had sent after the checkpoint is recognised by
the broker as already stored.

    .venv/bin/python examples/copy_job.py --bootstrap-server 127.0.0.1:9092 \\
        --source orders --dest orders-copy --state /tmp/copy-state.json --exit-at-end

Record i of source partition p goes to partition p of the destination, with its key,
headers and timestamp. Kill it with ``kill -9`` at any moment and start it again with the
same arguments: the destination ends equal to the source.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from oncelog import Admin, Consumer, ConsumerRecord, Producer, TopicPartition


def load_state(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {"positions": {}, "producer": None}


def save_state(path: Path, state: dict) -> None:
    """Write-temp, fsync, rename: a kill leaves the old state or the new one, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def forever(consumer: Consumer) -> Iterator[ConsumerRecord]:
    while True:
        yield from consumer.poll(timeout=1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-server", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--dest", required=True)
    parser.add_argument("--state", required=True, type=Path, help="checkpoint file")
    parser.add_argument("--checkpoint-every", type=int, default=1000,
                        help="records copied between checkpoints")
    parser.add_argument("--exit-at-end", action="store_true",
                        help="stop at the end of the source instead of waiting for more")
    args = parser.parse_args(argv)

    state = load_state(args.state)
    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        cluster = admin.metadata([args.source, args.dest])
    partitions = len(cluster.topics[args.source].partitions)
    if len(cluster.topics[args.dest].partitions) < partitions:
        parser.error(f"{args.dest} needs at least {partitions} partitions")

    producer = Producer({"bootstrap.servers": args.bootstrap_server,
                         "batching": "deterministic"}, resume=state["producer"])
    consumer = Consumer({"bootstrap.servers": args.bootstrap_server,
                         "auto.offset.reset": "earliest"})
    tps = [TopicPartition(args.source, p) for p in range(partitions)]
    positions = {str(tp.partition): int(state["positions"].get(str(tp.partition), 0))
                 for tp in tps}
    consumer.assign(tps, {tp: positions[str(tp.partition)] for tp in tps})
    copied = 0
    records = iter(consumer) if args.exit_at_end else forever(consumer)
    try:
        for record in records:
            producer.produce(args.dest, record.value, key=record.key,
                             partition=record.partition, headers=record.headers,
                             timestamp=record.timestamp)
            positions[str(record.partition)] = record.offset + 1
            copied += 1
            if copied % args.checkpoint_every == 0:
                save_state(args.state, {"positions": positions,
                                        "producer": producer.checkpoint()})
                print(f"checkpoint {sum(positions.values())}", flush=True)
        save_state(args.state, {"positions": positions, "producer": producer.checkpoint()})
        print(f"done {sum(positions.values())}", flush=True)
    finally:
        producer.close()
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
