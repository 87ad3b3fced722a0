"""Transaction requests crafted by hand over a BrokerConnection, for the tests that must send
what no well-behaved client sends: a zombie's old epoch, a batch without AddPartitions, a
marker from a coordinator that is not the one. Each call returns the broker's error codes as
they come, never raises on them."""

from __future__ import annotations

import datetime
import time

from kio.schema.errors import ErrorCode as E

from oncelog.client.network.connection import BrokerConnection
from oncelog.protocol import api_versions as apis
from oncelog.protocol.records import encode_batch
from oncelog.protocol.schema import build

WAIT = 30.0
NOW_MS = 1_700_000_000_000


def init_producer_id(conn: BrokerConnection, txn_id: str, timeout_ms: int = 60_000,
                     retry_busy: bool = True) -> tuple[E, int, int]:
    """(error, producer id, epoch); CONCURRENT_TRANSACTIONS (the previous incarnation's
    transaction being aborted) is retried until it clears, as clients do."""
    def make(mod, version):
        return build(mod.InitProducerIdRequest, transactional_id=txn_id,
                     transaction_timeout=datetime.timedelta(milliseconds=timeout_ms),
                     producer_id=-1, producer_epoch=-1)

    deadline = time.monotonic() + WAIT
    while True:
        answer = conn.call(apis.INIT_PRODUCER_ID, make)
        error = E(answer.error_code)
        if not (retry_busy and error in (E.concurrent_transactions,
                                         E.coordinator_load_in_progress)):
            return error, answer.producer_id, answer.producer_epoch
        assert time.monotonic() < deadline, f"InitProducerId stayed {error.name}"
        time.sleep(0.05)


def add_partitions(conn: BrokerConnection, txn_id: str, pid: int, epoch: int,
                   parts: list[tuple[str, int]]) -> dict[tuple[str, int], E]:
    by_topic: dict[str, list[int]] = {}
    for topic, index in parts:
        by_topic.setdefault(topic, []).append(index)

    def make(mod, version):
        topics = tuple(build(mod.AddPartitionsToTxnTopic, name=t, partitions=tuple(ps))
                       for t, ps in by_topic.items())
        if version >= 4:
            return build(mod.AddPartitionsToTxnRequest, transactions=(build(
                mod.AddPartitionsToTxnTransaction, transactional_id=txn_id, producer_id=pid,
                producer_epoch=epoch, verify_only=False, topics=topics),))
        return build(mod.AddPartitionsToTxnRequest, v3_and_below_transactional_id=txn_id,
                     v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
                     v3_and_below_topics=topics)

    answer = conn.call(apis.ADD_PARTITIONS_TO_TXN, make)
    topics = answer.results_by_transaction[0].topic_results \
        if hasattr(answer, "results_by_transaction") else answer.results_by_topic_v3_and_below
    return {(t.name, p.partition_index): E(p.partition_error_code)
            for t in topics for p in t.results_by_partition}


def add_offsets(conn: BrokerConnection, txn_id: str, pid: int, epoch: int, group: str) -> E:
    answer = conn.call(apis.ADD_OFFSETS_TO_TXN, lambda mod, v: build(
        mod.AddOffsetsToTxnRequest, transactional_id=txn_id, producer_id=pid,
        producer_epoch=epoch, group_id=group))
    return E(answer.error_code)


def txn_offset_commit(conn: BrokerConnection, txn_id: str, pid: int, epoch: int, group: str,
                      topic: str, offsets: dict[int, int]) -> list[E]:
    def make(mod, version):
        return build(mod.TxnOffsetCommitRequest, transactional_id=txn_id, group_id=group,
                     producer_id=pid, producer_epoch=epoch, generation_id=-1, member_id="",
                     group_instance_id=None, topics=(build(
                         mod.TxnOffsetCommitRequestTopic, name=topic, partitions=tuple(
                             build(mod.TxnOffsetCommitRequestPartition, partition_index=p,
                                   committed_offset=o, committed_leader_epoch=-1,
                                   committed_metadata="") for p, o in offsets.items())),))

    answer = conn.call(apis.TXN_OFFSET_COMMIT, make)
    return [E(p.error_code) for t in answer.topics for p in t.partitions]


def end_txn(conn: BrokerConnection, txn_id: str, pid: int, epoch: int,
            commit: bool) -> tuple[E, int]:
    """(error, the epoch to use next): version 5 (KIP-890 part 2) answers a bumped epoch."""
    answer = conn.call(apis.END_TXN, lambda mod, v: build(
        mod.EndTxnRequest, transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
        committed=commit))
    error = E(answer.error_code)
    bumped = getattr(answer, "producer_epoch", -1)
    return error, bumped if error is E.none and bumped >= 0 else epoch


def produce_txn(conn: BrokerConnection, txn_id: str | None, topic: str, partition: int,
                pid: int, epoch: int, seq: int, values: list[bytes],
                transactional: bool = True) -> E:
    batch = encode_batch([(None, v, (), NOW_MS) for v in values], producer_id=pid,
                         producer_epoch=epoch, base_sequence=seq, transactional=transactional)

    def make(mod, version):
        return build(mod.ProduceRequest, transactional_id=txn_id, acks=-1,
                     timeout=datetime.timedelta(seconds=30), topic_data=(build(
                         mod.TopicProduceData, name=topic, partition_data=(build(
                             mod.PartitionProduceData, index=partition, records=batch),)),))

    answer = conn.call(apis.PRODUCE, make)
    return E(answer.responses[0].partition_responses[0].error_code)


def produce_txn_batches(conn: BrokerConnection, txn_id: str, topic: str,
                        producers: dict[int, tuple[int, int]]) -> dict[int, E]:
    """One produce of a transactional batch (sequence 0) to each partition of ``producers``
    (partition -> (producer id, epoch)); each partition's error."""
    batches = {p: encode_batch([(None, b"v", (), NOW_MS)], producer_id=pid,
                               producer_epoch=epoch, base_sequence=0, transactional=True)
               for p, (pid, epoch) in producers.items()}

    def make(mod, version):
        return build(mod.ProduceRequest, transactional_id=txn_id, acks=-1,
                     timeout=datetime.timedelta(seconds=30), topic_data=(build(
                         mod.TopicProduceData, name=topic, partition_data=tuple(
                             build(mod.PartitionProduceData, index=p, records=batch)
                             for p, batch in batches.items())),))

    answer = conn.call(apis.PRODUCE, make)
    return {r.index: E(r.error_code) for r in answer.responses[0].partition_responses}


def write_marker(conn: BrokerConnection, pid: int, epoch: int, commit: bool,
                 coordinator_epoch: int, parts: list[tuple[str, int]]) -> list[E]:
    def make(mod, version):
        return build(mod.WriteTxnMarkersRequest, markers=(build(
            mod.WritableTxnMarker, producer_id=pid, producer_epoch=epoch,
            transaction_result=commit, coordinator_epoch=coordinator_epoch,
            topics=tuple(build(mod.WritableTxnMarkerTopic, name=t, partition_indexes=(p,))
                         for t, p in parts)),))

    answer = conn.call(apis.WRITE_TXN_MARKERS, make)
    return [E(p.error_code) for t in answer.markers[0].topics for p in t.partitions]


def write_markers(conn: BrokerConnection,
                  markers: list[tuple[int, int, bool, int, list[tuple[str, int]]]]
                  ) -> list[list[E]]:
    """One WriteTxnMarkers of several markers, each (producer id, epoch, commit, coordinator
    epoch, partitions); each marker's errors."""
    def make(mod, version):
        return build(mod.WriteTxnMarkersRequest, markers=tuple(build(
            mod.WritableTxnMarker, producer_id=pid, producer_epoch=epoch,
            transaction_result=commit, coordinator_epoch=coordinator_epoch,
            topics=tuple(build(mod.WritableTxnMarkerTopic, name=t, partition_indexes=(p,))
                         for t, p in parts)) for pid, epoch, commit, coordinator_epoch, parts
            in markers))

    answer = conn.call(apis.WRITE_TXN_MARKERS, make)
    return [[E(p.error_code) for t in m.topics for p in t.partitions] for m in answer.markers]


def list_txns(conn: BrokerConnection) -> dict[str, str]:
    """Every transactional id the coordinator knows, with its state (ListTransactions)."""
    def make(mod, version):
        fields = {"state_filters": (), "producer_id_filters": ()}
        if version >= 1:
            fields["duration_filter"] = -1
        if version >= 2:
            fields["transactional_id_pattern"] = None
        return build(mod.ListTransactionsRequest, **fields)

    answer = conn.call(apis.LIST_TRANSACTIONS, make)
    assert E(answer.error_code) is E.none
    return {t.transactional_id: t.transaction_state for t in answer.transaction_states}


def latest_offsets(conn: BrokerConnection, topic: str, partitions: int,
                   isolation: int) -> dict[int, int]:
    """ListOffsets latest: the high watermark (0) or the last stable offset (1)."""
    def make(mod, version):
        return build(mod.ListOffsetsRequest, replica_id=-1, isolation_level=isolation,
                     topics=(build(mod.ListOffsetsTopic, name=topic, partitions=tuple(
                         build(mod.ListOffsetsPartition, partition_index=p, timestamp=-1,
                               current_leader_epoch=-1, max_num_offsets=1)
                         for p in range(partitions))),))

    answer = conn.call(apis.LIST_OFFSETS, make)
    return {p.partition_index: p.offset for p in answer.topics[0].partitions}


def high_watermarks(conn: BrokerConnection, topic: str, partitions: int) -> dict | None:
    """``latest_offsets``' high watermarks, None when a partition was answered an error."""
    def make(mod, version):
        return build(mod.ListOffsetsRequest, replica_id=-1, isolation_level=0,
                     topics=(build(mod.ListOffsetsTopic, name=topic, partitions=tuple(
                         build(mod.ListOffsetsPartition, partition_index=p, timestamp=-1,
                               current_leader_epoch=-1, max_num_offsets=1)
                         for p in range(partitions))),))

    answer = conn.call(apis.LIST_OFFSETS, make)
    found = answer.topics[0].partitions
    if any(p.error_code != E.none for p in found):
        return None
    return {p.partition_index: p.offset for p in found}


def wait_settled(conn: BrokerConnection, topic: str, partitions: int) -> dict[int, int]:
    """The high watermarks once the last stable offset has caught up with them (the
    coordinator writes markers after it answers EndTxn)."""
    deadline = time.monotonic() + WAIT
    while True:
        end = latest_offsets(conn, topic, partitions, 0)
        if latest_offsets(conn, topic, partitions, 1) == end:
            return end
        assert time.monotonic() < deadline, "the last stable offset never caught up"
        time.sleep(0.05)
