"""What a caller may do to a resource, as the ``*_authorized_operations`` fields answer it.

Kafka encodes a set of AclOperation codes as a 32-bit field (bit ``code`` set for each
operation). With no authorizer configured Kafka answers every operation the resource type
supports (AclEntry.supportedOperations); oncelog has no authorizer, so it answers the same.
Left out when not asked for: the schema's default, -2^31 ("omitted").
"""

from __future__ import annotations

from enum import IntEnum


class AclOperation(IntEnum):  # Kafka's codes (org.apache.kafka.common.acl.AclOperation)
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


OMITTED = -(1 << 31)

_Op = AclOperation
TOPIC_OPERATIONS = (_Op.READ, _Op.WRITE, _Op.CREATE, _Op.DESCRIBE, _Op.DELETE, _Op.ALTER,
                    _Op.DESCRIBE_CONFIGS, _Op.ALTER_CONFIGS)
GROUP_OPERATIONS = (_Op.READ, _Op.DESCRIBE, _Op.DELETE, _Op.DESCRIBE_CONFIGS,
                    _Op.ALTER_CONFIGS)
CLUSTER_OPERATIONS = (_Op.CREATE, _Op.CLUSTER_ACTION, _Op.DESCRIBE_CONFIGS, _Op.ALTER_CONFIGS,
                      _Op.IDEMPOTENT_WRITE, _Op.ALTER, _Op.DESCRIBE)


def bitfield(operations) -> int:
    field = 0
    for operation in operations:
        field |= 1 << int(operation)
    return field


TOPIC = bitfield(TOPIC_OPERATIONS)
GROUP = bitfield(GROUP_OPERATIONS)
CLUSTER = bitfield(CLUSTER_OPERATIONS)


def answer(asked: bool, allowed: int) -> int:
    """The field's value: what the caller may do when asked, else "omitted"."""
    return allowed if asked else OMITTED
