"""WriteTxnMarkers (api key 27): the transaction coordinator's COMMIT / ABORT markers, written
to each partition of a transaction.

``write_markers`` is the operation (``append_markers`` its part before the fsyncs); the
transaction coordinator of this broker awaits it in process, and the WriteTxnMarkers handler
(what a coordinator on another broker will send) calls the same function, so both go through
one path: Partition.append_marker, all or
nothing like any append, judged by producer_state's marker rules (M1-M4).

In cluster mode a marker is written only by its partition's leader and counts once the ISR
has it, as Kafka appends markers with acks=all: NOT_ENOUGH_REPLICAS before the append when
the ISR is smaller than min.insync.replicas, and the answer waits for the high watermark to
pass the marker (NOT_ENOUGH_REPLICAS_AFTER_APPEND, REQUEST_TIMED_OUT after
``MARKER_TIMEOUT_S``, NOT_LEADER_OR_FOLLOWER when the leadership moves meanwhile): the
coordinator completes a transaction only once no failover can lose one of its markers.

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

from ...cluster import isr as isr_rules
from ...producer_state.rules import MarkerIdentity
from ...protocol import api_versions as apis
from ...protocol.api_versions import WRITE_TXN_MARKERS
from ...protocol.messages import Request
from ...protocol.record_batch import InvalidBatch
from ...protocol.schema import build, response_module
from .. import authorize
from ..authorize import Op
from ..partition_opening import open_all
from ..replication import ReplicationError
from ..topics import OFFSETS_TOPIC

log = logging.getLogger(__name__)

MARKER_TIMEOUT_S = 30.0  # Kafka's request.timeout.ms, which bounds its markers' acks=all

TopicPartition = tuple[str, int]


@dataclass
class MarkersWritten:
    """What ``write_markers`` did: an error per partition (NONE: written), and for the
    partitions whose flush policy wants the marker on disk before it counts, the fsync, and
    in cluster mode the wait for the ISR."""

    errors: dict[TopicPartition, ErrorCode]
    pending: dict[TopicPartition, list[asyncio.Future[None]]] = field(default_factory=dict)

    async def durable(self) -> dict[TopicPartition, ErrorCode]:
        """The errors once every marker written is as durable as the flush policy wants
        and replicated as acks=all wants; a failed fsync turns its partition's answer into
        KAFKA_STORAGE_ERROR, a failed replication into its acks=all error."""
        for tp, futures in self.pending.items():
            for future in futures:
                try:
                    await future
                except OSError as exc:
                    log.error("transaction marker in %s-%d not durable: %s", tp[0], tp[1],
                              exc)
                    self.errors[tp] = ErrorCode.kafka_storage_error
                except ReplicationError as exc:
                    log.info("transaction marker in %s-%d not replicated: %s (%s)", tp[0],
                             tp[1], exc, exc.error_code.name)
                    self.errors[tp] = exc.error_code
        self.pending.clear()
        return self.errors


async def write_markers(broker, producer_id: int, producer_epoch: int, commit: bool,
                        coordinator_epoch: int, partitions: Iterable[TopicPartition],
                        transaction_version: int = 0) -> dict[TopicPartition, ErrorCode]:
    """Append a COMMIT (``commit``) or ABORT marker of ``producer_id`` to each partition
    (logs not open yet are opened in worker threads first; then all of the markers before
    the next await), then wait until they are as durable as the flush policy wants; returns
    each partition's error (NONE: written)."""
    partitions = list(partitions)
    await open_all(_to_write(broker, partitions), writing=True)
    written = append_markers(broker, producer_id, producer_epoch, commit, coordinator_epoch,
                             partitions, transaction_version)
    return await written.durable()


def _refused(partition) -> ErrorCode:
    """Why a marker is not written to ``partition`` (NONE: it is)."""
    if partition is None:
        return ErrorCode.unknown_topic_or_partition
    if partition.replication is not None and not partition.replication.is_leader:
        return ErrorCode.not_leader_or_follower  # cluster mode: only its leader writes
    if partition.replication is not None and isr_rules.acks_all_before(
            len(partition.replication.isr), partition.replication.min_insync):
        return ErrorCode.not_enough_replicas
    return ErrorCode.none


def _to_write(broker, partitions: Iterable[TopicPartition]):
    """The partitions a marker will be written to (only their logs are opened first: a
    refused marker creates nothing)."""
    for topic, index in partitions:
        partition = broker.topics.partition(topic, index)
        if _refused(partition) is ErrorCode.none:
            yield partition


def append_markers(broker, producer_id: int, producer_epoch: int, commit: bool,
                   coordinator_epoch: int, partitions: Iterable[TopicPartition],
                   transaction_version: int = 0) -> MarkersWritten:
    """The appends of ``write_markers``, at once."""
    marker = MarkerIdentity(producer_id, producer_epoch, coordinator_epoch, commit,
                            transaction_version)
    written = MarkersWritten({})
    for topic, index in partitions:
        partition = broker.topics.partition(topic, index)
        error = _refused(partition)
        if error is ErrorCode.none:
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
                waits = [partition.durable(result)]
                if partition.replication is not None:
                    waits.append(partition.replication.wait_for(result.last_offset + 1,
                                                                MARKER_TIMEOUT_S))
                waits = [w for w in waits if w is not None]
                if waits:
                    written.pending[(topic, index)] = waits
        written.errors[(topic, index)] = error
    return written


async def handle_write_txn_markers(broker, request: Request):
    mod = response_module(WRITE_TXN_MARKERS, request.api_version)
    results = []
    # a broker's request: Cluster Alter or ClusterAction, else every partition refused
    permitted = authorize.cluster(broker, request, Op.ALTER, quiet=True) or \
        authorize.cluster(broker, request, Op.CLUSTER_ACTION)
    # Every marker appended before any is waited for (as Kafka): waited for one after the
    # other, a request of K markers could take K times the acks=all wait of each.
    written = []
    if permitted:  # logs not open yet are opened in worker threads before any append
        await open_all(_to_write(broker, ((t.name, p) for marker in request.body.markers
                                          for t in marker.topics for p in t.partition_indexes)),
                       writing=True)
    for marker in request.body.markers:
        wanted = [(t.name, p) for t in marker.topics for p in t.partition_indexes]
        written.append(append_markers(
            broker, marker.producer_id, marker.producer_epoch, marker.transaction_result,
            marker.coordinator_epoch, wanted, getattr(marker, "transaction_version", 0))
            if permitted else dict.fromkeys(wanted, ErrorCode.cluster_authorization_failed))
    for marker, appended in zip(request.body.markers, written, strict=True):
        errors = appended if isinstance(appended, dict) else await appended.durable()
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
