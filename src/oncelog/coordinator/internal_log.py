"""What the coordinators share about their internal topics (``__consumer_offsets``,
``__transaction_state``): the partition a key lands in, as Kafka chooses it, and the log of a
partition as a coordinator sees it (``OffsetsLog``), with the one error its writes raise."""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from typing import Protocol

from kio.schema.errors import ErrorCode


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (over UTF-16 code units), as a signed 32-bit int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


# Java's hash walks the id in Python, and every group request needs it: cached, per number
# of partitions, in a plain dict (the id is the key the coordinator keeps anyway; an
# lru_cache entry cost 150 bytes a group more, issue 26), emptied when full.
_PARTITIONS: dict[int, dict[str, int]] = {}
MAX_CACHED_PARTITIONS = 1 << 16


def partition_for(group_id: str, num_partitions: int) -> int:
    """The offsets-topic partition of a group, as Kafka chooses it (Utils.abs of the hash)."""
    cache = _PARTITIONS.get(num_partitions)
    if cache is None:
        cache = _PARTITIONS[num_partitions] = {}
    partition = cache.get(group_id)
    if partition is None:
        h = java_string_hash(group_id)
        partition = (0 if h == -(1 << 31) else abs(h)) % num_partitions
        if len(cache) >= MAX_CACHED_PARTITIONS:
            cache.clear()
        cache[group_id] = partition
    return partition


class WriteFailed(Exception):
    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


class NotReplicated(OSError):
    """A write the log took that did not reach the in-sync replicas (cluster mode: the ISR
    shrank below min.insync.replicas, the wait timed out, or this broker lost the lead
    meanwhile): never answered as a success. ``error`` is what a coordinator's request
    answers, Kafka's mapping (NOT_COORDINATOR when the lead was lost, else
    COORDINATOR_NOT_AVAILABLE)."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


def durable_error(exc: OSError) -> ErrorCode:
    """What a coordinator answers for a write that did not become durable: a write not
    replicated says its own error; a failed fsync (its log directory failing, which moves
    the partition's leadership away) NOT_COORDINATOR, Kafka's mapping of
    KAFKA_STORAGE_ERROR for coordinator writes: a client finds the coordinator again and
    retries, where KAFKA_STORAGE_ERROR is fatal to the Java clients' OffsetCommit,
    JoinGroup, InitProducerId, AddPartitionsToTxn and EndTxn ("Unexpected error")."""
    return exc.error if isinstance(exc, NotReplicated) else ErrorCode.not_coordinator


class OffsetsLog(Protocol):
    """Where the coordinator's records go: a partition of ``__consumer_offsets``."""

    def append(self, partition: int, records: list[tuple[bytes, bytes | None]]
               ) -> Awaitable[None] | None:
        """Append the records as one batch; raises WriteFailed when the log did not take
        them; returns what to await for them to be durable (None: they are): in a cluster,
        replicated to the in-sync replicas too (acks=all), else it raises NotReplicated.
        It is this write's own (broker/partition.py ``durable``): cancelling it cancels
        nothing else."""
        ...

    def append_at(self, partition: int, records: list[tuple[bytes, bytes | None]],
                  producer: tuple[int, int] | None = None
                  ) -> tuple[int, Awaitable[None] | None]:
        """``append`` (of a transaction's batch when ``producer`` is (id, epoch)), also
        returning the offset the batch's first record took."""
        ...

    def read(self, partition: int) -> Iterable[tuple]:
        """Every record of the partition, oldest first: (key, value) or (key, value,
        producer id or -1, marker or None, offset)."""
        ...


class KeysByPartition(dict):
    """A coordinator's keys (group ids, transactional ids) and their state, which also knows
    the keys of each partition of its internal topic: a partition that moves (resigned,
    loaded) costs time in its own keys, never in every key the coordinator holds in its
    other partitions. Only item assignment, ``del`` and ``pop`` change it.

    A partition's keys are a dict's keys (values None), not a set: a dict of string keys
    keeps no hashes, about 32 bytes a key where a set took about 41 (issue 26), and its
    order is the order the keys came in rather than their hashes'."""

    def __init__(self, partition_of) -> None:
        super().__init__()
        self.partition_of = partition_of
        self._of: dict[int, dict] = {}

    def __setitem__(self, key, value) -> None:
        if key not in self:
            self._of.setdefault(self.partition_of(key), {})[key] = None
        super().__setitem__(key, value)

    def __delitem__(self, key) -> None:
        super().__delitem__(key)
        self._forget(key)

    def pop(self, key, *default):
        if key in self:
            self._forget(key)
        return super().pop(key, *default)

    def _forget(self, key) -> None:
        partition = self.partition_of(key)
        held = self._of.get(partition)
        if held is not None:
            held.pop(key, None)
            if not held:
                del self._of[partition]

    def keys_of(self, partition: int) -> list:
        """The keys held of ``partition`` (a list: the caller may change the dict)."""
        return list(self._of.get(partition, ()))

    def count_of(self, partition: int) -> int:
        return len(self._of.get(partition, ()))

    def _refused(self, *args, **kwargs):
        raise TypeError("KeysByPartition changes by assignment, del and pop only")

    setdefault = update = popitem = clear = _refused
