"""The consumer: ``Consumer`` (consumer.py: fetching, positions, isolation), the classic group
protocol (classic_group, group_membership) and KIP-848's (consumer_group,
consumer_group_membership), their requests (group_calls), their shared coordinator I/O
(group_io), the client-side assignors and the consumer protocol's subscription/assignment
codec.

Must not know: producing (beyond ``GroupMetadata`` for a transaction's offsets), nor the
broker's code; membership modules are sans-IO state machines.
"""
