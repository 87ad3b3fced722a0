"""A model check of oncelog's producer against the broker's rules, with forgetful brokers.

The client is the real code (RecordAccumulator, IdempotenceManager, Delivery), the broker
the real ProducerStateManager over a list for a log (produce_model.py says how each is
driven). Up to three applications produce, each through one process after another: a
process may crash, and its successor resumes its last checkpoint and produces the same
input again (seed 001, "Transitivity"). The network loses and reorders requests and answers,
duplicates requests as the chaos proxy does, and cuts connections; the broker answers
errors now and then (a leader change, a refused timestamp, an append it could not
replicate); time passes, so that requests time out, batches reach
delivery.timeout.ms, and the broker moves idle producers to compact records and then forgets
them (producer.id.expiration.ms, producer.id.tombstone.ms), after which it takes a later
batch before an earlier one (rules.py rows 2 and 11, the case of issue 12). Producers are
evicted to compact records too (max_producers 1 or 2), the broker restarts from a
snapshot, a snapshot plus the log, or the log, and in some runs one application starts from
a checkpoint near the top of the sequence space, which wraps at 2^31.

After every step and at the end (produce_model.World): every record reported delivered is
in the log exactly once, where it was reported; nothing is stored twice; each application's
records of a partition are stored in the order it produced them; a record reported "not
stored" is not stored by that process; once the faults stop, every record gets its report.
"""

from __future__ import annotations

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from kio.schema.errors import ErrorCode
from support.produce_model import (
    EXPIRATION,
    TOMBSTONE,
    TOPIC,
    Checkpoint,
    World,
)

from oncelog.producer_state.manager import StateLimits
from oncelog.protocol.sequences import SEQUENCE_SPACE

PICK = st.integers(min_value=0, max_value=1 << 16)  # an index, taken modulo the list it picks
# A leader change (refused, retriable), a timestamp out of bounds (refused for good), an
# append not replicated in time (stored, not acknowledged).
BROKER_ERRORS = [ErrorCode.not_leader_or_follower, ErrorCode.invalid_timestamp,
                 ErrorCode.not_enough_replicas_after_append]


class ClientModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World()

    @initialize(applications=st.integers(1, 3), partitions=st.integers(1, 2),
                max_producers=st.sampled_from([1, 2, 100_000]), wrap=st.booleans())
    def start(self, applications: int, partitions: int, max_producers: int,
              wrap: bool) -> None:
        self.world = world = World(partitions, StateLimits(
            max_producers=max_producers, expiration_ms=EXPIRATION, tombstone_ms=TOMBSTONE))
        for number in range(applications):
            if wrap and number == 0:
                # A producer that wrote long ago (the broker forgot it: row 2 takes it back at
                # any sequence) resumes near the top of the sequence space.
                pid = world.new_producer_id()
                for partition in world.broker:
                    partition.state.forgotten_up_to = pid
                top = {str(p): SEQUENCE_SPACE - 4 for p in range(partitions)}
                world.start_lineage(Checkpoint({"producer_id": pid, "producer_epoch": 0,
                                                "sequences": {TOPIC: top}}, 0, world.now))
            else:
                world.start_lineage()

    def _pick(self, items: list, pick: int):
        return items[pick % len(items)]

    # --- the applications -------------------------------------------------------------------

    @rule(pick=PICK, count=st.integers(1, 5))
    def produce(self, pick: int, count: int) -> None:
        lineage = self._pick(self.world.lineages, pick)
        if lineage.process.delivery.fatal is None:
            self.world.produce(lineage, count)

    @rule(pick=PICK)
    def sender_turn(self, pick: int) -> None:
        self._pick(self.world.live(), pick).step()

    @precondition(lambda self: any(self.world.can_checkpoint(x) for x in self.world.lineages))
    @rule(pick=PICK)
    def checkpoint(self, pick: int) -> None:
        ready = [x for x in self.world.lineages if self.world.can_checkpoint(x)]
        self.world.checkpoint(self._pick(ready, pick))

    @precondition(lambda self: any(self.world.can_resume(x) for x in self.world.lineages))
    @rule(pick=PICK)
    def crash_and_resume(self, pick: int) -> None:
        ready = [x for x in self.world.lineages if self.world.can_resume(x)]
        self.world.crash_and_resume(self._pick(ready, pick))

    # --- the network ------------------------------------------------------------------------

    @precondition(lambda self: self.world.wire)
    @rule(pick=PICK)
    def broker_takes_a_request(self, pick: int) -> None:
        self.world.process_copy(self._pick(self.world.wire, pick))

    @precondition(lambda self: self.world.wire)
    @rule()
    def broker_takes_every_request_in_order(self) -> None:
        while self.world.wire:
            self.world.process_copy(self.world.wire[0])

    @precondition(lambda self: self.world.wire)
    @rule(pick=PICK, error=st.sampled_from(BROKER_ERRORS))
    def broker_answers_an_error(self, pick: int, error: ErrorCode) -> None:
        self.world.broker_fails(self._pick(self.world.wire, pick), error)

    @precondition(lambda self: self.world.answers)
    @rule(pick=PICK)
    def client_reads_an_answer(self, pick: int) -> None:
        self.world.read_answer(pick % len(self.world.answers))

    @precondition(lambda self: self.world.wire)
    @rule(pick=PICK)
    def lose_a_request(self, pick: int) -> None:
        self.world.wire.pop(pick % len(self.world.wire))

    @precondition(lambda self: self.world.answers)
    @rule(pick=PICK)
    def lose_an_answer(self, pick: int) -> None:
        self.world.answers.pop(pick % len(self.world.answers))

    @precondition(lambda self: self.world.wire)
    @rule(pick=PICK)
    def a_request_arrives_twice(self, pick: int) -> None:
        self.world.duplicate(self._pick(self.world.wire, pick))

    @rule(pick=PICK)
    def connection_cut(self, pick: int) -> None:
        self._pick(self.world.live(), pick).cut()

    @precondition(lambda self: any(p.lookups for p in self.world.live()))
    @rule(pick=PICK)
    def broker_describes_producers(self, pick: int) -> None:
        process = self._pick([p for p in self.world.live() if p.lookups], pick)
        process.answer_lookup(process.lookups[0])
        event("DescribeProducers answered")

    @rule(backwards=st.booleans(), fault=st.sampled_from([None, *BROKER_ERRORS]))
    def a_calm_spell(self, backwards: bool, fault: ErrorCode | None) -> None:
        """Every process sends what it may; the broker takes every request, in order or
        last first, and may answer the first an error; every answer and lookup is read."""
        world = self.world
        for process in world.live():
            process.step()
        if world.wire and fault is not None:
            world.broker_fails(world.wire[-1 if backwards else 0], fault)
        while world.wire:
            world.process_copy(world.wire[-1 if backwards else 0])
        while world.answers:
            world.read_answer(0)
        for process in world.live():
            while process.lookups:
                process.answer_lookup(process.lookups[0])

    @rule(ms=st.sampled_from([10, 10, 50, 50, 200, 1000]))
    def time_passes(self, ms: int) -> None:
        self.world.advance(ms)

    @rule()
    def the_broker_forgets_idle_producers(self) -> None:
        """Long enough for idle producers to become compact records, then for those to go."""
        self.world.advance(EXPIRATION + 1000)
        self.world.advance(TOMBSTONE + 1000)

    # --- the broker -------------------------------------------------------------------------

    @rule(pick=PICK)
    def take_snapshot(self, pick: int) -> None:
        self._pick(self.world.broker, pick).take_snapshot()

    @rule(how=st.sampled_from(["clean", "snapshot+log", "log"]))
    def restart_broker(self, how: str) -> None:
        self.world.restart_broker(how)

    # --- what must hold ---------------------------------------------------------------------

    @invariant()
    def every_report_is_true_and_nothing_is_stored_twice(self) -> None:
        self.world.check()

    def teardown(self) -> None:
        self.world.check()
        self.world.settle()
        self.world.final_checks()


TestClientModel = ClientModel.TestCase
TestClientModel.settings = settings(derandomize=True, database=None, max_examples=1000,
                                    stateful_step_count=100, deadline=None)
