"""One partition's files: segments and their indexes, append, read, roll, truncate, recover,
retention, compaction and the transaction index, over a ``Disk`` (disk.py) that tests can
replace.

Must not know: producers, or what a transaction means (the transaction index stores what
``producer_state/`` decided); sockets; other partitions.
"""
