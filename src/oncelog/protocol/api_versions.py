"""The API versions this broker implements: ApiVersions advertises exactly this table.

Ranges start where kio's schemas start (Kafka 4 removed the older versions) and reach at least
what a Kafka 4.1 broker serves: clients pinned to a broker version (kafka-python's
``api_version``) send that version's table without asking. tests/protocol/test_api_versions.py holds
the table against Kafka 4.1's and sends every version listed here to a broker.
"""

API_VERSIONS_KEY = 18

# the cluster and storage views (broker/apis/cluster_views.py)
ALTER_REPLICA_LOG_DIRS = 34
DESCRIBE_LOG_DIRS = 35
DESCRIBE_CLUSTER = 60
DESCRIBE_TOPIC_PARTITIONS = 75
DESCRIBE_QUORUM = 55
LIST_CONFIG_RESOURCES = 74  # KIP-1142; v0 was ListClientMetricsResources
# answered as a broker without SASL or an authorizer answers them (broker/apis/unsecured.py)
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31
CREATE_DELEGATION_TOKEN = 38
RENEW_DELEGATION_TOKEN = 39
EXPIRE_DELEGATION_TOKEN = 40
DESCRIBE_DELEGATION_TOKEN = 41
# SCRAM users (broker/apis/scram_users.py)
DESCRIBE_USER_SCRAM_CREDENTIALS = 50
ALTER_USER_SCRAM_CREDENTIALS = 51

PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
OFFSET_FOR_LEADER_EPOCH = 23
METADATA = 3
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
DELETE_GROUPS = 42
ADD_PARTITIONS_TO_TXN = 24
ADD_OFFSETS_TO_TXN = 25
END_TXN = 26
TXN_OFFSET_COMMIT = 28
DESCRIBE_TRANSACTIONS = 65
LIST_TRANSACTIONS = 66
OFFSET_DELETE = 47
CREATE_TOPICS = 19
DELETE_TOPICS = 20
DESCRIBE_CONFIGS = 32
INIT_PRODUCER_ID = 22
DESCRIBE_PRODUCERS = 61
WRITE_TXN_MARKERS = 27
CONSUMER_GROUP_HEARTBEAT = 68
CONSUMER_GROUP_DESCRIBE = 69
# configuration after creation
ALTER_CONFIGS = 33
INCREMENTAL_ALTER_CONFIGS = 44
# client quotas (broker/apis/client_quotas_admin.py)
DESCRIBE_CLIENT_QUOTAS = 48
ALTER_CLIENT_QUOTAS = 49
# Partition admin (broker/apis/partition_admin.py).
DELETE_RECORDS = 21
CREATE_PARTITIONS = 37
ELECT_LEADERS = 43
ALTER_PARTITION_REASSIGNMENTS = 45
LIST_PARTITION_REASSIGNMENTS = 46

SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    # the cluster and storage views; DescribeLogDirs v5 adds is_cordoned (never, here)
    ALTER_REPLICA_LOG_DIRS: (1, 2),
    DESCRIBE_LOG_DIRS: (1, 5),
    DESCRIBE_CLUSTER: (0, 2),
    DESCRIBE_TOPIC_PARTITIONS: (0, 0),
    DESCRIBE_QUORUM: (0, 2),
    LIST_CONFIG_RESOURCES: (0, 1),
    SASL_HANDSHAKE: (0, 1),
    SASL_AUTHENTICATE: (0, 2),
    DESCRIBE_ACLS: (1, 3),
    CREATE_ACLS: (1, 3),
    DELETE_ACLS: (1, 3),
    CREATE_DELEGATION_TOKEN: (1, 3),
    RENEW_DELEGATION_TOKEN: (1, 2),
    EXPIRE_DELEGATION_TOKEN: (1, 2),
    DESCRIBE_DELEGATION_TOKEN: (1, 3),
    DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    # Produce v13, Fetch v13+ and DeleteTopics v6 name topics by id (KIP-516).
    PRODUCE: (3, 13),
    FETCH: (4, 18),
    LIST_OFFSETS: (1, 10),
    OFFSET_FOR_LEADER_EPOCH: (2, 4),
    METADATA: (0, 13),
    FIND_COORDINATOR: (0, 6),
    # OffsetCommit and OffsetFetch stop before v10 (topic ids), as Kafka 4.1 does.
    OFFSET_COMMIT: (2, 9),
    OFFSET_FETCH: (1, 9),
    JOIN_GROUP: (0, 9),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    SYNC_GROUP: (0, 5),
    DESCRIBE_GROUPS: (0, 6),
    LIST_GROUPS: (0, 5),
    DELETE_GROUPS: (0, 2),
    OFFSET_DELETE: (0, 0),
    # AddPartitionsToTxn v4+ (verify_only, several transactions) is for brokers; clients use
    # up to v3, and EndTxn v5 is transaction version 2 (an epoch bump per transaction).
    ADD_PARTITIONS_TO_TXN: (0, 5),
    ADD_OFFSETS_TO_TXN: (0, 4),
    END_TXN: (0, 5),
    TXN_OFFSET_COMMIT: (0, 5),
    DESCRIBE_TRANSACTIONS: (0, 0),
    LIST_TRANSACTIONS: (0, 2),
    API_VERSIONS_KEY: (0, 4),
    CREATE_TOPICS: (2, 7),
    DELETE_TOPICS: (1, 6),
    DESCRIBE_CONFIGS: (1, 4),
    INIT_PRODUCER_ID: (0, 6),
    DESCRIBE_PRODUCERS: (0, 0),
    WRITE_TXN_MARKERS: (1, 2),
    CONSUMER_GROUP_HEARTBEAT: (0, 1),
    CONSUMER_GROUP_DESCRIBE: (0, 1),
    # configuration after creation
    ALTER_CONFIGS: (0, 2),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    # Partition admin: every version kio has, as Kafka 3.x and 4.x brokers list them.
    DELETE_RECORDS: (0, 2),
    CREATE_PARTITIONS: (0, 3),
    ELECT_LEADERS: (0, 2),
    ALTER_PARTITION_REASSIGNMENTS: (0, 1),
    LIST_PARTITION_REASSIGNMENTS: (0, 0),
    DESCRIBE_CLIENT_QUOTAS: (0, 1),
    ALTER_CLIENT_QUOTAS: (0, 1),
}

# librdkafka before 2.10 (kcat's among them) compresses with gzip, snappy or lz4 only when the
# broker lists a Produce version <= 2, and otherwise sends every batch uncompressed. Kafka 4
# lists Produce from v0 for that reason alone (KAFKA-18659) and refuses v0-v2 when used, as
# decode_request does here; clients pick their highest common version, so none sends them.
_ADVERTISED_MIN = {PRODUCE: 0}

# (api key, min, max) as ApiVersions lists them.
ADVERTISED_VERSIONS: list[tuple[int, int, int]] = [
    (key, _ADVERTISED_MIN.get(key, lo), hi) for key, (lo, hi) in sorted(SUPPORTED_VERSIONS.items())
]
