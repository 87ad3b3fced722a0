"""Which pyspark the data source runs on: 4.2 or newer, before 5.

Streaming reads use the admission-control API of Python streaming sources that pyspark 4.2
added (``pyspark.sql.streaming.datasource``: ``ReadLimit`` for maxOffsetsPerTrigger,
``SupportsTriggerAvailableNow``, ``latestOffset(start, limit)``), and streaming writes the
Arrow stream writer of 4.1 (``DataSourceStreamArrowWriter``). Rather than an ImportError deep
inside pyspark, an older pyspark gets an error that says what is needed.
"""

from __future__ import annotations

import re

MINIMUM = (4, 2)


class PySparkVersionError(ImportError):
    """The installed pyspark is too old (or too new) for format("oncelog")."""


def problem(version: str) -> str | None:
    """Why pyspark ``version`` cannot run the data source, or None if it can."""
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
    if len(numbers) == 2 and MINIMUM <= numbers < (5, 0):
        return None
    return (f'format("oncelog") needs pyspark >=4.2,<5 (streaming reads use the Python '
            f"streaming source API of pyspark 4.2: pyspark.sql.streaming.datasource); this is "
            f"pyspark {version}. Install a supported one: pip install 'pyspark>=4.2,<5'")


def require_pyspark() -> None:
    """Raise PySparkVersionError unless the installed pyspark is supported."""
    import pyspark

    reason = problem(pyspark.__version__)
    if reason is not None:
        raise PySparkVersionError(reason)
