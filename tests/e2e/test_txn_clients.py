"""Transactions end to end on a real broker, with clients we did not write: confluent-kafka's
transactional producers commit, abort and leave a transaction open (across a kill -9 of the
broker); read_committed consumers of confluent-kafka, kafka-python and aiokafka never return
an aborted record and stop at the last stable offset. WriteTxnMarkers is driven with crafted
requests for the errors Kafka gives per partition."""

from __future__ import annotations

from kio.schema.errors import ErrorCode as E
from support.brokers import BrokerProcess, create_topic
from support.txn_clients_helpers import (
    PARTITIONS,
    TIMEOUT,
    TOPIC,
    assert_read_committed,
    connect,
    expect,
    send,
    transactional,
)

from oncelog.protocol import api_versions as apis
from oncelog.protocol.schema import build


def offsets(broker: BrokerProcess, isolation: int) -> dict[int, int]:
    """The latest offset of each partition as ListOffsets answers for ``isolation``."""
    def make(mod, version):
        return build(mod.ListOffsetsRequest, replica_id=-1, isolation_level=isolation,
                     topics=(build(mod.ListOffsetsTopic, name=TOPIC, partitions=tuple(
                         build(mod.ListOffsetsPartition, partition_index=p, timestamp=-1,
                               current_leader_epoch=-1, max_num_offsets=1)
                         for p in range(PARTITIONS))),))

    with connect(broker) as conn:
        answer = conn.call(apis.LIST_OFFSETS, make)
    return {p.partition_index: p.offset for p in answer.topics[0].partitions}


def test_read_committed_consumers_never_see_aborted_records_and_stop_at_the_lso(tmp_path):
    broker = BrokerProcess(tmp_path / "data", {"group.initial.rebalance.delay.ms": "0"})
    broker.start()
    try:
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        aborter = transactional(broker.bootstrap, "aborter")
        committer = transactional(broker.bootstrap, "committer")
        aborter.begin_transaction()
        send(aborter, "a", 10)
        committer.begin_transaction()
        send(committer, "c", 10)  # interleaved with the aborted transaction
        aborter.abort_transaction(TIMEOUT)
        committer.commit_transaction(TIMEOUT)
        end = offsets(broker, 0)
        assert offsets(broker, 1) == end  # nothing open: the LSO is the high watermark
        assert_read_committed(broker.bootstrap, end, expect("c", 10))

        # An open transaction holds the LSO at its first offset, across a kill -9.
        opener = transactional(broker.bootstrap, "opener")
        opener.begin_transaction()
        send(opener, "o", 4)
        committer.begin_transaction()
        send(committer, "d", 4)
        committer.commit_transaction(TIMEOUT)
        lso = offsets(broker, 1)
        assert all(lso[p] < offsets(broker, 0)[p] for p in lso)
        broker.restart(clean=False)
        assert offsets(broker, 1) == lso
        assert_read_committed(broker.bootstrap, lso, expect("c", 10))
        opener.abort_transaction(TIMEOUT)
        end = offsets(broker, 0)
        assert offsets(broker, 1) == end
        assert_read_committed(broker.bootstrap, end, expect("c", 10) | expect("d", 4))
        for producer in (aborter, committer, opener):
            producer.flush(TIMEOUT)
    finally:
        broker.kill()


def markers_request(producer_id: int, epoch: int, commit: bool, coordinator_epoch: int,
                    parts: list[tuple[str, int]]):
    def make(mod, version):
        return build(mod.WriteTxnMarkersRequest, markers=(build(
            mod.WritableTxnMarker, producer_id=producer_id, producer_epoch=epoch,
            transaction_result=commit, coordinator_epoch=coordinator_epoch,
            topics=tuple(build(mod.WritableTxnMarkerTopic, name=t, partition_indexes=(p,))
                         for t, p in parts)),))
    return make


def test_write_txn_markers_answers_kafkas_errors_per_partition(tmp_path):
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        producer = transactional(broker.bootstrap, "marked")
        producer.begin_transaction()
        send(producer, "x", 2)
        producer.commit_transaction(TIMEOUT)
        with connect(broker) as conn:
            described = conn.call(apis.DESCRIBE_PRODUCERS, lambda mod, v: build(
                mod.DescribeProducersRequest, topics=(build(
                    mod.TopicRequest, name=TOPIC, partition_indexes=(0,)),)))
            state = described.topics[0].partitions[0].active_producers[0]
            assert state.current_txn_start_offset == -1
            pid, epoch = state.producer_id, state.producer_epoch
            coordinator_epoch = state.coordinator_epoch

            def errors(*args):
                answer = conn.call(apis.WRITE_TXN_MARKERS, markers_request(*args))
                return [p.error_code for t in answer.markers[0].topics for p in t.partitions]

            # A retry of the marker already written: accepted, changes nothing.
            assert errors(pid, epoch, True, coordinator_epoch, [(TOPIC, 0), (TOPIC, 1)]) == \
                [E.none, E.none]
            assert errors(pid, epoch - 1, True, coordinator_epoch, [(TOPIC, 0)]) == \
                [E.invalid_producer_epoch]
            assert errors(pid, epoch, False, coordinator_epoch - 1, [(TOPIC, 0)]) == \
                [E.transaction_coordinator_fenced]
            assert errors(pid, epoch, True, coordinator_epoch, [("nope", 0), (TOPIC, 9)]) == \
                [E.unknown_topic_or_partition, E.unknown_topic_or_partition]
        assert offsets(broker, 1) == offsets(broker, 0)
        assert_read_committed(broker.bootstrap, offsets(broker, 1), expect("x", 2))
    finally:
        broker.kill()
