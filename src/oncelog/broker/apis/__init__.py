"""The broker's API handlers, one module per API family: decode what the request asks, ask
the part of the broker that owns the answer, and build the response of the request's version.

Owns: the mapping of each API key to its handler (``registry.HANDLERS``, gathered from each
family module's ``HANDLERS``), and the per-version shape of the answers.

Must not know: any Kafka decision (idempotence is in ``producer_state/``, groups and
transactions in ``coordinator/``) and hold no state of its own: the state is the broker's
(``broker.server.Broker``: topics, partitions, coordinators). Adding an API touches its family
module here and the version table in ``protocol/api_versions.py``.
"""
