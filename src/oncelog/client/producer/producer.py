"""oncelog.Producer (blocking calls, a background sender thread) and oncelog.AIOProducer
(asyncio): idempotent by default, with an identity that can be checkpointed and resumed.

Both share everything but the waiting: configuration, partitioning, the accumulator, the
sender and the idempotence rules.

    p = oncelog.Producer({"bootstrap.servers": "127.0.0.1:9092"})
    future = p.produce("events", b"value", key=b"k")
    p.flush()
    future.result()        # RecordMetadata(topic, partition, offset, timestamp)
    saved = p.checkpoint()  # JSON: producer id, epoch, next sequence per partition
    p.close()
    p = oncelog.Producer(config, resume=saved)   # the same identity, continuing

With ``"batching": "deterministic"`` a process that resumes from a checkpoint and produces
the same records again re-creates the same batches, which the broker answers as duplicates:
a copy job can crash anywhere and restart from its last checkpoint without writing anything
twice (seed 001, "Transitivity").

With a ``transactional.id`` the producer writes in transactions (KIP-98), as Kafka's:

    p = oncelog.Producer({"bootstrap.servers": ..., "transactional.id": "copier-1"})
    p.init_transactions()   # fences any older producer with this transactional id
    p.begin_transaction()
    p.produce("out", b"v")
    p.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata())
    p.commit_transaction()  # or abort_transaction(): all of it, or none, becomes visible

An error says what to do (connection.py): ``txn_requires_abort()`` (abort, then go on with
the next transaction), ``is_fatal()`` (fenced, ...: close the producer), ``is_retriable()``
(call again). transactions.py holds the rules, txn_requests.py the coordinator requests.
With ``transaction.two.phase.commit.enable`` (KIP-939), ``prepare_transaction()`` and
``complete_transaction(prepared)`` let an external coordinator decide; a new instance finds
a prepared transaction with ``init_transactions(keep_prepared_txn=True)``.

``metrics()`` gives Kafka's producer metrics (metrics.py); ``stats_cb`` with
``statistics.interval.ms`` gets them as JSON on the sender's thread, as librdkafka's does.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from kio.schema.errors import ErrorCode

from ..network.connection import KafkaError, KafkaTimeout, TransactionStateError
from ..topic_partition import OffsetAndMetadata, TopicPartition
from .accumulator import RecordAccumulator
from .idempotence import IdempotenceManager
from .partitioner import partition_for_key
from .producer_batch import Headers, ProducerBatch, RecordFuture, RecordMetadata, as_bytes
from .producer_config import ProducerConfig, parse_producer_config
from .sender import Sender
from .transactions import GroupMetadata, PreparedTxnState, TransactionManager, TxnState

__all__ = ["AIOProducer", "Producer", "RecordFuture", "RecordMetadata"]

CHECKPOINT_VERSION = 1
# A column for append_columns(), in Arrow's layout: (validity bitmap or None, int32 offsets,
# data, first row) for binary and string values, (validity or None, int32 values, first
# row) for partitions.
Column = tuple[Any, Any, Any, int]
IntColumn = tuple[Any, Any, int]
log = logging.getLogger(__name__)


class _ProducerCore:
    """What both APIs share: config, partitioning, records into the accumulator."""

    def __init__(self, config: dict[str, Any], resume: dict[str, Any] | None,
                 new_loop_future: Callable[[], object] | None) -> None:
        self.config: ProducerConfig = parse_producer_config(config)
        cfg = self.config
        self.idem = IdempotenceManager(cfg.idempotence, cfg.max_in_flight, cfg.retries,
                                       transactional=cfg.transactional_id is not None)
        # [partition, bytes produced to it] per topic, for keyless records (KIP-794).
        self.sticky: dict[str, list[int]] = {}
        if resume is not None:
            if cfg.transactional_id is not None:
                raise ValueError("resume: a transactional producer continues through its "
                                 "transactional.id (init_transactions), not a checkpoint")
            if not cfg.idempotence:
                raise ValueError("resume: a checkpoint continues an idempotent producer; "
                                 "enable.idempotence must be true")
            self._resume(resume)
        self.acc = RecordAccumulator(cfg, time.monotonic, new_loop_future, self.sticky)
        self.acc.appended = {tp: state.next_sequence
                             for tp, state in self.idem.partitions.items()}
        self.sender = Sender(cfg, self.acc, self.idem)
        self.txn: TransactionManager | None = self.sender.txn
        self._closed = False
        self.partition_counts = self.acc.partition_counts  # the sender keeps it current
        # produce()'s common case, in one C call when the compiled fast path is built (it
        # answers None for everything it leaves to produce() below). A transactional
        # producer's records take it only inside a transaction.
        self.fast_append = self.acc.open.append
        if self.txn is not None:
            self.txn.on_abortable = lambda: self.fast_path(False)
            self.fast_path(False)

    def fast_path(self, on: bool) -> None:
        self.acc.open.enabled = (on and not self.config.deterministic and not self._closed
                                 and self.sender.fatal is None)

    @property
    def closed(self) -> bool:
        return self._closed

    @closed.setter
    def closed(self, closed: bool) -> None:
        self._closed = closed
        if closed:
            self.acc.open.enabled = False  # so that produce() raises

    def _resume(self, checkpoint: dict[str, Any]) -> None:
        if not isinstance(checkpoint, dict) or checkpoint.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"resume: not a version {CHECKPOINT_VERSION} producer checkpoint")
        self.idem.resume(checkpoint)
        try:
            self.sticky = {str(t): [int(p), int(n)]
                           for t, (p, n) in checkpoint.get("sticky", {}).items()}
        except (TypeError, ValueError) as exc:
            raise ValueError(f"resume: bad sticky partitions ({exc!r})") from None

    def checkpoint(self) -> dict[str, Any]:
        state = self.idem.checkpoint()
        with self.acc.lock:  # no keyless record is moving the sticky partition meanwhile
            sticky = {t: list(v) for t, v in sorted(self.sticky.items())}
        return {"version": CHECKPOINT_VERSION, **state, "sticky": sticky}

    def check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the producer is closed")
        if self.sender.fatal is not None:
            raise self.sender.fatal
        if self.txn is not None:
            self.txn.check_produce()

    def metrics(self) -> dict[str, float]:
        return self.sender.metrics.snapshot()

    # --- transactions (the parts both APIs share) --------------------------------------------

    def transactional(self, what: str) -> TransactionManager:
        if self.txn is None:
            raise TransactionStateError(f"{what}() needs a transactional.id")
        if self.closed:
            raise RuntimeError("the producer is closed")
        return self.txn

    def begin_transaction(self) -> None:
        self.transactional("begin_transaction").begin()
        self.fast_path(True)

    def ending(self, what: str, commit: bool) -> bool:
        """The first step of commit (``commit``) or abort: whether it starts now (False: a
        call that timed out is made again)."""
        txn = self.transactional(what)
        starting = txn.start_commit() if commit else txn.start_abort()
        self.fast_path(False)
        self.acc.wake()  # an abort fails what is not sent yet: the sender does it
        return starting

    def prepared(self, what: str) -> PreparedTxnState:
        txn = self.transactional(what)
        if txn.state is not TxnState.PREPARED or txn.prepared is None:
            raise TransactionStateError(f"{what}() needs a prepared transaction "
                                        f"(the producer is {txn.state.value})")
        return txn.prepared

    def prepare(self) -> PreparedTxnState:
        """After the flush of prepare_transaction(): the transaction's producer id and
        epoch, which commit or abort it later."""
        txn = self.transactional("prepare_transaction")
        prepared = txn.prepare(self.idem.producer_id, self.idem.epoch)
        self.fast_path(False)
        return prepared

    def produce(self, topic: str, value: Any, key: Any, partition: int | None,
                headers: Headers, timestamp: int | None, on_delivery: Callable | None
                ) -> RecordFuture | None:
        """Append one record (the topic's partition count must be known); None, appending
        nothing, when buffer.memory is full. What ``fast_append`` did not take comes here."""
        if self.closed or self.sender.fatal is not None or self.txn is not None:
            self.check_open()
        if type(key) is not bytes and key is not None:
            key = as_bytes(key, "key")
        if type(value) is not bytes and value is not None:
            value = as_bytes(value, "value")
        size = (len(key) if key else 0) + (len(value) if value else 0)
        if size > self.acc.record_limit:
            raise KafkaError(ErrorCode.message_too_large,
                             f"a {size}-byte record does not fit in max.request.size "
                             f"({self.config.max_request_size})")
        if timestamp is not None:
            timestamp = int(timestamp)  # None: the record builder reads the clock
        acc = self.acc
        if acc.open.buffered >= self.config.buffer_memory:
            return None  # before choosing: the sticky partitioner counts the record's bytes
        count = self.partition_counts[topic]
        if partition is None or type(partition) is not int or not 0 <= partition < count:
            partition = self.choose_partition(topic, key, partition, count, size)
        return RecordFuture(*acc.append(topic, partition, timestamp, key, value, headers, size,
                                        on_delivery))

    def choose_partition(self, topic: str, key: bytes | None, partition: int | None,
                         count: int, size: int) -> int:
        if partition is not None:
            if not 0 <= partition < count:
                raise KafkaError(ErrorCode.unknown_topic_or_partition,
                                 f"{topic} has partitions 0..{count - 1}, not {partition}")
            return partition
        partitioner = self.config.partitioner
        if callable(partitioner):
            return int(partitioner(key, count)) % count
        if partitioner == "random":
            return random.randrange(count)
        if key is not None or partitioner == "murmur2":
            return partition_for_key(key or b"", count)
        return self._sticky(topic, count, size)

    def _sticky(self, topic: str, count: int, size: int) -> int:
        """Keyless records fill a batch's worth on one partition, then move on (KIP-794);
        with deterministic batching the move is to the next partition, so that resuming from
        a checkpoint repeats it.

        Several threads may produce at once, and produce()'s fast path (_append.c) adds to
        the byte count without any lock (accumulator.py, "threading"). So the state changes
        under the accumulator's lock, and out of the dictionary: while it is taken out, the
        fast path finds none for the topic and leaves the record to this path, which waits
        for the lock; putting it back is one dictionary store."""
        with self.acc.lock:
            state = self.sticky.pop(topic, None)
            if state is None or state[0] >= count:
                first = 0 if self.config.deterministic else random.randrange(count)
                state = [first, 0]
            chosen = state[0]
            state[1] += size
            if state[1] >= self.config.batch_size:
                if self.config.deterministic or count == 1:
                    state[0] = (chosen + 1) % count
                else:
                    state[0] = (chosen + random.randrange(1, count)) % count
                state[1] = 0
            self.sticky[topic] = state
        return chosen

    def begin_flush(self) -> list[ProducerBatch]:
        pending = self.acc.start_flush()
        self.acc.wake()
        return pending

    def end_flush(self) -> None:
        """Raise the first delivery error of any record produced since the previous flush
        (a flush that returns means every one of them was stored)."""
        with self.acc.lock:
            self.acc.flushing -= 1
            error, self.acc.first_error = self.acc.first_error, None
        if error is not None:
            raise error


def topic_name(topic: Any) -> str:
    """A topic as a plain str: the producer's dictionaries are keyed by it, and the fast
    path's lookups in them must not run a str subclass's __eq__ (see _append.c)."""
    if type(topic) is str:
        return topic
    if isinstance(topic, str):
        return str.__str__(topic)
    raise TypeError(f"topic must be a str, not {type(topic).__name__}")


# How long interpreter exit waits for the sender of a producer not closed to stop.
EXIT_STOP_TIMEOUT = 5.0


def _stop_at_exit(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """The atexit hook of a Producer not closed: its sender's loop stops and its thread ends
    before the interpreter finalises. The thread is a daemon, which exit does not wait for;
    left in uvloop's run_forever, idle, it wakes for its next timer (within retry.backoff.ms
    * 10) or socket into uvloop's callbacks, which take the GIL with PyGILState_Ensure.
    During finalisation that ends the thread, but once Py_FinalizeEx has deleted the thread
    states it makes a new one for no interpreter: a SIGSEGV, with nothing logged
    (faulthandler is off by then). Nothing is flushed here: records not delivered by exit
    are lost, as they were. Its tasks (the sender's run) are cancelled first, as
    asyncio.run() ends: a task still pending when the interpreter collects it logs "Task was
    destroyed but it is pending!"."""
    if not thread.is_alive():
        return

    async def stop() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=EXIT_STOP_TIMEOUT / 2)
        loop.stop()

    try:
        asyncio.run_coroutine_threadsafe(stop(), loop)
    except RuntimeError:  # closed
        return
    thread.join(EXIT_STOP_TIMEOUT)


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Producer:
    """The blocking producer. ``produce`` returns a future at once; a background thread
    sends. ``on_delivery(error, metadata)`` callbacks run on that thread: keep them short.
    A callback may produce(); as the thread it runs on is the one that makes room and learns
    topics, produce() there never waits: it raises KafkaError at once when buffer.memory is
    full or the topic is not known yet, and flush(), checkpoint() and close() raise
    RuntimeError."""

    def __init__(self, config: dict[str, Any], resume: dict[str, Any] | None = None) -> None:
        self._core = _ProducerCore(config, resume, None)
        self._loop = _new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="oncelog-producer-sender", daemon=True)
        self._thread.start()
        self._at_exit = functools.partial(_stop_at_exit, self._loop, self._thread)
        atexit.register(self._at_exit)
        sender = self._core.sender
        self._core.acc.wake = lambda: self._loop.call_soon_threadsafe(sender._wake)
        try:
            self._call(sender.start(), self._core.config.max_block + 1)
        except BaseException:
            self._stop_loop()
            raise
        self._run = asyncio.run_coroutine_threadsafe(sender.run(), self._loop)

    @property
    def config(self) -> ProducerConfig:
        return self._core.config

    def _call(self, coro: Coroutine, timeout: float | None) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise KafkaTimeout(f"no answer within {timeout}s") from None

    def _on_sender_thread(self) -> bool:
        """Called from an on_delivery callback (or anything else the sender's loop runs)."""
        return threading.get_ident() == self._thread.ident

    def _not_from_callback(self, what: str) -> None:
        if self._on_sender_thread():
            raise RuntimeError(f"{what}() in an on_delivery callback would wait for the "
                               "producer's sender thread, which runs the callback")

    def produce(self, topic: str, value: Any = None, key: Any = None,
                partition: int | None = None, headers: Headers = None,
                timestamp: int | None = None,
                on_delivery: Callable[[BaseException | None, RecordMetadata | None], Any]
                | None = None) -> RecordFuture:
        core = self._core
        future = core.fast_append(topic, value, key, partition, headers, timestamp, on_delivery)
        if future is not None:
            return future
        topic = topic_name(topic)
        if topic not in core.sender.partition_counts:
            core.check_open()
            if self._on_sender_thread():
                core.sender._want_metadata(topic)  # known for a later call
                raise KafkaError(ErrorCode.unknown_topic_or_partition,
                                 f"topic {topic!r} is not known yet, and produce() in an "
                                 "on_delivery callback cannot wait for its metadata (the "
                                 "callback runs on the thread that fetches it)")
            self._call(core.sender.partitions_for(topic), core.config.max_block + 1)
        future = core.produce(topic, value, key, partition, headers, timestamp, on_delivery)
        while future is None:
            if self._on_sender_thread():
                raise KafkaError(ErrorCode.request_timed_out,
                                 "buffer.memory is full, and produce() in an on_delivery "
                                 "callback cannot wait for room (the callback runs on the "
                                 "thread that makes it)")
            if not core.acc.wait_for_space(core.config.max_block):
                raise KafkaError(ErrorCode.request_timed_out,
                                 "buffer.memory is full and max.block.ms passed")
            future = core.produce(topic, value, key, partition, headers, timestamp,
                                  on_delivery)
        return future

    def append_columns(self, topic: str, start: int, stop: int, values: Column,
                       keys: Column | None = None, partitions: IntColumn | None = None
                       ) -> int:
        """produce() of rows ``start`` to ``stop - 1`` of columns in Arrow's layout, in one
        C call while each row fits its partition's open batch (no future per record: flush()
        reports their delivery errors). Returns the first row not appended (``stop`` when
        all were): produce() that one, which opens the next batch, waits for room, learns
        the topic or raises what is wrong with the row, then call again from the next.

        ``values`` and ``keys`` (None: keyless) are binary or string columns as
        ``(validity bitmap or None, int32 offsets, data, first row)``; ``partitions`` (None,
        or null in a row: the partitioner chooses) an int32 column as ``(validity or None,
        values, first row)``. Buffers are anything with the buffer protocol (pyarrow's)."""
        return self._core.acc.open.append_many(topic, start, stop, values, keys, partitions)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything produced so far and wait for every answer; raises the first
        delivery error of any record produced since the previous flush (or KafkaTimeout)."""
        self._not_from_callback("flush")
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = self._core.begin_flush()
        timed_out = False
        for batch in pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not batch.wait(left):
                timed_out = True
                break
        self._core.end_flush()
        if timed_out:
            raise KafkaTimeout(f"flush: records still in flight after {timeout}s")

    def checkpoint(self, timeout: float | None = None) -> dict[str, Any]:
        """Flush, then the identity to resume from: JSON-serialisable."""
        self._not_from_callback("checkpoint")
        self.flush(timeout)
        return self._call(_in_loop(self._core.checkpoint), timeout)

    def metrics(self) -> dict[str, float]:
        """Kafka's producer metrics by name (metrics.py)."""
        return self._core.metrics()

    # --- transactions -------------------------------------------------------------------------

    def _timeout(self, timeout: float | None) -> float:
        return self._core.config.max_block if timeout is None else timeout

    def init_transactions(self, timeout: float | None = None,
                          keep_prepared_txn: bool = False) -> None:
        """Register the transactional id with its coordinator (InitProducerId): fences any
        older producer with it and aborts (or, KIP-939 ``keep_prepared_txn``, keeps) its
        unfinished transaction. Up to ``timeout`` seconds (max.block.ms); after a
        KafkaTimeout, call it again."""
        self._not_from_callback("init_transactions")
        core = self._core
        core.transactional("init_transactions").start_init()
        self._call(core.sender.txn_io.init_transactions(self._timeout(timeout),
                                                        keep_prepared_txn), None)

    def begin_transaction(self) -> None:
        self._core.begin_transaction()

    def send_offsets_to_transaction(self, offsets: dict, group_metadata: GroupMetadata | str,
                                    timeout: float | None = None) -> None:
        """Commit a consumer group's ``offsets`` (partition -> next offset to read, or
        OffsetAndMetadata) as part of the transaction: AddOffsetsToTxn, then TxnOffsetCommit
        to the group's coordinator with ``group_metadata``
        (Consumer.consumer_group_metadata(): KIP-447's generation fencing)."""
        self._not_from_callback("send_offsets_to_transaction")
        core = self._core
        core.transactional("send_offsets_to_transaction").check_offsets()
        self._call(core.sender.txn_io.send_offsets(
            _offsets(offsets), _group(group_metadata), self._timeout(timeout)), None)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush, then commit (EndTxn). Raises TransactionAbortableError when some record
        failed (abort_transaction() then), ProducerFatalError when fenced, KafkaTimeout
        (call it again: it waits for the same commit)."""
        self._end("commit_transaction", True, timeout)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Fail what is not sent yet (TransactionAbortedError), wait for what is in flight,
        then abort (EndTxn): none of the transaction becomes visible to read_committed
        readers."""
        self._end("abort_transaction", False, timeout)

    def _end(self, what: str, commit: bool, timeout: float | None) -> None:
        self._not_from_callback(what)
        timeout = self._timeout(timeout)
        deadline = time.monotonic() + timeout
        core = self._core
        core.ending(what, commit)
        self._flush_transaction(timeout)
        self._call(core.sender.txn_io.end_transaction(
            commit, max(0.0, deadline - time.monotonic())), None)

    def _flush_transaction(self, timeout: float) -> None:
        try:
            self.flush(timeout)
        except KafkaTimeout:
            raise
        except KafkaError:
            pass  # a record failed, and so the transaction: the next step says so

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """Two-phase commit (KIP-939): flush the transaction and hold it prepared; the
        answer (producer id and epoch; ``str()`` for Kafka's form) commits it later through
        complete_transaction(), here or in the next producer instance with this
        transactional id."""
        self._not_from_callback("prepare_transaction")
        self._core.transactional("prepare_transaction").check_produce()
        self._flush_transaction(self._timeout(timeout))
        return self._core.prepare()

    def complete_transaction(self, prepared: PreparedTxnState | str,
                             timeout: float | None = None) -> None:
        """Commit the prepared transaction if ``prepared`` is it, else abort it (KIP-939)."""
        kept = self._core.prepared("complete_transaction")
        if isinstance(prepared, str):
            prepared = PreparedTxnState.parse(prepared)
        self._end("complete_transaction", prepared == kept, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Deliver what was produced (up to ``timeout``), then stop; records still not
        settled then fail. Delivery errors are logged, not raised: use flush() for them."""
        if self._core.closed:
            return
        self._not_from_callback("close")
        try:
            self.flush(timeout)
        except KafkaError as exc:
            # As Kafka's close(): delivery errors were the futures' and callbacks' to report.
            log.warning("closing the producer: %s", exc)
        finally:
            self._core.closed = True
            sender = self._core.sender
            sender.closing = True
            self._core.acc.wake()
            try:
                self._run.result(5 if timeout is None else max(timeout, 0.1))
            except Exception:  # closing anyway: what is not settled now fails
                self._run.cancel()
                try:
                    self._call(_in_loop(lambda: sender.abort(_closed_error())), 5)
                except Exception:  # the loop is going away regardless
                    pass
            self._stop_loop()

    def _stop_loop(self) -> None:
        async def shutdown() -> None:
            self._core.sender.close_connections()

        try:
            self._call(shutdown(), 5)
        except Exception:  # the loop is going away regardless
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()
            atexit.unregister(self._at_exit)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _in_loop(fn: Callable[[], Any]) -> Any:
    return fn()


def _offsets(offsets: dict) -> dict[TopicPartition, OffsetAndMetadata]:
    result = {}
    for tp, value in offsets.items():
        if isinstance(value, int):
            value = OffsetAndMetadata(value)
        elif not isinstance(value, OffsetAndMetadata):
            value = OffsetAndMetadata(*value)
        result[TopicPartition(*tp)] = value
    return result


def _group(group_metadata: GroupMetadata | str) -> GroupMetadata:
    """Consumer.consumer_group_metadata(), or a group id alone (no generation fencing, as
    Kafka's deprecated form)."""
    if isinstance(group_metadata, str):
        return GroupMetadata(group_metadata)
    if not isinstance(group_metadata, GroupMetadata):
        raise TypeError("group_metadata: Consumer.consumer_group_metadata() or a group id")
    return group_metadata


def _closed_error() -> KafkaError:
    return KafkaError(ErrorCode.request_timed_out,
                      "the producer was closed before the record was acknowledged")


class AIOProducer:
    """The asyncio producer: ``await start()``, ``await send(...)`` gives an awaitable of the
    record's RecordMetadata, ``await flush()``, ``await stop()`` (or ``async with``)."""

    def __init__(self, config: dict[str, Any], resume: dict[str, Any] | None = None) -> None:
        self._config = config
        self._resume = resume
        self._core: _ProducerCore | None = None
        self._task: asyncio.Task | None = None
        self._space: asyncio.Event | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        core = self._core = _ProducerCore(self._config, self._resume, loop.create_future)
        self._space = asyncio.Event()
        core.acc.wake = core.sender._wake
        core.acc.space_listeners.append(self._space.set)
        await core.sender.start()
        self._task = loop.create_task(core.sender.run())

    def _started(self) -> _ProducerCore:
        if self._core is None or self._task is None:
            raise RuntimeError("await AIOProducer.start() first")
        return self._core

    async def send(self, topic: str, value: Any = None, key: Any = None,
                   partition: int | None = None, headers: Headers = None,
                   timestamp: int | None = None) -> RecordFuture:
        core = self._started()
        future = core.fast_append(topic, value, key, partition, headers, timestamp, None)
        if future is not None:
            return future  # it never closes a batch: nothing for the sender yet
        topic = topic_name(topic)
        if topic not in core.sender.partition_counts:
            core.check_open()
            await core.sender.partitions_for(topic)
        future = core.produce(topic, value, key, partition, headers, timestamp, None)
        if future is None:
            assert self._space is not None
            deadline = time.monotonic() + core.config.max_block
            while future is None:
                self._space.clear()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KafkaError(ErrorCode.request_timed_out,
                                     "buffer.memory is full and max.block.ms passed")
                try:
                    await asyncio.wait_for(self._space.wait(), left)
                except TimeoutError:
                    pass
                future = core.produce(topic, value, key, partition, headers, timestamp, None)
        elif core.acc.wake_pending:
            # This record closed a batch and woke the sender, which shares our loop: let it
            # send now (the record is appended already) rather than when the buffer is full.
            await asyncio.sleep(0)
        return future

    async def send_and_wait(self, topic: str, value: Any = None, key: Any = None,
                            partition: int | None = None, headers: Headers = None,
                            timestamp: int | None = None) -> RecordMetadata:
        return await (await self.send(topic, value, key, partition, headers, timestamp))

    async def flush(self) -> None:
        core = self._started()
        pending = core.begin_flush()
        try:
            for batch in pending:
                # Shielded: cancelling this flush must not cancel the batches' futures.
                await asyncio.shield(batch.loop_future)
        finally:
            core.end_flush()

    async def checkpoint(self) -> dict[str, Any]:
        await self.flush()
        return self._started().checkpoint()

    def metrics(self) -> dict[str, float]:
        """Kafka's producer metrics by name (metrics.py)."""
        return self._started().metrics()

    # --- transactions: as Producer's, awaited -------------------------------------------------

    def _timeout(self, timeout: float | None) -> float:
        return self._started().config.max_block if timeout is None else timeout

    async def init_transactions(self, timeout: float | None = None,
                                keep_prepared_txn: bool = False) -> None:
        core = self._started()
        core.transactional("init_transactions").start_init()
        await core.sender.txn_io.init_transactions(self._timeout(timeout), keep_prepared_txn)

    def begin_transaction(self) -> None:
        self._started().begin_transaction()

    async def send_offsets_to_transaction(self, offsets: dict,
                                          group_metadata: GroupMetadata | str,
                                          timeout: float | None = None) -> None:
        core = self._started()
        core.transactional("send_offsets_to_transaction").check_offsets()
        await core.sender.txn_io.send_offsets(_offsets(offsets), _group(group_metadata),
                                              self._timeout(timeout))

    async def commit_transaction(self, timeout: float | None = None) -> None:
        await self._end("commit_transaction", True, timeout)

    async def abort_transaction(self, timeout: float | None = None) -> None:
        await self._end("abort_transaction", False, timeout)

    async def _end(self, what: str, commit: bool, timeout: float | None) -> None:
        timeout = self._timeout(timeout)
        deadline = time.monotonic() + timeout
        core = self._started()
        core.ending(what, commit)
        await self._flush_transaction(timeout)
        await core.sender.txn_io.end_transaction(commit, max(0.0, deadline - time.monotonic()))

    async def _flush_transaction(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.flush(), timeout)
        except TimeoutError:
            raise KafkaTimeout(f"flush: records still in flight after {timeout}s") from None
        except KafkaTimeout:
            raise
        except KafkaError:
            pass  # a record failed, and so the transaction: the next step says so

    async def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        self._started().transactional("prepare_transaction").check_produce()
        await self._flush_transaction(self._timeout(timeout))
        return self._started().prepare()

    async def complete_transaction(self, prepared: PreparedTxnState | str,
                                   timeout: float | None = None) -> None:
        kept = self._started().prepared("complete_transaction")
        if isinstance(prepared, str):
            prepared = PreparedTxnState.parse(prepared)
        await self._end("complete_transaction", prepared == kept, timeout)

    async def stop(self) -> None:
        core = self._started()
        if core.closed:
            return
        try:
            await self.flush()
        except KafkaError as exc:
            log.warning("stopping the producer: %s", exc)
        finally:
            core.closed = True
            core.sender.closing = True
            core.sender._wake()
            assert self._task is not None
            try:
                await asyncio.wait_for(self._task, 5)
            except Exception:  # stopping anyway: what is not settled now fails
                self._task.cancel()
                core.sender.abort(_closed_error())
            core.sender.close_connections()

    async def __aenter__(self) -> AIOProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
