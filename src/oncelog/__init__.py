"""oncelog: a Kafka-compatible log broker built around exactly-once producing.

The client names below are imported on first use (module ``__getattr__``), not with the
package: ``import oncelog`` is paid by every broker, command-line tool and Spark Python
worker, and most need one client or none.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# name -> the module that defines it
_PUBLIC = {
    "Admin": "client.admin.admin",
    "AlterConfigOp": "client.admin.admin_configs",
    "ConfigEntry": "client.admin.admin_configs",
    "ConfigResource": "client.admin.admin_configs",
    "Consumer": "client.consumer.consumer",
    "ConsumerRecord": "client.consumer.consumer",
    "KafkaError": "client.network.connection",
    "KafkaTimeout": "client.network.connection",
    "OutcomeUnknown": "client.network.connection",
    "ProducerFatalError": "client.network.connection",
    "TransactionAbortableError": "client.network.connection",
    "TransactionAbortedError": "client.network.connection",
    "TransactionStateError": "client.network.connection",
    "AIOProducer": "client.producer.producer",
    "Producer": "client.producer.producer",
    "RecordFuture": "client.producer.producer",
    "RecordMetadata": "client.producer.producer",
    "GroupMetadata": "client.producer.transactions",
    "PreparedTxnState": "client.producer.transactions",
    "OffsetAndMetadata": "client.topic_partition",
    "TopicPartition": "client.topic_partition",
}

__all__ = ["AIOProducer", "Admin", "AlterConfigOp", "ConfigEntry", "ConfigResource", "Consumer",
           "ConsumerRecord", "GroupMetadata", "KafkaError",
           "KafkaTimeout", "OffsetAndMetadata", "OutcomeUnknown", "PreparedTxnState",
           "Producer", "ProducerFatalError", "RecordFuture", "RecordMetadata", "TopicPartition",
           "TransactionAbortableError", "TransactionAbortedError", "TransactionStateError"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


if TYPE_CHECKING:
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
