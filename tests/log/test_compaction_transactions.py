"""The log cleaner and transactions, through a real Partition (producer state, markers, the
aborted transaction index) on a MemoryDisk: read_committed is the oracle. Whatever the
offset map's capacity, wherever it fills, a clean never changes what a read_committed
consumer reads as each key's latest value, and never lets an aborted transaction's data be
seen (Kafka never counts an aborted transaction's data as live)."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from kio.schema.errors import ErrorCode
from support.compaction_model import committed_view, latest_committed

from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.log import cleaning
from oncelog.log.compaction import MAP_ENTRY_OVERHEAD, CompactionConfig
from oncelog.log.log import LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.producer_state.manager import StateLimits
from oncelog.producer_state.rules import MarkerIdentity
from oncelog.protocol.records import encode_batch

LOG_DIR = "/data"
NOW = int(time.time() * 1000)


class Issued:
    def is_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < 1000

    def highest_claimed(self) -> int:
        return 999


def accept(_pid: int, _epoch: int) -> ErrorCode:
    return ErrorCode.none


def open_partition(disk: MemoryDisk, segment_bytes: int = 1 << 20) -> Partition:
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=100,
                       compaction=CompactionConfig(min_cleanable_dirty_ratio=0.0,
                                                   delete_retention_ms=1000))
    return Partition("c", 0, "/data/c-0", config, 1 << 20, StateLimits(), Issued(),
                     log_dir=LogDir(LOG_DIR), disk=disk)


def keyed(pid: int, seq: int, records: list[tuple[bytes, bytes | None]],
          transactional: bool = True, epoch: int = 0) -> bytes:
    return encode_batch([(k, v, (), NOW) for k, v in records], producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq, transactional=transactional)


def test_a_full_offset_map_mid_segment_never_makes_an_aborted_transaction_visible():
    """Issue 21, defect 1: the map fills before an aborted transaction in the same sealed
    segment; the whole segment is rewritten, and the abort must still be known there."""
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk)
    p.append_records(keyed(1, 0, [(b"K", b"committed")]), accept)
    p.append_marker(MarkerIdentity(1, 0, 0, True))
    for i in range(6):  # enough keys to fill a map of three
        p.append_records(keyed(3, i, [(b"f%d" % i, b"x")], transactional=False), accept)
    p.append_records(keyed(2, 0, [(b"K", b"aborted")]), accept)
    p.append_marker(MarkerIdentity(2, 0, 0, False))
    p._roll()
    p.append_records(keyed(3, 6, [(b"tail", b"x")], transactional=False), accept)
    expected = latest_committed(p)
    assert expected[b"K"] == b"committed"
    capacity = 3 * (2 + MAP_ENTRY_OVERHEAD)
    cleans = 0
    while cleaning.run(p.clean_steps(NOW, capacity)) is not None:
        cleans += 1
        assert cleans < 10
        assert latest_committed(p) == expected
        assert (b"K", b"aborted") not in {(k, v) for _, k, v in committed_view(p)}
    assert cleans >= 2  # the map filled: the first clean stopped inside the segment
    p.close()
    p = open_partition(disk)
    assert latest_committed(p) == expected


# --- the class: any interleaving, the map filling anywhere ---------------------------------

KEYS = [b"k%d" % i for i in range(6)]
KEY_COST = 2 + MAP_ENTRY_OVERHEAD  # what one key of KEYS costs the offset map
TXN_PRODUCERS = (1, 2, 3)
PLAIN = 7  # an idempotent producer outside transactions


@dataclass
class Written:
    offset: int
    key: bytes
    value: bytes | None
    txn: int | None  # the transaction it belongs to (None: outside any)


@dataclass
class Producer:
    epoch: int = 0
    seq: int = 0
    txn: int | None = None  # the open transaction's number


class CleanerWithTransactions(RuleBasedStateMachine):
    """Transactions of both versions (TV2 markers carry a bumped epoch), open, committed and
    aborted, with plain writes and tombstones around them, on a compacted Partition; cleans
    with offset maps from one key up, so that the map fills after any batch; restarts. After
    every step, what a read_committed consumer reads is what the model says it may: no
    record of an aborted or open transaction, and each key's latest value exactly as
    before any clean."""

    def __init__(self) -> None:
        super().__init__()
        self.disk = MemoryDisk()
        self.disk.makedirs(LOG_DIR)
        self.segment_bytes = 1 << 20
        self.partition: Partition | None = None
        self.written: list[Written] = []
        self.outcomes: dict[int, bool | None] = {}  # transaction -> committed (None: open)
        self.producers = {pid: Producer() for pid in (*TXN_PRODUCERS, PLAIN)}
        self.clock = NOW
        self.values = 0

    @initialize(segment_bytes=st.sampled_from([250, 400, 1 << 20]))
    def start(self, segment_bytes: int) -> None:
        self.segment_bytes = segment_bytes
        self.partition = open_partition(self.disk, segment_bytes)

    @property
    def p(self) -> Partition:
        assert self.partition is not None
        return self.partition

    def _value(self, tombstone: bool) -> bytes | None:
        self.values += 1
        return None if tombstone else b"v%d" % self.values

    @rule(pid=st.sampled_from((TXN_PRODUCERS[0], PLAIN, -1)),
          keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3),
          tombstones=st.lists(st.booleans(), min_size=3, max_size=3))
    def produce(self, pid: int, keys: list[bytes], tombstones: list[bool]) -> None:
        records = [(k, self._value(t)) for k, t in zip(keys, tombstones, strict=False)]
        transactional = pid in TXN_PRODUCERS
        if pid < 0:
            data = encode_batch([(k, v, (), NOW) for k, v in records])
        else:
            producer = self.producers[pid]
            data = keyed(pid, producer.seq, records, transactional, producer.epoch)
        result = self.p.append_records(data, accept)
        assert not result.duplicate
        txn = None
        if transactional:
            producer = self.producers[pid]
            if producer.txn is None:
                producer.txn = len(self.outcomes)
                self.outcomes[producer.txn] = None
            txn = producer.txn
        if pid >= 0:
            self.producers[pid].seq += len(records)
        self.written += [Written(result.base_offset + i, k, v, txn)
                         for i, (k, v) in enumerate(records)]

    @rule(pid=st.sampled_from(TXN_PRODUCERS), keys=st.lists(st.sampled_from(KEYS),
                                                           min_size=1, max_size=3),
          commit=st.booleans(), tv2=st.booleans())
    def transaction(self, pid: int, keys: list[bytes], commit: bool, tv2: bool) -> None:
        """A whole transaction at once (when none of this producer's is open)."""
        if self.producers[pid].txn is None:
            self.produce(pid, keys, [False] * 3)
        self.end_transaction(pid, commit, tv2)

    @rule(pid=st.sampled_from(TXN_PRODUCERS), commit=st.booleans(), tv2=st.booleans())
    def end_transaction(self, pid: int, commit: bool, tv2: bool) -> None:
        producer = self.producers[pid]
        epoch = producer.epoch + tv2
        self.p.append_marker(MarkerIdentity(pid, epoch, 0, commit, 2 if tv2 else 0))
        if producer.txn is not None:
            self.outcomes[producer.txn] = commit
            producer.txn = None
        if tv2:
            producer.epoch, producer.seq = epoch, 0

    @rule()
    def roll(self) -> None:
        if self.p.is_open and self.p.log.active.size:
            self.p._roll()

    @rule(ms=st.integers(1, 1500))
    def tick(self, ms: int) -> None:
        self.clock += ms

    @rule(keys=st.one_of(st.integers(1, 4), st.just(1 << 14)),
          extra=st.integers(0, KEY_COST - 1))
    def clean(self, keys: int, extra: int) -> None:
        """A map with room for ``keys`` keys: it fills after whichever batch brings one
        more (the first batch always goes in)."""
        before = latest_committed(self.p)
        result = cleaning.run(self.p.clean_steps(self.clock, keys * KEY_COST + extra))
        event("cleaned" if result is not None else "nothing due")
        assert latest_committed(self.p) == before

    @rule(crash=st.booleans())
    def restart(self, crash: bool) -> None:
        if crash:
            self.p.abandon()
            self.disk.crash()
        else:
            self.p.close()
        self.partition = open_partition(self.disk, self.segment_bytes)

    def _last_stable_offset(self) -> int:
        open_txns = {n for n, outcome in self.outcomes.items() if outcome is None}
        return min((w.offset for w in self.written if w.txn in open_txns),
                   default=self.p.log.log_end_offset)

    @invariant()
    def read_committed_reads_what_the_model_allows(self) -> None:
        if self.partition is None:
            return
        lso = self._last_stable_offset()
        assert self.p.last_stable_offset == lso
        visible = {w.offset: w for w in self.written if w.offset < lso and (
            w.txn is None or self.outcomes[w.txn])}
        latest: dict[bytes, bytes | None] = {}
        for offset, key, value in committed_view(self.p):
            w = visible.get(offset)
            assert w is not None, f"offset {offset} ({key!r}={value!r}) must not be read"
            assert (key, value) == (w.key, w.value)
            latest[key] = value
        expected: dict[bytes, bytes | None] = {}
        for w in sorted(visible.values(), key=lambda w: w.offset):
            expected[w.key] = w.value
        assert {k: v for k, v in latest.items() if v is not None} == \
            {k: v for k, v in expected.items() if v is not None}


CleanerWithTransactions.TestCase.settings = settings(
    derandomize=True, database=None, max_examples=150, stateful_step_count=40,
    deadline=None)
TestCleanerWithTransactions = CleanerWithTransactions.TestCase


steps = st.lists(st.one_of(
    st.tuples(st.just("produce"), st.sampled_from((TXN_PRODUCERS[0], PLAIN, -1)),
              st.lists(st.sampled_from(KEYS), min_size=1, max_size=3),
              st.lists(st.booleans(), min_size=3, max_size=3)),
    st.tuples(st.just("transaction"), st.sampled_from(TXN_PRODUCERS),
              st.lists(st.sampled_from(KEYS), min_size=1, max_size=3), st.booleans(),
              st.booleans()),
    st.tuples(st.just("end_transaction"), st.sampled_from(TXN_PRODUCERS), st.booleans(),
              st.booleans()),
    st.tuples(st.just("roll")),
), min_size=2, max_size=30)


@settings(derandomize=True, database=None, max_examples=60, deadline=None)
@given(st.sampled_from([250, 400, 1 << 20]), steps)
def test_wherever_the_offset_map_fills_read_committed_reads_the_same(segment_bytes, history):
    """One history, cleaned with every map size from one key to all of them: the map ends
    after each batch that brings a new key (and at the last stable offset), in each clean
    until nothing is due; then the open transactions end, and the same again."""
    written = CleanerWithTransactions()
    written.start(segment_bytes)
    for name, *args in history:
        getattr(written, name)(*args)
    written.roll()
    written.p.close()
    written.partition = None
    for keys in range(1, len(KEYS) + 1):
        m = CleanerWithTransactions()
        for name in ("disk", "written", "outcomes", "producers", "clock", "values"):
            setattr(m, name, copy.deepcopy(getattr(written, name)))
        m.segment_bytes = segment_bytes
        m.partition = open_partition(m.disk, segment_bytes)
        m.read_committed_reads_what_the_model_allows()
        for round_ in range(2):
            before = latest_committed(m.p)
            for _ in range(20):
                if cleaning.run(m.p.clean_steps(m.clock, keys * KEY_COST)) is None:
                    break
                assert latest_committed(m.p) == before
                m.read_committed_reads_what_the_model_allows()
            else:
                raise AssertionError("cleans still due after 20")
            if round_ == 0:
                for pid in TXN_PRODUCERS:
                    if m.producers[pid].txn is not None:
                        m.end_transaction(pid, pid % 2 == 0, False)
                m.read_committed_reads_what_the_model_allows()
                m.roll()
                m.clock += 2000  # past delete.retention.ms: tombstones and markers may go


def test_no_clean_is_due_while_an_open_transaction_begins_at_the_checkpoint():
    """Found by the test above: the sealed segment holding the checkpoint and the start of
    an open transaction counted as dirty, so the cleaner rewrote it again and again, each
    time leaving the checkpoint where it was."""
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk)
    p.append_records(keyed(1, 0, [(b"k0", b"aborted")]), accept)
    p.append_marker(MarkerIdentity(1, 0, 0, False))
    p.append_records(keyed(1, 1, [(b"k0", b"open")]), accept)
    p._roll()
    assert cleaning.run(p.clean_steps(NOW, 1 << 20)) is not None
    assert p.log.first_dirty_offset == p.last_stable_offset == 2
    assert cleaning.run(p.clean_steps(NOW, 1 << 20)) is None
    assert p.cleanable(NOW).dirty_bytes == 0
