"""The group coordinator's own CPU per Heartbeat and per one-offset OffsetCommit
(``GroupCoordinator.heartbeat``, ``commit_now``), in process, over the tests' in-memory
offsets log (so without the partition append): best of 5 x 3,000. Not run by ``make bench``
(its name starts with ``_``); to compare two trees, run it with each tree's ``src`` first on
the path:

    .venv/bin/python bench/_coordinator_cost.py
    PYTHONPATH=/work/wt/perf2-base/src .venv/bin/python bench/_coordinator_cost.py
"""

from __future__ import annotations

import asyncio
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.group_coordinator_helpers import MemoryOffsetsLog

import oncelog
from oncelog.coordinator.group.group_coordinator import (
    GroupConfig,
    GroupCoordinator,
    OffsetCommitPartition,
)


async def main() -> None:
    c = GroupCoordinator(MemoryOffsetsLog(), GroupConfig(
        num_partitions=3, initial_rebalance_delay_ms=0, min_session_timeout_ms=100),
        lambda t, p: True)
    await c.load_all()
    args = ("client", "/127.0.0.1", 30000, 30000, "consumer", [("range", b"")])
    first = await c.join("g", "", None, *args, require_known_member_id=True,
                         supports_skip_assignment=True)
    joined = await c.join("g", first.member_id, None, *args, require_known_member_id=True,
                          supports_skip_assignment=True)
    await c.sync("g", joined.generation, joined.member_id, None, None, None, [])
    parts = [OffsetCommitPartition("small", 0, 5, -1, "")]
    runs = {
        "heartbeat": lambda: c.heartbeat("g", joined.generation, joined.member_id, None),
        "commit_now": lambda: c.commit_now("g", joined.generation, joined.member_id, None, -1,
                                           parts),
    }
    for name, call in runs.items():
        best = min(timeit.repeat(call, number=3000, repeat=5, timer=time.process_time))
        print(f"{name:10} {best / 3000 * 1e6:.2f} us")
    c.close()


if __name__ == "__main__":
    print(oncelog.__file__)
    asyncio.run(main())
