"""What becomes of a batch between its queue and its futures: the Sender without sockets.

The Sender (sender.py) does the I/O: connections, requests, the event loop. Everything it
does with a batch once a request for it is sent, answered or lost, once DescribeProducers
answers about it, once it expires or the producer needs a new epoch, goes through this
class, which asks IdempotenceManager (idempotence.py, the table) and carries out the
verdict on the accumulator and the batch's futures. It runs no I/O and no event loop, so
the model tests (tests/client/test_client_model.py, tests/client/test_idempotence_model.py)
drive exactly this code against the broker's rules.

Settling a batch releases its buffer space and records its error before its futures and
callbacks learn the outcome: a flush woken by them sees the error, and an on_delivery
callback that produces finds the room the batch held.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from ..metrics import ProducerMetrics
from ..network.connection import KafkaError, ProducerFatalError
from .accumulator import RecordAccumulator
from .idempotence import RESUMED_STOPS, IdempotenceManager, Outcome, Verdict
from .producer_batch import ProducerBatch
from .producer_config import ProducerConfig

log = logging.getLogger(__name__)


class Delivery:
    def __init__(self, config: ProducerConfig, accumulator: RecordAccumulator,
                 idempotence: IdempotenceManager, clock: Callable[[], float]) -> None:
        self.config = config
        self.acc = accumulator
        self.idem = idempotence
        self.clock = clock
        self._fatal: KafkaError | None = None
        self.metrics = ProducerMetrics(clock)
        # Told of every batch that fails, with its error (the transaction manager: a failed
        # batch makes its transaction abortable).
        self.on_failed: Callable[[ProducerBatch, BaseException], None] | None = None

    @property
    def fatal(self) -> KafkaError | None:
        """The error that stopped this producer, which every later produce() raises."""
        return self._fatal

    @fatal.setter
    def fatal(self, error: KafkaError | None) -> None:
        self._fatal = error
        if error is not None:
            self.acc.open.enabled = False  # so that produce() takes the path that raises

    # --- sending ----------------------------------------------------------------------------

    def take(self, batch: ProducerBatch, connection_in_flight: int) -> bool:
        """Take a ready head batch to send on a connection with that many requests in
        flight, if the rules allow: built and stamped. False leaves it queued."""
        if not self.idem.has_identity or not self.idem.may_send(batch, connection_in_flight):
            return False
        self.acc.take(batch)  # closed to appends (under the lock) before it is built
        batch.build(self.config.codec)
        self.idem.sending(batch)
        self.metrics.batch_sent(batch.count, batch.size, batch.attempts > 1)
        return True

    def refuse_after_fatal(self, batch: ProducerBatch) -> None:
        """A ready batch of a producer that has stopped."""
        assert self.fatal is not None
        self.acc.take(batch)
        self.idem.give_up(batch, leaves_gap=False)
        self.fail(batch, self.idem.failure(batch, self.fatal.error,
                                           f"the producer stopped ({self.fatal})"))

    # --- answers ----------------------------------------------------------------------------

    def answered(self, batch: ProducerBatch, error: ErrorCode, base_offset: int,
                 message: str | None = None) -> bool:
        """The broker's answer to the batch's attempt in flight; True when the producer must
        now be looked up for it (DescribeProducers, then ``looked_up``)."""
        verdict = self.idem.answered(batch, error,
                                     error == ErrorCode.none or self._time_left(batch))
        if verdict.outcome is Outcome.DELIVERED:  # the common case, first
            if error == ErrorCode.none:
                self.deliver(batch, base_offset)
            else:
                # Seed 004: a duplicate the broker refused is logged and counted as an
                # error (record-error-rate), not raised: the records are stored.
                log.info("%s-%d: the batch at sequence %s (%d records) was stored before "
                         "(DUPLICATE_SEQUENCE_NUMBER)", batch.topic, batch.partition,
                         batch.base_sequence, batch.count)
                self.deliver(batch, -1, duplicate=True)
            return False
        detail = f"{error.name.upper()}: {message}" if message else error.name.upper()
        return self._act(batch, verdict, error, detail, -1)

    def lost(self, batch: ProducerBatch, exc: BaseException, sent: bool = True) -> None:
        """No answer to the batch's attempt: the connection failed or timed out (``sent``),
        or the request was refused before it was written (not ``sent``)."""
        verdict = self.idem.lost(batch, str(exc), sent, self._time_left(batch))
        error = exc.error if isinstance(exc, KafkaError) else ErrorCode.network_exception
        self._act(batch, verdict, error, str(exc), -1)

    def looked_up(self, batch: ProducerBatch, held: tuple[int, int] | None) -> None:
        """DescribeProducers answered: the partition holds (epoch, last sequence) for this
        producer, or nothing (None)."""
        verdict = self.idem.looked_up(batch, held)
        if verdict is None:
            return  # settled meanwhile (it expired in its queue)
        log.info("%s-%d: the batch at sequence %s (%d records) after OUT_OF_ORDER: the "
                 "broker holds %s: row %s, %s", batch.topic, batch.partition,
                 batch.base_sequence, batch.count, held, verdict.row, verdict.outcome.value)
        if verdict.outcome is Outcome.SPLIT:
            head = batch.split_head(verdict.records, self.config.codec)
            self.idem.split(batch, head)
            self.acc.split_off(head, self.idem.order)
            return
        self._act(batch, verdict, ErrorCode.out_of_order_sequence_number, "", -1)

    def lookup_failed(self, batch: ProducerBatch, exc: BaseException) -> None:
        verdict = self.idem.lookup_failed(batch, str(exc))
        if verdict is not None:
            self._act(batch, verdict, ErrorCode.out_of_order_sequence_number, "", -1)

    def _time_left(self, batch: ProducerBatch) -> bool:
        return self.clock() < batch.created + self.config.delivery_timeout

    def _act(self, batch: ProducerBatch, verdict: Verdict, error: ErrorCode, detail: str,
             base_offset: int) -> bool:
        outcome = verdict.outcome
        if outcome is Outcome.DELIVERED:
            self.deliver(batch, base_offset)
        elif outcome in (Outcome.RETRY, Outcome.NEW_EPOCH, Outcome.NEW_ID, Outcome.LOOKUP):
            log.debug("%s-%d: %s after %s", batch.topic, batch.partition, outcome.value,
                      detail)
            batch.retry_at = self.clock() + self.config.retry_backoff
            self.acc.reenqueue(batch, self.idem.order)
            return outcome is Outcome.LOOKUP
        elif outcome is Outcome.FATAL:
            self.fatal = ProducerFatalError(error, f"{verdict.why} ({detail})")
            log.error("producer stopped: %s", self.fatal)
            self.fail(batch, self.idem.failure(batch, error, verdict.why))
        else:
            assert outcome is Outcome.FAIL
            cause = verdict.why + (f" (last answer: {detail})" if detail else "")
            if verdict.row == "9b" and not self._time_left(batch):
                error = ErrorCode.request_timed_out
            self.acc.remove(batch)
            self.fail(batch, self.idem.failure(batch, error, cause))
        return False

    # --- time and epochs --------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Fail the queued batches whose delivery.timeout.ms has passed."""
        for batch in self.acc.take_expired(self.config.delivery_timeout, now):
            self.idem.give_up(batch)
            self.fail(batch, self.idem.failure(
                batch, ErrorCode.request_timed_out,
                "delivery.timeout.ms expired before the broker acknowledged it"))

    def bump(self) -> bool:
        """A new epoch or producer id (rows 13-16; call when idem.quiet()): True when a new
        producer id must be asked for now (InitProducerId)."""
        error = ErrorCode.out_of_order_sequence_number
        if self.idem.bump_needed:
            for batch, verdict in self.idem.bump():
                self.acc.remove(batch)
                self.fail(batch, self.idem.failure(batch, error, verdict.why))
            if self.idem.stopped:  # row 13: the queued batches fail too
                self.fatal = ProducerFatalError(error, RESUMED_STOPS)
                log.error("producer stopped: %s", self.fatal)
                for batch in self.acc.drain_all():
                    self.fail(batch, self.idem.failure(batch, error, RESUMED_STOPS))
                return False
            self.acc.restart_sequences()
            self.metrics.epoch_bumped()
            log.info("producer %d: new epoch %d", self.idem.producer_id, self.idem.epoch)
        return self.idem.needs_new_id

    # --- settling ---------------------------------------------------------------------------

    def deliver(self, batch: ProducerBatch, base_offset: int, duplicate: bool = False) -> None:
        self.acc.finished(batch, None)
        if duplicate:
            self.metrics.duplicate(batch.count)
        batch.complete(base_offset)

    def fail(self, batch: ProducerBatch, error: BaseException) -> None:
        self.acc.finished(batch, error)
        self.metrics.batch_failed(batch.count)
        if self.on_failed is not None:
            self.on_failed(batch, error)
        batch.fail(error)

    def abort(self, error: KafkaError) -> None:
        """Fail every batch not yet settled (a forced close, or a sender failure)."""
        self.fatal = self.fatal or error
        for batch in self.acc.drain_all():
            self.fail(batch, self.idem.failure(batch, error.error, str(error)))
        with self.acc.lock:
            pending = list(self.acc.incomplete)
        for batch in pending:
            if not batch.settled:
                self.fail(batch, self.idem.failure(batch, error.error, str(error)))
