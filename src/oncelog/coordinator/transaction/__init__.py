"""The transaction coordinator: ``transaction_coordinator`` (InitProducerId with a
transactional id, AddPartitions/AddOffsets, EndTxn, markers, timeouts), ``txn_rules`` (every
decision, as a table), ``txn_records`` (the record format of ``__transaction_state``).

Must not know: a partition's producer state (the markers it writes are applied by
``producer_state/``), sockets or API versions.
"""
