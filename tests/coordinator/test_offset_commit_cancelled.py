"""A coordinator request cancelled while its write waits for the fsync (its task cancelled at a
broker's stop, a background step cancelled at the coordinator's close) must not take the
other waiters' answers with it: the writes of one pass share one flush future
(broker/partition.py ``durable``), and a task awaiting a future cancels that very future
when it is cancelled. ``durable`` hands each caller a future of its own: each coordinator
write, each transaction marker, each produce.

The coordinator runs over the broker's own log of ``__consumer_offsets`` (a TopicManager on a
real directory, fsync after every message), in process."""

from __future__ import annotations

import asyncio
import contextlib

from kio.schema.errors import ErrorCode as E
from support.compaction_config_helpers import NoProducers

from oncelog.broker.apis.groups import make_coordinator
from oncelog.broker.config import BrokerConfig
from oncelog.broker.topics import TopicManager
from oncelog.coordinator.group.group_coordinator import OffsetCommitPartition
from oncelog.metadata.store import LocalFileStore


@contextlib.asynccontextmanager
async def _durable_broker(tmp_path):
    """A broker in process, fsync after every message, with a topic "t" of one partition."""
    from oncelog.broker.server import Broker

    broker = Broker(BrokerConfig({"log.dirs": str(tmp_path / "data"),
                                  "listeners": "PLAINTEXT://127.0.0.1:0",
                                  "log.flush.interval.messages": "1"}))
    await broker.start()
    try:
        broker.topics.create("t", 1, 1, {})
        yield broker
    finally:
        await broker.stop()


def _offset(coordinator, group: str) -> int | None:
    error, ((_, _, value),) = coordinator.fetch(group, [("t", [0])])
    assert error is E.none
    return None if value is None else value.offset


def _run(tmp_path, scenario) -> None:
    config = BrokerConfig({"log.dirs": str(tmp_path / "data"),
                           "offsets.topic.num.partitions": "1",
                           "log.flush.interval.messages": "1"})
    topics = TopicManager(config, LocalFileStore(str(tmp_path / "meta")), NoProducers())

    async def run() -> None:
        coordinator = make_coordinator(config, topics)
        coordinator.partition_exists = lambda topic, partition: topic == "t"
        await coordinator.load_all()
        try:
            await scenario(coordinator)
        finally:
            coordinator.close()

    try:
        asyncio.run(asyncio.wait_for(run(), 20))
    finally:
        topics.close()


def _commit(coordinator, group: str, offset: int) -> asyncio.Future:
    return asyncio.ensure_future(coordinator.commit(
        group, -1, "", None, -1, [OffsetCommitPartition("t", 0, offset, -1, "")]))


def test_a_cancelled_commit_leaves_the_commits_sharing_its_fsync_answered(tmp_path):
    async def scenario(coordinator) -> None:
        gone, kept = _commit(coordinator, "gone", 3), _commit(coordinator, "kept", 5)
        await asyncio.sleep(0)  # one pass: both appended, both waiting for one fsync
        assert not gone.done() and not kept.done()
        gone.cancel()
        assert await asyncio.wait_for(kept, 10) == [E.none]
        assert gone.cancelled()
        assert _offset(coordinator, "kept") == 5
        # the cancelled commit's write was made durable all the same: it is served
        assert _offset(coordinator, "gone") == 3

    _run(tmp_path, scenario)


def test_a_cancelled_group_deletion_leaves_a_commit_sharing_its_fsync_answered(tmp_path):
    """The paths that await a write's durability directly (DeleteGroups here; JoinGroup,
    SyncGroup, the transaction coordinator's writes) wait on a future of their own too."""
    async def scenario(coordinator) -> None:
        assert await _commit(coordinator, "gone", 3) == [E.none]
        deleting = asyncio.ensure_future(coordinator.delete_group("gone"))
        kept = _commit(coordinator, "kept", 5)
        await asyncio.sleep(0)
        assert not deleting.done() and not kept.done()
        deleting.cancel()
        assert await asyncio.wait_for(kept, 10) == [E.none]
        assert _offset(coordinator, "kept") == 5

    _run(tmp_path, scenario)


def test_a_cancelled_marker_write_leaves_the_markers_sharing_its_fsync_answered(tmp_path):
    """The transaction coordinator's markers (apis/txn_markers.py, awaited by its completion
    step, which its close cancels) share a data partition's flush with every produce and
    marker of that pass: their waits are their own too."""
    from oncelog.broker.apis.txn_markers import write_markers

    async def main() -> None:
        async with _durable_broker(tmp_path) as broker:

            def markers(producer_id: int) -> asyncio.Future:
                return asyncio.ensure_future(write_markers(broker, producer_id, 0, True, 0,
                                                           [("t", 0)]))

            gone, kept = markers(7), markers(8)  # one pass: one fsync for both
            await asyncio.sleep(0)
            assert not gone.done() and not kept.done()
            gone.cancel()
            assert await asyncio.wait_for(kept, 10) == {("t", 0): E.none}

    asyncio.run(asyncio.wait_for(main(), 20))


def test_a_cancelled_produce_wait_leaves_the_produce_and_marker_sharing_its_fsync_answered(
        tmp_path):
    """Every caller of a data partition's ``durable`` gets a future of its own
    (broker/partition.py): a produce whose wait is cancelled (its task, a gather around it)
    cancels neither another produce's wait of that pass nor a transaction marker's, whose
    coordinator would otherwise get CancelledError and leave the transaction pending."""
    from oncelog.broker.apis.produce import _produce_partition
    from oncelog.broker.apis.txn_markers import write_markers
    from oncelog.protocol.records import encode_batch
    from oncelog.protocol.validation import Inflation

    async def main() -> None:
        async with _durable_broker(tmp_path) as broker:
            # Opened as a Produce request would first (in a worker): _produce_partition
            # leaves a log not open yet to that.
            await broker.topics.partition("t", 0).open_async()

            def produce() -> asyncio.Future:
                batch = encode_batch([(None, b"v", (), 0)])
                _, durable = _produce_partition(broker, -1, "t", 0, batch, None, None,
                                                Inflation(), None)
                assert durable is not None
                return durable

            gone, kept = produce(), produce()  # one pass: one fsync for both, and the marker
            marker = asyncio.ensure_future(write_markers(broker, 7, 0, True, 0, [("t", 0)]))
            await asyncio.sleep(0)
            assert not gone.done() and not kept.done() and not marker.done()
            gone.cancel()
            await asyncio.wait_for(kept, 10)
            assert await asyncio.wait_for(marker, 10) == {("t", 0): E.none}

    asyncio.run(asyncio.wait_for(main(), 20))
