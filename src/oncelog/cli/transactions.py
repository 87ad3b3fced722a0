"""``oncelog transactions``: list and describe transactions, describe the producers of a
partition, find hanging transactions and abort them, in the manner of Kafka's
``kafka-transactions.sh`` (its columns, its "None" where a value is missing, its messages),
against oncelog or any Kafka broker; and find prepared two-phase commit transactions left
open (``find-prepared``, below), which Kafka's tool has no command for.

A hanging transaction is one a partition holds open (its producer wrote transactional data
and no marker followed) while the transaction coordinator no longer counts that partition in
an ongoing transaction: nothing will ever end it, and the last stable offset of the partition
stays behind it, so read_committed consumers stop there. ``find-hanging`` finds them
(DescribeProducers, then ListTransactions and DescribeTransactions), ``abort`` writes the ABORT
marker that ends one (WriteTxnMarkers to the partition's leader), as Kafka's tool does.

Exit status: 0 done, 1 the broker refused or failed, 2 usage errors.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from ..client.admin.admin import Admin, ProducerInfo, TransactionDescription
from ..client.network.connection import KafkaError
from .errors import Failed, UsageError, admin_for, guarded
from .table import print_tabbed

NONE = "None"
# The states of a transaction, as Kafka spells them (ListTransactions' filter).
STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit",
          "CompleteAbort", "Dead", "PrepareEpochFence")
# While in these states the coordinator will still write markers to the transaction's
# partitions: an open transaction it lists there is not hanging.
_OPEN = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")
# The timeout a coordinator gives a two-phase commit transaction (KIP-939): none.
TWO_PHASE_TIMEOUT_MS = 2**31 - 1


def _now_ms() -> int:
    return int(time.time() * 1000)


def _failed(message: str, exc: KafkaError) -> Failed:
    return Failed(f"{message}: {exc}.")


def partitions_text(partitions: tuple[tuple[str, int], ...]) -> str:
    """Kafka's TopicPartition list: topic-0,topic-1."""
    return ",".join(f"{t}-{p}" for t, p in partitions)


# --- list -------------------------------------------------------------------------------------

def parse_states(text: str) -> list[str]:
    by_lower = {s.lower(): s for s in STATES}
    wanted = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in wanted if s.lower() not in by_lower]
    if unknown or not wanted:
        raise UsageError(f"Invalid state list '{text}'. Valid states are: {', '.join(STATES)}")
    return [by_lower[s.lower()] for s in wanted]


def _list(args: argparse.Namespace) -> int:
    states = parse_states(args.state) if args.state is not None else []
    if args.duration_filter is not None and args.duration_filter < 0:
        raise UsageError("--duration-filter must be 0 or more (milliseconds)")
    producer_ids = args.producer_id or []
    with admin_for(args, "oncelog-transactions") as admin:
        try:
            listed = admin.list_transactions(
                states, producer_ids,
                -1 if args.duration_filter is None else args.duration_filter,
                args.transactional_id_pattern)
        except KafkaError as exc:
            raise _failed("Failed to list transactions", exc) from None
    rows = [(t.transactional_id, str(node), str(t.producer_id), t.state)
            for node, listings in sorted(listed.items()) for t in listings]
    print_tabbed(("TransactionalId", "Coordinator", "ProducerId", "TransactionState"), rows)
    return 0


# --- describe ---------------------------------------------------------------------------------

def describe_row(d: TransactionDescription, now_ms: int) -> tuple[str, ...]:
    started = d.start_ms >= 0 and d.state in _OPEN
    return (str(d.coordinator_id), d.transactional_id, str(d.producer_id),
            str(d.producer_epoch), d.state, str(d.timeout_ms),
            str(d.start_ms) if started else NONE,
            str(now_ms - d.start_ms) if started else NONE, partitions_text(d.partitions))


def _describe(args: argparse.Namespace) -> int:
    txn_id = args.transactional_id
    with admin_for(args, "oncelog-transactions") as admin:
        found = admin.describe_transactions([txn_id])[txn_id]
    if isinstance(found, KafkaError):
        raise _failed(f"Failed to describe transaction state of transactional-id `{txn_id}`",
                      found)
    print_tabbed(("CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch",
                  "TransactionState", "TransactionTimeoutMs", "CurrentTransactionStartTimeMs",
                  "TransactionDurationMs", "TopicPartitions"), [describe_row(found, _now_ms())])
    return 0


# --- describe-producers -----------------------------------------------------------------------

def _producers_of(admin: Admin, topic: str, partition: int, where: str) -> list[ProducerInfo]:
    try:
        return admin.describe_producers(topic, [partition]).get(partition, [])
    except KafkaError as exc:
        raise _failed(f"Failed to describe producers for partition {topic}-{partition} on "
                      f"{where}", exc) from None


def _describe_producers(args: argparse.Namespace) -> int:
    _check_partition(args.partition)
    with admin_for(args, "oncelog-transactions") as admin:
        producers = _producers_of(admin, args.topic, args.partition, "leader")
    rows = [(str(p.producer_id), str(p.epoch), str(p.coordinator_epoch), str(p.last_sequence),
             str(p.last_timestamp),
             str(p.current_txn_start_offset) if p.current_txn_start_offset >= 0 else NONE)
            for p in sorted(producers, key=lambda p: p.producer_id)]
    print_tabbed(("ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence",
                  "LastTimestamp", "CurrentTransactionStartOffset"), rows)
    return 0


def _check_partition(partition: int | None) -> None:
    if partition is not None and partition < 0:
        raise UsageError(f"--partition must be 0 or more, not {partition}")


# --- abort ------------------------------------------------------------------------------------

def _abort(args: argparse.Namespace) -> int:
    _check_partition(args.partition)
    tp = f"{args.topic}-{args.partition}"
    if args.start_offset is None and args.producer_id is None:
        raise UsageError("The transaction to abort must be identified either with "
                         "--start-offset (for brokers on 3.0 or above) or with --producer-id, "
                         "--producer-epoch, and --coordinator-epoch (for older brokers)")
    if args.start_offset is not None and args.producer_id is not None:
        raise UsageError("Give either --start-offset or --producer-id (with --producer-epoch "
                         "and --coordinator-epoch), not both")
    if args.start_offset is None:
        for flag in ("producer_epoch", "coordinator_epoch"):
            if getattr(args, flag) is None:
                raise UsageError(f"Missing required argument --{flag.replace('_', '-')}")
        if not 0 <= args.producer_epoch <= 32767:
            raise UsageError(f"--producer-epoch must be 0 to 32767, not {args.producer_epoch}")
    with admin_for(args, "oncelog-transactions") as admin:
        if args.start_offset is None:
            producer_id, epoch = args.producer_id, args.producer_epoch
            # A transaction that hung before its first marker has coordinator epoch -1:
            # 0 is no greater than any epoch a coordinator wrote, as Kafka's tool reasons.
            coordinator_epoch = max(args.coordinator_epoch, 0)
        else:
            found = [p for p in _producers_of(admin, args.topic, args.partition, "leader")
                     if p.current_txn_start_offset == args.start_offset]
            if not found:
                raise Failed(f"Could not find any open transactions starting at offset "
                             f"{args.start_offset} on partition {tp}")
            producer_id, epoch = found[0].producer_id, found[0].epoch
            coordinator_epoch = max(found[0].coordinator_epoch, 0)
        try:
            admin.abort_transaction(args.topic, args.partition, producer_id, epoch,
                                    coordinator_epoch)
        except KafkaError as exc:
            raise _failed(f"Failed to abort transaction of producer {producer_id} (epoch "
                          f"{epoch}, coordinator epoch {coordinator_epoch}) on partition {tp}",
                          exc) from None
    print(f"Aborted the transaction of producer {producer_id} (epoch {epoch}) on partition "
          f"{tp}.")
    return 0


# --- find-hanging -----------------------------------------------------------------------------

@dataclass(frozen=True)
class OpenTransaction:
    topic: str
    partition: int
    producer: ProducerInfo


def hanging(candidates: list[OpenTransaction], txn_ids: dict[int, str],
            described: dict[str, TransactionDescription | KafkaError]) -> list[OpenTransaction]:
    """Kafka's rule: an open transaction is hanging unless its producer id belongs to a
    transactional id whose coordinator still has this partition in a transaction it will end
    (same producer id, a state in which markers are still to come)."""
    result = []
    for txn in candidates:
        txn_id = txn_ids.get(txn.producer.producer_id)
        d = described.get(txn_id) if txn_id is not None else None
        if isinstance(d, TransactionDescription) and d.producer_id == txn.producer.producer_id \
                and d.state in _OPEN and (txn.topic, txn.partition) in d.partitions:
            continue
        result.append(txn)
    return result


def _partitions_to_search(admin: Admin, args: argparse.Namespace) -> list[tuple[str, int]]:
    if args.topic is not None and args.partition is not None:
        return [(args.topic, args.partition)]
    try:
        info = admin.metadata([args.topic] if args.topic is not None else None)
    except KafkaError as exc:
        raise _failed("Failed to describe topics", exc) from None
    return sorted((t.name, p.index) for t in info.topics.values() for p in t.partitions
                  if args.broker_id is None or args.broker_id in p.replicas)


def _find_hanging(args: argparse.Namespace) -> int:
    if args.topic is None and args.broker_id is None:
        raise UsageError("The `find-hanging` command requires either --topic or --broker-id "
                         "to limit the scope of the search")
    if args.partition is not None and args.topic is None:
        raise UsageError("The --partition argument requires --topic to be provided")
    _check_partition(args.partition)
    if args.max_transaction_timeout < 0:
        raise UsageError("--max-transaction-timeout must be 0 or more (minutes)")
    max_timeout_ms = args.max_transaction_timeout * 60_000
    with admin_for(args, "oncelog-transactions") as admin:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in _partitions_to_search(admin, args):
            by_topic.setdefault(topic, []).append(partition)
        candidates = []
        now = _now_ms()
        for topic, partitions in sorted(by_topic.items()):
            try:
                described = admin.describe_producers(topic, partitions)
            except KafkaError as exc:
                raise _failed(f"Failed to describe producers for {len(partitions)} partitions "
                              f"of topic {topic}", exc) from None
            candidates += [OpenTransaction(topic, partition, p)
                           for partition in partitions for p in described.get(partition, [])
                           if p.current_txn_start_offset >= 0
                           and now - p.last_timestamp > max_timeout_ms]
        found: list[OpenTransaction] = []
        if candidates:
            producer_ids = sorted({c.producer.producer_id for c in candidates})
            try:
                listed = admin.list_transactions(producer_ids=producer_ids)
            except KafkaError as exc:
                raise _failed(f"Failed to list transactions for {len(producer_ids)} producers",
                              exc) from None
            txn_ids = {t.producer_id: t.transactional_id
                       for listings in listed.values() for t in listings}
            found = hanging(candidates, txn_ids,
                            admin.describe_transactions(sorted(set(txn_ids.values()))))
    now = _now_ms()
    rows = [(t.topic, str(t.partition), str(t.producer.producer_id), str(t.producer.epoch),
             str(t.producer.coordinator_epoch), str(t.producer.current_txn_start_offset),
             str(t.producer.last_timestamp), str((now - t.producer.last_timestamp) // 60_000))
            for t in found]
    print_tabbed(("Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch",
                  "StartOffset", "LastTimestamp", "Duration(min)"), rows)
    return 0


# --- find-prepared ----------------------------------------------------------------------------
# A two-phase commit transaction (KIP-939) has no timeout: when its external coordinator (a
# Spark driver, say) dies for good, it stays open, its coordinator still lists it as Ongoing
# (so find-hanging does not show it), and read_committed readers of its partitions wait at its
# first record until someone ends it.

def _find_prepared(args: argparse.Namespace) -> int:
    if args.duration_filter < 0:
        raise UsageError("--duration-filter must be 0 or more (milliseconds)")
    with admin_for(args, "oncelog-transactions") as admin:
        try:
            listed = admin.list_transactions(("Ongoing",), (), args.duration_filter,
                                             args.transactional_id_pattern)
        except KafkaError as exc:
            raise _failed("Failed to list transactions", exc) from None
        ids = sorted({t.transactional_id for ts in listed.values() for t in ts})
        described = admin.describe_transactions(ids)
    now = _now_ms()
    rows = [describe_row(d, now) for d in described.values()
            if isinstance(d, TransactionDescription) and d.state == "Ongoing"
            and d.timeout_ms == TWO_PHASE_TIMEOUT_MS]
    print_tabbed(("CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch",
                  "TransactionState", "TransactionTimeoutMs", "CurrentTransactionStartTimeMs",
                  "TransactionDurationMs", "TopicPartitions"), rows)
    return 0


# --- wiring -----------------------------------------------------------------------------------


def add_transaction_commands(sub, with_bootstrap) -> None:
    txns = sub.add_parser(
        "transactions", help="list and describe transactions, find and abort hanging ones",
        description="Analyse the transactional state of producers, in the manner of "
                    "kafka-transactions.sh: detect and recover from hanging transactions "
                    "(exit status 0 done, 1 refused or failed, 2 usage errors).")
    tsub = txns.add_subparsers(dest="transactions_command", required=True, metavar="ACTION")

    listing = with_bootstrap(tsub.add_parser(
        "list", help="list transactions: TransactionalId Coordinator ProducerId "
                     "TransactionState"))
    listing.add_argument("--state", metavar="STATES",
                         help=f"only these states, comma-separated ({', '.join(STATES)})")
    listing.add_argument("--producer-id", type=int, action="append", metavar="ID",
                         help="only this producer id; may be repeated")
    listing.add_argument("--duration-filter", type=int, metavar="MS",
                         help="only transactions open for longer than MS milliseconds")
    listing.add_argument("--transactional-id-pattern", metavar="REGEX",
                         help="only transactional ids matching this regular expression")
    listing.set_defaults(func=guarded(_list, "transactions"))

    describe = with_bootstrap(tsub.add_parser(
        "describe", help="describe the state of a transactional id",
        description="Describe the state of a transactional id as its coordinator holds it."))
    describe.add_argument("--transactional-id", required=True)
    describe.set_defaults(func=guarded(_describe, "transactions"))

    producers = with_bootstrap(tsub.add_parser(
        "describe-producers", help="the producers a partition remembers, with the start "
                                   "offset of each one's open transaction"))
    producers.add_argument("--topic", required=True)
    producers.add_argument("--partition", type=int, required=True)
    producers.set_defaults(func=guarded(_describe_producers, "transactions"))

    abort = with_bootstrap(tsub.add_parser(
        "abort", help="abort a hanging transaction (writes an ABORT marker)",
        description="Write an ABORT marker for a hanging transaction of a partition. Identify "
                    "it by its start offset (see find-hanging or describe-producers), or by "
                    "producer id, producer epoch and coordinator epoch."))
    abort.add_argument("--topic", required=True)
    abort.add_argument("--partition", type=int, required=True)
    abort.add_argument("--start-offset", type=int, metavar="OFFSET",
                       help="start offset of the transaction to abort")
    abort.add_argument("--producer-id", type=int)
    abort.add_argument("--producer-epoch", type=int)
    abort.add_argument("--coordinator-epoch", type=int)
    abort.set_defaults(func=guarded(_abort, "transactions"))

    find = with_bootstrap(tsub.add_parser(
        "find-hanging", help="find hanging transactions",
        description="List the transactions partitions hold open for longer than "
                    "--max-transaction-timeout that the coordinator does not know as "
                    "ongoing in that partition."))
    find.add_argument("--broker-id", type=int, help="search the partitions of this broker")
    find.add_argument("--max-transaction-timeout", type=int, default=15, metavar="MINUTES",
                      help="only transactions whose last write is older than this "
                           "(default 15, Kafka's transaction.max.timeout.ms)")
    find.add_argument("--topic", help="only this topic")
    find.add_argument("--partition", type=int, help="only this partition (with --topic)")
    find.set_defaults(func=guarded(_find_hanging, "transactions"))

    prepared = with_bootstrap(tsub.add_parser(
        "find-prepared", help="find prepared (two-phase commit) transactions left open",
        description="List the two-phase commit transactions (KIP-939) open for longer than "
                    "--duration-filter. They have no timeout: one whose coordinator (a Spark "
                    "driver, say) is gone holds read_committed readers of its partitions "
                    "back until it is ended (for the Spark sink's: oncelog spark recover)."))
    prepared.add_argument("--duration-filter", type=int, default=900_000, metavar="MS",
                          help="only transactions open for longer than MS milliseconds "
                               "(default 900000, transaction.max.timeout.ms's default)")
    prepared.add_argument("--transactional-id-pattern", metavar="REGEX",
                          help="only transactional ids matching this regular expression")
    prepared.set_defaults(func=guarded(_find_prepared, "transactions"))
