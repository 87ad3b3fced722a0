"""A model check of oncelog.Producer's idempotence rules against the broker's real ones.

The client is the real RecordAccumulator, ProducerBatch and IdempotenceManager, driven the way
the Sender drives them; the broker is test_idempotence_model's Broker (the real
ProducerStateManager in front of a list standing for the log). Between them, one connection:
requests are processed in order, answers come back in order, and a cut loses every request
not yet processed and every answer not yet read (some of those requests were stored). The
broker restarts at any time from its state or its log.

Faults: cuts, broker restarts, and delivery timeouts of the oldest queued batch (which leave a
gap and force a new epoch). After the faults stop and every batch is settled: nothing is
stored twice, every record the client was told was delivered is stored, the records are stored
in the order they were produced, and a record the client failed is one whose fate it could not
know.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kio.schema.errors import ErrorCode
from test_idempotence_model import FIRST_PID, Broker, Request, Stored

from oncelog.client.accumulator import RecordAccumulator
from oncelog.client.idempotence import Action, IdempotenceManager
from oncelog.client.producer_batch import ProducerBatch
from oncelog.client.producer_config import parse_producer_config
from oncelog.producer_state.rules import Duplicate, Refuse
from oncelog.protocol.records import NONE, decode_batch

MAX_IN_FLIGHT = 5
SETTLE_STEPS = 10_000


def record_ids(batch: ProducerBatch) -> tuple[int, ...]:
    assert batch.data is not None
    return tuple(int(r.value) for r in decode_batch(batch.data)[1])


class ClientAndBroker(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.broker = Broker()
        config = parse_producer_config({"linger.ms": 0, "batch.num.messages": 3})
        self.acc = RecordAccumulator(config, lambda: 0.0)
        self.idem = IdempotenceManager(True, MAX_IN_FLIGHT, retries=10**9)
        self.idem.set_identity(FIRST_PID, 0)
        self.wire: list[ProducerBatch] = []   # sent, not yet processed by the broker
        self.answers: list[tuple[ProducerBatch, object]] = []  # processed, not yet read
        self.produced = 0
        self.delivered: set[int] = set()
        self.failed: set[int] = set()
        self.records_of: dict[ProducerBatch, list[int]] = {}

    # --- the application and the sender ------------------------------------------------------

    @rule(n=st.integers(1, 4))
    def produce(self, n: int) -> None:
        for _ in range(n):
            value = b"%d" % self.produced
            batch, _ = self.acc.append("t", 0, 0, None, value, None, len(value))
            self.records_of.setdefault(batch, []).append(self.produced)
            self.produced += 1

    @rule()
    def send(self) -> None:
        if (self.idem.bump_needed or self.idem.needs_new_id) and self.idem.in_flight() == 0:
            self._bump()
        with self.acc.lock:
            self.acc.flushing += 1  # every open batch is ready: linger 0
        heads, _ = self.acc.ready_heads(0.0)
        with self.acc.lock:
            self.acc.flushing -= 1
        for batch in heads:
            if self.idem.may_send(batch, len(self.wire) + len(self.answers)):
                self.acc.take(batch)
                batch.build(NONE)
                self.idem.sending(batch)
                self.wire.append(batch)

    def _bump(self) -> None:
        for batch in self.idem.bump():
            self.acc.remove(batch)
            self._fail(batch)
        if self.idem.needs_new_id:
            self.idem.set_identity(self.idem.producer_id + 1, 0)

    # --- the connection ----------------------------------------------------------------------

    @rule()
    def broker_processes(self) -> None:
        if not self.wire:
            return
        batch = self.wire.pop(0)
        assert batch.base_sequence is not None
        request = Request(self.idem.producer_id, batch.epoch, batch.base_sequence,
                          record_ids(batch), opens_epoch=False, sent_as_oldest=False)
        self.answers.append((batch, self.broker.produce(request)))

    @rule()
    def client_reads(self) -> None:
        if not self.answers:
            return
        batch, answer = self.answers.pop(0)
        if isinstance(answer, Stored):
            error, offset = ErrorCode.none, answer.base_offset
        elif isinstance(answer, Duplicate):
            error, offset = ErrorCode.none, answer.base_offset
        else:
            assert isinstance(answer, Refuse)
            error, offset = answer.error, -1
        action = self.idem.answered(batch, error)
        if action is Action.DELIVERED:
            self._deliver(batch, offset)
        elif action is Action.RESOLVE:
            entry = self.broker.state.entry(self.idem.producer_id)
            held = (entry.epoch, entry.last_seq) if entry is not None else None
            self.acc.reenqueue(batch, self.idem.order)
            stored = self.idem.resolved(batch, held)
            if stored == batch.count:
                self.acc.remove(batch)
                self._deliver(batch, -1)
            elif stored:
                batch.drop_head(stored, NONE)
                batch.stamp(self.idem.producer_id, batch.epoch, batch.base_sequence)
        elif action is Action.RETRY:
            self.acc.reenqueue(batch, self.idem.order)
        else:
            raise AssertionError(f"{action} for {error!r}: the model has no such faults")

    @rule()
    def cut(self) -> None:
        """The connection breaks: what the broker did not process is lost, and so is every
        answer not read yet."""
        lost = self.wire + [batch for batch, _ in self.answers]
        self.wire, self.answers = [], []
        for batch in lost:
            assert self.idem.lost(batch) is Action.RETRY
            self.acc.reenqueue(batch, self.idem.order)

    @rule()
    def delivery_timeout(self) -> None:
        """The oldest queued batch runs out of delivery.timeout.ms: it fails; if it was
        sent, it leaves a gap and the producer needs a new epoch."""
        queue = self.acc.queues.get(("t", 0))
        if not queue:
            return
        batch = queue.popleft()
        self.idem.give_up(batch)
        self._fail(batch)

    @rule(how=st.sampled_from(["clean", "log"]))
    def broker_restarts(self, how: str) -> None:
        self.cut()
        self.broker.restart(how)

    def _deliver(self, batch: ProducerBatch, offset: int) -> None:
        batch.complete(offset)
        self.acc.finished(batch)
        self.delivered.update(self.records_of[batch])

    def _fail(self, batch: ProducerBatch) -> None:
        batch.fail(RuntimeError("outcome unknown"))
        self.acc.finished(batch)
        self.failed.update(self.records_of[batch])

    # --- what must hold ----------------------------------------------------------------------

    def stored(self) -> list[int]:
        return [r for logged in self.broker.log for r in logged.request.records]

    @invariant()
    def nothing_stored_twice_and_in_order(self) -> None:
        stored = self.stored()
        assert len(stored) == len(set(stored)), "a record was stored twice"
        assert stored == sorted(stored), "records stored out of order"

    def teardown(self) -> None:
        for _ in range(SETTLE_STEPS):
            if not self.acc.incomplete:
                break
            self.send()
            self.broker_processes()
            self.client_reads()
        assert not self.acc.incomplete, "batches never settled"
        stored = set(self.stored())
        assert self.delivered <= stored, "a delivered record is not stored"
        assert stored <= set(range(self.produced))
        assert stored | self.failed == set(range(self.produced)), "a record vanished"


TestClientAndBroker = ClientAndBroker.TestCase
TestClientAndBroker.settings = settings(max_examples=150, stateful_step_count=60,
                                        deadline=None)
