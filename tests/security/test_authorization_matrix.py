"""The authorization matrix: every API the broker answers that Kafka authorizes, for the
resource and operation Kafka checks, in four states of the ACLs, over the wire.

One broker with Kafka's authorizer class configured and no super user. Its admin (User:ANONYMOUS
from 127.0.0.2) may do everything (seeded in the store before start); the subject
(User:ANONYMOUS from 127.0.0.1) gets, per row and state:

- ``allowed``: Allow of the row's operation on its resource;
- ``denied``: that Allow and a Deny of it (Deny wins);
- ``no_acl``: nothing;
- ``other_type``: Allow of the operation on the same name of another resource type.

Only ``allowed`` may pass: the row's Kafka error is then absent from the answer, in the
three others present. A row's ``background`` ACLs (the other permissions its request needs)
are granted in every state. ``ROWS`` is the table; the test is one loop over it.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import struct
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from support.acl_wire import (
    ADMIN_HOST,
    ANONYMOUS,
    AUTHORIZER,
    SUBJECT_HOST,
    Wire,
    error_codes,
    seed_admin,
)
from support.brokers import BrokerProcess

from oncelog.protocol import api_versions as apis
from oncelog.protocol.records import encode_batch
from oncelog.protocol.schema import build
from oncelog.security.acls import (
    CLUSTER_NAME,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)

Op, Rt, Pt, Perm = AclOperation, ResourceType, PatternType, AclPermissionType
E = ErrorCode
TOPIC, GROUP, TXN = "m-topic", "m-group", "m-txn"
LISTED_GROUP, LISTED_TXN = "m-listed", "m-txn-listed"
STATES = ("allowed", "denied", "no_acl", "other_type")
MS = datetime.timedelta(milliseconds=1)


def grant(rtype, name, op, perm=Perm.ALLOW, pattern=Pt.LITERAL) -> AclBinding:
    return AclBinding(ResourcePattern(rtype, name, pattern),
                      AccessControlEntry(ANONYMOUS, SUBJECT_HOST, op, perm))


@dataclass
class Row:
    name: str
    api_key: int
    rtype: ResourceType
    resource: str  # "{state}" is replaced: rows whose allowed state changes something
    op: AclOperation
    error: ErrorCode
    make: Any  # (request module, version, resource name) -> request body
    version: int | None = None
    background: list[AclBinding] = field(default_factory=list)
    codes: Any = error_codes  # response -> the error codes to look at
    raw: bool = False  # codes() reads the frame: an answer kio cannot decode


def batch(transactional: bool = False) -> bytes:
    return encode_batch([(None, b"v", (), 0)], producer_id=7 if transactional else -1,
                        producer_epoch=0 if transactional else -1,
                        base_sequence=0 if transactional else -1, transactional=transactional)


def produce(transactional: bool):
    def make(m, v, name):
        return build(m.ProduceRequest, transactional_id=TXN if transactional else None,
                     acks=1, timeout=1000 * MS, topic_data=(build(
                         m.TopicProduceData, name=TOPIC, partition_data=(build(
                             m.PartitionProduceData, index=0,
                             records=batch(transactional)),)),))
    return make


def fetch(replica_id: int):
    def make(m, v, name):
        return build(m.FetchRequest, cluster_id=None, replica_id=replica_id, max_wait=0 * MS,
                     min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=0,
                     session_epoch=-1, forgotten_topics_data=(), rack_id="", topics=(build(
                         m.FetchTopic, topic=name, partitions=(build(
                             m.FetchPartition, partition=0, current_leader_epoch=-1,
                             fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
                             partition_max_bytes=1 << 16),)),))
    return make


def metadata(name_of, auto: bool):
    def make(m, v, name):
        return build(m.MetadataRequest, topics=None if name_of is None else (
            build(m.MetadataRequestTopic, topic_id=None, name=name),),
            allow_auto_topic_creation=auto, include_topic_authorized_operations=False,
            include_cluster_authorized_operations=False)
    return make


def listed_topic(response) -> list[ErrorCode]:
    return [E.none if any(t.name == TOPIC for t in response.topics)
            else E.topic_authorization_failed]


def create_topics(m, v, name):
    return build(m.CreateTopicsRequest, timeout=5000 * MS, validate_only=False, topics=(build(
        m.CreatableTopic, name=name, num_partitions=1, replication_factor=1, assignments=(),
        configs=()),))


def config_resource(kind: int, configs: str):
    def make(m, v, name):
        if configs == "describe":
            return build(m.DescribeConfigsRequest, include_synonyms=False,
                         include_documentation=False, resources=(build(
                             m.DescribeConfigsResource, resource_type=kind,
                             resource_name=name if kind != 4 else "0",
                             configuration_keys=None),))
        entry = build(m.AlterableConfig, name="retention.ms" if kind == 2
                      else "log.cleaner.backoff.ms", config_operation=0, value="1000000")
        request = m.IncrementalAlterConfigsRequest if configs == "incremental" \
            else m.AlterConfigsRequest
        return build(request, validate_only=True, resources=(build(
            m.AlterConfigsResource, resource_type=kind,
            resource_name=name if kind != 4 else "0", configs=(entry,)),))
    return make


def find(key_type: int):
    def make(m, v, name):
        return build(m.FindCoordinatorRequest, key_type=key_type, coordinator_keys=(name,))
    return make


def join(m, v, name):
    return build(m.JoinGroupRequest, group_id=name, session_timeout=10_000 * MS,
                 rebalance_timeout=10_000 * MS, member_id="", group_instance_id=None,
                 protocol_type="consumer", protocols=(build(
                     m.JoinGroupRequestProtocol, name="range", metadata=b""),), reason=None)


def offset_commit(m, v, name):
    return build(m.OffsetCommitRequest, group_id=GROUP, generation_id_or_member_epoch=-1,
                 member_id="", group_instance_id=None, topics=(build(
                     m.OffsetCommitRequestTopic, name=TOPIC, partitions=(build(
                         m.OffsetCommitRequestPartition, partition_index=0, committed_offset=0,
                         committed_leader_epoch=-1, committed_metadata=""),)),))


def offset_fetch(m, v, name):
    return build(m.OffsetFetchRequest, require_stable=False, groups=(build(
        m.OffsetFetchRequestGroup, group_id=GROUP, member_id=None, member_epoch=-1,
        topics=(build(m.OffsetFetchRequestTopics, name=TOPIC, partition_indexes=(0,)),)),))


def txn_offset_commit(m, v, name):
    return build(m.TxnOffsetCommitRequest, transactional_id=TXN, group_id=GROUP,
                 producer_id=7, producer_epoch=0, generation_id=-1, member_id="",
                 group_instance_id=None, topics=(build(
                     m.TxnOffsetCommitRequestTopic, name=TOPIC, partitions=(build(
                         m.TxnOffsetCommitRequestPartition, partition_index=0,
                         committed_offset=0, committed_leader_epoch=-1,
                         committed_metadata=""),)),))


def add_partitions(m, v, name):
    return build(m.AddPartitionsToTxnRequest, v3_and_below_transactional_id=TXN,
                 v3_and_below_producer_id=7, v3_and_below_producer_epoch=0,
                 v3_and_below_topics=(build(m.AddPartitionsToTxnTopic, name=TOPIC,
                                            partitions=(0,)),))


def init_producer_id(txn: str | None, two_phase: bool = False):
    def make(m, v, name):
        return build(m.InitProducerIdRequest, transactional_id=txn,
                     transaction_timeout=60_000 * MS, producer_id=-1, producer_epoch=-1,
                     enable2_pc=two_phase, keep_prepared_txn=False)
    return make


def acl_filter(m, cls: str):
    return build(getattr(m, cls), resource_type_filter=int(Rt.TOPIC),
                 resource_name_filter="m-unrelated", pattern_type_filter=int(Pt.ANY),
                 principal_filter=None, host_filter=None, operation=int(Op.ANY),
                 permission_type=int(Perm.ANY))


def first_state_error(frame: bytes) -> list[ErrorCode]:
    """DescribeTransactions v0's first state's error code, read from the frame: kio cannot
    decode the -1 start time Kafka writes for a transaction not started. After the flexible
    header's tags (1), the throttle time (4) and the states' count (1)."""
    return [ErrorCode(struct.unpack_from(">h", frame, 6)[0])]


def describe_cluster_ops(response) -> list[ErrorCode]:
    return [E.cluster_authorization_failed if response.cluster_authorized_operations == 0
            else E.none]


def listed_group(response) -> list[ErrorCode]:
    return [E.none if any(g.group_id == LISTED_GROUP for g in response.groups)
            else E.group_authorization_failed]


def listed_txn(response) -> list[ErrorCode]:
    return [E.none if any(t.transactional_id == LISTED_TXN for t in response.transaction_states)
            else E.transactional_id_authorization_failed]


TOPIC_READ = grant(Rt.TOPIC, TOPIC, Op.READ)
TOPIC_WRITE = grant(Rt.TOPIC, TOPIC, Op.WRITE)
GROUP_READ = grant(Rt.GROUP, GROUP, Op.READ)
TXN_WRITE = grant(Rt.TRANSACTIONAL_ID, TXN, Op.WRITE)
TFA, GFA = E.topic_authorization_failed, E.group_authorization_failed
CFA, XFA = E.cluster_authorization_failed, E.transactional_id_authorization_failed

ROWS = [
    Row("Produce", apis.PRODUCE, Rt.TOPIC, TOPIC, Op.WRITE, TFA, produce(False), 12),
    Row("Produce transactional", apis.PRODUCE, Rt.TRANSACTIONAL_ID, TXN, Op.WRITE, XFA,
        produce(True), 12, [TOPIC_WRITE]),
    Row("Fetch", apis.FETCH, Rt.TOPIC, TOPIC, Op.READ, TFA, fetch(-1), 12),
    Row("Fetch as a follower", apis.FETCH, Rt.CLUSTER, CLUSTER_NAME, Op.CLUSTER_ACTION, TFA,
        lambda m, v, n: fetch(1)(m, v, TOPIC), 12),
    Row("ListOffsets", apis.LIST_OFFSETS, Rt.TOPIC, TOPIC, Op.DESCRIBE, TFA,
        lambda m, v, n: build(m.ListOffsetsRequest, replica_id=-1, isolation_level=0,
                              timeout=1000 * MS, topics=(build(
                                  m.ListOffsetsTopic, name=n, partitions=(build(
                                      m.ListOffsetsPartition, partition_index=0,
                                      current_leader_epoch=-1, timestamp=-1),)),))),
    Row("OffsetForLeaderEpoch", apis.OFFSET_FOR_LEADER_EPOCH, Rt.TOPIC, TOPIC, Op.DESCRIBE,
        TFA, lambda m, v, n: build(m.OffsetForLeaderEpochRequest, replica_id=-1, topics=(build(
            m.OffsetForLeaderTopic, topic=n, partitions=(build(
                m.OffsetForLeaderPartition, partition=0, current_leader_epoch=-1,
                leader_epoch=0),)),))),
    Row("Metadata of a topic", apis.METADATA, Rt.TOPIC, TOPIC, Op.DESCRIBE, TFA,
        metadata(True, False), 12),
    Row("Metadata of all topics", apis.METADATA, Rt.TOPIC, TOPIC, Op.DESCRIBE, TFA,
        metadata(None, False), 12, codes=listed_topic),
    Row("Metadata auto-creates (cluster)", apis.METADATA, Rt.CLUSTER, CLUSTER_NAME, Op.CREATE,
        TFA, lambda m, v, n: metadata(True, True)(m, v, "m-auto-{state}"), 12,
        [grant(Rt.TOPIC, "m-auto", Op.DESCRIBE, pattern=Pt.PREFIXED)]),
    Row("Metadata auto-creates (topic)", apis.METADATA, Rt.TOPIC, "m-autot-{state}",
        Op.CREATE, TFA, metadata(True, True), 12,
        [grant(Rt.TOPIC, "m-autot", Op.DESCRIBE, pattern=Pt.PREFIXED)]),
    Row("CreateTopics (topic)", apis.CREATE_TOPICS, Rt.TOPIC, "m-new-{state}", Op.CREATE, TFA,
        create_topics, None, [grant(Rt.TOPIC, "m-new", Op.DESCRIBE_CONFIGS,
                                    pattern=Pt.PREFIXED)]),
    Row("CreateTopics (cluster)", apis.CREATE_TOPICS, Rt.CLUSTER, CLUSTER_NAME, Op.CREATE, TFA,
        lambda m, v, n: create_topics(m, v, "m-newc-{state}"), None,
        [grant(Rt.TOPIC, "m-newc", Op.DESCRIBE_CONFIGS, pattern=Pt.PREFIXED)]),
    Row("DeleteTopics", apis.DELETE_TOPICS, Rt.TOPIC, "m-gone", Op.DELETE, TFA,
        lambda m, v, n: build(m.DeleteTopicsRequest, timeout=1000 * MS, topics=(
            build(m.DeleteTopicState, name=n, topic_id=None),))),
    Row("CreatePartitions", apis.CREATE_PARTITIONS, Rt.TOPIC, TOPIC, Op.ALTER, TFA,
        lambda m, v, n: build(m.CreatePartitionsRequest, timeout=1000 * MS, validate_only=True,
                              topics=(build(m.CreatePartitionsTopic, name=n, count=1,
                                            assignments=None),))),
    Row("DeleteRecords", apis.DELETE_RECORDS, Rt.TOPIC, TOPIC, Op.DELETE, TFA,
        lambda m, v, n: build(m.DeleteRecordsRequest, timeout=1000 * MS, topics=(build(
            m.DeleteRecordsTopic, name=n, partitions=(build(
                m.DeleteRecordsPartition, partition_index=0, offset=0),)),))),
    Row("DescribeConfigs (topic)", apis.DESCRIBE_CONFIGS, Rt.TOPIC, TOPIC, Op.DESCRIBE_CONFIGS,
        TFA, config_resource(2, "describe")),
    Row("DescribeConfigs (broker)", apis.DESCRIBE_CONFIGS, Rt.CLUSTER, CLUSTER_NAME,
        Op.DESCRIBE_CONFIGS, CFA, config_resource(4, "describe")),
    Row("AlterConfigs (topic)", apis.ALTER_CONFIGS, Rt.TOPIC, TOPIC, Op.ALTER_CONFIGS, TFA,
        config_resource(2, "alter")),
    Row("IncrementalAlterConfigs (topic)", apis.INCREMENTAL_ALTER_CONFIGS, Rt.TOPIC, TOPIC,
        Op.ALTER_CONFIGS, TFA, config_resource(2, "incremental")),
    Row("IncrementalAlterConfigs (broker)", apis.INCREMENTAL_ALTER_CONFIGS, Rt.CLUSTER,
        CLUSTER_NAME, Op.ALTER_CONFIGS, CFA, config_resource(4, "incremental")),
    Row("FindCoordinator (group)", apis.FIND_COORDINATOR, Rt.GROUP, GROUP, Op.DESCRIBE, GFA,
        find(0)),
    Row("FindCoordinator (transaction)", apis.FIND_COORDINATOR, Rt.TRANSACTIONAL_ID, TXN,
        Op.DESCRIBE, XFA, find(1)),
    Row("JoinGroup", apis.JOIN_GROUP, Rt.GROUP, "m-join-{state}", Op.READ, GFA, join),
    Row("SyncGroup", apis.SYNC_GROUP, Rt.GROUP, GROUP, Op.READ, GFA,
        lambda m, v, n: build(m.SyncGroupRequest, group_id=n, generation_id=1, member_id="x",
                              group_instance_id=None, protocol_type="consumer",
                              protocol_name="range", assignments=())),
    Row("Heartbeat", apis.HEARTBEAT, Rt.GROUP, GROUP, Op.READ, GFA,
        lambda m, v, n: build(m.HeartbeatRequest, group_id=n, generation_id=1, member_id="x",
                              group_instance_id=None)),
    Row("LeaveGroup", apis.LEAVE_GROUP, Rt.GROUP, GROUP, Op.READ, GFA,
        lambda m, v, n: build(m.LeaveGroupRequest, group_id=n, members=(build(
            m.MemberIdentity, member_id="x", group_instance_id=None, reason=None),))),
    Row("OffsetCommit (group)", apis.OFFSET_COMMIT, Rt.GROUP, GROUP, Op.READ, GFA,
        offset_commit, None, [TOPIC_READ]),
    Row("OffsetCommit (topic)", apis.OFFSET_COMMIT, Rt.TOPIC, TOPIC, Op.READ, TFA,
        offset_commit, None, [GROUP_READ]),
    Row("OffsetFetch (group)", apis.OFFSET_FETCH, Rt.GROUP, GROUP, Op.DESCRIBE, GFA,
        offset_fetch, None, [TOPIC_READ]),
    Row("OffsetFetch (topic)", apis.OFFSET_FETCH, Rt.TOPIC, TOPIC, Op.DESCRIBE, TFA,
        offset_fetch, None, [GROUP_READ]),
    Row("OffsetDelete", apis.OFFSET_DELETE, Rt.GROUP, GROUP, Op.DELETE, GFA,
        lambda m, v, n: build(m.OffsetDeleteRequest, group_id=n, topics=(build(
            m.OffsetDeleteRequestTopic, name=TOPIC, partitions=(build(
                m.OffsetDeleteRequestPartition, partition_index=0),)),)), None, [TOPIC_READ]),
    Row("DescribeGroups", apis.DESCRIBE_GROUPS, Rt.GROUP, GROUP, Op.DESCRIBE, GFA,
        lambda m, v, n: build(m.DescribeGroupsRequest, groups=(n,),
                              include_authorized_operations=True)),
    Row("ListGroups", apis.LIST_GROUPS, Rt.GROUP, LISTED_GROUP, Op.DESCRIBE, GFA,
        lambda m, v, n: build(m.ListGroupsRequest, states_filter=(), types_filter=()),
        codes=listed_group),
    Row("ListGroups (cluster)", apis.LIST_GROUPS, Rt.CLUSTER, CLUSTER_NAME, Op.DESCRIBE, GFA,
        lambda m, v, n: build(m.ListGroupsRequest, states_filter=(), types_filter=()),
        codes=listed_group),
    Row("DeleteGroups", apis.DELETE_GROUPS, Rt.GROUP, "m-never", Op.DELETE, GFA,
        lambda m, v, n: build(m.DeleteGroupsRequest, groups_names=(n,))),
    Row("ConsumerGroupHeartbeat", apis.CONSUMER_GROUP_HEARTBEAT, Rt.GROUP, "m-848-{state}",
        Op.READ, GFA, lambda m, v, n: build(
            m.ConsumerGroupHeartbeatRequest, group_id=n, member_id=str(uuid.uuid4()),
            member_epoch=0, instance_id=None, rack_id=None, rebalance_timeout=10_000 * MS,
            subscribed_topic_names=(TOPIC,), subscribed_topic_regex=None,
            server_assignor=None, topic_partitions=())),
    Row("ConsumerGroupDescribe", apis.CONSUMER_GROUP_DESCRIBE, Rt.GROUP, GROUP, Op.DESCRIBE,
        GFA, lambda m, v, n: build(m.ConsumerGroupDescribeRequest, group_ids=(n,),
                                   include_authorized_operations=True)),
    Row("InitProducerId (idempotent)", apis.INIT_PRODUCER_ID, Rt.CLUSTER, CLUSTER_NAME,
        Op.IDEMPOTENT_WRITE, CFA, init_producer_id(None)),
    Row("InitProducerId (KIP-679 Write on a topic)", apis.INIT_PRODUCER_ID, Rt.TOPIC, TOPIC,
        Op.WRITE, CFA, init_producer_id(None)),
    Row("InitProducerId (transactional)", apis.INIT_PRODUCER_ID, Rt.TRANSACTIONAL_ID, TXN,
        Op.WRITE, XFA, init_producer_id(TXN)),
    Row("InitProducerId (KIP-939 two-phase commit)", apis.INIT_PRODUCER_ID,
        Rt.TRANSACTIONAL_ID, "m-2pc", Op.TWO_PHASE_COMMIT, XFA, init_producer_id("m-2pc", True),
        None, [grant(Rt.TRANSACTIONAL_ID, "m-2pc", Op.WRITE)]),
    Row("AddPartitionsToTxn (transaction)", apis.ADD_PARTITIONS_TO_TXN, Rt.TRANSACTIONAL_ID,
        TXN, Op.WRITE, XFA, add_partitions, 3, [TOPIC_WRITE]),
    Row("AddPartitionsToTxn (topic)", apis.ADD_PARTITIONS_TO_TXN, Rt.TOPIC, TOPIC, Op.WRITE,
        TFA, add_partitions, 3, [TXN_WRITE]),
    Row("AddPartitionsToTxn (broker's v4+)", apis.ADD_PARTITIONS_TO_TXN, Rt.CLUSTER,
        CLUSTER_NAME, Op.CLUSTER_ACTION, CFA, lambda m, v, n: build(
            m.AddPartitionsToTxnRequest, transactions=(build(
                m.AddPartitionsToTxnTransaction, transactional_id=TXN, producer_id=7,
                producer_epoch=0, verify_only=True, topics=(build(
                    m.AddPartitionsToTxnTopic, name=TOPIC, partitions=(0,)),)),))),
    Row("AddOffsetsToTxn (transaction)", apis.ADD_OFFSETS_TO_TXN, Rt.TRANSACTIONAL_ID, TXN,
        Op.WRITE, XFA, lambda m, v, n: build(m.AddOffsetsToTxnRequest, transactional_id=TXN,
                                             producer_id=7, producer_epoch=0, group_id=GROUP),
        None, [GROUP_READ]),
    Row("AddOffsetsToTxn (group)", apis.ADD_OFFSETS_TO_TXN, Rt.GROUP, GROUP, Op.READ, GFA,
        lambda m, v, n: build(m.AddOffsetsToTxnRequest, transactional_id=TXN, producer_id=7,
                              producer_epoch=0, group_id=GROUP), None, [TXN_WRITE]),
    Row("EndTxn", apis.END_TXN, Rt.TRANSACTIONAL_ID, TXN, Op.WRITE, XFA,
        lambda m, v, n: build(m.EndTxnRequest, transactional_id=n, producer_id=7,
                              producer_epoch=0, committed=False)),
    Row("TxnOffsetCommit (transaction)", apis.TXN_OFFSET_COMMIT, Rt.TRANSACTIONAL_ID, TXN,
        Op.WRITE, XFA, txn_offset_commit, None, [GROUP_READ, TOPIC_READ]),
    Row("TxnOffsetCommit (group)", apis.TXN_OFFSET_COMMIT, Rt.GROUP, GROUP, Op.READ, GFA,
        txn_offset_commit, None, [TXN_WRITE, TOPIC_READ]),
    Row("TxnOffsetCommit (topic)", apis.TXN_OFFSET_COMMIT, Rt.TOPIC, TOPIC, Op.READ, TFA,
        txn_offset_commit, None, [TXN_WRITE, GROUP_READ]),
    Row("DescribeTransactions", apis.DESCRIBE_TRANSACTIONS, Rt.TRANSACTIONAL_ID, TXN,
        Op.DESCRIBE, XFA, lambda m, v, n: build(m.DescribeTransactionsRequest,
                                                transactional_ids=(n,)),
        0, codes=first_state_error, raw=True),
    Row("ListTransactions", apis.LIST_TRANSACTIONS, Rt.TRANSACTIONAL_ID, LISTED_TXN,
        Op.DESCRIBE, XFA, lambda m, v, n: build(
            m.ListTransactionsRequest, state_filters=(), producer_id_filters=(),
            duration_filter=-1, transactional_id_pattern=None), codes=listed_txn),
    Row("DescribeProducers", apis.DESCRIBE_PRODUCERS, Rt.TOPIC, TOPIC, Op.READ, TFA,
        lambda m, v, n: build(m.DescribeProducersRequest, topics=(build(
            m.TopicRequest, name=n, partition_indexes=(0,)),))),
    Row("WriteTxnMarkers", apis.WRITE_TXN_MARKERS, Rt.CLUSTER, CLUSTER_NAME,
        Op.CLUSTER_ACTION, CFA, lambda m, v, n: build(m.WriteTxnMarkersRequest, markers=(build(
            m.WritableTxnMarker, producer_id=7, producer_epoch=0, transaction_result=False,
            coordinator_epoch=0, transaction_version=0, topics=(build(
                m.WritableTxnMarkerTopic, name="m-none", partition_indexes=(0,)),)),))),
    Row("DescribeAcls", apis.DESCRIBE_ACLS, Rt.CLUSTER, CLUSTER_NAME, Op.DESCRIBE, CFA,
        lambda m, v, n: acl_filter(m, "DescribeAclsRequest")),
    Row("CreateAcls", apis.CREATE_ACLS, Rt.CLUSTER, CLUSTER_NAME, Op.ALTER, CFA,
        lambda m, v, n: build(m.CreateAclsRequest, creations=(build(
            m.AclCreation, resource_type=int(Rt.TOPIC), resource_name="m-unrelated",
            resource_pattern_type=int(Pt.LITERAL), principal="User:x", host="*",
            operation=int(Op.READ), permission_type=int(Perm.ALLOW)),))),
    Row("DeleteAcls", apis.DELETE_ACLS, Rt.CLUSTER, CLUSTER_NAME, Op.ALTER, CFA,
        lambda m, v, n: build(m.DeleteAclsRequest, filters=(
            acl_filter(m, "DeleteAclsFilter"),))),
    Row("DescribeLogDirs", apis.DESCRIBE_LOG_DIRS, Rt.CLUSTER, CLUSTER_NAME, Op.DESCRIBE, CFA,
        lambda m, v, n: build(m.DescribeLogDirsRequest, topics=None)),
    Row("AlterReplicaLogDirs", apis.ALTER_REPLICA_LOG_DIRS, Rt.CLUSTER, CLUSTER_NAME,
        Op.ALTER, CFA, lambda m, v, n: build(m.AlterReplicaLogDirsRequest, dirs=(build(
            m.AlterReplicaLogDir, path="/m-nowhere", topics=(build(
                m.AlterReplicaLogDirTopic, name=TOPIC, partitions=(0,)),)),))),
    Row("ElectLeaders", apis.ELECT_LEADERS, Rt.CLUSTER, CLUSTER_NAME, Op.ALTER, CFA,
        lambda m, v, n: build(m.ElectLeadersRequest, election_type=0, timeout=1000 * MS,
                              topic_partitions=(build(m.TopicPartitions, topic=TOPIC,
                                                      partitions=(0,)),))),
    Row("AlterPartitionReassignments", apis.ALTER_PARTITION_REASSIGNMENTS, Rt.CLUSTER,
        CLUSTER_NAME, Op.ALTER, CFA, lambda m, v, n: build(
            m.AlterPartitionReassignmentsRequest, timeout=1000 * MS,
            allow_replication_factor_change=True, topics=(build(
                m.ReassignableTopic, name=TOPIC, partitions=(build(
                    m.ReassignablePartition, partition_index=0, replicas=(0,)),)),))),
    Row("ListPartitionReassignments", apis.LIST_PARTITION_REASSIGNMENTS, Rt.CLUSTER,
        CLUSTER_NAME, Op.DESCRIBE, CFA, lambda m, v, n: build(
            m.ListPartitionReassignmentsRequest, timeout=1000 * MS, topics=None)),
    Row("DescribeClientQuotas", apis.DESCRIBE_CLIENT_QUOTAS, Rt.CLUSTER, CLUSTER_NAME,
        Op.DESCRIBE_CONFIGS, CFA,
        lambda m, v, n: build(m.DescribeClientQuotasRequest, components=(), strict=False)),
    Row("AlterClientQuotas", apis.ALTER_CLIENT_QUOTAS, Rt.CLUSTER, CLUSTER_NAME,
        Op.ALTER_CONFIGS, CFA,
        lambda m, v, n: build(m.AlterClientQuotasRequest, validate_only=True, entries=(build(
            m.EntryData, entity=(build(m.EntityData, entity_type="client-id",
                                       entity_name="m-quota"),),
            ops=(build(m.OpData, key="producer_byte_rate", value=1024.0, remove=False),)),))),
    Row("DescribeUserScramCredentials", apis.DESCRIBE_USER_SCRAM_CREDENTIALS, Rt.CLUSTER,
        CLUSTER_NAME, Op.DESCRIBE, CFA,
        lambda m, v, n: build(m.DescribeUserScramCredentialsRequest, users=None)),
    Row("AlterUserScramCredentials", apis.ALTER_USER_SCRAM_CREDENTIALS, Rt.CLUSTER,
        CLUSTER_NAME, Op.ALTER, CFA,
        lambda m, v, n: build(m.AlterUserScramCredentialsRequest, upsertions=(), deletions=(
            build(m.ScramCredentialDeletion, name="m-nobody", mechanism=1),))),
    Row("DescribeQuorum", apis.DESCRIBE_QUORUM, Rt.CLUSTER, CLUSTER_NAME, Op.DESCRIBE, CFA,
        lambda m, v, n: build(m.DescribeQuorumRequest, topics=(build(
            m.TopicData, topic_name="__cluster_metadata", partitions=(build(
                m.PartitionData, partition_index=0),)),))),
    Row("ListConfigResources", apis.LIST_CONFIG_RESOURCES, Rt.CLUSTER, CLUSTER_NAME,
        Op.DESCRIBE_CONFIGS, CFA, lambda m, v, n: build(m.ListConfigResourcesRequest,
                                                        resource_types=())),
    Row("DescribeTopicPartitions", apis.DESCRIBE_TOPIC_PARTITIONS, Rt.TOPIC, TOPIC,
        Op.DESCRIBE, TFA, lambda m, v, n: build(
            m.DescribeTopicPartitionsRequest, topics=(build(m.TopicRequest, name=n),),
            response_partition_limit=100, cursor=None)),
    Row("DescribeCluster (authorized operations)", apis.DESCRIBE_CLUSTER, Rt.CLUSTER,
        CLUSTER_NAME, Op.DESCRIBE, CFA, lambda m, v, n: build(
            m.DescribeClusterRequest, include_cluster_authorized_operations=True,
            endpoint_type=1, include_fenced_brokers=False), codes=describe_cluster_ops),
]

# The resource type whose ACL must not count for a row's ("other_type")
OTHER_TYPE = {Rt.TOPIC: Rt.GROUP, Rt.GROUP: Rt.TOPIC, Rt.CLUSTER: Rt.TOPIC,
              Rt.TRANSACTIONAL_ID: Rt.GROUP}


@pytest.fixture(scope="module")
def wires():
    # Each ACL change is fsynced (file and directory): ~12 ms on disk, and the matrix makes
    # some 400. What it tests is the decision, so its store is on tmpfs where there is one.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="acl-matrix-", dir=shm) as root:
        yield from _matrix_broker(Path(root) / "broker")


def _matrix_broker(data_dir: Path):
    seed_admin(data_dir)
    broker = BrokerProcess(data_dir, {"authorizer.class.name": AUTHORIZER,
                                      "transaction.two.phase.commit.enable": "true",
                                      "offsets.topic.num.partitions": "1",
                                      "transaction.state.log.num.partitions": "1"}).start()
    admin, subject = Wire(broker.port, ADMIN_HOST), Wire(broker.port, SUBJECT_HOST)
    try:
        created = admin.call(apis.CREATE_TOPICS, lambda m, v: create_topics(m, v, TOPIC))
        assert [t.error_code for t in created.topics] == [E.none]
        committed = admin.call(apis.OFFSET_COMMIT, lambda m, v: dataclasses.replace(
            offset_commit(m, v, TOPIC), group_id=LISTED_GROUP))
        assert set(error_codes(committed)) == {E.none}
        txn = admin.call(apis.INIT_PRODUCER_ID, lambda m, v: init_producer_id(LISTED_TXN)(
            m, v, LISTED_TXN))
        assert txn.error_code == E.none
        yield broker, admin, subject
    finally:
        admin.close()
        subject.close()
        code = broker.stop()
        assert code == 0, broker.log_text()
        assert "Traceback" not in broker.log_text(), broker.log_text()


def acls_for(row: Row, state: str, resource: str) -> list[AclBinding]:
    mine = grant(row.rtype, resource, row.op)
    return {"allowed": [mine],
            "denied": [mine, grant(row.rtype, resource, row.op, Perm.DENY)],
            "no_acl": [],
            "other_type": [grant(OTHER_TYPE[row.rtype], resource, row.op)]}[state]


def test_every_api_every_state(wires):
    _, admin, subject = wires
    wrong = []
    for row in ROWS:
        for state in STATES:
            resource = row.resource.replace("{state}", state)
            assert admin.create_acls(row.background + acls_for(row, state, resource)) == \
                [E.none] * (len(row.background) + len(acls_for(row, state, resource)))
            try:
                response = subject.call(row.api_key, lambda m, v, row=row, r=resource, s=state:
                                        _with_state(row.make(m, v, r), s), row.version,
                                        row.raw)
                codes = set(row.codes(response))
                refused = row.error in codes
                if refused == (state == "allowed"):
                    wrong.append(f"{row.name} [{state}]: {sorted(c.name for c in codes)}")
            finally:
                admin.delete_acls_of_host(SUBJECT_HOST)
    assert not wrong, "\n".join(wrong)


def _with_state(body, state: str):
    """Rows naming resources by state (``{state}``) in fields the row does not name."""
    values = {}
    for f in dataclasses.fields(body):
        value = getattr(body, f.name)
        if isinstance(value, str) and "{state}" in value:
            values[f.name] = value.replace("{state}", state)
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            changed = tuple(_with_state(item, state) for item in value)
            if changed != value:
                values[f.name] = changed
    return dataclasses.replace(body, **values) if values else body


def test_rows_cover_every_api_kafka_authorizes():
    """Every API the broker answers is a row, or one Kafka does not authorize."""
    unchecked = {apis.API_VERSIONS_KEY, apis.SASL_HANDSHAKE, apis.SASL_AUTHENTICATE,
                 apis.CREATE_DELEGATION_TOKEN, apis.RENEW_DELEGATION_TOKEN,
                 apis.EXPIRE_DELEGATION_TOKEN, apis.DESCRIBE_DELEGATION_TOKEN}
    assert set(apis.SUPPORTED_VERSIONS) - unchecked == {row.api_key for row in ROWS}
