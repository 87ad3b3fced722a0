"""``oncelog audit`` on transactions: the rules of ``audit/transactions.py`` on hand-made
headers, then against a broker: confluent-kafka's transactional producer committing and
aborting across 3 partitions (clean), and a hostile topic whose one transaction was committed
on two partitions and aborted on the third (torn)."""

from __future__ import annotations

import json

from support.audit_helpers import T0, header, produce, run_cli
from support.audit_transactions_helpers import (
    PARTITIONS,
    TIMEOUT,
    torn_topic,
    transactions_by_confluent,
)
from support.brokers import create_topic

from oncelog.audit import audit_topic
from oncelog.audit.transactions import (
    MarkerSeen,
    TransactionAudit,
    TransactionReport,
    transactions_of,
)
from oncelog.protocol.control import Marker
from oncelog.protocol.record_batch import CONTROL_BIT, TRANSACTIONAL_BIT


def data(pid: int, offset: int, n: int = 1, epoch: int = 0):
    return header(pid, epoch, 0, n, offset, attributes=TRANSACTIONAL_BIT)


def control(pid: int, offset: int, epoch: int = 0, ts: int = T0):
    return header(pid, epoch, -1, 1, offset,
                  attributes=TRANSACTIONAL_BIT | CONTROL_BIT)._replace(max_timestamp=ts)


# --- the rules, on headers ------------------------------------------------------------------------

def test_decisions_against_what_read_committed_got():
    txns = TransactionAudit()
    p = 0
    txns.add_batch(p, data(1, 0, 2))  # committed at 4
    txns.add_batch(p, data(2, 2))  # aborted at 5
    txns.add_batch(p, data(1, 3))  # committed at 4
    txns.add_batch(p, control(1, 4), Marker(True, 0))
    txns.add_batch(p, control(2, 5), Marker(False, 0))
    txns.add_batch(p, header(9, 0, 0, 1, 6))  # not transactional: not counted
    txns.add_batch(p, data(3, 7, 3))  # open: no marker
    txns.add_batch(p, control(4, 10), None)  # an emptied control batch
    # read_committed got the first committed batch, the aborted one and the open one, not the
    # second committed one: three findings.
    for offset in (0, 2, 7):
        txns.add_visible(p, data(0, offset))
    txns.finish_partition(p, 10)
    report = txns.finish()
    (row,) = report.partitions
    assert (row.markers, row.committed, row.aborted, row.open) == (2, 3, 1, 3)
    assert (row.aborted_visible, row.open_visible, row.committed_missing) == (1, 3, 1)
    assert report.problems == ["1 aborted record visible to read_committed",
                               "3 open-transaction records visible to read_committed",
                               "1 committed record missing from read_committed"]

    # A committed batch above the last stable offset, or deleted before read_committed got to
    # it, is not missing; an open one above it is no finding.
    txns = TransactionAudit()
    txns.add_batch(0, data(1, 0))
    txns.add_batch(0, data(1, 1))
    txns.add_batch(0, control(1, 2), Marker(True, 0))
    txns.add_batch(0, data(2, 3))
    txns.add_lost(0, 0, 1)
    txns.finish_partition(0, 1)
    report = txns.finish()
    assert report.problems == [] and report.totals["open_records"] == 1


def marker(partition: int, offset: int, pid: int, epoch: int, commit: bool, ts: int):
    return MarkerSeen(partition, offset, pid, epoch, commit, 0, ts, 1)


def test_transactions_across_partitions_and_torn_ones():
    # Transaction version 2: the epoch names the transaction, whatever the clocks say.
    tv2 = [marker(0, 5, 1, 1, True, 900), marker(1, 5, 1, 1, True, 100),
           marker(0, 9, 1, 2, False, 100), marker(1, 9, 1, 2, False, 50)]
    assert [[(m.partition, m.epoch) for m in t] for t in transactions_of(tv2)] == [
        [(1, 1), (0, 1)], [(1, 2), (0, 2)]]
    # Transaction version 1: one epoch; cut by time where a partition would repeat or after a
    # pause, a tie in the millisecond settled by the markers' rank on their partition.
    tv1 = [marker(0, 5, 1, 0, True, 100), marker(1, 5, 1, 0, True, 101),
           marker(0, 9, 1, 0, False, 101), marker(1, 9, 1, 0, False, 102),
           marker(2, 3, 1, 0, True, 1000), marker(0, 12, 1, 0, True, 1010),
           marker(1, 12, 1, 0, False, 1011), marker(2, 7, 1, 0, False, 1300)]
    found = transactions_of(tv1)
    assert [[(m.partition, m.offset) for m in t] for t in found] == [
        [(0, 5), (1, 5)], [(0, 9), (1, 9)], [(2, 3), (0, 12), (1, 12)], [(2, 7)]]
    report = TransactionReport.build([], tv1)
    assert report.transactions == 4
    (torn,) = report.torn
    assert (torn.producer_id, torn.committed, torn.aborted, torn.timestamp) == (1, [0, 2], [1],
                                                                              1000)


# --- against a broker -----------------------------------------------------------------------------


def test_transactions_of_a_real_producer_are_clean(broker, capsys):
    counts, producer = transactions_by_confluent(broker.bootstrap, "txns")
    try:
        report = audit_topic(broker.bootstrap, "txns")
        assert report.clean, report.problems
        t = report.totals
        assert (t["committed_records"], t["aborted_records"], t["open_records"]) == (
            counts["committed"], counts["aborted"], counts["open"])
        assert (t["transactions"], t["torn_transactions"]) == (5, 0)
        assert t["records"] == 180 + PARTITIONS
        code, out = run_cli(capsys, "--bootstrap-server", broker.bootstrap, "--topic", "txns")
        assert code == 0, out
        assert out.splitlines()[-1] == (
            "CLEAN: 183 records in 3 partitions, 2 producer ids; no duplicate, gap or "
            "regression; 5 transactions: no aborted or open-transaction record visible to "
            "read_committed, no committed record missing, no torn transaction")
        assert "READ_COMMITTED_TO" in out and "0 torn transactions" in out
    finally:
        producer.abort_transaction(TIMEOUT)


def test_a_torn_transaction_is_reported(broker, capsys):
    torn_topic(broker.bootstrap, "torn")
    code, out = run_cli(capsys, "--bootstrap-server", broker.bootstrap, "--topic", "torn")
    assert code == 1, out
    assert out.splitlines()[-1] == (
        "NOT CLEAN: 6 records in 3 partitions, 1 producer id; 1 torn transaction")
    assert "torn: producer id " in out
    assert "committed on partition 0, 1 (3 records), aborted on partition 2 (3 records)" in out
    code, out = run_cli(capsys, "--bootstrap-server", broker.bootstrap, "--topic", "torn",
                        "--json")
    report = json.loads(out)
    (torn,) = report["transactions"]["torn"]
    assert (torn["committed"], torn["aborted"]) == ([0, 1], [2])
    assert report["totals"]["aborted_records"] == 3 and report["totals"]["committed_records"] == 3


def test_transactions_of_kafka_python_are_clean(broker):
    """kafka-python's transactional producer (one epoch for all its transactions: the markers
    are told apart by the rule for transaction version 1)."""
    from kafka import KafkaProducer

    create_topic(broker.bootstrap, "kp", PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kp-tx",
                             request_timeout_ms=int(TIMEOUT * 1000))
    try:
        producer.init_transactions()
        for round_ in range(6):
            producer.begin_transaction()
            for i in range(9):
                producer.send("kp", value=b"%d-%d" % (round_, i), partition=i % PARTITIONS)
            producer.flush(TIMEOUT)
            if round_ % 3 == 1:
                producer.abort_transaction()
            else:
                producer.commit_transaction()
    finally:
        producer.close(TIMEOUT)
    report = audit_topic(broker.bootstrap, "kp")
    assert report.clean, report.problems
    assert {len(row.epochs) for row in report.producers} == {1}
    t = report.totals
    assert (t["transactions"], t["committed_records"], t["aborted_records"],
            t["open_records"]) == (6, 36, 18, 0)


def test_transactions_of_oncelogs_producer_are_clean(broker):
    """oncelog's transactional producer (transaction version 2: a new epoch per transaction,
    the markers named by it)."""
    from oncelog import Producer as OncelogProducer

    create_topic(broker.bootstrap, "own", PARTITIONS)
    producer = OncelogProducer({"bootstrap.servers": broker.bootstrap,
                                "transactional.id": "own-tx"})
    try:
        producer.init_transactions(TIMEOUT)
        for round_ in range(4):
            producer.begin_transaction()
            for i in range(6):
                producer.produce("own", b"%d-%d" % (round_, i), partition=i % PARTITIONS)
            producer.flush(TIMEOUT)
            if round_ % 2:
                producer.abort_transaction(TIMEOUT)
            else:
                producer.commit_transaction(TIMEOUT)
    finally:
        producer.close(TIMEOUT)
    report = audit_topic(broker.bootstrap, "own")
    assert report.clean, report.problems
    assert {len(row.epochs) for row in report.producers} == {4}  # one epoch per transaction
    t = report.totals
    assert (t["transactions"], t["committed_records"], t["aborted_records"]) == (4, 12, 12)


def test_by_value_counts_what_read_committed_gets(broker):
    """A retried transaction (aborted, then the same values committed) holds no repeated
    value; records of a transaction still open are not counted; a committed copy is."""
    from oncelog import Producer as OncelogProducer

    create_topic(broker.bootstrap, "retried", PARTITIONS)
    config = {"bootstrap.servers": broker.bootstrap}
    producer = OncelogProducer({**config, "transactional.id": "retried-tx"})
    still_open = OncelogProducer({**config, "transactional.id": "open-tx"})
    try:
        producer.init_transactions(TIMEOUT)
        for decide in (producer.abort_transaction, producer.commit_transaction):
            producer.begin_transaction()
            for i in range(6):
                producer.produce("retried", b"v%d" % i, partition=i % PARTITIONS)
            producer.flush(TIMEOUT)
            decide(TIMEOUT)
        still_open.init_transactions(TIMEOUT)
        still_open.begin_transaction()
        still_open.produce("retried", b"v1", partition=0)
        still_open.flush(TIMEOUT)
        report = audit_topic(broker.bootstrap, "retried", by=("value",))
        assert [r.extra for r in report.repeats] == [0]
        assert report.repeats[0].records == 6
        produce(broker.bootstrap, "retried", [(2, b"v4")])  # a plain copy of a committed value
        report = audit_topic(broker.bootstrap, "retried", by=("value",))
    finally:
        still_open.abort_transaction(TIMEOUT)
        still_open.close(TIMEOUT)
        producer.close(TIMEOUT)
    repeat = report.repeats[0]
    assert (repeat.records, repeat.repeated, repeat.extra, repeat.by_partition) == (7, 1, 1, {2: 1})
    assert [(e.count, e.data) for e in repeat.examples] == [(2, b"v4")]
