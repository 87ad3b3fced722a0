"""oncelog: a Kafka-compatible log broker built around exactly-once producing."""

__version__ = "0.1.0"
