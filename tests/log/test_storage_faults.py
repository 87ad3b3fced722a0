"""The produce path on a disk that fails: every write all or nothing, nothing acknowledged lost.

A hypothesis state machine drives a real Partition (log, indexes, snapshots, producer state)
on a MemoryDisk (src/oncelog/log/memory_disk.py) with idempotent producers that retry what
was not acknowledged, a plain producer that does not, and a disk that makes writes short,
fills up, answers EIO, fails fsync or a truncation, then crashes (kill -9) or loses power.
After every step: every batch read back has a good CRC (no torn bytes are ever served), no
batch is in the log twice, every acknowledged batch is there exactly once at the offset it was
acknowledged with (unless retention deleted it), and producer state is what a replay of the
log gives.
"""

from __future__ import annotations

import errno
import random
from dataclasses import dataclass, field

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kio.schema.errors import ErrorCode

from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.log.log import LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.producer_state.manager import ProducerStateManager, StateLimits
from oncelog.producer_state.rules import BatchIdentity
from oncelog.protocol.record_batch import InvalidBatch, crc_of, read_header
from oncelog.protocol.records import decode_batch, encode_batch

LOG_DIR = "/data"
PARTITION_DIR = "/data/t-0"
PRODUCERS = (3, 7, 11)
PLAIN = -1
TIMESTAMP = 1_700_000_000_000


class IssuedBelow:
    def is_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < 100

    def highest_claimed(self) -> int:
        return 99


@dataclass
class Sent:
    ident: int
    producer_id: int
    first_seq: int
    count: int
    acked_offset: int | None = None  # base offset the broker acknowledged, once it did

    def records(self) -> list:
        return [(None, b"%d:%d" % (self.ident, i), (), TIMESTAMP) for i in range(self.count)]

    def encode(self) -> bytes:
        if self.producer_id == PLAIN:
            return encode_batch(self.records())
        return encode_batch(self.records(), producer_id=self.producer_id, producer_epoch=0,
                            base_sequence=self.first_seq)


@dataclass
class Producer:
    next_seq: int = 0
    batches: list[Sent] = field(default_factory=list)

    def unacked(self) -> list[Sent]:
        return [b for b in self.batches if b.acked_offset is None]


FAULTS = {
    # name: (op, errno, bytes taken before failing)
    "enospc-torn": ("write", errno.ENOSPC, 37),
    "enospc": ("write", errno.ENOSPC, 0),
    "eio-torn": ("write", errno.EIO, 70),
    "short": ("write", 0, 25),  # a short write; the rest then goes in (or meets the next)
    "fsync": ("fsync", errno.EIO, 0),
    "index": ("write", errno.ENOSPC, 3),  # lands on whatever writes next: a roll's index or
    #                                        snapshot write, or a segment
    "fsync-dir": ("fsync_dir", errno.EIO, 0),
}


class StorageFaults(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.disk = MemoryDisk()
        self.disk.makedirs(LOG_DIR)
        self.config: LogConfig | None = None
        self.partition: Partition | None = None
        self.producers = {pid: Producer() for pid in PRODUCERS}
        self.plain: list[Sent] = []
        self.idents = 0
        self.synced = False

    # --- set-up ----------------------------------------------------------------------------

    @initialize(synced=st.booleans(), segment_bytes=st.sampled_from([400, 1200, 1 << 20]),
          retention_bytes=st.sampled_from([-1, -1, 2500]))
    def start(self, synced: bool, segment_bytes: int, retention_bytes: int) -> None:
        self.synced = synced
        self.config = LogConfig(segment_bytes=segment_bytes, retention_bytes=retention_bytes,
                                flush_messages=1 if synced else (1 << 63) - 1,
                                index_interval_bytes=200)
        self._open()

    def _open(self) -> None:
        assert self.config is not None
        self.partition = Partition("t", 0, PARTITION_DIR, self.config, 1 << 20, StateLimits(),
                                   IssuedBelow(), log_dir=LogDir(LOG_DIR), disk=self.disk)
        # opened (its directory created) now, as a produce would: a read creates nothing
        assert self.partition.state is not None

    @property
    def online(self) -> bool:
        return self.partition is not None and not self.partition.log_dir.offline

    # --- producing -------------------------------------------------------------------------

    def _send(self, sent: Sent) -> ErrorCode | None:
        """Send a batch as a produce request; record its acknowledgement. Returns the error."""
        partition = self.partition
        assert partition is not None
        faults = self.disk.faults_hit
        try:
            result = partition.append_records(sent.encode())
            if self.synced and result.last_offset >= partition.flushed_offset:
                partition.flush_now()  # the answer waits for this fsync (see durable())
        except InvalidBatch as exc:
            event(f"answered {exc.error.name}")
            return exc.error
        except OSError:
            event("answered KAFKA_STORAGE_ERROR" + (", directory offline"
                                                     if partition.log_dir.offline else ""))
            return ErrorCode.kafka_storage_error
        finally:
            if self.disk.faults_hit > faults:
                event("a produce met a fault")
        if sent.acked_offset is not None:
            assert result.base_offset == sent.acked_offset, "a retry got another offset"
        sent.acked_offset = result.base_offset
        return None

    @precondition(lambda self: self.online)
    @rule(pid=st.sampled_from(PRODUCERS), count=st.integers(1, 4))
    def produce(self, pid: int, count: int) -> None:
        producer = self.producers[pid]
        if len(producer.unacked()) >= 5:  # max.in.flight: the oldest must be through first
            return
        self.idents += 1
        sent = Sent(self.idents, pid, producer.next_seq, count)
        producer.next_seq += count
        producer.batches.append(sent)
        error = self._send(sent)
        self._judge(producer, sent, error)

    @precondition(lambda self: self.online)
    @rule(pid=st.sampled_from(PRODUCERS), which=st.integers(0, 4))
    def resend(self, pid: int, which: int) -> None:
        """A retry: of an unacknowledged batch, or of an acknowledged one whose answer was
        lost. The first unacknowledged batch is retried most; any of the last five may be."""
        producer = self.producers[pid]
        unacked = producer.unacked()
        candidates = unacked[:1] + producer.batches[-5:]
        if not candidates:
            return
        sent = candidates[which % len(candidates)]
        error = self._send(sent)
        self._judge(producer, sent, error)

    def _judge(self, producer: Producer, sent: Sent, error: ErrorCode | None) -> None:
        if error is None or error == ErrorCode.kafka_storage_error:
            return
        earlier_unacked = any(b.acked_offset is None and b.first_seq < sent.first_seq
                              for b in producer.batches)
        if error == ErrorCode.duplicate_sequence_number:
            # Stored before and older than the cache: only for a batch acknowledged already
            # or one that a lost answer left unacknowledged.
            return
        # A gap is right only while an earlier batch is not in the log.
        assert error == ErrorCode.out_of_order_sequence_number and earlier_unacked, (
            f"{error.name} for batch {sent} with every earlier batch acknowledged")

    @precondition(lambda self: self.online)
    @rule(count=st.integers(1, 3))
    def produce_plain(self, count: int) -> None:
        self.idents += 1
        sent = Sent(self.idents, PLAIN, -1, count)
        self.plain.append(sent)
        self._send(sent)  # never retried: acknowledged once, or at most once in the log

    # --- the disk --------------------------------------------------------------------------

    @precondition(lambda self: self.online)
    @rule(fault=st.sampled_from(sorted(FAULTS)), path=st.sampled_from(["", ".log"]))
    def inject(self, fault: str, path: str) -> None:
        op, error, partial = FAULTS[fault]
        self.disk.fail(op, error, partial, path_suffix=path)

    @precondition(lambda self: self.online)
    @rule(room=st.integers(0, 600))
    def fill_disk(self, room: int) -> None:
        self.disk.capacity = self.disk.used + room

    @precondition(lambda self: self.partition is not None)
    @rule()
    def free_disk(self) -> None:
        self.disk.capacity = None

    @precondition(lambda self: self.online)
    @rule()
    def retention(self) -> None:
        assert self.partition is not None
        try:
            self.partition.apply_retention(TIMESTAMP)
        except OSError:
            pass

    # --- restarts --------------------------------------------------------------------------

    @precondition(lambda self: self.partition is not None)
    @rule(kind=st.sampled_from(["clean", "crash", "power"]), seed=st.integers(0, 2**32 - 1))
    def restart(self, kind: str, seed: int) -> None:
        assert self.partition is not None
        if kind == "power" and not self.synced:
            kind = "crash"  # without flush.messages=1 an acknowledgement promises no fsync
        event(f"restart: {kind}" + (" after the directory went offline" if not self.online
                                    else ""))
        self.disk.clear_faults()
        if kind == "clean" and self.online:
            self.partition.close()
        else:
            self.partition.abandon()
        assert self.disk.open_fds == 0, "files left open"
        if kind == "power":
            self.disk.power_loss(random.Random(seed))
        self.disk.capacity = None
        self._open()

    # --- what must hold --------------------------------------------------------------------

    @invariant()
    def log_holds_each_batch_at_most_once_and_every_acknowledged_one(self) -> None:
        if not self.online:
            return
        partition = self.partition
        assert partition is not None
        plog = partition.log
        start, end = plog.log_start_offset, plog.log_end_offset
        found: dict[int, list[int]] = {}
        replayed = ProducerStateManager(StateLimits())
        offset = start
        while offset < end:
            data = plog.read(offset, 1 << 20).records
            assert data, f"nothing readable at {offset} below the log end {end}"
            pos = 0
            while pos < len(data):
                header = read_header(data, pos)
                assert crc_of(data, pos, header.size) == header.crc, "torn bytes served"
                assert header.base_offset == offset, "offsets are not contiguous"
                _, records = decode_batch(data, pos)
                ident, first = records[0].value.split(b":")
                assert first == b"0"
                found.setdefault(int(ident), []).append(header.base_offset)
                if header.producer_id >= 0:
                    replayed.replay(BatchIdentity(header.producer_id, header.producer_epoch,
                                                  header.base_sequence, header.last_sequence),
                                    header.last_offset, header.max_timestamp, 0)
                offset = header.last_offset + 1
                pos += header.size
        for ident, offsets in found.items():
            assert len(offsets) == 1, f"batch {ident} stored {len(offsets)} times"
        everything = [b for p in self.producers.values() for b in p.batches] + self.plain
        for sent in everything:
            if sent.acked_offset is not None and sent.acked_offset >= start:
                assert found.get(sent.ident) == [sent.acked_offset], (
                    f"acknowledged batch {sent} lost or moved: {found.get(sent.ident)}")
        for entry in replayed.entries():
            held = partition.state.entry(entry.producer_id)
            assert held is not None and held.last_seq == entry.last_seq and \
                held.last_offset == entry.last_offset, "producer state differs from the log"


StorageFaults.TestCase.settings = settings(
    derandomize=True, database=None, max_examples=300, stateful_step_count=40, deadline=None)
TestStorageFaults = StorageFaults.TestCase
