"""``oncelog audit --spark`` reports what the one-process audit reports, on a clean topic, on
one holding duplicates, gaps and regressions, and on transactions (clean and torn) with
``--by``."""

from __future__ import annotations

import io
import json

from support.audit_helpers import produce, store_forgetting
from support.audit_transactions_helpers import TIMEOUT as TXN_TIMEOUT
from support.audit_transactions_helpers import torn_topic, transactions_by_confluent
from support.brokers import create_topic

from oncelog.audit import audit_topic, format_report
from oncelog.cli.main import main
from oncelog.spark.audit import audit_topic_on_spark

TIMEOUT = 30.0


def same_reports(spark_report, plain_report) -> None:
    spark_json, plain_json = spark_report.to_json(), plain_report.to_json()
    for report in (spark_json, plain_json):
        report.pop("seconds")
    assert spark_json == plain_json
    texts = []
    for report in (spark_report, plain_report):
        out = io.StringIO()
        format_report(report, out)
        texts.append(out.getvalue())
    assert texts[0] == texts[1]


def test_clean_topic_cut_into_many_ranges(spark, broker, capsys):
    create_topic(broker.bootstrap, "clean", 3)
    produce(broker.bootstrap, "clean", [(i % 3, b"v%d" % i) for i in range(3000)],
            **{"enable.idempotence": True, "batch.num.messages": 7})
    produce(broker.bootstrap, "clean", [(0, b"plain")], **{"enable.idempotence": False})
    plain = audit_topic(broker.bootstrap, "clean")
    on_spark = audit_topic_on_spark(spark, broker.bootstrap, "clean", min_partitions=9)
    assert on_spark.clean and on_spark.totals["records"] == 3001
    same_reports(on_spark, plain)

    capsys.readouterr()
    assert main(["audit", "--bootstrap-server", broker.bootstrap, "--topic", "clean",
                 "--spark", "--json", "--partition", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["partition"] for p in report["partitions"]] == [1]
    assert report["verdict"] == ("CLEAN: 1,000 records in 1 partition, 1 producer id; "
                                 "no duplicate, gap or regression")


def test_duplicates_gaps_and_regressions_as_the_one_process_audit_finds_them(
        spark, start_broker, capsys):
    """As test_audit's forgetful broker: a retried batch stored again, a lost one, a late one;
    on two partitions, plus a second epoch."""
    broker = start_broker(**{"producer.id.expiration.ms": "1",
                             "producer.id.expiration.check.interval.ms": "50",
                             "producer.id.tombstone.ms": "0"})
    create_topic(broker.bootstrap, "forgot", 2)
    store_forgetting(broker.bootstrap, "forgot", [
        (0, 0, 0, [b"a", b"b"]), (0, 0, 0, [b"a", b"b"]), (0, 0, 10, [b"k"]), (0, 0, 5, [b"f"]),
        (1, 0, 0, [b"x"] * 5), (1, 1, 0, [b"y"] * 3), (1, 0, 5, [b"z"])])
    plain = audit_topic(broker.bootstrap, "forgot")
    on_spark = audit_topic_on_spark(spark, broker.bootstrap, "forgot", min_partitions=4)
    assert not on_spark.clean
    assert on_spark.problems == ["2 duplicate sequences", "2 gaps (7 missing sequences)",
                                 "2 regressed sequences"]
    same_reports(on_spark, plain)

    capsys.readouterr()
    assert main(["audit", "--bootstrap-server", broker.bootstrap, "--topic", "forgot",
                 "--spark"]) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("NOT CLEAN: 15 records")


def test_transactions_and_repeats_as_the_one_process_audit_finds_them(spark, broker, capsys):
    """confluent-kafka's committed, aborted and open transactions over 3 partitions with
    repeated values beside them, cut into more ranges than partitions; then a torn one."""
    counts, producer = transactions_by_confluent(broker.bootstrap, "txns")
    try:
        produce(broker.bootstrap, "txns", [(2, b"committed-0-3"), (0, b"committed-0-3"),
                                           (1, b"aborted-1-7"), (2, b"aborted-1-7")])
        plain = audit_topic(broker.bootstrap, "txns", by=("value", "key"), examples=3)
        on_spark = audit_topic_on_spark(spark, broker.bootstrap, "txns", min_partitions=7,
                                        by=("value", "key"), examples=3)
    finally:
        producer.abort_transaction(TXN_TIMEOUT)
    # the aborted copy of aborted-1-7 is not counted: read_committed never gets it
    assert on_spark.problems == ["2 values repeated (3 extra records)"]
    t = on_spark.totals
    assert (t["committed_records"], t["aborted_records"], t["open_records"]) == (
        counts["committed"], counts["aborted"], counts["open"])
    assert t["repeated_keys"] == 0
    same_reports(on_spark, plain)

    torn_topic(broker.bootstrap, "torn")
    plain = audit_topic(broker.bootstrap, "torn")
    capsys.readouterr()
    assert main(["audit", "--bootstrap-server", broker.bootstrap, "--topic", "torn",
                 "--spark", "--json", "--min-partitions", "4"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["problems"] == ["1 torn transaction"]
    plain_json = plain.to_json()
    for r in (report, plain_json):
        r.pop("seconds")
    assert report == plain_json


def test_spark_audit_usage_errors(capsys):
    assert main(["audit", "--topic", "t", "--spark", "--min-partitions", "0"]) == 2
