"""Spark looks for Python data sources in modules named ``pyspark_*`` that define
``DefaultSource``: this one makes ``format("oncelog")`` work with no registration."""

from oncelog.spark import OncelogDataSource as DefaultSource

__all__ = ["DefaultSource"]
