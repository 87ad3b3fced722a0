"""``format("oncelog_held")``: oncelog's sink whose commit stops at a chosen point, for the
tests that kill a driver there or let it go on (tests/spark/test_spark_exactly_once_jobs.py,
and tests/support/spark_write_job.py, the driver the Spark tests kill)."""

from __future__ import annotations

import time
from pathlib import Path

from oncelog.spark.source import OncelogDataSource


def held_source(entered: Path, release: Path | None, wait: float,
                stream_after_batch: int | None = None):
    """A batch write holds before its commit; a stream holds after committing micro-batch
    ``stream_after_batch`` and each later one (not at all when None). Made in a function, so
    that Spark pickles the class by value to the process that commits (everything it uses
    is made here too: a function of this module would be pickled by name, and the Python
    workers need not find this module)."""

    def _hold(entered: Path, release: Path | None, wait: float) -> None:
        """Touch ``entered``, then wait (bounded by ``wait`` seconds) for ``release`` to exist,
        or out the whole ``wait`` when there is none (the test kills the process meanwhile)."""
        entered.touch()
        deadline = time.monotonic() + wait
        while (release is None or not release.exists()) and time.monotonic() < deadline:
            time.sleep(0.05)

    class Held(OncelogDataSource):
        @classmethod
        def name(cls) -> str:
            return "oncelog_held"

        def writer(self, schema, overwrite):
            writer = super().writer(schema, overwrite)
            real = writer.commit

            def commit(messages) -> None:
                _hold(entered, release, wait)
                real(messages)

            writer.commit = commit
            return writer

        def streamWriter(self, schema, overwrite):
            writer = super().streamWriter(schema, overwrite)
            real = writer.commit

            def commit(messages, batch_id: int) -> None:
                real(messages, batch_id)
                if stream_after_batch is not None and batch_id >= stream_after_batch:
                    _hold(entered, release, wait)

            writer.commit = commit
            return writer

    return Held
