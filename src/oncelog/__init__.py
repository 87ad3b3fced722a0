"""oncelog: a Kafka-compatible log broker built around exactly-once producing."""

from .client.admin import Admin
from .client.admin_configs import AlterConfigOp, ConfigEntry, ConfigResource
from .client.connection import (
    KafkaError,
    KafkaTimeout,
    OutcomeUnknown,
    ProducerFatalError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionStateError,
)
from .client.consumer import Consumer, ConsumerRecord
from .client.producer import AIOProducer, Producer, RecordFuture, RecordMetadata
from .client.topic_partition import OffsetAndMetadata, TopicPartition
from .client.transactions import GroupMetadata, PreparedTxnState

__all__ = ["AIOProducer", "Admin", "AlterConfigOp", "ConfigEntry", "ConfigResource", "Consumer",
           "ConsumerRecord", "GroupMetadata", "KafkaError",
           "KafkaTimeout", "OffsetAndMetadata", "OutcomeUnknown", "PreparedTxnState",
           "Producer", "ProducerFatalError", "RecordFuture", "RecordMetadata", "TopicPartition",
           "TransactionAbortableError", "TransactionAbortedError", "TransactionStateError"]
__version__ = "0.1.0"
