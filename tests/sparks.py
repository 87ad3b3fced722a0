"""One Spark session per test process, shared by the Spark tests (they all run in one xdist
worker: ``pytest.mark.xdist_group("spark")`` and ``--dist loadgroup``).

local[2], the UI off, 2 shuffle partitions, everything bound to 127.0.0.1, and the workers
running this interpreter (``PYSPARK_PYTHON``), which has pyarrow and oncelog.
"""

from __future__ import annotations

import os
import sys

_current: dict[str, object] = {}


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
