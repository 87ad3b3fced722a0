"""Kafka wire format: frames, request/response codecs (kio), API versions, record batches.

Owns: frames and request/response codecs (kio, and compiled codecs for the hot requests held
byte-for-byte to kio), the table of API versions (api_versions.py), error codes, RecordBatch v2
parse/patch, CRC32C, record validation, the one batch iterator every reader uses (batches.py)
and the one place a client's regex is compiled (client_regex.py).

Must not know: any I/O, or any other oncelog package: everything else builds on this one.
"""
