"""RecordAccumulator: per-partition queues of batches between produce() and the sender.

produce() appends to the newest open batch of a partition (from the caller's thread); the
sender drains batches from the heads (from its own). Everything is guarded by one lock, held
for a few dictionary and list operations at a time, except the common case of produce(): a
record that fits its partition's open batch goes in through ``open.append`` (fast_append.py,
_append.c), one C call that the GIL keeps whole. So whatever that call reads or changes (the
open batches' records, ``closed`` and ``accounted``, the ``buffered`` total, the callbacks,
the sticky partition's [partition, bytes] list) is changed here only in single C calls too,
never by a Python read-modify-write; and ``append`` below closes the open batch to the fast
path while it checks and appends, so that its several steps are whole as well. The sticky
partitioner (producer.py, ``_sticky``) does the same with its topic's list: under the lock,
taken out of the dictionary while it changes, put back in one store.

When is a batch ready to send?
- ``batching="linger"``: when it is full (``batch.size`` bytes or ``batch.num.messages``
  records), when its first record has waited ``linger.ms``, or on flush.
- ``batching="deterministic"``: only when full, or on flush, and "full" means the partition's
  record count reached a multiple of ``batch.num.messages``: batches are aligned on sequence
  numbers, never cut by time or by the bytes since some starting point. A process that
  resumes from a checkpoint and produces the same records again, even flushing at other
  points than before, cuts batches that lie each within one batch it sent before or wholly
  after them, so the broker recognises every record it already stored (as a cached batch or
  as DUPLICATE_SEQUENCE_NUMBER) and none straddles the end of what it holds.

A retried batch goes back into its queue in sequence order (seed 002's ``reenqueue``), so a
partition never sends a later batch ahead of an earlier one.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

from ..topic_partition import TopicPartition
from . import fast_append
from .producer_batch import Headers, ProducerBatch, RecordFuture, encode_headers
from .producer_config import ProducerConfig

# Estimated bytes a record adds beyond key, value and headers: length, attributes, deltas.
_RECORD_OVERHEAD = 12
_REQUEST_OVERHEAD = 512  # request header, topic name, batch header
_RECORD_LIMIT_OVERHEAD = 128  # batch header and request framing around a lone record
log = logging.getLogger(__name__)


class RecordAccumulator:
    def __init__(self, config: ProducerConfig, clock: Callable[[], float],
                 new_loop_future: Callable[[], object] | None = None,
                 sticky: dict[str, list[int]] | None = None) -> None:
        self.config = config
        # The largest key + value a record may have: bigger ones never fit a request.
        self.record_limit = config.max_request_size - _RECORD_LIMIT_OVERHEAD
        self.partition_counts: dict[str, int] = {}  # the sender keeps it current
        partitioner = config.partitioner
        self.open = fast_append.OpenBatches(
            self.partition_counts, {} if sticky is None else sticky, RecordFuture,
            config.batch_size, config.batch_records, config.buffer_memory, self.record_limit,
            fast_append.PARTITIONERS.get(partitioner, fast_append.PARTITION_BY_PYTHON)
            if isinstance(partitioner, str) else fast_append.PARTITION_BY_PYTHON)
        # Deterministic batches are cut at sequence boundaries, which append() counts.
        self.open.enabled = not config.deterministic
        self.clock = clock
        self.lock = threading.Lock()
        self.space = threading.Condition(self.lock)  # notified when buffered bytes drop
        # Callers blocked in wait_for_space: a Condition's notify costs microseconds even
        # with nobody to wake, and batches finish by the thousand a second.
        self.space_waiters = 0
        self.queues: dict[TopicPartition, collections.deque[ProducerBatch]] = {}
        self.incomplete: set[ProducerBatch] = set()  # created, not yet acknowledged or failed
        self.space_listeners: list[Callable[[], None]] = []
        self.first_error: BaseException | None = None  # of a record since the last flush
        self.flushing = 0      # flush() calls waiting: every open batch is ready
        self.wake: Callable[[], None] = lambda: None
        self.wake_pending = False
        self.sender_deadline = float("inf")  # when the sender wakes on its own
        self._new_loop_future = new_loop_future
        # Records appended per partition since the identity began (the next record's
        # sequence, as long as no epoch bump intervenes): deterministic batching aligns on it.
        self.appended: dict[TopicPartition, int] = {}
        self._warned_oversize = False

    # --- the caller's side ------------------------------------------------------------------

    def append(self, topic: str, partition: int, timestamp: int | None, key: bytes | None,
               value: bytes | None, headers: Headers, size: int,
               on_delivery: Callable | None = None) -> tuple[ProducerBatch, int]:
        """Add a record (``size``: key and value bytes; a timestamp of None is now) to the
        partition's open batch: the Python path, for what ``open.append`` left to it."""
        size += _RECORD_OVERHEAD
        encoded = encode_headers(headers) if headers else None  # raises before the lock
        if encoded:
            size += sum(len(k) + len(v or b"") + 4 for k, v in encoded)
        config = self.config
        wake = False
        with self.lock:
            tp = (topic, partition)
            queue = self.queues.get(tp)
            if queue is None:
                queue = self.queues[tp] = collections.deque()
            batch = queue[-1] if queue else None
            reopen = False
            if batch is not None and not batch.closed:
                # Closed to the fast path while this runs: its appends would land between
                # the checks and the steps below (a record with headers is encoded from the
                # batch's count). They wait for the lock meanwhile, as any Python append.
                batch.closed = True
                # Full? Then the record starts the next batch and this one stays closed.
                if (batch.records.count >= config.batch_records
                        or batch.records.size + size > config.batch_size
                        if not config.deterministic else self._oversize(batch, size)):
                    wake = True
                else:
                    reopen = True
            fresh = not reopen
            if fresh:
                now = self.clock()
                batch = ProducerBatch(topic, partition, now,
                                      self._new_loop_future() if self._new_loop_future
                                      else None)
                queue.append(batch)
                self.incomplete.add(batch)
                if not config.deterministic and now + config.linger < self.sender_deadline:
                    self.sender_deadline = now + config.linger
                    wake = True
            try:
                index = batch.append(timestamp, key, value, encoded)
            except BaseException:  # a timestamp out of range, say: leave things as they were
                if fresh:
                    queue.pop()
                    self.incomplete.discard(batch)
                else:
                    batch.closed = False
                raise
            self.open.reserve(batch.records, size)
            if config.deterministic:
                appended = self.appended.get(tp, 0) + 1
                self.appended[tp] = appended
                if appended % config.batch_records == 0:
                    batch.closed = True
                    reopen = False
                    batch.created = self.clock()  # its delivery clock starts when ready
                    wake = True
            if on_delivery is not None:
                # Under the lock: the sender cannot have taken the batch yet.
                batch.add_callback(index, on_delivery)
            if reopen:
                batch.closed = False
            elif fresh and not config.deterministic:
                # Only now: with its first record in, the batch is never left empty.
                self.open.set(topic, partition, batch)
            if wake and not self.wake_pending:
                self.wake_pending = True
            else:
                wake = False
        if wake:
            self.wake()
        return batch, index

    def _oversize(self, batch: ProducerBatch, size: int) -> bool:
        """Aligned batches close themselves at the boundary; bytes only stop a batch that
        would not fit in a request at all."""
        if batch.records.size + size <= self.config.max_request_size - _REQUEST_OVERHEAD:
            return False
        if not self._warned_oversize:
            self._warned_oversize = True
            log.warning("deterministic batching: %d records do not fit in max.request.size "
                        "(%d); cutting by bytes, which a resumed run may cut differently. "
                        "Lower batch.num.messages.", self.config.batch_records,
                        self.config.max_request_size)
        return True

    def start_flush(self) -> list[ProducerBatch]:
        """Every open batch becomes ready (a held-back deterministic one starts its delivery
        clock now); returns the batches not yet settled."""
        with self.lock:
            self.flushing += 1
            if self.config.deterministic:
                now = self.clock()
                for queue in self.queues.values():
                    if queue and not queue[-1].closed:
                        queue[-1].created = now
            return list(self.incomplete)

    def wait_for_space(self, timeout: float) -> bool:
        """Block until buffer.memory has room (False when ``timeout`` passes first)."""
        with self.space:
            self.space_waiters += 1
            try:
                return self.space.wait_for(
                    lambda: self.open.buffered < self.config.buffer_memory, timeout)
            finally:
                self.space_waiters -= 1

    # --- the sender's side -----------------------------------------------------------------

    def ready_heads(self, now: float) -> tuple[list[ProducerBatch], float]:
        """The head batch of every partition that may be sent now, and when the next one
        becomes ready by lingering."""
        heads = []
        next_ready = float("inf")
        linger = self.config.linger
        with self.lock:
            self.wake_pending = False
            flushing = self.flushing > 0
            for queue in self.queues.values():
                if not queue:
                    continue
                batch = queue[0]
                if batch.retry_at > now:
                    next_ready = min(next_ready, batch.retry_at)
                    continue
                # Only a queue's last batch is ever open, so a head with others behind it
                # is closed already.
                if batch.closed or flushing or batch.count >= self.config.batch_records:
                    heads.append(batch)
                elif not self.config.deterministic:
                    if batch.created + linger <= now:
                        heads.append(batch)
                    else:
                        next_ready = min(next_ready, batch.created + linger)
        return heads, next_ready

    def take(self, batch: ProducerBatch) -> None:
        """Remove ``batch`` (a head returned by ready_heads) from its queue to send it."""
        with self.lock:
            queue = self.queues[(batch.topic, batch.partition)]
            assert queue[0] is batch
            queue.popleft()
            batch.closed = True

    def reenqueue(self, batch: ProducerBatch, order: Callable[[ProducerBatch], int]) -> None:
        """Put a batch to retry back in front of its partition's queue, in ``order``."""
        with self.lock:
            queue = self.queues.setdefault((batch.topic, batch.partition),
                                           collections.deque())
            key = order(batch)
            position = 0
            for queued in queue:
                if queued.base_sequence is None or order(queued) > key:
                    break
                position += 1
            queue.insert(position, batch)

    def split_off(self, head: ProducerBatch, order: Callable[[ProducerBatch], int]) -> None:
        """A batch's first records split off into ``head`` (idempotence.py row 10): it goes
        into the queue in ``order``, and counts as not yet settled."""
        with self.lock:
            self.incomplete.add(head)
        self.reenqueue(head, order)

    def remove(self, batch: ProducerBatch) -> bool:
        with self.lock:
            queue = self.queues.get((batch.topic, batch.partition))
            if queue is not None and batch in queue:
                queue.remove(batch)
                batch.closed = True
                return True
            return False

    def finished(self, batch: ProducerBatch, error: BaseException | None) -> None:
        """A batch is about to be acknowledged or to fail with ``error``: its records no
        longer count as buffered. Called before its futures settle, so that a flush woken by
        them sees the error, and an on_delivery callback that produces finds the room."""
        with self.lock:
            self.open.release(batch.accounted)
            self.incomplete.discard(batch)
            if error is not None and self.first_error is None:
                self.first_error = error
            if self.space_waiters:
                self.space.notify_all()
        for listener in self.space_listeners:
            listener()

    def restart_sequences(self) -> None:
        """A new epoch or producer id starts every partition's sequences at 0 again, the
        queued batches first: deterministic batching aligns on the new numbers from here."""
        with self.lock:
            self.appended = {tp: sum(b.count for b in queue)
                             for tp, queue in self.queues.items()}

    def take_expired(self, deadline_age: float, now: float) -> list[ProducerBatch]:
        """Remove and return queued batches created ``deadline_age`` or more ago. The oldest
        are at the heads (retries go back in front), so only heads need looking at. A
        deterministic batch held back on purpose (open, not flushing) does not expire."""
        expired = []
        with self.lock:
            hold = self.config.deterministic and not self.flushing
            for queue in self.queues.values():
                while queue and now >= queue[0].created + deadline_age and not (
                        hold and not queue[0].closed):
                    queue[0].closed = True  # out of its queue: no record may join it
                    expired.append(queue.popleft())
        return expired

    def drain_all(self) -> list[ProducerBatch]:
        with self.lock:
            batches = [b for queue in self.queues.values() for b in queue]
            for queue in self.queues.values():
                queue.clear()
            for batch in batches:
                batch.closed = True
        return batches

