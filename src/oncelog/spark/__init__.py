"""PySpark data source ``format("oncelog")``: read and write topics from Spark.

Owns: the source and its options, the two-phase-commit sink, the audit on Spark. Must not
know: the broker's code (it reads and writes through ``oncelog.client``).

Installing oncelog with pyspark present is enough: Spark finds the source through the
``pyspark_oncelog`` module. ``register(spark)`` registers it by hand (for example in a session
whose Python path does not include it when Spark looks).
"""

from __future__ import annotations

from .version import require_pyspark

require_pyspark()

from .source import OncelogDataSource  # noqa: E402 (only once pyspark is known to fit)

__all__ = ["OncelogDataSource", "register"]


def register(spark) -> None:
    """Make ``format("oncelog")`` available in ``spark`` (a SparkSession)."""
    spark.dataSource.register(OncelogDataSource)
