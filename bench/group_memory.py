"""Where a one-member classic group's bytes go: the group coordinator alone, in this process.

    .venv/bin/python bench/group_memory.py [--groups 2000] [--top 15]

``--groups`` groups of one member each are made as a consumer makes them (JoinGroup, answered
MEMBER_ID_REQUIRED as KIP-394 asks, JoinGroup again with the id, the leader's SyncGroup), then
each member commits one offset, all through ``GroupCoordinator``'s own methods over an offsets
log that keeps nothing (what is written lives on disk, not in the coordinator). tracemalloc
counts every byte Python allocated meanwhile: bytes per group, and the lines that allocated
most. bench/groups.py measures the same groups over the protocol as the broker's RSS
(target: under 1 KiB a group, issue 26); this says where they go.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tracemalloc

from kio.schema.consumer_protocol_assignment.v0.data import TopicPartition as Assigned

from oncelog.coordinator.group.group_coordinator import (
    GroupConfig,
    GroupCoordinator,
    OffsetCommitPartition,
)
from oncelog.protocol.consumer_protocol import write_assignment, write_subscription

TOPIC = "memory-topic"
SESSION_MS = 1_800_000  # as bench/groups.py: no heartbeats needed


class NothingKeptLog:
    """An offsets log that takes every write and keeps nothing in memory."""

    def append(self, partition, records):
        return None

    def append_at(self, partition, records, producer=None):
        return 0, None

    def read(self, partition):
        return iter(())


async def measure(groups: int, top: int) -> dict:
    metadata = write_subscription(0, topics=(TOPIC,), user_data=None)
    assignment = write_assignment(0, assigned_partitions=(Assigned(topic=TOPIC,
                                                                   partitions=(0,)),),
                                  user_data=None)
    c = GroupCoordinator(NothingKeptLog(), GroupConfig(num_partitions=50,
                                                       initial_rebalance_delay_ms=0),
                         lambda topic, partition: True)
    await c.load_all()

    async def one(i: int) -> tuple[str, int, str]:
        # Each request decodes its own strings and numbers: made afresh here too.
        group = f"group-{i}"
        join = (None, "".join(["rd", "kafka"]), "".join(["/127.", "0.0.1"]),
                int(str(SESSION_MS)), int(str(SESSION_MS)), "".join(["con", "sumer"]))
        first = await c.join(group, "", *join, [("".join(["ran", "ge"]), metadata)],
                             require_known_member_id=True, supports_skip_assignment=True)
        joined = await c.join(group, first.member_id, *join,
                              [("".join(["ran", "ge"]), metadata)],
                              require_known_member_id=True, supports_skip_assignment=True)
        await c.sync(group, joined.generation, joined.member_id, None, "consumer", "range",
                     [(joined.member_id, assignment)])
        return group, joined.generation, joined.member_id

    for i in range(100):  # warm-up: the coordinator's own tables reach their working size
        await one(i)
    gc.collect()
    tracemalloc.start()
    start, before = tracemalloc.take_snapshot(), tracemalloc.get_traced_memory()[0]
    made = [await one(i) for i in range(100, 100 + groups)]
    gc.collect()
    joined, after_join = tracemalloc.take_snapshot(), tracemalloc.get_traced_memory()[0]
    for group, generation, member in made:
        await c.commit(group, generation, member, None, -1,
                       [OffsetCommitPartition(TOPIC, 0, 1, -1, "")])
    gc.collect()
    committed, after_commit = tracemalloc.take_snapshot(), tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    c.close()
    for title, a, b in (("join + sync", start, joined), ("one commit", joined, committed)):
        print(f"  {title}: the lines that allocated most, bytes a group")
        for stat in b.compare_to(a, "lineno")[:top]:
            if stat.size_diff / groups >= 8:
                frame = stat.traceback[0]
                print(f"    {stat.size_diff / groups:7.1f}  {frame.filename}:{frame.lineno}")
    # The benchmark's own list of (group, generation, member id) tuples is not the
    # coordinator's: 80 bytes a group taken off (a tuple's 64, its place in the list 16).
    own = sys.getsizeof(made[0]) + 16
    return {"joined": (after_join - before) / groups - own,
            "committed": (after_commit - before) / groups - own}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=2000)
    parser.add_argument("--top", type=int, default=15)
    args, _ = parser.parse_known_args(argv)  # run_all.py may pass other modules' options
    result = asyncio.run(measure(args.groups, args.top))
    verdict = "met" if result["joined"] < 1024 else "MISS"
    print(f"group coordinator memory: {result['joined']:,.0f} B per one-member group, "
          f"{result['committed']:,.0f} B with one committed offset ({args.groups:,} groups, "
          f"tracemalloc; target under 1,024 B: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
