"""A leader whose ISR is itself alone (replication factor 1, or every follower out of sync)
commits what it appends at once, as Kafka's leader moves its high watermark right after an
append: no follower fetch would move it. Before, an acks=all produce to such a partition
waited for the replica manager's next periodic pass (about a second, found by
bench/replication.py: 928 msgs/s with replication factor 1 against 60,983 with 3), and
consumers saw the records that late. With followers in the ISR, the append alone commits
nothing."""

from __future__ import annotations

import asyncio
import time

from kio.schema.errors import ErrorCode

from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.broker.replication import ReplicaState, ReplicationError, until_replicated
from oncelog.log.log import LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.producer_state.manager import StateLimits
from oncelog.producer_state.rules import MarkerIdentity
from oncelog.protocol.records import encode_batch

NOW = int(time.time() * 1000)


class Issued:
    def is_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < 1000

    def highest_claimed(self) -> int:
        return 999


def leader(isr: tuple[int, ...]) -> Partition:
    partition = Partition("t", 0, "/data/t-0", LogConfig(), 1 << 20, StateLimits(), Issued(),
                          log_dir=LogDir("/data"), disk=MemoryDisk())
    partition.replication = ReplicaState(1, 1, 0, isr, (1, 2, 3), 0)
    return partition


def test_an_isr_of_the_leader_alone_commits_at_the_append():
    alone = leader((1,))
    alone.append_records(encode_batch([(None, b"a", (), NOW), (None, b"b", (), NOW)]))
    assert alone.high_watermark == 2

    async def acks_all():  # answered at once: nothing to wait for
        return alone.replication.wait_for(2, 30)

    assert asyncio.run(acks_all()) is None
    pid = 7
    alone.append_records(encode_batch([(None, b"t", (), NOW)], producer_id=pid,
                                      producer_epoch=0, base_sequence=0, transactional=True))
    alone.append_marker(MarkerIdentity(pid, 0, 0, True))
    assert alone.high_watermark == 4  # the marker too: the last stable offset moves on


def test_followers_in_the_isr_hold_the_high_watermark():
    replicated = leader((1, 2))
    replicated.append_records(encode_batch([(None, b"a", (), NOW)]))
    assert replicated.high_watermark == 0


def test_an_isr_expansion_whose_write_is_unanswered_holds_the_high_watermark():
    """Found by test_txn_workload.py (seed 7): a leader wrote an ISR expansion to ZooKeeper,
    the write landed but its answer was lost (the leader cut off from ZooKeeper), so the
    leader went on counting the ISR without the follower it had added and acknowledged
    records that follower did not have; the controller then elected that follower and the
    records of a committed transaction were gone. Until ZooKeeper says what the ISR is, the
    high watermark counts the ISR asked for too (Kafka's maximal ISR)."""
    p = leader((1, 2))
    r = p.replication
    p.append_records(encode_batch([(None, b"a", (), NOW), (None, b"b", (), NOW)]))
    r.follower_fetched(2, 2, 2, NOW)
    r.follower_fetched(3, 2, 2, NOW)  # caught up: the leader asks for ISR [1, 2, 3]
    r.advance_high_watermark(2)
    assert r.high_watermark == 2
    wanted = r.isr_changes(NOW, 10_000, fetching=3)
    assert wanted == (1, 2, 3)
    r.isr_write_started(wanted)
    r.isr_write_ended(wanted, None)  # no answer: it may have landed
    p.append_records(encode_batch([(None, b"c", (), NOW), (None, b"d", (), NOW)]))
    r.follower_fetched(2, 4, 4, NOW)  # broker 2 has them, broker 3 not yet
    r.advance_high_watermark(4)
    assert r.high_watermark == 2, "acknowledged what a replica ZooKeeper may count lacks"
    r.isr_read((1, 2), 5)  # ZooKeeper's state read: the write had not landed
    r.advance_high_watermark(4)
    assert r.high_watermark == 4
    assert r.maximal_isr == (1, 2)


def test_an_isr_read_while_a_write_is_in_flight_keeps_the_isr_asked_for():
    p = leader((1, 2))
    r = p.replication
    r.isr_write_started((1, 2, 3))
    r.isr_read((1, 2), 5)  # read before the write landed
    assert r.maximal_isr == (1, 2, 3)
    r.isr_write_ended((1, 2, 3), 6)
    assert r.isr == (1, 2, 3) and r.maximal_isr == (1, 2, 3) and r.zk_version == 6


def test_a_second_isr_write_keeps_counting_the_first_one_whose_outcome_is_unknown():
    """Found in review: ISR [1], a write for [1, 2] unanswered (it may have landed), then a
    write for [1, 3] (broker 2 fell behind, broker 3 caught up): broker 2 stays counted until
    ZooKeeper says which ISR holds, or the controller could elect it without records the
    high watermark let through."""
    p = leader((1,))
    r = p.replication
    r.isr_write_started((1, 2))
    r.isr_write_ended((1, 2), None)
    r.isr_write_started((1, 3))
    assert set(r.maximal_isr) == {1, 2, 3}
    r.isr_write_ended((1, 3), None)  # refused (BadVersion: the first one landed)
    p.append_records(encode_batch([(None, b"a", (), NOW)]))
    r.follower_fetched(3, 1, 1, NOW)
    r.advance_high_watermark(1)
    assert r.high_watermark == 0  # broker 2 has nothing yet
    r.isr_read((1, 2), 7)  # ZooKeeper: the first write had landed
    assert r.maximal_isr == (1, 2)


def test_an_isr_write_whose_outcome_is_unknown_owes_the_read_that_ends_acks_all_waiting():
    """How long acks=all waits after an ISR write whose outcome is unknown, as an order: a
    state read that began while the write was in flight (woken by kazoo's reconnection, a
    watch or the periodic pass, its view applied before the write's ConnectionLoss reaches
    the event loop) keeps the follower asked for; the outcome then owes a read that begins
    after it (the replica manager asks the watch at once), and that read, not the watch's
    next periodic pass a third of the session timeout later, answers the waiting produce.
    Before, nothing was owed: the produce waited for that pass (or timed out) for a follower
    never in the ISR."""

    async def run() -> None:
        p = leader((1, 2))
        r = p.replication
        r.min_insync = 2
        p.append_records(encode_batch([(None, b"a", (), NOW)]))
        r.follower_fetched(2, 1, 1, NOW)
        r.follower_fetched(3, 0, 1, NOW)  # broker 3 fetching, behind
        r.advance_high_watermark(1)
        assert r.high_watermark == 1
        r.isr_write_started((1, 2, 3))  # broker 3 had caught up a moment before
        p.append_records(encode_batch([(None, b"b", (), NOW)]))
        r.follower_fetched(2, 2, 2, NOW)  # broker 2 has it, broker 3 (dead now) never will
        r.advance_high_watermark(2)
        waiting = r.wait_for(2, 30.0)
        assert waiting is not None and not waiting.done()
        r.isr_read((1, 2), 5)  # the reconnection's read, while the write is in flight
        r.advance_high_watermark(2)
        r.resolve_waiters()
        assert not waiting.done() and 3 in r.maximal_isr
        owed = r.isr_write_ended((1, 2, 3), None)  # ConnectionLoss: perhaps written
        assert owed, "no state read owed: acks=all waits for the periodic pass"
        assert not waiting.done()
        r.isr_read((1, 2), 5)  # the owed read: the write had not landed
        r.advance_high_watermark(2)
        r.resolve_waiters()
        await asyncio.wait_for(waiting, 1.0)
        assert r.high_watermark == 2 and r.maximal_isr == (1, 2)

    asyncio.run(run())


def test_an_isr_write_answered_owes_no_read():
    p = leader((1, 2))
    r = p.replication
    r.isr_write_started((1, 2, 3))
    assert r.isr_write_ended((1, 2, 3), 6) is False
    assert r.isr == (1, 2, 3) and r.zk_version == 6


def test_an_isr_write_answered_after_its_partition_was_deleted_ends_quietly():
    """A topic deleted while its leader's ISR write was out (writes go in batches, queued):
    the answer finds the partition deleted and does nothing more. Before, it opened the log
    to move the high watermark, and the deleted partition raised in the event loop's
    callback (a Traceback in the broker's log, and the rest of the batch's partitions left
    without their answer)."""
    from types import SimpleNamespace

    from oncelog.broker.replica_manager import ReplicaManager

    p = leader((1,))
    r = p.replication
    p.append_records(encode_batch([(None, b"a", (), NOW)]))
    r.isr_write_started((1, 2))
    p.delete()
    manager = SimpleNamespace(_count_isr=lambda old, new: None,
                              watch=SimpleNamespace(refresh=lambda: None))
    ReplicaManager._isr_written(manager, p, r, (1,), (1, 2), 7)
    assert r.isr == (1, 2)


def test_acks_one_in_controlled_shutdown_waits_for_the_isr_with_no_minimum():
    """Row K6: in controlled shutdown an acks=1 answer waits as acks=all does, but the ISR
    shrinking below min.insync.replicas acknowledges it (it asked for no minimum) where
    acks=all's is NOT_ENOUGH_REPLICAS_AFTER_APPEND."""
    p = leader((1, 2))
    r = p.replication
    r.min_insync = 2
    p.append_records(encode_batch([(None, b"a", (), NOW)]))

    async def run():
        acks_all, acks_one = r.wait_for(1, 30), r.wait_for(1, 30, 1)
        assert not acks_all.done() and not acks_one.done()
        r.isr_read((1,), 3)  # the follower out: the leader's ISR alone
        r.advance_high_watermark(1)
        await asyncio.wait([acks_all, acks_one])
        return acks_all.exception(), acks_one.exception()

    all_error, one_error = asyncio.run(run())
    assert isinstance(all_error, ReplicationError)
    assert all_error.error_code == ErrorCode.not_enough_replicas_after_append
    assert one_error is None


def test_a_leader_leaving_waits_until_its_isr_has_what_it_appended():
    """Before a stopping broker asks the controller to move its leaderships, the ISR of
    each partition it leads holds what it appended (and so acknowledged with acks=1): the
    new leader comes from that ISR. A leadership moved meanwhile ends the wait too; one
    never caught up is given up on after the bound."""
    followed, alone, moved, stuck = leader((1, 2)), leader((1,)), leader((1, 3)), \
        leader((1, 2))
    for p in (followed, alone, moved, stuck):
        p.append_records(encode_batch([(None, b"a", (), NOW), (None, b"b", (), NOW)]))

    async def run():
        waiting = asyncio.ensure_future(until_replicated([followed, alone, moved], 30))
        await asyncio.sleep(0)
        assert not waiting.done()
        r = followed.replication
        r.follower_fetched(2, 2, 2, NOW)
        r.advance_high_watermark(2)
        moved.replication.fail_waiters(ErrorCode.not_leader_or_follower, "moved")
        lacking = await asyncio.wait_for(waiting, 5)
        return lacking, await until_replicated([stuck], 0.01)

    assert asyncio.run(run()) == (0, 1)
