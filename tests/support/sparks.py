"""One Spark session per test process, shared by the Spark tests that process runs. The Spark
tests carry no xdist group: ``-n 2`` spreads them over both workers, each with its session
(its own JVM), so that neither worker holds all of Spark's minutes. (Under pytest 9.2 with
pytest-xdist 3.8 ``xdist_group`` does nothing anyway: xdist renames ``item._nodeid``, which
pytest no longer reads.)

local[2], the UI off, 2 shuffle partitions, everything bound to 127.0.0.1, and the workers
running this interpreter (``PYSPARK_PYTHON``), which has pyarrow and oncelog, forked from the
daemon of tests/support/spark_daemon.py (oncelog imported once, not by every fork).
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


# The settings of every local-mode session the tests make (the shared one, a killed driver's).
SESSION_CONFIG = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stopTimeout": "30s",
}


def worker_path() -> str:
    """A Python path on which Spark's Python workers find tests/support/spark_daemon.py."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))


def worker_config() -> dict[str, str]:
    """The Python workers' settings of every driver the tests start, local or not: forked
    from tests/support/spark_daemon.py. (A local driver's workers take their Python path from
    the JVM's environment, see spark_session; an executor's from spark.executorEnv.)"""
    return {"spark.python.daemon.module": "spark_daemon",
            "spark.executorEnv.PYTHONPATH": worker_path()}


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
    builder = SparkSession.builder.master(master).appName("oncelog-tests")
    for key, value in {**SESSION_CONFIG, **worker_config()}.items():
        builder = builder.config(key, value)
    # The JVM's environment, which its Python workers inherit, not this process's for good
    # (the brokers and tools the tests start after it).
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = worker_path()
    try:
        session = builder.getOrCreate()
    finally:
        if path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = path
    session.sparkContext.setLogLevel("ERROR")
    _current.update(session=session, master=master)
    return session


def stop() -> None:
    session = _current.pop("session", None)
    _current.pop("master", None)
    if session is not None:
        session.stop()
