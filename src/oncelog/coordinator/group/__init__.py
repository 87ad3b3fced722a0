"""The group coordinator, both protocols: ``group_coordinator`` (the classic protocol's join,
sync, heartbeat, leave, offsets; the owner of every group and of ``__consumer_offsets``),
``classic_group`` (a classic group's state), ``consumer_coordinator`` and ``consumer_group``
(KIP-848's heartbeat and its reconciliation), ``group_records`` and ``consumer_records`` (the
record formats of ``__consumer_offsets``), ``offset_rules`` (commit and expiry decisions) and
``assignors`` (the server-side assignors of KIP-848).

Must not know: transactions beyond the transactional offset commits the transaction coordinator
hands it; sockets or API versions.
"""
