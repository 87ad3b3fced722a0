"""oncelog's own Kafka clients, one package per role, over the Kafka protocol only.

Owns: ``producer/`` (accumulator, batches, sender, idempotence, transactions, the compiled
fast append), ``consumer/`` (fetching, the classic and KIP-848 group protocols, assignors),
``admin/`` (the admin client and its config types), ``network/`` (the blocking and asyncio
connections and single calls every role builds on), ``topic_reader`` (the plain reader the
audit and Spark read through), and what every role shares (``topic_partition``, ``metrics``).

Must not know: the broker (nothing here imports ``oncelog.broker``, ``coordinator``, ``log``
or ``producer_state``): a client only speaks the wire format of ``protocol/``, so it works
against any Kafka broker.
"""
