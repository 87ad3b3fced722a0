"""One Spark session per test process, shared by the Spark tests that process runs. The Spark
tests carry no xdist group: ``-n 2`` spreads them over both workers, each with its session
(its own JVM), so that neither worker holds all of Spark's minutes. (Under pytest 9.2 with
pytest-xdist 3.8 ``xdist_group`` does nothing anyway: xdist renames ``item._nodeid``, which
pytest no longer reads.)

local[2], the UI off, 2 shuffle partitions, everything bound to 127.0.0.1, and the workers
running this interpreter (``PYSPARK_PYTHON``), which has pyarrow and oncelog.
"""

from __future__ import annotations

import os
import sys

_current: dict[str, object] = {}

# For every JVM the tests start (this session's, a driver's of tests/support/spark_write_job.py, a
# standalone cluster's): the JIT's first tier only and one GC thread. These JVMs live for
# seconds to minutes on two shared cores, where C2's compiler threads and the parallel GC
# took half of their CPU (a session and three small jobs: 33 s of CPU, 15 s with these).
JAVA_ENV = {"JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}


def spark_session(master: str = "local[2]"):
    """The shared session, restarted with ``master`` if it runs another one (the task-retry
    test wants ``local[2,3]``: three attempts per task)."""
    from pyspark.sql import SparkSession

    session = _current.get("session")
    if session is not None and _current.get("master") == master:
        return session
    stop()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ.update(JAVA_ENV)
    session = (SparkSession.builder.master(master).appName("oncelog-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.streaming.stopTimeout", "30s")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    _current.update(session=session, master=master)
    return session


def stop() -> None:
    session = _current.pop("session", None)
    _current.pop("master", None)
    if session is not None:
        session.stop()
