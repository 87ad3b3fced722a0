"""ElectLeaders, AlterPartitionReassignments and ListPartitionReassignments in cluster mode
(partition_admin.py answers them on one broker): the elections are the controller's
(cluster/leader_election.py, rows P1-P3 and U1-U4), so a broker that is not the controller
answers NOT_CONTROLLER and the client asks the controller Metadata names; a reassignment is
written into the topic's assignment znode (cluster/topic_admin.py) and completed by the
controller once the target replicas are in the ISR (row A1)."""

from __future__ import annotations

import asyncio
import logging

from kio.schema.errors import ErrorCode

from ...protocol.api_versions import (
    ALTER_PARTITION_REASSIGNMENTS,
    ELECT_LEADERS,
    LIST_PARTITION_REASSIGNMENTS,
)
from ...protocol.messages import Request
from ...protocol.schema import build, response_module
from ..log_limits import log_safe
from .api_meta import NO_THROTTLE

log = logging.getLogger(__name__)

UNCLEAN_ELECTION = 1


async def elect_leaders(broker, request: Request):
    mod = response_module(ELECT_LEADERS, request.api_version)
    body = request.body
    election = getattr(body, "election_type", 0)
    if election not in (0, UNCLEAN_ELECTION):
        return build(mod.ElectLeadersResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.invalid_request, replica_election_results=())
    wanted = None if body.topic_partitions is None else [
        (t.topic, p) for t in body.topic_partitions for p in t.partitions]
    try:
        answers = await broker.cluster_mode.elect(wanted, election == UNCLEAN_ELECTION,
                                                  body.timeout)
    except Exception as exc:  # ZooKeeper failed a read or write: nothing was elected
        # Kafka answers a failed election with the error of its failure, unknown to clients
        log.warning("elect leaders failed: %r", exc)
        message = f"the election failed: {exc!r}"
        if wanted is None:
            return _elect_answer(mod, {}, ErrorCode.unknown_server_error)
        return _elect_answer(mod, dict.fromkeys(wanted, (ErrorCode.unknown_server_error,
                                                         message)), ErrorCode.none)
    if answers is None:
        controller = broker.cluster_mode.member.controller.controller_id
        message = f"broker {broker.broker_id} is not the controller (broker {controller} is)"
        answers = dict.fromkeys(wanted or (), (ErrorCode.not_controller, message))
        return _elect_answer(mod, answers, ErrorCode.not_controller)
    if wanted is None:  # Kafka answers only the partitions it elected or failed to
        answers = {k: v for k, v in answers.items() if v[0] != ErrorCode.election_not_needed}
    for (topic, p), (error, message) in answers.items():
        if error != ErrorCode.none:
            log.info("elect leaders of %s-%d: %s: %s", log_safe(topic), p, error.name, message)
    return _elect_answer(mod, answers, ErrorCode.none)


def _elect_answer(mod, answers, error: ErrorCode):
    by_topic: dict[str, list] = {}
    for (topic, p), (code, message) in answers.items():
        by_topic.setdefault(topic, []).append(build(
            mod.PartitionResult, partition_id=p, error_code=code, error_message=message))
    return build(mod.ElectLeadersResponse, throttle_time=NO_THROTTLE, error_code=error,
                 replica_election_results=tuple(
                     build(mod.ReplicaElectionResult, topic=topic, partition_result=tuple(ps))
                     for topic, ps in by_topic.items()))


async def alter_partition_reassignments(broker, request: Request):
    mod = response_module(ALTER_PARTITION_REASSIGNMENTS, request.api_version)
    body = request.body
    mode = broker.cluster_mode
    topics = []
    for t in body.topics:
        changes = {p.partition_index: None if p.replicas is None else tuple(p.replicas)
                   for p in t.partitions}
        answers = await asyncio.to_thread(mode.reassign, t.name, changes)
        partitions = []
        for index, (error, message) in answers.items():
            if error != ErrorCode.none:
                log.info("reassignment of %s-%d refused: %s", log_safe(t.name), index,
                         log_safe(message))
            partitions.append(build(mod.ReassignablePartitionResponse, partition_index=index,
                                    error_code=error, error_message=message))
        topics.append(build(mod.ReassignableTopicResponse, name=t.name,
                            partitions=tuple(partitions)))
    return build(mod.AlterPartitionReassignmentsResponse, throttle_time=NO_THROTTLE,
                 allow_replication_factor_change=getattr(
                     body, "allow_replication_factor_change", True),
                 error_code=ErrorCode.none, error_message=None, responses=tuple(topics))


def list_partition_reassignments(broker, request: Request):
    mod = response_module(LIST_PARTITION_REASSIGNMENTS, request.api_version)
    asked = request.body.topics
    wanted = None if asked is None else [(t.name, p) for t in asked
                                         for p in t.partition_indexes]
    found = broker.cluster_mode.ongoing_reassignments(wanted)
    return build(mod.ListPartitionReassignmentsResponse, throttle_time=NO_THROTTLE,
                 error_code=ErrorCode.none, error_message=None, topics=tuple(
                     build(mod.OngoingTopicReassignment, name=name, partitions=tuple(
                         build(mod.OngoingPartitionReassignment, partition_index=p.index,
                               replicas=p.replicas, adding_replicas=p.adding,
                               removing_replicas=p.removing) for p in partitions))
                     for name, partitions in sorted(found.items())))
