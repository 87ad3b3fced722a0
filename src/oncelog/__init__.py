"""oncelog: a Kafka-compatible log broker built around exactly-once producing."""

from .client.admin import Admin
from .client.connection import KafkaError, KafkaTimeout, OutcomeUnknown
from .client.consumer import Consumer, ConsumerRecord
from .client.producer import AIOProducer, Producer, RecordFuture, RecordMetadata
from .client.topic_partition import OffsetAndMetadata, TopicPartition

__all__ = ["AIOProducer", "Admin", "Consumer", "ConsumerRecord", "KafkaError", "KafkaTimeout",
           "OffsetAndMetadata", "OutcomeUnknown", "Producer", "RecordFuture", "RecordMetadata",
           "TopicPartition"]
__version__ = "0.1.0"
