"""A coordinator whose load raises retries it (coordinator/ownership.py rows O12-O16, A5):
a real broker whose ``__consumer_offsets`` and ``__transaction_state`` segments cannot be
opened at its start (each replaced by a directory of the same name: EISDIR, for root too)
answers NOT_COORDINATOR meanwhile, Kafka's answer for a failed load, and serves the groups
and transactions it had once the segments are back, without a restart. Before, the failed
load left the partitions COORDINATOR_LOAD_IN_PROGRESS until the broker restarted.

The remote KIP-890 verification (AddPartitionsToTxn v4 ``verify_only``, what a partition
leader sends the transaction's coordinator) is answered by the coordinator as Kafka's
coordinator answers it, NOT_COORDINATOR here, never NOT_ENOUGH_REPLICAS (the produce's own
mapping, broker/txn_verification.py P2)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode as E
from support.brokers import BrokerProcess, create_topic
from support.group_model_helpers import ModelLog
from support.txn_wire import add_partitions, init_producer_id, list_txns, produce_txn
from support.waits import wait_for

from oncelog.client.network import calls
from oncelog.client.network.connection import connect
from oncelog.client.topic_partition import SIMPLE_COMMIT, OffsetAndMetadata, TopicPartition
from oncelog.coordinator.group.group_coordinator import GroupConfig, GroupCoordinator
from oncelog.coordinator.ownership import Ownership, Status, load_retrying
from oncelog.protocol import api_versions as apis
from oncelog.protocol.schema import build

SEGMENT = "00000000000000000000.log"
TP = TopicPartition("t", 0)


def _committed(conn) -> tuple[E, int | None]:
    error, offsets = calls.offset_fetch_result(
        conn.call(apis.OFFSET_FETCH, calls.offset_fetch_request("g", [TP])))
    found = offsets.get(TP)
    return E(error), None if found is None or found[1] is None else found[1].offset


def _verify_only(conn, pid: int, epoch: int) -> E:
    """As a partition leader asks the coordinator (v4, a broker's version)."""
    conn.versions[apis.ADD_PARTITIONS_TO_TXN] = 4

    def make(mod, version):
        return build(mod.AddPartitionsToTxnRequest, transactions=(build(
            mod.AddPartitionsToTxnTransaction, transactional_id="tx", producer_id=pid,
            producer_epoch=epoch, verify_only=True, topics=(build(
                mod.AddPartitionsToTxnTopic, name="t", partitions=(0,)),)),))

    answer = conn.call(apis.ADD_PARTITIONS_TO_TXN, make)
    assert E(answer.error_code) is E.none
    (result,) = answer.results_by_transaction
    return E(result.topic_results[0].results_by_partition[0].partition_error_code)


def _break(segment: Path, aside: Path) -> None:
    os.rename(segment, aside)
    segment.mkdir()


def _repair(segment: Path, aside: Path) -> None:
    segment.rmdir()
    os.rename(aside, segment)


def test_a_failed_coordinator_load_is_retried_until_the_disk_gives_its_segment(tmp_path):
    broker = BrokerProcess(tmp_path / "broker", {
        "offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1",
        "group.initial.rebalance.delay.ms": "0"}).start()
    try:
        create_topic(broker.bootstrap, "t")
        with connect(broker.bootstrap) as conn:
            answer = conn.call(apis.OFFSET_COMMIT, calls.offset_commit_request(
                "g", SIMPLE_COMMIT, {TP: OffsetAndMetadata(5, "")}))
            assert calls.offset_commit_errors(answer) == {TP: E.none}
            error, pid, epoch = init_producer_id(conn, "tx")
            assert error is E.none
            assert add_partitions(conn, "tx", pid, epoch, [("t", 0)]) == {("t", 0): E.none}
        broker.stop()
        broken = [(broker.data_dir / name / SEGMENT, tmp_path / f"{name}.aside")
                  for name in ("__consumer_offsets-0", "__transaction_state-0")]
        for segment, aside in broken:
            _break(segment, aside)
        broker.start()
        with connect(broker.bootstrap) as conn:
            # A5 once the load failed (before: COORDINATOR_LOAD_IN_PROGRESS for good)
            wait_for(lambda: _committed(conn) == (E.not_coordinator, None), 10,
                     "OffsetFetch answered NOT_COORDINATOR")
            wait_for(lambda: init_producer_id(conn, "tx", retry_busy=False)[0]
                     is E.not_coordinator, 10, "InitProducerId answered NOT_COORDINATOR")
            # the coordinator's own answer (before: NOT_ENOUGH_REPLICAS), and the produce's
            assert _verify_only(conn, pid, epoch) is E.not_coordinator
            assert produce_txn(conn, "tx", "t", 0, pid, epoch, 0, [b"a"]) \
                is E.not_enough_replicas  # txn_verification.py P2
            for segment, aside in broken:
                _repair(segment, aside)
            # each partition's retry is its own timer: they need not end together
            wait_for(lambda: _committed(conn) == (E.none, 5), 30, "the offset served again")
            wait_for(lambda: _verify_only(conn, pid, epoch) is E.none, 30,
                     "the transaction served again")
            assert list_txns(conn) == {"tx": "Ongoing"}
            assert produce_txn(conn, "tx", "t", 0, pid, epoch, 0, [b"a"]) is E.none
    finally:
        broker.stop()
    text = broker.log_text()
    assert "__consumer_offsets-0: loading again (attempt 2)" in text, text[-3000:]
    assert "__transaction_state-0: loading again (attempt 2)" in text, text[-3000:]


class _UnreadableLog(ModelLog):
    """__consumer_offsets whose every read raises ``fault``, reads counted."""

    def __init__(self, fault: Exception) -> None:
        super().__init__()
        self.fault = fault
        self.reads = 0

    def read(self, partition):
        self.reads += 1
        raise self.fault


@pytest.mark.parametrize("fault, retried", [(OSError("EIO"), True),
                                            (MemoryError(), True),
                                            (RuntimeError("a bug"), False)])
def test_only_an_io_fault_of_a_load_is_retried(fault, retried):
    """O12 against O17: a load failing by anything but an OSError would fail the same at
    every read, the whole partition read each time: it is not retried (before: every 30 s,
    for ever), the partition failed (NOT_COORDINATOR) until it is elected again."""
    log = _UnreadableLog(fault)

    async def load() -> GroupCoordinator:
        c = GroupCoordinator(log, GroupConfig(num_partitions=1), lambda t, p: True)
        await c.load_all()
        return c

    loop = asyncio.new_event_loop()
    try:
        c = loop.run_until_complete(load())
        assert (log.reads, c.ownership.status(0), c.not_served("g")) == \
            (1, Status.FAILED, E.not_coordinator)
        assert bool(c._tasks) is retried  # the retry's timer, waiting its delay
        c.close()
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()


def test_a_coordinator_whose_load_all_raises_leaves_the_others_load_running(tmp_path, caplog):
    """The broker starts both coordinators' loads each on its own guard: the group
    coordinator's load_all raising (past load_retrying's own guard: a bug) is logged, and
    the transaction coordinator still loads (before: every __transaction_state partition
    stayed COORDINATOR_LOAD_IN_PROGRESS)."""
    from oncelog.broker.config import BrokerConfig
    from oncelog.broker.server import Broker

    async def main() -> None:
        broker = Broker(BrokerConfig({"log.dirs": str(tmp_path / "data"),
                                      "listeners": "PLAINTEXT://127.0.0.1:0",
                                      "transaction.state.log.num.partitions": "1"}))

        async def broken() -> None:
            raise RuntimeError("a bug past the load's own guard")

        broker.groups.load_all = broken
        try:
            await broker._load_groups()
            assert broker.transactions.ownership.status(0) is Status.OWNED
        finally:
            await broker.stop()

    asyncio.run(asyncio.wait_for(main(), 20))
    assert "a bug past the load's own guard" in caplog.text


def test_one_partition_load_raising_past_its_guard_leaves_the_others_loading(caplog):
    """load_all's loads each on their own guard: partition 1's load raising past
    load_retrying's guard (a bug, simulated) fails that partition (O17) and partitions 2
    and 3 still load (before: they stayed COORDINATOR_LOAD_IN_PROGRESS for good)."""

    async def load() -> GroupCoordinator:
        c = GroupCoordinator(ModelLog(), GroupConfig(num_partitions=4), lambda t, p: True)
        loaded = c._load_logged

        async def buggy(one) -> None:
            if one.partition == 1:
                raise RuntimeError("a bug past the load's guard")
            await loaded(one)

        c._load_logged = buggy
        await c.load_all()
        return c

    c = asyncio.run(load())
    assert [c.ownership.status(p) for p in range(4)] == \
        [Status.OWNED, Status.FAILED, Status.OWNED, Status.OWNED]
    assert "a bug past the load's guard" in caplog.text


@pytest.mark.parametrize("broken", ["drop", "background"])
def test_a_failed_load_whose_cleanup_raises_ends_failed_and_logged(broken, caplog):
    """load_retrying never raises: a ``drop`` (O13's UNLOAD) or ``background`` (O12's
    RETRY) raising is logged and the partition stays failed, not retried (O17)."""
    ownership = Ownership()
    first = ownership.elect(0, 0)
    assert ownership.loaded(first)  # owned: a failed install unloads it (O13)

    async def read(load) -> None:
        raise OSError("EIO")

    def drop(partition: int) -> None:
        if broken == "drop":
            raise RuntimeError("drop broke")

    retries = []

    def background(work) -> None:
        retries.append(work)
        work.close()
        if broken == "background":
            raise RuntimeError("background broke")

    asyncio.run(load_retrying(ownership, first, read, drop, background, "t"))
    assert ownership.status(0) is Status.FAILED
    assert len(retries) == (broken == "background")  # none after a drop that raised
    assert f"{broken} broke" in caplog.text
