"""The coordinators: one package per coordinator, each a state machine fed by its internal
topic's records, with its record formats beside it, and the producer-id manager.

Owns: ``group/`` (the group coordinator of the classic protocol and of KIP-848, the records of
``__consumer_offsets``, offset rules, server-side assignors), ``transaction/`` (the transaction
coordinator, its rules as a table, the records of ``__transaction_state``),
``producer_id_manager`` (blocks of producer ids from the metadata store), and what both
coordinators share about their internal topic (``internal_log``: a partition's log as a
coordinator sees it, the partition of a key; ``ownership``: which partitions a coordinator
serves, at which coordinator epoch).

Must not know: sockets, requests' versions or the broker's classes (``broker/apis/`` turns
requests into calls here and answers into responses); state lives in memory only as a cache of
the internal topic's records, and an entry awaiting a write is held "pending".
"""
