"""The producer: ``Producer`` / ``AIOProducer`` (producer.py), the record accumulator and its
batches, the Sender that does the I/O and Delivery that decides a batch's fate, the
idempotence manager (sequence numbers, epoch bumps), the transaction manager and its requests,
the partitioner, and the fast append (``_append.c``, with ``fast_append.py`` as its pure-Python
stand-in).

Must not know: consumers or groups beyond what a transaction sends them (TxnOffsetCommit's
group metadata), nor the broker's code.
"""
