"""``oncelog audit``: check a topic for duplicates, gaps and reordering, on any Kafka broker.

Must not know: the broker's code: it reads topics through ``client.topic_reader`` with the
standard Kafka APIs only.

The modules:

* ``core``: ``Audit``, the pure core. Feed it ``add_batch(partition, header, records)`` in log
  order, one partition after another or interleaved, then call ``finish()`` for an
  ``AuditReport`` (``report``). It keeps per producer id and epoch the sequences seen
  (``sequences``) and, for ``by``, hashes of keys or values (``repeats``).
* ``topic``: ``audit_topic`` reads a topic through ``client.topic_reader.TopicReader``, which
  uses the standard Kafka APIs only (Metadata for the leader of each partition, ListOffsets,
  Fetch), so the audit runs against Kafka, Redpanda or any other Kafka-compatible broker as
  well as against oncelog.
* ``transactions``: ``TransactionAudit``, the pure core of the transaction checks (its rules,
  and how a transaction is recognised across partitions, are in its docstring).
* ``text``: the report for people (``--json`` prints ``AuditReport.to_json()``).

What the sequence audit checks, per partition, producer id and epoch (the idempotent
producer's record sequence numbers; the sequence of a record is its batch's base sequence plus
its offset delta, wrapping from 2^31-1 to 0):

* duplicate: a sequence stored twice (the same producer id, epoch and sequence);
* gap: a hole in the sequences of an epoch at the end of the audit (``missing`` counts the
  sequences in the holes); a hole that a later batch fills is reported as a regression instead;
* regression: a batch whose new sequences lie below ones stored before it (out of order), and
  every batch of an epoch older than one already seen for its producer id on the partition
  (a fenced producer that got through).

A new epoch resets expectations: KIP-360 bumps the epoch and restarts sequences at 0. The first
batch seen of an epoch may start anywhere (retention may have deleted the start, and a producer
whose state expired continues where it was). Per epoch the audit keeps the sorted disjoint
ranges of the sequences seen: an idempotent stream is one range, so memory stays tiny however
long the stream; each hole costs 16 bytes. A producer id whose batches on a partition so far
form one run in one epoch (nearly all) is kept packed, about 150 bytes; memory therefore grows
with the number of producer ids and of holes, not with the number of records.

The sequence audit cannot see a duplicate that a producer wrote under a new epoch (as Kafka
stores it in the seed's figure 5) or that a non-idempotent producer, or an application that
sent a record twice, wrote: ``by=("value",)`` / ``("key",)`` finds records whose value (key)
occurs more than once in the topic. Null keys and values are not counted. It does not hold the
values: each record contributes an 8-byte BLAKE2b hash and its location to one of up to 256
bucket files in a temporary directory (16 bytes a record on disk: 160 MB for 10^7 records), and
``finish()`` reads one bucket at a time (about 100 bytes a record of the bucket: 4 MB at 10^7
records, growing linearly past 8.4 million). Two different values share a hash with
probability about n^2 / 2^65 (below 10^-5 for 10^7 distinct values); the examples reported are
read back from the broker and compared byte for byte, so a collision would show as
``same: false`` in an example.

The sequence audit reads uncommitted: records of aborted transactions count like any other.
``by`` counts what a read_committed reader gets: non-transactional batches from the first
read, transactional ones from the read_committed read, so the aborted first try of a retried
transaction is not a repeat, and records of transactions still open are not counted. The
control batches (transaction markers) go to the transaction audit only: where a partition
holds transactional batches, ``transactions`` decides each one from the markers and checks
a read_committed read of the partition against the decisions, and the markers of all
partitions show transactions torn across them.
"""

from __future__ import annotations

from ..protocol.sequences import SEQUENCE_SPACE
from .core import Audit
from .repeats import RepeatExample, RepeatFinder, RepeatReport
from .report import AuditReport, EpochReport, PartitionReport, ProducerReport
from .sequences import SeenSequences
from .text import format_report
from .topic import AuditError, audit_topic, read_partition, record_fields
from .transactions import TransactionAudit, TransactionReport

__all__ = ["SEQUENCE_SPACE", "Audit", "AuditError", "AuditReport", "EpochReport",
           "PartitionReport", "ProducerReport", "RepeatExample", "RepeatFinder", "RepeatReport",
           "SeenSequences", "TransactionAudit", "TransactionReport", "audit_topic",
           "format_report", "read_partition", "record_fields"]
