"""Kafka wire format: frames, request/response codecs (kio), API versions, record batches."""
