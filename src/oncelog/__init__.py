"""oncelog: a Kafka-compatible log broker built around exactly-once producing."""

from .client.admin.admin import Admin
from .client.admin.admin_configs import AlterConfigOp, ConfigEntry, ConfigResource
from .client.consumer.consumer import Consumer, ConsumerRecord
from .client.network.connection import (
           KafkaError,
           KafkaTimeout,
           OutcomeUnknown,
           ProducerFatalError,
           TransactionAbortableError,
           TransactionAbortedError,
           TransactionStateError,
)
from .client.producer.producer import AIOProducer, Producer, RecordFuture, RecordMetadata
from .client.producer.transactions import GroupMetadata, PreparedTxnState
from .client.topic_partition import OffsetAndMetadata, TopicPartition

__all__ = ["AIOProducer", "Admin", "AlterConfigOp", "ConfigEntry", "ConfigResource", "Consumer",
           "ConsumerRecord", "GroupMetadata", "KafkaError",
           "KafkaTimeout", "OffsetAndMetadata", "OutcomeUnknown", "PreparedTxnState",
           "Producer", "ProducerFatalError", "RecordFuture", "RecordMetadata", "TopicPartition",
           "TransactionAbortableError", "TransactionAbortedError", "TransactionStateError"]
__version__ = "0.1.0"
