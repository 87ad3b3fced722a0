"""The leader's side of a handover (isr.py's K6 and H7-H13) on the real ReplicaManager code
and ReplicaState, with a stand-in for ZooKeeper: an ask taken back (H6) and asked again is a
new ask, whose wait covers what was acknowledged on the append in between; ready is written
only once the ISR holds it; a write lost to one in between reads the state again."""

from __future__ import annotations

import asyncio
import types

from oncelog.broker import replica_manager as rm
from oncelog.broker.replication import ReplicaState
from oncelog.cluster import isr as rules
from oncelog.cluster import znodes as zn


class FakeWatch:
    """ZooKeeper's side: each write lands at the version given (or is lost, ``lose``)."""

    def __init__(self) -> None:
        self.written: list[zn.PartitionState] = []
        self.refreshed = 0
        self.lose = False

    def write_isrs(self, changes, notify=True):
        if self.lose:
            return [None] * len(changes)
        self.written.extend(change.state for change in changes)
        return [change.version + 1 for change in changes]

    def refresh(self) -> None:
        self.refreshed += 1


class Leader:
    """Broker 1 leading t-0 at epoch 5, ISR (1, 2, 3), through ReplicaManager's own
    methods for reading a state and handing over."""

    def __init__(self) -> None:
        self.partition = types.SimpleNamespace(
            topic="t", index=0, name="t-0", is_open=True, deleted=False,
            log_dir=types.SimpleNamespace(offline=False),
            log=types.SimpleNamespace(log_end_offset=0))
        self.r = ReplicaState(1, 1, 5, (1, 2, 3), (2, 1, 3), 0, zk_version=1)
        self.partition.replication = self.r
        self.manager = types.SimpleNamespace(broker_id=1, watch=FakeWatch(),
                                             _handing_over=set())
        self.manager._hand_over = lambda p, r, ask: rm.ReplicaManager._hand_over(
            self.manager, p, r, ask)

    def read(self, state: zn.PartitionState) -> None:
        rm.ReplicaManager._handover_read(self.manager, self.partition, self.r, state)

    def append(self, n: int) -> None:
        self.partition.log.log_end_offset += n
        self.r.advance_high_watermark(self.partition.log.log_end_offset)

    def fetched(self, broker: int, offset: int) -> None:
        self.r.follower_fetched(broker, offset, self.partition.log.log_end_offset,
                                rm._now_ms())
        self.r.advance_high_watermark(self.partition.log.log_end_offset)

    def ready_written(self) -> bool:
        return any(s.handover_ready for s in self.manager.watch.written)


ASKED = zn.PartitionState(1, 5, (1, 2, 3), 1, zn.HANDOVER_PREFERRED, False)
NOT_ASKED = zn.PartitionState(1, 5, (1, 2, 3), 1)


async def _settle(leader: Leader) -> None:
    """Every wait that can end has ended (its ready write, in a worker, answered)."""
    for _ in range(10):
        await asyncio.sleep(0)
    running = list(leader.manager._handing_over)
    if running:
        await asyncio.wait(running, timeout=0.5)  # those still waiting for the ISR stay


def test_an_ask_taken_back_and_asked_again_waits_for_what_was_acknowledged_between():
    """Before: the first ask's wait (for offset 100) was still running when the ask was
    taken back (acks=1 answered on the append again, up to 150) and asked again; once the
    ISR reached 100 it wrote ready, and the move would have lost 100-149 on replica 2."""
    async def run() -> None:
        leader = Leader()
        leader.append(100)
        leader.fetched(2, 100)
        leader.fetched(3, 50)  # broker 3 lags: the high watermark at 50
        leader.read(ASKED)  # H7: K6 from now, a wait for the log end of now (100)
        await _settle(leader)
        assert rules.acks_one_waits(False, bool(leader.r.handover_for))  # K6
        leader.read(NOT_ASKED)  # H6 taken back: acks=1 on the append again (K5)
        assert not rules.acks_one_waits(False, bool(leader.r.handover_for))
        leader.append(50)  # 100-149 acknowledged on the append
        leader.fetched(2, 120)
        leader.read(ASKED)  # asked again: a new ask, a new wait (for 150)
        leader.fetched(3, 100)  # the first wait's target reached
        await _settle(leader)
        assert not leader.ready_written(), leader.manager.watch.written  # H11 for the first
        leader.fetched(2, 150)
        leader.fetched(3, 150)
        await _settle(leader)
        assert leader.ready_written()  # H10 for the second, once the ISR holds 150
        assert leader.r.handover_ready
    asyncio.run(run())


def test_a_ready_write_lost_to_another_reads_the_state_again():
    """H13/H7: the ready write lost (a write at the same znode version won): the leader
    reads the state again, and the read that still asks starts a wait anew."""
    async def run() -> None:
        leader = Leader()
        leader.append(10)
        leader.manager.watch.lose = True
        leader.read(ASKED)
        leader.fetched(2, 10)
        leader.fetched(3, 10)
        await _settle(leader)
        assert not leader.ready_written() and leader.manager.watch.refreshed
        leader.manager.watch.lose = False
        leader.read(ASKED)  # the state read again: still asked
        await _settle(leader)
        assert leader.ready_written()
    asyncio.run(run())
