"""WriteTxnMarkers (api key 27): the transaction coordinator's COMMIT / ABORT markers, written
to each partition of a transaction.

``write_markers`` is the operation (``append_markers`` its part before the fsyncs); the
transaction coordinator of this broker awaits it in process, and the WriteTxnMarkers handler
(what a coordinator on another broker will send) calls the same function, so both go through
one path: Partition.append_marker, all or
nothing like any append, judged by producer_state's marker rules (M1-M4).

Per-partition errors as Kafka gives them: UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER
(cluster mode, a partition this broker does not lead), INVALID_PRODUCER_EPOCH
(a marker of an older epoch), TRANSACTION_COORDINATOR_FENCED (of an older coordinator
epoch), KAFKA_STORAGE_ERROR (the disk failed, or the marker could not be made durable). A
marker for a producer with no transaction ongoing in a partition (a retry) is written and
changes nothing else. Markers go to internal topics too (``__consumer_offsets`` holds the
offsets of TxnOffsetCommit).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from ...producer_state.rules import MarkerIdentity
from ...protocol import api_versions as apis
from ...protocol.api_versions import WRITE_TXN_MARKERS
from ...protocol.messages import Request
from ...protocol.record_batch import InvalidBatch
from ...protocol.schema import build, response_module
from .. import authorize
from ..authorize import Op
from ..topics import OFFSETS_TOPIC

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


@dataclass
class MarkersWritten:
    """What ``write_markers`` did: an error per partition (NONE: written), and for the
    partitions whose flush policy wants the marker on disk before it counts, the fsync."""

    errors: dict[TopicPartition, ErrorCode]
    pending: dict[TopicPartition, asyncio.Future[None]] = field(default_factory=dict)

    async def durable(self) -> dict[TopicPartition, ErrorCode]:
        """The errors once every marker written is as durable as the flush policy wants;
        a failed fsync turns its partition's answer into KAFKA_STORAGE_ERROR."""
        for tp, future in self.pending.items():
            try:
                await future
            except OSError as exc:
                log.error("transaction marker in %s-%d not durable: %s", tp[0], tp[1], exc)
                self.errors[tp] = ErrorCode.kafka_storage_error
        self.pending.clear()
        return self.errors


async def write_markers(broker, producer_id: int, producer_epoch: int, commit: bool,
                        coordinator_epoch: int, partitions: Iterable[TopicPartition],
                        transaction_version: int = 0) -> dict[TopicPartition, ErrorCode]:
    """Append a COMMIT (``commit``) or ABORT marker of ``producer_id`` to each partition
    (all of them before the first await), then wait until they are as durable as the flush
    policy wants; returns each partition's error (NONE: written)."""
    written = append_markers(broker, producer_id, producer_epoch, commit, coordinator_epoch,
                             partitions, transaction_version)
    return await written.durable()


def append_markers(broker, producer_id: int, producer_epoch: int, commit: bool,
                   coordinator_epoch: int, partitions: Iterable[TopicPartition],
                   transaction_version: int = 0) -> MarkersWritten:
    """The appends of ``write_markers``, at once."""
    marker = MarkerIdentity(producer_id, producer_epoch, coordinator_epoch, commit,
                            transaction_version)
    written = MarkersWritten({})
    for topic, index in partitions:
        error = ErrorCode.none
        partition = broker.topics.partition(topic, index)
        if partition is None:
            error = ErrorCode.unknown_topic_or_partition
        elif partition.replication is not None and not partition.replication.is_leader:
            error = ErrorCode.not_leader_or_follower  # cluster mode: only its leader writes
        else:
            try:
                result = partition.append_marker(marker)
            except InvalidBatch as exc:
                error = exc.error
                log.warning("%s marker of producer %d epoch %d refused in %s-%d: %s (%s)",
                            "COMMIT" if commit else "ABORT", producer_id, producer_epoch,
                            topic, index, exc, error.name)
            except OSError as exc:
                error = ErrorCode.kafka_storage_error
                log.error("writing a transaction marker to %s-%d failed: %s", topic, index,
                          exc)
            else:
                if topic == OFFSETS_TOPIC:
                    # The group coordinator replays the marker as the log now holds it,
                    # whoever sent it (its transaction's offsets are decided).
                    broker.groups.complete_txn(index, producer_id, commit)
                durable = partition.durable(result)
                if durable is not None:
                    written.pending[(topic, index)] = durable
        written.errors[(topic, index)] = error
    return written


async def handle_write_txn_markers(broker, request: Request):
    mod = response_module(WRITE_TXN_MARKERS, request.api_version)
    results = []
    # a broker's request: Cluster Alter or ClusterAction, else every partition refused
    permitted = authorize.cluster(broker, request, Op.ALTER, quiet=True) or \
        authorize.cluster(broker, request, Op.CLUSTER_ACTION)
    for marker in request.body.markers:
        wanted = [(t.name, p) for t in marker.topics for p in t.partition_indexes]
        errors = await write_markers(broker, marker.producer_id, marker.producer_epoch,
                                     marker.transaction_result, marker.coordinator_epoch,
                                     wanted, getattr(marker, "transaction_version", 0)) \
            if permitted else dict.fromkeys(wanted, ErrorCode.cluster_authorization_failed)
        topics = []
        for topic in marker.topics:
            topics.append(build(mod.WritableTxnMarkerTopicResult, name=topic.name, partitions=tuple(
                build(mod.WritableTxnMarkerPartitionResult, partition_index=p,
                      error_code=errors[(topic.name, p)])
                for p in topic.partition_indexes)))
        results.append(build(mod.WritableTxnMarkerResult, producer_id=marker.producer_id,
                             topics=tuple(topics)))
    return build(mod.WriteTxnMarkersResponse, markers=tuple(results))


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.WRITE_TXN_MARKERS: handle_write_txn_markers,
}
