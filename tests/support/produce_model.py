"""The real producer against the real broker rules over a model network, for the model tests
(test_client_model.py, test_idempotence_model.py).

The client is oncelog's own code: RecordAccumulator, IdempotenceManager and Delivery (the
Sender's decisions without its sockets), driven as sender.py drives them, on a model clock.
The broker is, per partition, the real ProducerStateManager (producer_state/rules.py) in
front of a list standing for the log, used as broker/partition.py uses it: validate, append,
apply; expire() as its periodic check runs it; snapshots and restarts from a snapshot plus
the log after it, or from the log alone; DescribeProducers answered from its live entries,
as broker/producer_ids.py answers it.

Between them, copies of requests: any copy may be processed in any order, lost, processed
twice in a row (the chaos proxy's duplicate-request: the second answer is eaten), processed
after the client gave up on it (it was still in a socket buffer when the connection broke or
timed out), or answered into the void. What no network does: replay a request later (TCP
delivers a request once), or deliver a copy later than request.timeout.ms after it was sent
(it dies then). With the producer's
delivery.timeout.ms that bounds how long after a batch was made any copy of it can arrive,
and the broker forgets an idle producer only after producer.id.expiration.ms plus
producer.id.tombstone.ms, longer than that (client/idempotence.py, "What this relies on").

What the tests check through World: every record a producer reported delivered is in the
log exactly once, at the offset it reported; no record is in the log twice; a record
reported "not stored" is not in the log from that process's copies, even after every copy
still on its way has arrived; each producer's records of a partition are in the log in the
order it produced them; every record gets its report within a bounded number of steps once
the faults stop.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import hypothesis
from hypothesis.errors import InvalidArgument
from kio.schema.errors import ErrorCode

from oncelog.client.network.connection import KafkaError, OutcomeUnknown
from oncelog.client.producer.accumulator import RecordAccumulator
from oncelog.client.producer.delivery import Delivery
from oncelog.client.producer.idempotence import IdempotenceManager
from oncelog.client.producer.producer_batch import ProducerBatch, RecordMetadata
from oncelog.client.producer.producer_config import parse_producer_config
from oncelog.producer_state import snapshot
from oncelog.producer_state.manager import ProducerStateManager, StateLimits
from oncelog.producer_state.rules import Append, BatchIdentity, Duplicate
from oncelog.protocol.record_batch import read_header
from oncelog.protocol.records import decode_batch
from oncelog.protocol.sequences import SEQUENCE_SPACE

START = 1_700_000_000_000  # ms
TOPIC = "t"
# The producer's and the broker's timing (ms). The broker forgets an idle producer only
# after EXPIRATION + TOMBSTONE, which is more than DELIVERY_TIMEOUT + REQUEST_TIMEOUT (and
# TOMBSTONE alone is too: a producer evicted while busy becomes a compact record at once).
# ProducerStateManager keeps the last append in whole seconds, so the first step may come
# up to a second early.
REQUEST_TIMEOUT = 200
DELIVERY_TIMEOUT = 1000
RETRY_BACKOFF = 10
EXPIRATION = 2000
TOMBSTONE = 2000
CONFIG = {"linger.ms": 0, "batch.num.messages": 3, "request.timeout.ms": REQUEST_TIMEOUT,
          "delivery.timeout.ms": DELIVERY_TIMEOUT, "retry.backoff.ms": RETRY_BACKOFF}
MAX_IN_FLIGHT = 5
CACHE_SIZE = 5  # batches the broker remembers per producer (StateLimits.batches_to_retain)
# A process that crashes is resumed from its checkpoint at most this long after it took it,
# so that the records it stored after it are still remembered when its successor sends
# them again (what the copy job of seed 001 relies on).
RESUME_WINDOW = EXPIRATION + TOMBSTONE - 1000 - DELIVERY_TIMEOUT - REQUEST_TIMEOUT


def event(what: str) -> None:
    """hypothesis.event inside a hypothesis test (its statistics), nothing outside one."""
    try:
        hypothesis.event(what)
    except InvalidArgument:
        pass


def value_of(lineage: int, index: int) -> bytes:
    return b"%d:%d" % (lineage, index)


def parse_value(value: bytes) -> tuple[int, int]:
    lineage, index = value.split(b":")
    return int(lineage), int(index)


# --- the broker -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Logged:
    process: int  # the model process whose copy stored it
    identity: BatchIdentity
    records: tuple[bytes, ...]
    base_offset: int


class BrokerPartition:
    """One partition as broker/partition.py runs it, over a list for a log."""

    def __init__(self, limits: StateLimits) -> None:
        self.limits = limits
        self.state = ProducerStateManager(limits)
        self.log: list[Logged] = []
        self.end = 0
        self.snapshots: list[bytes] = []

    def produce(self, copy: Copy, now: int) -> tuple[ErrorCode, int, str]:
        decision = self.state.validate(copy.identity, lambda pid: True)
        if isinstance(decision, Append):
            logged = Logged(copy.process.number, copy.identity, copy.records, self.end)
            self.log.append(logged)
            self.end += len(copy.records)
            self.state.apply(decision, self.end - 1, now, now)
            return ErrorCode.none, logged.base_offset, ""
        if isinstance(decision, Duplicate):
            held = self.records_at(decision.base_offset, decision.last_offset)
            assert held == list(copy.records), \
                f"a Duplicate of {copy.identity} points at other records: {held}"
            return ErrorCode.none, decision.base_offset, ""
        return decision.error, -1, decision.message

    def records_at(self, first: int, last: int) -> list[bytes]:
        return [r for logged in self.log for i, r in enumerate(logged.records)
                if first <= logged.base_offset + i <= last]

    def record_at(self, offset: int) -> bytes | None:
        found = self.records_at(offset, offset)
        return found[0] if found else None

    def describe(self, producer_id: int) -> tuple[int, int] | None:
        """DescribeProducers, as broker/producer_ids.py answers it: live entries only."""
        for entry in self.state.entries():
            if entry.producer_id == producer_id:
                return entry.epoch, entry.last_seq
        return None

    def take_snapshot(self) -> None:
        """What a segment roll does: keep the state as of the log end."""
        self.snapshots.append(snapshot.of_state(self.end, self.state))

    def restart(self, how: str, now: int) -> None:
        """From a snapshot now (a clean shutdown), the newest snapshot and the log after it,
        or the log alone, as Partition._open does."""
        state = ProducerStateManager(self.limits)
        start = 0
        image = snapshot.of_state(self.end, self.state) if how == "clean" else None
        if how == "snapshot+log" and self.snapshots:
            image = self.snapshots[-1]
        if image is not None:
            snap = snapshot.decode(image)
            state.load(snap.entries, snap.tombstones, snap.forgotten_up_to)
            start = snap.offset
        for logged in self.log:
            if logged.base_offset >= start:
                state.replay(logged.identity, logged.base_offset + len(logged.records) - 1,
                             now, now)
        self.state = state


# --- the wire ---------------------------------------------------------------------------------

@dataclass(eq=False)
class Copy:
    """One attempt of a batch on its way to the broker: what its bytes say, as sent."""

    process: Process
    batch: ProducerBatch
    partition: int
    identity: BatchIdentity
    records: tuple[bytes, ...]
    sent_at: int
    open: bool = True  # its process still waits for the answer

    @classmethod
    def of(cls, process: Process, batch: ProducerBatch, now: int) -> Copy:
        assert batch.data is not None
        data = bytes(batch.data)
        header = read_header(data)
        last = (header.base_sequence + header.records_count - 1) % SEQUENCE_SPACE
        identity = BatchIdentity(header.producer_id, header.producer_epoch,
                                 header.base_sequence, last)
        records = tuple(record.value for record in decode_batch(data)[1])
        return cls(process, batch, batch.partition, identity, records, now)

    def ghost(self) -> Copy:
        return Copy(self.process, self.batch, self.partition, self.identity, self.records,
                    self.sent_at, open=False)


@dataclass(frozen=True)
class Checkpoint:
    state: dict
    position: int  # the lineage's next input record when it was taken
    at: int


# --- the producer -----------------------------------------------------------------------------

class Process:
    """One producer process: the real accumulator, idempotence manager and Delivery."""

    def __init__(self, world: World, number: int, lineage: int,
                 resume: Checkpoint | None) -> None:
        self.world = world
        self.number = number
        self.lineage = lineage
        config = parse_producer_config({**CONFIG, **world.config})
        self.acc = RecordAccumulator(config, world.clock)
        self.idem = IdempotenceManager(True, MAX_IN_FLIGHT, config.retries)
        self.delivery = Delivery(config, self.acc, self.idem, world.clock)
        self._trace_rows()
        if resume is not None:
            self.idem.resume(resume.state)
        else:
            self.idem.set_identity(world.new_producer_id(), 0)
        self.lookups: list[ProducerBatch] = []  # waiting for DescribeProducers
        self.produced = 0
        self.reported = 0
        self.failed = False  # a record failed since the last checkpoint: flush would raise

    def _trace_rows(self) -> None:
        """Which rows of the client's table the run went through (hypothesis statistics)."""
        idem = self.idem
        apply, bump = idem._apply, idem.bump

        def traced_apply(state, batch, verdict):
            event(f"client row {verdict.row}: {verdict.outcome.value}")
            return apply(state, batch, verdict)

        def traced_bump():
            unacked = sum(len(state.unacked) for state in idem.partitions.values())
            failing = bump()
            for _, verdict in failing:
                event(f"client row {verdict.row}: {verdict.outcome.value}")
            if unacked > len(failing) and not idem.stopped:
                event("client row 16: resequenced")
            return failing

        idem._apply, idem.bump = traced_apply, traced_bump

    def produce(self, index: int) -> None:
        value = value_of(self.lineage, index)
        partition = self.world.partition_of(index)

        def on_delivery(error: BaseException | None, meta: RecordMetadata | None) -> None:
            self.reported += 1
            self.world.reported(self, value, error, meta)

        self.acc.append(TOPIC, partition, None, None, value, None, len(value), on_delivery)
        self.produced += 1

    def open_copies(self) -> list[Copy]:
        """Its attempts in flight: on the wire, lost, or answered and not yet read."""
        return [c for c in self.world.pending if c.process is self]

    def step(self) -> None:
        """One turn of Sender.run: expire, bump when quiet, send rounds while they send."""
        now = self.world.clock()
        self.delivery.expire(now)
        if (self.idem.bump_needed or self.idem.needs_new_id) and self.idem.quiet():
            if self.delivery.bump():
                self.idem.set_identity(self.world.new_producer_id(), 0)  # InitProducerId
        sent = True
        while sent:
            sent = False
            heads, _ = self.acc.ready_heads(now)
            for batch in heads:
                if self.delivery.fatal is not None:
                    self.delivery.refuse_after_fatal(batch)
                elif self.delivery.take(batch, len(self.open_copies())):
                    self.world.send(Copy.of(self, batch, self.world.now))
                    sent = True

    def read(self, copy: Copy, error: ErrorCode, base_offset: int, message: str) -> None:
        copy.open = False
        self.world.pending.remove(copy)
        if self.delivery.answered(copy.batch, error, base_offset, message):
            self.lookups.append(copy.batch)

    def cut(self) -> None:
        """The connection breaks (or a request on it times out): every attempt on it is
        lost to the client; its copies may still reach the broker."""
        for copy in self.open_copies():
            copy.open = False
            self.world.pending.remove(copy)
            self.delivery.lost(copy.batch, KafkaError(ErrorCode.network_exception, "cut"))
        self.world.answers = [a for a in self.world.answers if a[0].process is not self]

    def answer_lookup(self, batch: ProducerBatch) -> None:
        self.lookups.remove(batch)
        partition = self.world.broker[batch.partition]
        self.delivery.looked_up(batch, partition.describe(self.idem.producer_id))

    def lookups_give_up(self) -> None:
        """Sender._describe_producer asks until the batch's delivery timeout."""
        for batch in list(self.lookups):
            if self.world.clock() >= batch.created + DELIVERY_TIMEOUT / 1000:
                self.lookups.remove(batch)
                self.delivery.lookup_failed(batch, KafkaError(ErrorCode.network_exception,
                                                              "no answer"))

    @property
    def settled(self) -> bool:
        return not self.acc.incomplete and self.reported == self.produced


# --- the world --------------------------------------------------------------------------------

@dataclass
class Lineage:
    """An application's stream of input records, produced by one process after another."""

    number: int
    next_input: int = 0
    process: Process | None = None
    checkpoint: Checkpoint | None = None


@dataclass
class World:
    partitions: int = 2
    limits: StateLimits = field(default_factory=lambda: StateLimits(
        expiration_ms=EXPIRATION, tombstone_ms=TOMBSTONE))
    config: dict = field(default_factory=dict)  # producer settings over CONFIG
    now: int = START

    def __post_init__(self) -> None:
        self.broker = [BrokerPartition(self.limits) for _ in range(self.partitions)]
        self.lineages: list[Lineage] = []
        self.processes: list[Process] = []  # every process ever started
        self.wire: list[Copy] = []  # copies on their way to the broker
        self.answers: list[tuple[Copy, ErrorCode, int, str]] = []
        self.pending: list[Copy] = []  # copies whose process waits for their answer
        self._producer_ids = itertools.count(1000)
        self._process_numbers = itertools.count()
        self.not_stored: set[tuple[int, bytes]] = set()  # (process, record) said not stored
        # What a report said that was not so (an on_delivery callback's exception is logged,
        # not raised, so the reports are checked here and the machine asserts this is empty).
        self.violations: list[str] = []
        self.reports: dict[bytes, tuple[BaseException | None, RecordMetadata | None]] = {}
        self.scanned = [0] * self.partitions
        self.seen: dict[bytes, int] = {}  # record -> times in the log
        self.last_index: dict[tuple[int, int], int] = {}  # (lineage, partition) -> index

    # --- plumbing ---------------------------------------------------------------------------

    def clock(self) -> float:
        return self.now / 1000

    def new_producer_id(self) -> int:
        return next(self._producer_ids)

    def partition_of(self, index: int) -> int:
        return (index // 6) % self.partitions  # runs of two batches

    def send(self, copy: Copy) -> None:
        self.wire.append(copy)
        self.pending.append(copy)

    def live(self) -> list[Process]:
        return [lineage.process for lineage in self.lineages if lineage.process is not None]

    # --- the application --------------------------------------------------------------------

    def start_lineage(self, resume: Checkpoint | None = None) -> Lineage:
        lineage = Lineage(len(self.lineages))
        self.lineages.append(lineage)
        lineage.process = Process(self, next(self._process_numbers), lineage.number, resume)
        return lineage

    def produce(self, lineage: Lineage, count: int) -> None:
        assert lineage.process is not None
        for _ in range(count):
            lineage.process.produce(lineage.next_input)
            lineage.next_input += 1

    def can_checkpoint(self, lineage: Lineage) -> bool:
        process = lineage.process
        return (process is not None and process.delivery.fatal is None and process.settled
                and not process.failed)

    def checkpoint(self, lineage: Lineage) -> None:
        """Producer.checkpoint(): a flush that raised nothing, then the identity."""
        assert lineage.process is not None and self.can_checkpoint(lineage)
        lineage.checkpoint = Checkpoint(lineage.process.idem.checkpoint(), lineage.next_input,
                                        self.now)

    def can_resume(self, lineage: Lineage) -> bool:
        return (lineage.checkpoint is not None
                and self.now - lineage.checkpoint.at <= RESUME_WINDOW)

    def crash_and_resume(self, lineage: Lineage) -> None:
        """The process dies (its copies on the wire may still arrive, their answers go
        nowhere); a new one resumes the checkpoint and produces again every input record
        from the checkpoint's position on (seed 001, "Transitivity")."""
        old = lineage.process
        assert old is not None and lineage.checkpoint is not None
        for copy in self.pending:
            if copy.process is old:
                copy.open = False
        self.pending = [c for c in self.pending if c.process is not old]
        self.answers = [a for a in self.answers if a[0].process is not old]
        checkpoint = lineage.checkpoint
        process = lineage.process = Process(self, next(self._process_numbers), lineage.number,
                                            checkpoint)
        for index in range(checkpoint.position, lineage.next_input):
            process.produce(index)
        event("a process crashed and its successor resumed the checkpoint")

    # --- the network ------------------------------------------------------------------------

    def process_copy(self, copy: Copy) -> None:
        """The broker takes one copy off the wire."""
        self.wire.remove(copy)
        error, offset, message = self.broker[copy.partition].produce(copy, self.now)
        event(f"broker: {error.name}" + ("" if copy.open else " (no one waits)"))
        if copy.open:
            self.answers.append((copy, error, offset, message))
        self.check_log()

    def broker_fails(self, copy: Copy, error: ErrorCode) -> None:
        """The broker takes a copy and answers ``error`` whatever the rules say: refused
        before the append (a leader change, a timestamp out of bounds, ...), or, for
        NOT_ENOUGH_REPLICAS_AFTER_APPEND, stored but not acknowledged."""
        self.wire.remove(copy)
        if error == ErrorCode.not_enough_replicas_after_append:
            self.broker[copy.partition].produce(copy, self.now)
            self.check_log()
        event(f"broker: {error.name} whatever the rules say")
        if copy.open:
            self.answers.append((copy, error, -1, "a fault"))

    def read_answer(self, index: int) -> None:
        copy, error, offset, message = self.answers.pop(index)
        copy.process.read(copy, error, offset, message)

    def duplicate(self, copy: Copy) -> None:
        """The broker takes a copy twice in a row; the second answer is eaten."""
        self.process_copy(copy)
        ghost = copy.ghost()
        self.wire.append(ghost)
        self.process_copy(ghost)

    def advance(self, ms: int) -> None:
        """Time passes: the broker's expiration check runs, copies older than the request
        timeout die, and a process whose oldest attempt is that old gives up on the whole
        connection (aio_connection's watchdog)."""
        self.now += ms
        for partition in self.broker:
            retired, dropped = partition.state.expire(self.now)
            if retired:
                event("broker: idle producer moved to a compact record")
            if dropped:
                event("broker: compact record dropped, producer forgotten")
        deadline = self.now - REQUEST_TIMEOUT
        self.wire = [c for c in self.wire if c.sent_at >= deadline]
        for process in self.live():
            if any(c.sent_at < deadline for c in process.open_copies()):
                process.cut()
            process.lookups_give_up()

    def restart_broker(self, how: str) -> None:
        """Every connection breaks; what is in the old broker's socket buffers is gone."""
        for process in self.live():
            process.cut()
        self.pending.clear()  # a crashed process's copies (its successor's are cut above)
        self.wire.clear()
        self.answers.clear()
        for partition in self.broker:
            partition.restart(how, self.now)

    # --- what must hold ---------------------------------------------------------------------

    def reported(self, process: Process, value: bytes, error: BaseException | None,
                 meta: RecordMetadata | None) -> None:
        self.reports[value] = (error, meta)
        try:
            self._check_report(process, value, error, meta)
        except AssertionError as exc:
            self.violations.append(str(exc))

    def _check_report(self, process: Process, value: bytes, error: BaseException | None,
                      meta: RecordMetadata | None) -> None:
        """A record's future settled: what it says must be true now (and stay true)."""
        self.check_log()
        if error is None:
            assert meta is not None
            assert self.seen.get(value) == 1, \
                f"process {process.number} reported {value!r} delivered; in the log " \
                f"{self.seen.get(value, 0)} times"
            if meta.offset >= 0:
                held = self.broker[meta.partition].record_at(meta.offset)
                assert held == value, f"{value!r} reported at {meta.offset}, which holds {held!r}"
            event("record delivered" + (" (offset unknown)" if meta.offset < 0 else ""))
            return
        process.failed = True
        assert isinstance(error, KafkaError), error
        if isinstance(error, OutcomeUnknown):
            event("record failed, outcome unknown")
            assert "outcome unknown" in str(error)
        else:
            event("record failed, not stored")
            assert str(error).endswith("; not stored"), error
            self.not_stored.add((process.number, value))

    def check(self) -> None:
        self.check_log()
        assert not self.violations, self.violations

    def check_log(self) -> None:
        """Nothing twice; each lineage's records of a partition in the order produced."""
        for p, partition in enumerate(self.broker):
            for logged in partition.log[self.scanned[p]:]:
                for value in logged.records:
                    self.seen[value] = self.seen.get(value, 0) + 1
                    assert self.seen[value] == 1, f"{value!r} stored twice"
                    lineage, index = parse_value(value)
                    last = self.last_index.get((lineage, p), -1)
                    assert index > last, f"{value!r} stored after record {last}"
                    self.last_index[(lineage, p)] = index
            self.scanned[p] = len(partition.log)

    def settle(self, max_rounds: int = 400) -> None:
        """The faults stop: every live process's records get their reports within a bounded
        number of rounds (time moves on, so delivery.timeout.ms ends any wait)."""
        for _ in range(max_rounds):
            live = self.live()
            if all(p.settled for p in live):
                break
            for process in live:
                process.step()
            while self.wire:
                self.process_copy(self.wire[0])
            while self.answers:
                self.read_answer(0)
            for process in live:
                while process.lookups:
                    process.answer_lookup(process.lookups[0])
            self.advance(RETRY_BACKOFF * 5)
        unsettled = {p.number: (len(p.acc.incomplete), p.produced - p.reported)
                     for p in self.live() if not p.settled}
        assert not unsettled, f"records never reported: {unsettled}"
        self.check()

    def final_checks(self) -> None:
        """After settling: the copies still on their way arrive too, then every record said
        not stored is not in the log from the process that said so."""
        while self.wire:
            self.process_copy(self.wire[0])
        stored_by = {(logged.process, value) for partition in self.broker
                     for logged in partition.log for value in logged.records}
        wrong = self.not_stored & stored_by
        assert not wrong, f"reported not stored, yet stored: {sorted(wrong)}"
        self.check()
