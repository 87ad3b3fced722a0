"""oncelog: a Kafka-compatible log broker built around exactly-once producing.

The client names below are imported on first use (module ``__getattr__``), not with the
package: ``import oncelog`` is paid by every broker, command-line tool and Spark Python
worker, and most need one client or none.

kio imports hypothesis whenever it is installed, to register strategies for its types: about
half of what importing a client cost. Imported through oncelog, kio goes without it unless
hypothesis was imported first (``_KioWithoutHypothesis``).
"""

from __future__ import annotations

import importlib
import sys
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


class _KioWithoutHypothesis:
    """On the meta path until kio.static._phantom is imported: that module tries ``import
    hypothesis.strategies`` and goes without it on ImportError, which ``None`` in sys.modules
    gives for the time the module runs. A process that imported hypothesis before (a test
    run using kio's strategies) keeps them. Another thread importing hypothesis during those
    milliseconds would fail; nothing in oncelog imports it."""

    NAME = "kio.static._phantom"

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != cls.NAME:
            return None
        if cls in sys.meta_path:
            sys.meta_path.remove(cls)  # once: a reload imports it as kio ships it
        if "hypothesis" in sys.modules:
            return None
        for finder in sys.meta_path:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") \
                else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _WithoutHypothesis(spec.loader)
                return spec
        return None


class _WithoutHypothesis:
    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        blocked = "hypothesis" not in sys.modules
        if blocked:
            sys.modules["hypothesis"] = None  # type: ignore[assignment]
        try:
            self.loader.exec_module(module)
        finally:
            if blocked and sys.modules.get("hypothesis", ...) is None:
                del sys.modules["hypothesis"]


if "kio.static._phantom" not in sys.modules:
    sys.meta_path.insert(0, _KioWithoutHypothesis)  # type: ignore[arg-type]


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
