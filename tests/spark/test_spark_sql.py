"""format("oncelog") from Spark SQL, as SQL users write jobs: a view made with
CREATE TEMPORARY VIEW ... USING oncelog OPTIONS (...) to SELECT from and INSERT INTO (exactly
once, read back read_committed); and the limit of Spark 4.3: a catalog table's OPTIONS
(CREATE TABLE ... USING oncelog) reach a Python data source's schema only, so reading or
writing such a table fails, saying so."""

from __future__ import annotations

import pytest
from support.spark_read_helpers import create, produce

from oncelog import Consumer, TopicPartition


def test_sql_views_select_and_insert_and_the_table_limit(spark, start_broker):
    bootstrap = start_broker().bootstrap
    create(bootstrap, "sql_in", 2)
    create(bootstrap, "sql_out", 1)
    produce(bootstrap, "sql_in", [(i % 2, b"k%d" % i, b"v%d" % i, None, None)
                                  for i in range(20)])
    try:
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW sql_in USING oncelog OPTIONS ("
                  f"'kafka.bootstrap.servers' '{bootstrap}', subscribe 'sql_in')")
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW sql_out USING oncelog OPTIONS ("
                  f"'kafka.bootstrap.servers' '{bootstrap}', topic 'sql_out')")
        rows = spark.sql("SELECT cast(value AS string) AS v FROM sql_in WHERE offset >= 5"
                         ).collect()
        assert sorted(r.v for r in rows) == sorted(f"v{i}" for i in range(20) if i // 2 >= 5)
        spark.sql("INSERT INTO sql_out (key, value) "
                  "SELECT key, cast(upper(cast(value AS string)) AS binary) FROM sql_in")

        spark.sql(f"CREATE TABLE sql_table USING oncelog OPTIONS ("
                  f"'kafka.bootstrap.servers' '{bootstrap}', subscribe 'sql_in')")
        with pytest.raises(Exception, match=r"Spark 4 hands a SQL table's OPTIONS \(CREATE "
                                            r"TABLE \.\.\. USING oncelog\) to a Python data "
                                            r"source's schema only"):
            spark.sql("SELECT * FROM sql_table").collect()
    finally:
        spark.sql("DROP VIEW IF EXISTS sql_in")
        spark.sql("DROP VIEW IF EXISTS sql_out")
        spark.sql("DROP TABLE IF EXISTS sql_table")
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                   "isolation.level": "read_committed"}) as c:
        c.assign([TopicPartition("sql_out", 0)])
        out = list(c)
    assert sorted((r.key, r.value) for r in out) == sorted((b"k%d" % i, b"V%d" % i)
                                                           for i in range(20))
    assert all(r.producer_id >= 0 for r in out)  # the exactly-once sink's transactions
