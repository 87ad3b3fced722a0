"""Transactions on the partition side: producer state's transactional rules (rows T1-T4,
M1-M4 of producer_state/rules.py), markers, the last stable offset, the aborted transaction
index (.txnindex) through crashes, power cuts and the cleaner, and read_committed readers.

The pure parts are table rows and hypothesis interleavings; the storage parts run a real
Partition on a MemoryDisk that fails and loses power; the end-to-end part a real broker,
driven by crafted requests (InitProducerId, transactional Produce, WriteTxnMarkers) until the
transaction coordinator exists, read by confluent-kafka, kafka-python and aiokafka consumers
with isolation.level=read_committed.
"""

from __future__ import annotations

import errno
import random

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from support.txn_storage_helpers import E, Issued, accept

from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.log import cleaning
from oncelog.log.compaction import CompactionConfig
from oncelog.log.log import LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.log.txn_index import AbortedTxn, decode, encode
from oncelog.producer_state import snapshot
from oncelog.producer_state.manager import ProducerStateManager, StateLimits
from oncelog.producer_state.rules import (
    NO_TXN,
    Append,
    BatchIdentity,
    CachedBatch,
    EndTxn,
    MarkerIdentity,
    ProducerStateEntry,
    Refuse,
    Tombstone,
    decide,
    decide_marker,
)
from oncelog.protocol.batches import RecordSetWalk
from oncelog.protocol.control import marker_batch, read_marker
from oncelog.protocol.record_batch import InvalidBatch, read_header, scan_batches
from oncelog.protocol.records import encode_batch

PID = 42
NOW = 1_700_000_000_000


def entry(epoch=3, last_seq=9, txn=NO_TXN, coordinator_epoch=-1, batches=True):
    cached = [CachedBatch(last_seq - 4, last_seq, 100)] if batches else []
    return ProducerStateEntry(PID, epoch, 0, cached, NOW, NOW, txn, coordinator_epoch)


def batch(epoch=3, first=10, last=12, transactional=True):
    return BatchIdentity(PID, epoch, first, last, transactional)


def outcome(decision):
    if isinstance(decision, Refuse):
        return decision.error
    if isinstance(decision, Append):
        return "begins" if decision.begins_txn else "append"
    return type(decision).__name__


# --- the rules as a table ------------------------------------------------------------------

DATA_ROWS = [
    # (row, what the partition knows, the batch, outcome)
    ("T1", entry(txn=95), batch(transactional=False), E.invalid_txn_state),
    ("T2", entry(txn=95), batch(epoch=4, first=0, last=2), E.invalid_txn_state),
    ("T3", entry(txn=95), batch(), "append"),
    ("T4", entry(), batch(), "begins"),
    ("T4, first sight", None, batch(first=0, last=2), "begins"),
    ("T4, new epoch", entry(), batch(epoch=4, first=0, last=0), "begins"),
    ("plain idempotent, no transaction", entry(), batch(transactional=False), "append"),
    ("row 3 first: fenced", entry(txn=95), batch(epoch=2), E.invalid_producer_epoch),
    ("row 6 first: a retry in a transaction", entry(txn=95), batch(first=5, last=9),
     "Duplicate"),
    ("after a bumped marker: 0 starts", entry(batches=False), batch(first=0, last=1), "begins"),
    ("after a bumped marker: not 0", entry(batches=False), batch(first=3, last=4),
     E.out_of_order_sequence_number),
    ("a compact record left by a marker", Tombstone(PID, 3, 0, -1, -1, NOW),
     batch(first=0, last=0), "begins"),
]


@pytest.mark.parametrize(("row", "known", "incoming", "expected"), DATA_ROWS,
                         ids=[r[0] for r in DATA_ROWS])
def test_data_batch_rows(row, known, incoming, expected):
    assert outcome(decide(incoming, known, True, False)) == expected


def marker(epoch=3, coordinator_epoch=5, commit=True, tv=0):
    return MarkerIdentity(PID, epoch, coordinator_epoch, commit, tv)


MARKER_ROWS = [
    ("M1", entry(txn=95), marker(epoch=2), E.invalid_producer_epoch),
    ("M2", entry(txn=95), marker(tv=2), E.invalid_producer_epoch),
    ("M2 retry: nothing ongoing", entry(), marker(tv=2), NO_TXN),
    ("M3", entry(txn=95, coordinator_epoch=6), marker(), E.transaction_coordinator_fenced),
    ("M4 ends the transaction", entry(txn=95), marker(), 95),
    ("M4 TV2 bumped", entry(txn=95), marker(epoch=4, tv=2), 95),
    ("M4 retry (TV1)", entry(), marker(), NO_TXN),
    ("M4 unknown producer", None, marker(), NO_TXN),
    ("M1 on a compact record", Tombstone(PID, 3, 0, 9, 100, NOW), marker(epoch=1),
     E.invalid_producer_epoch),
]


@pytest.mark.parametrize(("row", "known", "incoming", "expected"), MARKER_ROWS,
                         ids=[r[0] for r in MARKER_ROWS])
def test_marker_rows(row, known, incoming, expected):
    decision = decide_marker(incoming, known)
    got = decision.error if isinstance(decision, Refuse) else decision.first_offset
    assert got == expected


def test_a_marker_with_a_bumped_epoch_starts_the_next_transaction_at_sequence_0():
    """KIP-890 part 2: the marker carries the new epoch; a delayed batch of the finished
    transaction is fenced, the next transaction starts at 0 at the new epoch."""
    state = ProducerStateManager()
    begin = state.validate(batch(epoch=0, first=0, last=4), lambda _: True)
    assert isinstance(begin, Append) and begin.begins_txn
    state.apply(begin, 14, NOW, NOW)
    assert state.last_stable_offset(20) == 10
    end = state.validate_marker(marker(epoch=1, tv=2, commit=False))
    assert isinstance(end, EndTxn)
    done = state.apply_marker(end, 15, NOW, NOW)
    assert done is not None and (done.first_offset, done.last_offset, done.aborted,
                                 done.last_stable_offset) == (10, 15, True, 16)
    assert state.last_stable_offset(20) == 20
    late = state.validate(batch(epoch=0, first=5, last=5), lambda _: True)
    assert isinstance(late, Refuse) and late.error == E.invalid_producer_epoch
    again = state.validate_marker(marker(epoch=1, tv=2, commit=False))
    assert isinstance(again, EndTxn) and again.first_offset == NO_TXN  # a retry: harmless
    assert outcome(state.validate(batch(epoch=1, first=5, last=5), lambda _: True)) == \
        E.out_of_order_sequence_number
    assert outcome(state.validate(batch(epoch=1, first=0, last=0), lambda _: True)) == "begins"


# --- interleavings: producer state against a model -----------------------------------------

class Model:
    """What the log says, kept the plainest way: per producer its epoch, next sequence and
    open transaction; the aborted transactions in the order they ended."""

    def __init__(self) -> None:
        self.epoch: dict[int, int] = {}
        self.seq: dict[int, int] = {}
        self.open: dict[int, int] = {}
        self.aborted: list[tuple[int, int, int, int]] = []
        self.end = 0

    def lso(self) -> int:
        return min(self.open.values(), default=self.end)


steps = st.lists(st.tuples(st.sampled_from(["data", "txn", "commit", "abort", "bump",
                                            "restart"]),
                           st.sampled_from([1, 2, 3]), st.integers(1, 3)),
                 max_size=60)


@settings(derandomize=True, database=None, max_examples=300, deadline=None)
@given(steps)
def test_interleavings_keep_lso_and_aborted_transactions(plan):
    """Begin, append, commit, abort, epoch bumps and restarts (a snapshot encoded and loaded)
    in any order: the last stable offset, the open transactions and what each marker ended
    are what the model says."""
    state = ProducerStateManager(StateLimits(batches_to_retain=2))
    model = Model()
    for kind, pid, count in plan:
        epoch = model.epoch.setdefault(pid, 0)
        seq = model.seq.setdefault(pid, 0)
        if kind in ("data", "txn"):
            incoming = BatchIdentity(pid, epoch, seq, seq + count - 1, kind == "txn")
            decision = state.validate(incoming, lambda _: True)
            if kind == "data" and pid in model.open:
                assert outcome(decision) == E.invalid_txn_state
                continue
            assert isinstance(decision, Append), decision
            assert decision.begins_txn == (kind == "txn" and pid not in model.open)
            if decision.begins_txn:
                model.open[pid] = model.end
            model.end += count
            model.seq[pid] = seq + count
            state.apply(decision, model.end - 1, NOW, NOW)
        elif kind == "restart":
            data = snapshot.of_state(model.end, state)
            state = ProducerStateManager(StateLimits(batches_to_retain=2))
            loaded = snapshot.decode(data)
            state.load(loaded.entries, loaded.tombstones, loaded.forgotten_up_to)
        else:
            bump = kind == "bump"
            decision = state.validate_marker(MarkerIdentity(
                pid, epoch + bump, 0, kind == "commit", 2 if bump else 0))
            assert isinstance(decision, EndTxn)
            offset = model.end
            model.end += 1
            first = model.open.pop(pid, None)
            done = state.apply_marker(decision, offset, NOW, NOW)
            if first is None:
                assert done is None
            else:
                assert done is not None and done.first_offset == first
                if done.aborted:
                    model.aborted.append((pid, first, offset, model.lso()))
                    assert done.last_stable_offset == model.lso()
            if bump:
                model.epoch[pid], model.seq[pid] = epoch + 1, 0
        assert state.last_stable_offset(model.end) == model.lso()
        assert state.ongoing_transactions() == dict(sorted(model.open.items(),
                                                           key=lambda kv: kv[1]))


def test_old_snapshots_are_read_and_get_no_transaction():
    state = ProducerStateManager()
    state.apply(Append(batch(first=0, last=4, transactional=False), True), 4, NOW, NOW)
    v4 = snapshot.decode(snapshot.of_state(5, state))
    head_v3 = v4.entries[0][1][:6] + v4.entries[0][1][18:]  # without the transaction fields
    body = snapshot._decode_body  # the v3 layout differs only in the packed entry
    import struct

    import crc32c
    parts = [struct.pack("<qq", 5, -1), struct.pack("<I", 1), struct.pack("<qH", PID,
                                                                           len(head_v3)),
             head_v3, struct.pack("<I", 0)]
    payload = b"".join(parts)
    v3 = struct.pack("<4sHI", b"OLPS", 3, crc32c.crc32c(payload)) + payload
    loaded = snapshot.decode(v3)
    assert body is not None and loaded.entries == v4.entries
    again = ProducerStateManager()
    again.load(loaded.entries, loaded.tombstones, loaded.forgotten_up_to)
    assert again.entry(PID) == state.entry(PID)
    assert again.entry(PID).txn_first_offset == NO_TXN


def test_txn_index_is_kafkas_layout():
    entries = [AbortedTxn(7, 10, 20, 21), AbortedTxn(8, 11, 30, 31)]
    data = encode(entries)
    assert len(data) == 68 and data[:2] == b"\x00\x00"
    assert decode(data) == entries
    with pytest.raises(ValueError):
        decode(data[:-1])


# --- read_committed readers ------------------------------------------------------------------

def _records(values, **kw) -> bytes:
    return encode_batch([(None, v, (), NOW) for v in values], **kw)


def _at(data: bytes, offset: int) -> bytes:
    header = read_header(data)
    patched = header._replace(base_offset=offset)
    from oncelog.protocol.record_batch import pack_header
    return pack_header(patched) + data[61:]


def test_record_set_walk_drops_aborted_transactions_for_read_committed():
    """Producer 1 aborts (offsets 0-1, marker 2), producer 2 commits (3, marker 5) around
    producer 1's second, committed transaction (4, marker 6); a plain batch at 7."""
    sets = [
        _at(_records([b"a1", b"a2"], producer_id=1, producer_epoch=0, base_sequence=0,
                     transactional=True), 0),
        _at(marker_batch(1, 0, False, 0, NOW), 2),
        _at(_records([b"c1"], producer_id=2, producer_epoch=0, base_sequence=0,
                     transactional=True), 3),
        _at(_records([b"k1"], producer_id=1, producer_epoch=0, base_sequence=2,
                     transactional=True), 4),
        _at(marker_batch(2, 0, True, 0, NOW), 5),
        _at(marker_batch(1, 0, True, 0, NOW), 6),
        _at(_records([b"p"]), 7),
    ]
    data = b"".join(sets)

    def values(walk):
        return [v for b in walk for _, _, _, v, _ in b.record_fields()]

    assert values(RecordSetWalk(data, 0)) == [b"a1", b"a2", b"c1", b"k1", b"p"]
    committed = RecordSetWalk(data, 0, aborted=[(1, 0)])
    assert values(committed) == [b"c1", b"k1", b"p"]
    assert committed.position == 8
    assert values(RecordSetWalk(data, 0, aborted=[])) == [b"a1", b"a2", b"c1", b"k1", b"p"]
    assert read_marker(sets[1]) == (False, 0)


# --- a Partition on a failing disk ------------------------------------------------------------

LOG_DIR = "/data"
PARTITION_DIR = "/data/t-0"
PRODUCERS = (3, 7, 11)


def derive(plog) -> tuple[dict[int, int], list[tuple[int, int, int, int]], int]:
    """Open transactions, aborted ones (pid, first, last, LSO then) and the LSO, from the
    batches of the log alone."""
    open_: dict[int, int] = {}
    aborted = []
    offset, end = plog.log_start_offset, plog.log_end_offset
    while offset < end:
        data = plog.read(offset, 1 << 20).records
        assert data
        for pos, header in scan_batches(data):
            if header.is_control:
                found = read_marker(data, pos)
                first = open_.pop(header.producer_id, None)
                if found is not None and not found.commit and first is not None:
                    aborted.append((header.producer_id, first, header.base_offset,
                                    min(open_.values(), default=header.base_offset + 1)))
            elif header.is_transactional:
                open_.setdefault(header.producer_id, header.base_offset)
            offset = header.last_offset + 1
    return open_, aborted, min(open_.values(), default=end)


FAULTS = {
    "enospc-torn": ("write", errno.ENOSPC, 37),
    "eio": ("write", errno.EIO, 0),
    "fsync": ("fsync", errno.EIO, 0),
    "index": ("write", errno.ENOSPC, 3),
    "fsync-dir": ("fsync_dir", errno.EIO, 0),
}


class TransactionsOnDisk(RuleBasedStateMachine):
    """Transactional batches and markers on a real Partition whose disk fails, crashes and
    loses power: after every step the partition's last stable offset, open transactions and
    aborted transaction index are exactly what the log itself says."""

    def __init__(self) -> None:
        super().__init__()
        self.disk = MemoryDisk()
        self.disk.makedirs(LOG_DIR)
        self.partition: Partition | None = None
        self.config = LogConfig()
        self.epochs = dict.fromkeys(PRODUCERS, 0)
        self.seqs = dict.fromkeys(PRODUCERS, 0)

    @initialize(segment_bytes=st.sampled_from([300, 700, 1 << 20]), synced=st.booleans())
    def start(self, segment_bytes: int, synced: bool) -> None:
        self.config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=100,
                                flush_messages=1 if synced else (1 << 63) - 1)
        self._open()

    def _open(self) -> None:
        self.partition = Partition("t", 0, PARTITION_DIR, self.config, 1 << 20, StateLimits(),
                                   Issued(), log_dir=LogDir(LOG_DIR), disk=self.disk)
        assert self.partition.log is not None
        for pid in PRODUCERS:  # the producers learn where the log stands (as on an error)
            known = self.partition.state.entry(pid)
            if known is not None:
                self.epochs[pid] = known.epoch
                self.seqs[pid] = known.last_seq + 1

    @property
    def online(self) -> bool:
        return self.partition is not None and not self.partition.log_dir.offline

    def _call(self, what, *args):
        assert self.partition is not None
        try:
            result = what(*args)
            if self.config.flush_messages == 1:
                self.partition.flush_now()
            return result
        except InvalidBatch as exc:
            event(f"refused {exc.error.name}")
        except OSError:
            event("storage error" + (", offline" if not self.online else ""))
        return None

    @precondition(lambda self: self.online)
    @rule(pid=st.sampled_from(PRODUCERS), transactional=st.booleans(),
          count=st.integers(1, 3))
    def produce(self, pid: int, transactional: bool, count: int) -> None:
        assert self.partition is not None
        seq = self.seqs[pid]
        data = encode_batch([(None, b"v%d" % i, (), NOW) for i in range(count)],
                            producer_id=pid, producer_epoch=self.epochs[pid],
                            base_sequence=seq, transactional=transactional)
        if self._call(self.partition.append_records, data, accept) is not None:
            self.seqs[pid] = seq + count

    @precondition(lambda self: self.online)
    @rule(pid=st.sampled_from(PRODUCERS), commit=st.booleans(), bump=st.booleans())
    def end_transaction(self, pid: int, commit: bool, bump: bool) -> None:
        assert self.partition is not None
        epoch = self.epochs[pid] + bump
        done = self._call(self.partition.append_marker,
                          MarkerIdentity(pid, epoch, 0, commit, 2 if bump else 0))
        if done is not None and bump:
            self.epochs[pid], self.seqs[pid] = epoch, 0

    @precondition(lambda self: self.online)
    @rule(fault=st.sampled_from(sorted(FAULTS)), path=st.sampled_from(["", ".log"]))
    def inject(self, fault: str, path: str) -> None:
        op, error, partial = FAULTS[fault]
        self.disk.fail(op, error, partial, path_suffix=path)

    @precondition(lambda self: self.partition is not None)
    @rule(kind=st.sampled_from(["clean", "crash", "power"]), seed=st.integers(0, 2**32 - 1))
    def restart(self, kind: str, seed: int) -> None:
        assert self.partition is not None
        event(f"restart: {kind}")
        self.disk.clear_faults()
        if kind == "clean" and self.online:
            self.partition.close()
        else:
            self.partition.abandon()
        if kind == "power":
            self.disk.power_loss(random.Random(seed))
        self._open()

    @invariant()
    def state_is_what_the_log_says(self) -> None:
        if not self.online:
            return
        partition = self.partition
        assert partition is not None
        plog = partition.log
        open_, aborted, lso = derive(plog)
        assert partition.state.ongoing_transactions() == open_
        assert partition.last_stable_offset == lso
        indexed = plog.aborted_transactions(plog.log_start_offset, plog.log_end_offset + 1)
        assert [tuple(e) for e in indexed] == aborted


TransactionsOnDisk.TestCase.settings = settings(
    derandomize=True, database=None, max_examples=200, stateful_step_count=50, deadline=None)
TestTransactionsOnDisk = TransactionsOnDisk.TestCase


# --- the cleaner -------------------------------------------------------------------------------

def _compacted(disk: MemoryDisk) -> Partition:
    config = LogConfig(segment_bytes=250, compaction=CompactionConfig(
        min_cleanable_dirty_ratio=0.0, delete_retention_ms=1000))
    return Partition("c", 0, "/data/c-0", config, 1 << 20, StateLimits(), Issued(),
                     log_dir=LogDir(LOG_DIR), disk=disk)


def _keyed(pid: int, seq: int, keys: list[bytes], transactional: bool = True,
           epoch: int = 0) -> bytes:
    return encode_batch([(k, b"from %d" % pid, (), NOW) for k in keys], producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq, transactional=transactional)


def _committed_view(p: Partition) -> tuple[list[tuple[bytes, bytes]], list]:
    """What a read_committed reader reads of the whole log (key, value), and the markers."""
    plog = p.log
    offset, end = plog.log_start_offset, p.last_stable_offset
    seen: list = []
    markers: list = []
    while offset < end:  # a Fetch at a time, as a consumer reads
        data = plog.read(offset, 1 << 20).records
        aborted = [(a.producer_id, a.first_offset)
                   for a in p.aborted_transactions(offset, end)]
        walk = RecordSetWalk(data, offset, end, aborted=aborted)
        seen += [(k, v) for b in walk for _, _, k, v, _ in b.record_fields()]
        markers += [(h.producer_id, read_marker(data, pos)) for pos, h in scan_batches(data)
                    if h.is_control and h.base_offset < end]
        assert walk.position > offset
        offset = walk.position
    return seen, markers


def test_cleaner_removes_aborted_data_then_markers_after_the_horizon():
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    p = _compacted(disk)
    p.append_records(_keyed(1, 0, [b"k1", b"k2"]), accept)  # aborted below
    p.append_records(_keyed(2, 0, [b"k1"]), accept)  # committed below
    p.append_marker(MarkerIdentity(1, 0, 0, False))
    p.append_marker(MarkerIdentity(2, 0, 0, True))
    p.append_records(_keyed(3, 0, [b"k3"], transactional=False), accept)
    open_txn = p.log.log_end_offset
    p.append_records(_keyed(4, 0, [b"k4"]), accept)  # stays open: nothing from it is cleaned
    for i in range(6):
        p.append_records(_keyed(5, i, [b"filler%d" % i], transactional=False), accept)
    assert p.last_stable_offset == open_txn
    before, _ = _committed_view(p)
    assert before == [(b"k1", b"from 2"), (b"k3", b"from 3")]

    def clean(now):
        return cleaning.run(p.clean_steps(now, 1 << 20))

    clean(NOW)
    seen, markers = _committed_view(p)
    assert seen == before
    # The aborted data went; both markers stay (data of their transactions was met).
    assert [pid for pid, _ in markers] == [1, 2]
    assert [(a.producer_id, a.first_offset) for a in p.aborted_transactions(0, open_txn)] \
        == [(1, 0)]
    assert any(name.endswith(".txnindex") for name in disk.listdir("/data/c-0"))
    assert p.state.ongoing_transactions() == {4: open_txn}  # the open one was not touched
    p.close()
    p = _compacted(disk)  # the cleaned segment's index came through the swap and a restart
    assert p.last_stable_offset == open_txn
    assert _committed_view(p)[0] == before
    # While the emptied batches of producers 1 and 2 stay as their last ones (producer state
    # rebuilt from the log finds them), so do their markers: a replay must see those
    # transactions end. Producer 4 commits; 1 and 2 write again, outside transactions; k1 is
    # overwritten: the transactional batches of 1 and 2 go.
    p.append_marker(MarkerIdentity(4, 0, 0, True))
    p.append_records(_keyed(1, 2, [b"k9"], transactional=False), accept)
    p.append_records(_keyed(2, 1, [b"k8"], transactional=False), accept)
    p.append_records(_keyed(3, 1, [b"k1"], transactional=False), accept)
    fillers = iter(range(6, 100))

    def dirty():  # something new to clean, in sealed segments
        for _ in range(6):
            i = next(fillers)
            p.append_records(_keyed(5, i, [b"filler%d" % i], transactional=False), accept)

    dirty()
    assert p.last_stable_offset == p.log.log_end_offset
    clean(NOW)  # the data of 1 and 2 goes; their markers stay (their data was met)
    dirty()
    clean(NOW)  # no data of 1 and 2 is left: their markers get a delete horizon
    _, markers = _committed_view(p)
    assert [pid for pid, _ in markers] == [1, 2, 4]
    clean(NOW + 5000)  # past delete.retention.ms: they go; producer 4's k4 stays
    seen, markers = _committed_view(p)
    assert [pid for pid, _ in markers] == [4]
    assert p.aborted_transactions(0, p.log.log_end_offset) == []
    assert (b"k1", b"from 3") in seen and (b"k4", b"from 4") in seen
    assert not {(b"k1", b"from 1"), (b"k2", b"from 1"), (b"k1", b"from 2")} & set(seen)
