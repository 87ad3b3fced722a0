"""``format("oncelog_paused")``: oncelog's sink whose tasks stop halfway through their rows,
their transactions open with rows in the log, until the test has killed a broker
(tests/spark/test_spark_on_cluster.py)."""

from __future__ import annotations

from pathlib import Path

from oncelog.spark.source import OncelogDataSource


def paused_source(folder: Path, holds: frozenset[str], wait: float):
    """Each task pauses after its N-th Arrow batch (from 0) of a batch write (hold
    ``batch.N``) or of micro-batch B (hold ``B.N``) when the hold is in ``holds``: it
    touches ``folder/entered-HOLD-P`` (P its partition) and waits (bounded by ``wait``
    seconds) for ``folder/release-HOLD``. Made in a function, so that Spark pickles it by
    value to its Python workers (as tests/support/held_sink.py)."""

    def _paused(batches):
        import time

        from pyspark import TaskContext

        context = TaskContext.get()
        key = context.getLocalProperty("streaming.sql.batchId") or "batch"
        for n, batch in enumerate(batches):
            yield batch
            hold = f"{key}.{n}"
            if hold not in holds or context.attemptNumber() > 0:
                continue
            (folder / f"entered-{hold}-{context.partitionId()}").touch()
            deadline = time.monotonic() + wait
            while not (folder / f"release-{hold}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    def _pausing(writer):
        real = writer.write
        writer.write = lambda iterator: real(_paused(iterator))
        return writer

    class Paused(OncelogDataSource):
        @classmethod
        def name(cls) -> str:
            return "oncelog_paused"

        def writer(self, schema, overwrite):
            return _pausing(super().writer(schema, overwrite))

        def streamWriter(self, schema, overwrite):
            return _pausing(super().streamWriter(schema, overwrite))

    return Paused
