"""Spark looks for Python data sources in modules named ``pyspark_*`` that define
``DefaultSource``: this one makes ``format("oncelog")`` work with no registration.

Spark imports every such module when it first looks up a Python data source, so this import
must not fail: under a pyspark the source cannot run on (see ``oncelog.spark.version``), or
without pyarrow, ``format("oncelog")`` resolves to a stand-in that raises the reason as soon
as it is used, instead of Spark's "data source not found".
"""

try:
    from oncelog.spark import OncelogDataSource as DefaultSource
except ImportError as exc:
    from pyspark.sql.datasource import DataSource

    _REASON = str(exc)

    class DefaultSource(DataSource):  # type: ignore[no-redef]
        @classmethod
        def name(cls) -> str:
            return "oncelog"

        def _fail(self, *args: object) -> None:
            raise ImportError(_REASON)

        schema = reader = streamReader = writer = streamWriter = _fail

__all__ = ["DefaultSource"]
