"""The Python daemon of the Spark drivers the tests start (``spark.python.daemon.module``, set
by tests/support/sparks.py): pyspark's own daemon, after importing what its forks import.

Spark forks every Python worker from a daemon per kind of worker: a UDF's, and one fork per
call of a Python data source's create, plan, write and commit, and per micro-batch of a
stream's commit. pyspark's daemon imports nothing before it forks, so each fork imported
pyspark's worker module and then, unpickling format("oncelog"), oncelog's client and kio:
0.9 s of CPU a fork, several times per job and per micro-batch. Imported here once, a fork
finds them in memory, as tests/support/broker_zygote.py does for brokers.

Not pyarrow, nor what imports it (oncelog.spark, pyspark's read planner): it starts threads
as it is imported (jemalloc's), and a fork of a process with threads may inherit a lock one
of them held; pyspark's daemon imports the worker module after the fork for that reason.
If the preload started a thread after all, this process becomes pyspark's own daemon
(exec: nothing imported, no thread), which is slower and never wrong.
"""

from __future__ import annotations

import importlib
import os
import sys

# Imported before the fork: oncelog's clients (and kio's schema) without its Spark package,
# which imports pyarrow.
PRELOAD = ("oncelog.client.admin.admin", "oncelog.client.producer.producer",
           "oncelog.client.topic_reader", "oncelog.protocol.batches", "oncelog.protocol.records",
           "oncelog.protocol.sequences", "pyspark.sql.datasource",
           "pyspark.sql.streaming.datasource", "pyspark.sql.types")
# pyspark's worker modules that import neither pyarrow nor pandas (a fork of the others
# imports them after the fork, as pyspark does).
_WORKERS = ("pyspark.worker", "pyspark.sql.worker.")
_THREADED = ("pyspark.sql.worker.plan_data_source_read",)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def preload(worker_module: str) -> bool:
    """Import what a fork for ``worker_module`` imports; False if that started a thread."""
    names = list(PRELOAD)
    if worker_module.startswith(_WORKERS) and worker_module not in _THREADED:
        names.append(worker_module)
    for name in names:
        importlib.import_module(name)
    return _threads() == 1


if __name__ == "__main__":
    if not preload(sys.argv[1] if len(sys.argv) > 1 else "pyspark.worker"):
        os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *sys.argv[1:]])
    from pyspark import daemon

    daemon.manager()
