"""oncelog: a Kafka-compatible log broker built around exactly-once producing."""

from .client.admin import Admin
from .client.consumer import Consumer, ConsumerRecord, TopicPartition

__all__ = ["Admin", "Consumer", "ConsumerRecord", "TopicPartition"]
__version__ = "0.1.0"
