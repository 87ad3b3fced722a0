"""The seeds' transactional flows (seed 004, KIP-98), run against a live broker and drawn like
the idempotence flows: ``zombie-fencing`` and ``abort-then-commit``.

Each producer is a raw one whose every request the scenario decides (InitProducerId with a
transactional id, AddPartitionsToTxn at a client's version, transactional Produce, EndTxn),
so the diagram shows each request and its exact answer. The verdict reads the partition back
twice: as a read_committed reader (Fetch with isolation level 1, the aborted transactions of
the answer dropped) and as a read_uncommitted one.

Record values name their transaction and position (``Z:3``: the zombie's fourth record).
"""

from __future__ import annotations

import datetime
import time

from kio.schema.errors import ErrorCode

from ..client.admin.admin import Admin
from ..client.network import calls
from ..client.network.connection import BrokerConnection, connect
from ..protocol import api_versions as apis
from ..protocol.batches import RecordSetWalk
from ..protocol.records import encode_batch
from ..protocol.schema import build
from .outcome import Outcome, Step, describe_log

FENCED = (ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch)
RECORDS = 5  # per transaction


KAFKA_NOTES = {
    "zombie-fencing": "Kafka's classic protocol (before KIP-890) lets a zombie's produce into "
                      "a partition not yet in the new instance's transaction open a hanging "
                      "transaction; oncelog checks every transactional batch with the "
                      "coordinator first.",
}


class TxnProducer:
    """A transactional producer on its own connection, one request at a time."""

    def __init__(self, bootstrap: str, name: str, txn_id: str, topic: str,
                 outcome: Outcome) -> None:
        self.conn: BrokerConnection = connect(bootstrap, f"oncelog-scenario-{name}")
        # AddPartitionsToTxn v4+ (several transactions, verify_only) is for brokers.
        self.conn.versions[apis.ADD_PARTITIONS_TO_TXN] = min(
            self.conn.version(apis.ADD_PARTITIONS_TO_TXN), 3)
        self.name, self.txn_id, self.topic, self.outcome = name, txn_id, topic, outcome
        self.producer_id, self.epoch, self.sequence = -1, -1, 0

    def close(self) -> None:
        self.conn.close()

    def _request(self, text: str) -> None:
        self.outcome.steps.append(Step("request", f"{self.name}: {text}"))

    def _answer(self, what: str, error: ErrorCode, ok_text: str = "") -> ErrorCode:
        if error == ErrorCode.none:
            text, tone = f"{what} OK{ok_text}", "ok"
        else:
            text, tone = f"{what}: {error.name.upper()}", "error"
        self.outcome.steps.append(Step("response", f"{self.name}: {text}", tone=tone))
        return error

    def note(self, lane: str, text: str) -> None:
        self.outcome.steps.append(Step(f"{lane}-note", text))

    def init(self, attempts: int = 50) -> ErrorCode:
        """InitProducerId, retried as clients do while the coordinator is still aborting
        the previous instance's transaction (CONCURRENT_TRANSACTIONS)."""
        for _ in range(attempts):
            error = self._init_once()
            if error != ErrorCode.concurrent_transactions:
                return error
            self.note("producer", f"{self.name}: the previous transaction is being aborted: "
                                  "retry InitProducerId")
            time.sleep(0.05)
        return error

    def _init_once(self) -> ErrorCode:
        self._request(f"InitProducerId({self.txn_id})")

        def make(mod, version):
            return calls.init_producer_id_request(mod, self.txn_id,
                                                  datetime.timedelta(seconds=60))

        response = self.conn.call(apis.INIT_PRODUCER_ID, make)
        if response.error_code == ErrorCode.none:
            self.producer_id, self.epoch, self.sequence = (response.producer_id,
                                                           response.producer_epoch, 0)
        return self._answer("InitProducerId", response.error_code,
                            f": producer id {self.producer_id}, epoch {self.epoch}")

    def add_partition(self) -> ErrorCode:
        self._request(f"AddPartitionsToTxn({self.topic}-0, epoch {self.epoch})")

        def make(mod, version):
            return build(mod.AddPartitionsToTxnRequest,
                         v3_and_below_transactional_id=self.txn_id,
                         v3_and_below_producer_id=self.producer_id,
                         v3_and_below_producer_epoch=self.epoch,
                         v3_and_below_topics=(build(mod.AddPartitionsToTxnTopic,
                                                    name=self.topic, partitions=(0,)),))

        response = self.conn.call(apis.ADD_PARTITIONS_TO_TXN, make)
        error = response.results_by_topic_v3_and_below[0].results_by_partition[0] \
            .partition_error_code
        return self._answer("AddPartitionsToTxn", error)

    def produce(self, label: str) -> ErrorCode:
        values = [f"{label}:{i}" for i in range(RECORDS)]
        self._request(f"Produce {values[0]}..{values[-1]} (epoch {self.epoch}, sequences "
                      f"{self.sequence}..{self.sequence + RECORDS - 1})")
        data = encode_batch([(None, v.encode(), (), int(time.time() * 1000)) for v in values],
                            producer_id=self.producer_id, producer_epoch=self.epoch,
                            base_sequence=self.sequence, transactional=True)

        def make(mod, version):
            pdata = build(mod.PartitionProduceData, index=0, records=data)
            tdata = build(mod.TopicProduceData, name=self.topic, partition_data=(pdata,))
            return build(mod.ProduceRequest, transactional_id=self.txn_id, acks=-1,
                         timeout=datetime.timedelta(seconds=30), topic_data=(tdata,))

        result = calls.produce_result(self.conn.call(apis.PRODUCE, make))
        if result.error_code == ErrorCode.none:
            self.sequence += RECORDS
        return self._answer(f"Produce {label}", result.error_code,
                            f" at offset {result.base_offset}")

    def end(self, commit: bool) -> ErrorCode:
        what = "commit" if commit else "abort"
        self._request(f"EndTxn({what}, epoch {self.epoch})")

        def make(mod, version):
            return build(mod.EndTxnRequest, transactional_id=self.txn_id,
                         producer_id=self.producer_id, producer_epoch=self.epoch,
                         committed=commit)

        response = self.conn.call(apis.END_TXN, make)
        error = self._answer(f"EndTxn({what})", response.error_code)
        new_epoch = getattr(response, "producer_epoch", -1)
        if error == ErrorCode.none and new_epoch not in (-1, self.epoch):
            # Transaction version 2 (EndTxn v5, KIP-890): a new epoch per transaction, whose
            # sequences start again at 0.
            self.epoch, self.sequence = new_epoch, 0
            self.note("producer", f"{self.name}: the coordinator bumped the epoch to "
                                  f"{new_epoch} with the transaction's end (KIP-890)")
        return error


def flow_zombie_fencing(bootstrap: str, topic: str, outcome: Outcome) -> tuple[bool, str]:
    txn_id = f"{topic}-app"
    old = TxnProducer(bootstrap, "P1", txn_id, topic, outcome)
    new = TxnProducer(bootstrap, "P2", txn_id, topic, outcome)
    try:
        old.init()
        old.add_partition()
        old.produce("Z")
        old.note("producer", "P1 stalls (a long GC pause, a network partition); its "
                             "replacement P2 starts with the same transactional.id")
        new.init()
        new.note("broker", f"the new epoch fences P1's epoch {old.epoch}; P1's open "
                           "transaction is aborted (an ABORT marker in the partition)")
        old.note("producer", "P1 wakes up and carries on as if nothing happened")
        zombie = [old.produce("Y"), old.add_partition(), old.end(commit=True)]
        new.add_partition()
        new.produce("N")
        new.end(commit=True)
    finally:
        old.close()
        new.close()
    fenced = all(e in FENCED for e in zombie)
    committed = read_values(bootstrap, topic, read_committed=True)
    expected = [f"N:{i}" for i in range(RECORDS)]
    if not fenced:
        return False, ("FAIL: the zombie was not fenced everywhere: "
                       + ", ".join(e.name.upper() for e in zombie))
    if committed != expected:
        return False, f"FAIL: a read_committed reader sees {committed}, not {expected}"
    return True, ("PASS: Produce, AddPartitionsToTxn and EndTxn of the zombie were all fenced "
                  f"({', '.join(sorted({e.name.upper() for e in zombie}))}); a "
                  f"read_committed reader sees only the {RECORDS} records of the new producer")


def flow_abort_then_commit(bootstrap: str, topic: str, outcome: Outcome) -> tuple[bool, str]:
    p = TxnProducer(bootstrap, "P", f"{topic}-app", topic, outcome)
    try:
        p.init()
        p.add_partition()
        p.produce("A")
        p.note("producer", "the application fails half-way: abort the transaction")
        p.end(commit=False)
        p.note("producer", "retry the work in a new transaction")
        p.add_partition()
        p.produce("C")
        p.end(commit=True)
    finally:
        p.close()
    committed = read_values(bootstrap, topic, read_committed=True)
    uncommitted = read_values(bootstrap, topic, read_committed=False)
    expected = [f"C:{i}" for i in range(RECORDS)]
    if committed != expected:
        return False, f"FAIL: a read_committed reader sees {committed}, not {expected}"
    if uncommitted != [f"A:{i}" for i in range(RECORDS)] + expected:
        return False, f"FAIL: a read_uncommitted reader sees {uncommitted}"
    return True, (f"PASS: a read_committed reader sees only the committed {RECORDS} records "
                  f"(C); the aborted ones (A) stay in the log, where only a read_uncommitted "
                  f"reader sees them")


EXPECTED_LABEL = {"zombie-fencing": "N", "abort-then-commit": "C"}
_RUNS = {"zombie-fencing": flow_zombie_fencing, "abort-then-commit": flow_abort_then_commit}


def run_txn_scenario(name: str, title: str, bootstrap: str, topic: str | None = None
                     ) -> Outcome:
    topic = topic or f"scenario-{name}-{int(time.time() * 1000)}"
    outcome = Outcome(name, title, kafka_note=KAFKA_NOTES.get(name, ""))
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(topic, 1, -1)
    outcome.passed, outcome.verdict = _RUNS[name](bootstrap, topic, outcome)
    # What the verdict judges: the read_committed view (only the last transaction's records
    # are committed, in both flows); the diagram shows everything the log holds.
    committed = read_partition(bootstrap, topic, read_committed=True)
    outcome.offsets = [offset for offset, _ in committed]
    outcome.log = [value for _, value in committed]
    outcome.expected = [f"{EXPECTED_LABEL[name]}:{i}" for i in range(RECORDS)]
    outcome.steps.append(Step("broker-note", f"log of {topic}-0: "
                              + describe_log(read_partition(bootstrap, topic, False))
                              + "; read_committed: " + describe_log(committed)))
    return outcome


def read_values(bootstrap: str, topic: str, read_committed: bool) -> list[str]:
    return [value for _, value in read_partition(bootstrap, topic, read_committed)]


def read_partition(bootstrap: str, topic: str, read_committed: bool,
                   max_fetches: int = 100) -> list[tuple[int, str]]:
    """(offset, value) of partition 0's records up to the last stable offset
    (read_committed, aborted transactions dropped) or the high watermark."""
    found: list[tuple[int, str]] = []
    position = 0
    with connect(bootstrap, "oncelog-scenario") as conn:
        for _ in range(max_fetches):
            calls.send_fetch(conn, {(topic, 0): position}, 100, 1 << 20, 1 << 20,
                             isolation_level=int(read_committed))
            _, response = conn.receive()
            p = response.responses[0].partitions[0]
            if p.error_code != ErrorCode.none:
                raise OSError(f"fetch of {topic}-0 at {position}: {p.error_code.name}")
            end = p.last_stable_offset if read_committed else p.high_watermark
            if position >= end:
                break
            aborted = [(a.producer_id, a.first_offset)
                       for a in (p.aborted_transactions or ())] if read_committed else None
            walk = RecordSetWalk(p.records or b"", position, aborted=aborted)
            for batch in walk:
                base = batch.header.base_offset
                found += [(base + fields[0], (fields[3] or b"").decode())
                          for fields in batch.record_fields()]
            position = walk.position
    return found
