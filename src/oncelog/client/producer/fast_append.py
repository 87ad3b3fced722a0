"""produce()'s fast path: the compiled OpenBatches of _append.c when it was built, else a
Python stand-in whose ``append`` always answers None (and ``append_many`` appends no row),
so that every record takes the Python path under the accumulator's lock (which the compiled
one only shortcuts; see _append.c).

Both keep the partitions' open batches (``set``) and the bytes buffered (``reserve``,
``release``, ``buffered``), which the fast path changes without the lock.
"""

from __future__ import annotations

from typing import Any

from ...protocol import records

compiled: Any = None
if records.compiled is not None:  # off too with ONCELOG_PURE_PYTHON=1
    try:
        from . import _append as compiled
    except ImportError:  # built without a C compiler, or a Python without the GIL
        pass


class PyFutureBase:
    """What a RecordFuture holds: its batch and its index in it."""

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: Any, index: int) -> None:
        self._batch = batch
        self._index = index


class PyOpenBatches:
    """The Python twin of _append.OpenBatches, without the fast path: every record is the
    accumulator's to append, under its lock, which also guards ``buffered`` here."""

    def __init__(self, partition_counts: dict[str, int], sticky: dict[str, list[int]],
                 future_type: type, batch_size: int, batch_records: int, buffer_memory: int,
                 record_limit: int, partitioner: int) -> None:
        self.buffered = 0
        self.enabled = True

    def append(self, topic: str, value: Any, key: Any, partition: int | None, headers: Any,
               timestamp: int | None, on_delivery: Any) -> None:
        return None

    def append_many(self, topic: str, start: int, stop: int, values: Any, keys: Any,
                    partitions: Any) -> int:
        return start

    def set(self, topic: str, partition: int, batch: Any) -> None:
        pass

    def reserve(self, builder: Any, n: int) -> None:
        builder.accounted += n
        self.buffered += n

    def release(self, n: int) -> None:
        self.buffered -= n


# How the fast path may choose a partition when produce() names none (producer_config's
# partitioner names); anything else (random, a callable) is the Python path's.
PARTITION_BY_PYTHON, PARTITION_MURMUR2_RANDOM, PARTITION_MURMUR2 = range(3)
PARTITIONERS = {"murmur2_random": PARTITION_MURMUR2_RANDOM, "murmur2": PARTITION_MURMUR2}

FutureBase: Any = compiled.FutureBase if compiled is not None else PyFutureBase
# Looked up at each accumulator's creation, so a test can set it to PyOpenBatches.
OpenBatches: Any = compiled.OpenBatches if compiled is not None else PyOpenBatches
