"""The ACL codes of Kafka's CreateAcls, DescribeAcls and DeleteAcls (resource types, pattern
types, operations, permissions) and the names Kafka writes for them (kafka-acls.sh, its
ZooKeeper JSON): wire facts, shared by the broker's authorizer and the admin client."""

from __future__ import annotations

from enum import IntEnum


class ResourceType(IntEnum):  # Kafka's codes (org.apache.kafka.common.resource.ResourceType)
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):  # org.apache.kafka.common.acl.AclOperation
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15  # KIP-939


class AclPermissionType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"  # the one name of the Cluster resource

# The names Kafka writes (SecurityUtils: ZooKeeper paths and JSON, kafka-acls.sh).
RESOURCE_TYPE_NAMES = {
    ResourceType.TOPIC: "Topic", ResourceType.GROUP: "Group", ResourceType.CLUSTER: "Cluster",
    ResourceType.TRANSACTIONAL_ID: "TransactionalId",
    ResourceType.DELEGATION_TOKEN: "DelegationToken", ResourceType.USER: "User",
}
OPERATION_NAMES = {
    AclOperation.ALL: "All", AclOperation.READ: "Read", AclOperation.WRITE: "Write",
    AclOperation.CREATE: "Create", AclOperation.DELETE: "Delete", AclOperation.ALTER: "Alter",
    AclOperation.DESCRIBE: "Describe", AclOperation.CLUSTER_ACTION: "ClusterAction",
    AclOperation.DESCRIBE_CONFIGS: "DescribeConfigs",
    AclOperation.ALTER_CONFIGS: "AlterConfigs", AclOperation.IDEMPOTENT_WRITE: "IdempotentWrite",
    AclOperation.CREATE_TOKENS: "CreateTokens", AclOperation.DESCRIBE_TOKENS: "DescribeTokens",
    AclOperation.TWO_PHASE_COMMIT: "TwoPhaseCommit",
}
PERMISSION_NAMES = {AclPermissionType.ALLOW: "Allow", AclPermissionType.DENY: "Deny"}
