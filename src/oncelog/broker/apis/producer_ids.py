"""InitProducerId (idempotent producers) and DescribeProducers (KIP-664)."""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from ...coordinator.producer_id_manager import ProducerIdsExhausted
from ...metadata.store import MetadataUnavailable
from ...protocol import api_versions as apis
from ...protocol.api_versions import DESCRIBE_PRODUCERS, INIT_PRODUCER_ID
from ...protocol.messages import Request
from ...protocol.schema import build, response_module
from .. import authorize
from ..authorize import Op, Rt
from ..log_limits import log_safe
from .api_meta import NO_THROTTLE
from .transactions import init_transactional_producer

log = logging.getLogger(__name__)



def handle_init_producer_id(broker, request: Request):
    mod = response_module(INIT_PRODUCER_ID, request.api_version)
    body = request.body

    def answer(error: ErrorCode, producer_id: int = -1, epoch: int = -1,
               ongoing_producer_id: int = -1, ongoing_epoch: int = -1):
        return build(mod.InitProducerIdResponse, throttle_time=NO_THROTTLE, error_code=error,
                     producer_id=producer_id, producer_epoch=epoch,
                     ongoing_txn_producer_id=ongoing_producer_id,
                     ongoing_txn_producer_epoch=ongoing_epoch)

    if body.transactional_id is not None:
        if not _transactional_id_allowed(broker, request):
            return answer(ErrorCode.transactional_id_authorization_failed)
        return init_transactional_producer(broker, request, answer)
    if not (authorize.cluster(broker, request, Op.IDEMPOTENT_WRITE, quiet=True)
            or authorize.any_of_type(broker, request, Op.WRITE, Rt.TOPIC)):
        # KIP-679: Write on some topic is enough, as IdempotentWrite on the cluster is
        log.info("InitProducerId from %s refused: neither IdempotentWrite on the cluster nor "
                 "Write on any topic", log_safe(request.client_id))
        return answer(ErrorCode.cluster_authorization_failed)
    # Without a transactional id Kafka always hands out a fresh id, even to a producer that
    # names its current one to have its epoch bumped (KIP-360): the old id's sequences are
    # then simply never continued, and partitions accept the new id from any sequence.
    try:
        producer_id = broker.producer_ids.generate()
    except ProducerIdsExhausted as exc:
        log.error("InitProducerId refused: %s", exc)
        return answer(ErrorCode.unknown_server_error)
    except MetadataUnavailable as exc:  # cluster mode, ZooKeeper away: the client retries
        log.warning("InitProducerId deferred: %s", exc)
        return answer(ErrorCode.coordinator_load_in_progress)
    log.debug("%s: issued producer id %d", log_safe(request.client_id), producer_id)
    return answer(ErrorCode.none, producer_id, 0)


def _transactional_id_allowed(broker, request: Request) -> bool:
    """Write on the transactional id; and TwoPhaseCommit on it too for a KIP-939 two-phase
    commit producer (``enable2_pc``)."""
    txn_id = request.body.transactional_id
    return authorize.allowed(broker, request, Op.WRITE, Rt.TRANSACTIONAL_ID, txn_id) and (
        not getattr(request.body, "enable2_pc", False)
        or authorize.allowed(broker, request, Op.TWO_PHASE_COMMIT, Rt.TRANSACTIONAL_ID, txn_id))


def handle_describe_producers(broker, request: Request):
    mod = response_module(DESCRIBE_PRODUCERS, request.api_version)
    topics = []
    names = {t.name for t in request.body.topics}
    denied = names - authorize.allowed_names(broker, request, Op.READ, Rt.TOPIC, names)
    for topic_req in request.body.topics:
        partitions = []
        for index in topic_req.partition_indexes:
            if topic_req.name in denied:
                partitions.append(build(mod.PartitionResponse, partition_index=index,
                                        error_code=ErrorCode.topic_authorization_failed,
                                        error_message=None, active_producers=()))
                continue
            partition = broker.topics.partition(topic_req.name, index)
            if partition is None or (partition.replication is not None
                                     and not partition.replication.is_leader):
                # cluster mode: only the leader knows the producers as they are now
                error = ErrorCode.unknown_topic_or_partition if partition is None \
                    else ErrorCode.not_leader_or_follower
                partitions.append(build(mod.PartitionResponse, partition_index=index,
                                        error_code=error, error_message=None,
                                        active_producers=()))
                continue
            try:
                entries = list(partition.state.entries())
            except OSError as exc:
                log.error("describe producers of %s-%d failed: %s", topic_req.name, index, exc)
                partitions.append(build(mod.PartitionResponse, partition_index=index,
                                        error_code=ErrorCode.kafka_storage_error,
                                        error_message=str(exc), active_producers=()))
                continue
            producers = tuple(
                build(mod.ProducerState, producer_id=e.producer_id, producer_epoch=e.epoch,
                      last_sequence=e.last_seq, last_timestamp=e.last_timestamp,
                      coordinator_epoch=e.coordinator_epoch,
                      current_txn_start_offset=e.txn_first_offset)
                for e in entries
            )
            partitions.append(build(mod.PartitionResponse, partition_index=index,
                                    error_code=ErrorCode.none, error_message=None,
                                    active_producers=producers))
        topics.append(build(mod.TopicResponse, name=topic_req.name, partitions=tuple(partitions)))
    return build(mod.DescribeProducersResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.INIT_PRODUCER_ID: handle_init_producer_id,
    apis.DESCRIBE_PRODUCERS: handle_describe_producers,
}
