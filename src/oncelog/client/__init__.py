"""oncelog's own Kafka clients, one package per role, over the Kafka protocol only.

Owns: ``producer/`` (accumulator, batches, sender, idempotence, transactions, the compiled
fast append), ``consumer/`` (fetching, the classic and KIP-848 group protocols, assignors),
``admin/`` (the admin client and its config types), ``network/`` (the blocking and asyncio
connections and single calls every role builds on), ``topic_reader`` (the plain reader the
audit and Spark read through), and what every role shares (``topic_partition``, ``metrics``).

Inside, imports go up this order only (tests/architecture/test_import_graph.py, INSIDE):
``topic_partition`` and ``metrics``, ``network`` (no role: the calls every role sends),
``producer``, ``admin``, ``consumer``, ``topic_reader``.

Must not know: the broker (nothing here imports ``oncelog.broker``, ``coordinator``, ``log``
or ``producer_state``): a client only speaks the wire format of ``protocol/``, so it works
against any Kafka broker.
"""
