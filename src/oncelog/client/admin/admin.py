"""oncelog.Admin: topics, configs, records, consumer groups, transactions and the cluster's
views over the Kafka protocol, against oncelog or any Kafka broker. Each family of calls is a
module of this package (see its ``__init__``); ``Admin`` is all of them, and every name a
caller imports from here is re-exported."""

from __future__ import annotations

from .admin_acls import AclAdmin
from .admin_configs import AlterConfigOp, ConfigEntry, ConfigResource
from .admin_scram import ScramAdmin
from .base import ClusterInfo, Coordinator, PartitionInfo, TopicInfo
from .cluster import (
    BrokerDescription,
    ClusterAdmin,
    ClusterDescription,
    LogDirDescription,
    ReplicaInfo,
    TopicDescription,
)
from .configs import RESOURCE_TOPIC, ConfigsAdmin
from .groups import GroupInfo, GroupListing, GroupsAdmin, MemberInfo
from .records import ProducerInfo, RecordsAdmin
from .topics import PartitionReassignment, TopicsAdmin
from .transactions import (
    COORDINATOR_TRANSACTION,
    FencedTransaction,
    TransactionDescription,
    TransactionListing,
    TransactionsAdmin,
)

__all__ = ["COORDINATOR_TRANSACTION", "RESOURCE_TOPIC", "Admin", "AlterConfigOp",
           "BrokerDescription", "ClusterDescription", "ClusterInfo", "ConfigEntry",
           "ConfigResource", "Coordinator", "FencedTransaction", "GroupInfo", "GroupListing",
           "LogDirDescription", "MemberInfo", "PartitionInfo", "PartitionReassignment",
           "ProducerInfo", "ReplicaInfo", "TopicDescription", "TopicInfo",
           "TransactionDescription", "TransactionListing"]


# One family a line, in the order of their modules' names: a new family is its module and
# one line here (see the package's __init__).
class Admin(
    AclAdmin,
    ClusterAdmin,
    ConfigsAdmin,
    GroupsAdmin,
    RecordsAdmin,
    ScramAdmin,
    TopicsAdmin,
    TransactionsAdmin,
):
    """A Kafka admin client: ``Admin({"bootstrap.servers": ...})``, every call blocking
    until answered or ``request.timeout.ms`` passes."""
