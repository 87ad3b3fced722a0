"""format("oncelog") from a Spark Connect client (pyspark.sql.connect, an sc:// session)
against a real Spark Connect server the test starts (tests/support/spark_connect_job.py): the server
finds the data source as a classic session does, and a read and an exactly-once write work
as they do there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.spark_read_helpers import TIMEOUT, create, produce

from oncelog import Consumer, TopicPartition

pytest.importorskip("grpc", reason="Spark Connect's client needs pyspark[connect]")


def test_read_and_write_through_spark_connect(start_broker):
    bootstrap = start_broker().bootstrap
    create(bootstrap, "connect_in", 2)
    create(bootstrap, "connect_out", 1)
    produce(bootstrap, "connect_in", [(i % 2, b"k%d" % i, b"v%d" % i, None, None)
                                      for i in range(12)])
    job = Path(__file__).parents[1] / "support" / "spark_connect_job.py"
    done = subprocess.run([sys.executable, str(job), bootstrap, "connect_in", "connect_out"],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["session"] == "pyspark.sql.connect.session"
    assert result["values"] == sorted(f"v{i}" for i in range(12))
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                   "isolation.level": "read_committed"}) as c:
        c.assign([TopicPartition("connect_out", 0)])
        out = list(c)
    assert sorted(r.value for r in out) == sorted(b"V%d" % i for i in range(12))
    assert all(r.producer_id >= 0 for r in out)
