"""A view read before the leader's own ISR write landed, applied after that write's
answer, must not take the leader's ISR back to the older, smaller one (isr.py's B8). The
replica watch hands the broker its whole kept picture on every read, on its own thread, and
the ISR write's answer comes back from an executor thread; nothing orders the two on the
loop. Adopted, the older ISR counts the high watermark without the follower just let in:
acks=all answered past what that follower holds, and a handover's wait over at once, so the
leader wrote ready while the preferred replica (in the ISR ZooKeeper holds) lacked records
acknowledged with acks=all, and the controller's H2 elected it.

Found by a review; driven through ReplicaManager's own methods (apply_state, _isr_written,
_handover_read, _hand_over) with a stand-in for ZooKeeper, as
tests/cluster/test_handover_leader.py does. Before: both the acknowledgement and the ready.
"""

from __future__ import annotations

import asyncio
import types

from oncelog.broker import replica_manager as rm
from oncelog.broker.replication import ReplicaState
from oncelog.cluster import isr as rules
from oncelog.cluster import znodes as zn


class FakeWatch:
    def __init__(self) -> None:
        self.written: list[zn.PartitionState] = []

    def write_isrs(self, changes, notify=True):
        self.written.extend(change.state for change in changes)
        return [change.version + 1 for change in changes]

    def refresh(self) -> None:
        pass


def _manager():
    m = types.SimpleNamespace(broker_id=1, watch=FakeWatch(), _handing_over=set(),
                              isr_shrinks=0, isr_expands=0)
    for name in ("_adopt_isr", "_handover_read", "_hand_over", "_count_isr", "_isr_written"):
        setattr(m, name, getattr(rm.ReplicaManager, name).__get__(m))
    return m


def test_a_view_older_than_the_leaders_own_isr_write_is_ignored():
    async def run() -> None:
        manager = _manager()
        partition = types.SimpleNamespace(
            topic="t", index=0, name="t-0", is_open=True, deleted=False,
            log_dir=types.SimpleNamespace(offline=False),
            log=types.SimpleNamespace(log_end_offset=100), _wake_waiters=lambda: None)
        replicas = (2, 1, 3)  # broker 2 is the preferred replica
        r = ReplicaState(1, 1, 5, (1, 3), replicas, 100, zk_version=1, min_insync=2)
        partition.replication = r
        now = rm._now_ms()
        for b in (2, 3):
            r.follower_fetched(b, 100, 100, now)
        r.advance_high_watermark(100)
        v1 = zn.PartitionState(1, 5, (1, 3), 1)  # as ZooKeeper holds it at version 1

        def apply(state: zn.PartitionState, version: int) -> None:
            rm.ReplicaManager.apply_state(manager, partition, state, version, replicas, 2)

        # broker 2 caught up: the leader lets it in (I3); the write lands at version 2
        r.isr_write_started((2, 1, 3))
        manager._isr_written(partition, r, (1, 3), (2, 1, 3), 2)
        assert r.isr == (2, 1, 3)
        # the view read before that write landed reaches the loop after its answer
        apply(v1, 1)
        # 50 more records; broker 3 fetches them, broker 2 not yet
        partition.log.log_end_offset = 150
        r.follower_fetched(3, 150, 150, rm._now_ms())
        r.advance_high_watermark(150)
        acked = r.wait_for(150, 30)  # acks=all for 100-149: None = acknowledged now
        # the controller (it read version 2: ISR (2, 1, 3)) asks the handover: version 3
        apply(zn.PartitionState(1, 5, (2, 1, 3), 1, zn.HANDOVER_PREFERRED, False), 3)
        for _ in range(10):
            await asyncio.sleep(0)
        if manager._handing_over:
            await asyncio.wait(list(manager._handing_over), timeout=0.5)
        broker_2_end = r.followers[2].log_end_offset
        ready = [s for s in manager.watch.written if s.handover_ready]
        problems = []
        if acked is None:
            problems.append(f"acks=all answered up to 150 while ISR member 2 holds "
                            f"{broker_2_end}")
        if ready:
            problems.append(f"ready written (ISR {list(ready[0].isr)}) while the preferred "
                            f"replica 2 holds {broker_2_end} of 150: H2 elects it")
        assert not problems, problems
        assert rules.acks_one_waits(False, bool(r.handover_for))

    asyncio.run(run())
