"""oncelog: a Kafka-compatible log broker built around exactly-once producing."""

from .client.admin import Admin
from .client.connection import KafkaError, KafkaTimeout, OutcomeUnknown
from .client.consumer import Consumer, ConsumerRecord, TopicPartition
from .client.producer import AIOProducer, Producer, RecordFuture, RecordMetadata

__all__ = ["AIOProducer", "Admin", "Consumer", "ConsumerRecord", "KafkaError", "KafkaTimeout",
           "OutcomeUnknown", "Producer", "RecordFuture", "RecordMetadata", "TopicPartition"]
__version__ = "0.1.0"
