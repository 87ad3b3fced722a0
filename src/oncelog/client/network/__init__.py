"""The client network layer: a blocking connection (connection.py: also the client error
classes and version negotiation), an asyncio connection for the producer's Sender
(aio_connection.py), and single Kafka calls as request builders/answer readers (calls.py).

Must not know: batching, retries, idempotence or group state (those live in the roles above).
"""
