"""oncelog.Admin's transaction calls. KIP-664's: DescribeTransactions to the transactional
id's coordinator (FindCoordinator key type 1), ListTransactions to every broker,
WriteTxnMarkers (a hanging transaction's abort) to the partition's leader. KIP-939's, what
a two-phase commit coordinator does with transactions others wrote and prepared: EndTxn and
InitProducerId, one request per transactional id to its coordinator, pipelined on one
connection per coordinator, instead of a producer per id (its thread, connections,
InitProducerId)."""

from __future__ import annotations

import datetime
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.schema import build
from ..network import calls
from ..network.connection import BrokerConnection, KafkaError
from ..producer.transactions import TWO_PHASE_FROM, Action, Api, judge
from .base import RETRY_BACKOFF, AdminBase, Coordinator, connection_lost, raise_for

COORDINATOR_TRANSACTION = 1  # FindCoordinator key type
TRANSACTION_STATE_TOPIC = "__transaction_state"
# Required in InitProducerId; two-phase commit transactions have none (the broker ignores it).
_FENCE_TXN_TIMEOUT = datetime.timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    transactional_id: str
    coordinator_id: int
    producer_id: int
    producer_epoch: int
    state: str  # as Kafka spells it: Ongoing, PrepareCommit, CompleteAbort...
    timeout_ms: int
    start_ms: int  # of the ongoing transaction; -1: none
    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class FencedTransaction:
    """fence_transactions()' answer for one transactional id: its new producer id and
    epoch, and (``keep_prepared``) the kept open transaction's, or -1, -1 when none was."""

    transactional_id: str
    producer_id: int
    epoch: int
    ongoing_producer_id: int = -1
    ongoing_epoch: int = -1


@dataclass(frozen=True, slots=True)
class TransactionListing:
    transactional_id: str
    coordinator_id: int
    producer_id: int
    state: str


@dataclass(frozen=True, slots=True)
class _ListFilter:
    states: tuple[str, ...]
    producer_ids: tuple[int, ...]
    duration_ms: int
    pattern: str | None


class TransactionsAdmin(AdminBase):
    def find_transaction_coordinator(self, transactional_id: str) -> Coordinator:
        return self._find_coordinator(transactional_id, COORDINATOR_TRANSACTION)

    def describe_transactions(self, transactional_ids: Iterable[str]
                              ) -> dict[str, TransactionDescription | KafkaError]:
        """Each transactional id's state as its coordinator holds it, or the error
        (TRANSACTIONAL_ID_NOT_FOUND for an id the coordinator does not know)."""
        result: dict[str, TransactionDescription | KafkaError] = {}
        for txn_id in dict.fromkeys(transactional_ids):
            try:
                error, found = self._coordinator_call(
                    txn_id, COORDINATOR_TRANSACTION, apis.DESCRIBE_TRANSACTIONS,
                    _describe_transactions_request(txn_id), lambda r: r[0],
                    read=_read_describe_transactions)
            except KafkaError as exc:
                result[txn_id] = exc
                continue
            if error != ErrorCode.none or found is None:
                result[txn_id] = KafkaError(error, f"transactional id {txn_id!r}")
                continue
            coordinator = self._coordinators[COORDINATOR_TRANSACTION, txn_id]
            result[txn_id] = TransactionDescription(txn_id, coordinator.node_id, *found)
        return result

    def list_transactions(self, states: Iterable[str] = (), producer_ids: Iterable[int] = (),
                          duration_ms: int = -1, pattern: str | None = None
                          ) -> dict[int, list[TransactionListing]]:
        """ListTransactions of every broker: broker id -> its transactions that pass every
        filter (states, producer ids, open for at least ``duration_ms``, transactional id
        matching the regular expression ``pattern``). Answered only once every broker did,
        each coordinator loaded, and every partition of __transaction_state was led by one
        of them; until the admin's timeout, then the retriable error is raised
        (AdminBase._each_broker): a transaction is never left out unsaid."""
        wanted = _ListFilter(tuple(states), tuple(producer_ids), duration_ms, pattern)

        def ask(node_id: int, conn: BrokerConnection) -> list[TransactionListing]:
            version = conn.version(apis.LIST_TRANSACTIONS)
            if duration_ms >= 0 and version < 1:
                raise KafkaError(ErrorCode.unsupported_version, "the broker cannot filter "
                                 "transactions by duration (ListTransactions v1)")
            if pattern and version < 2:
                raise KafkaError(ErrorCode.unsupported_version, "the broker cannot filter "
                                 "transactional ids by pattern (ListTransactions v2)")
            response = conn.call(apis.LIST_TRANSACTIONS, _list_transactions_request(wanted))
            raise_for(response.error_code, f"ListTransactions on broker {node_id}")
            return sorted((TransactionListing(t.transactional_id, node_id, t.producer_id,
                                              t.transaction_state)
                           for t in response.transaction_states),
                          key=lambda t: t.transactional_id)

        return self._each_broker(ask, covering=TRANSACTION_STATE_TOPIC)

    def abort_transaction(self, topic: str, partition: int, producer_id: int,
                          producer_epoch: int, coordinator_epoch: int) -> None:
        """Write an ABORT marker of the producer to the partition (WriteTxnMarkers to its
        leader), as Kafka's Admin.abortTransaction does for a hanging transaction."""
        def make(mod, version):
            marker = build(mod.WritableTxnMarker, producer_id=producer_id,
                           producer_epoch=producer_epoch, transaction_result=False,
                           coordinator_epoch=coordinator_epoch, transaction_version=0,
                           topics=(build(mod.WritableTxnMarkerTopic, name=topic,
                                         partition_indexes=(partition,)),))
            return build(mod.WriteTxnMarkersRequest, markers=(marker,))

        def ask(conn, asked):
            response = conn.call(apis.WRITE_TXN_MARKERS, make)
            return {(t.name, p.partition_index): None if p.error_code == ErrorCode.none
                    else KafkaError(p.error_code, f"{t.name}-{p.partition_index}")
                    for m in response.markers for t in m.topics for p in t.partitions}

        for answer in self._leader_call({(topic, partition): partition}, ask).values():
            if answer is not None:
                raise answer

    # --- ending others' transactions (KIP-939) -------------------------------------------

    def end_transactions(self, ends: Mapping[str, tuple[int, int]], commit: bool
                         ) -> dict[str, ErrorCode]:
        """EndTxn of each transactional id's open transaction with the producer id and
        epoch it was prepared with (``(producer id, epoch)``, as prepare_transaction()
        answered). Retriable answers are asked again until the admin's timeout; each id gets
        its last answer: NONE (ended), PRODUCER_FENCED (the epoch moved on since: another
        instance took the id over), INVALID_TXN_STATE (nothing open)..."""
        def make(txn_id: str):
            producer_id, epoch = ends[txn_id]

            def build_request(mod, version):
                return build(mod.EndTxnRequest, transactional_id=txn_id,
                             producer_id=producer_id, producer_epoch=epoch, committed=commit)

            return build_request

        answers = self._per_transaction(ends, Api.END_TXN, apis.END_TXN, make,
                                        lambda r: r.error_code)
        return {txn_id: a if isinstance(a, ErrorCode) else ErrorCode(a.error_code)
                for txn_id, a in answers.items()}

    def fence_transactions(self, transactional_ids: Iterable[str], keep_prepared: bool = False
                           ) -> dict[str, FencedTransaction | KafkaError]:
        """InitProducerId of each transactional id as a new two-phase commit instance
        (KIP-939; the broker must allow it): fences the instances before it and aborts the
        open transaction (waiting until it is aborted), or with ``keep_prepared`` keeps it
        open for end_transactions() with the new producer id and epoch."""
        def make(txn_id: str):
            def build_request(mod, version):
                if version < TWO_PHASE_FROM:
                    raise KafkaError(ErrorCode.unsupported_version, "two-phase commit "
                                     "needs InitProducerId v6 (KIP-939); the coordinator "
                                     f"speaks v{version}")
                return calls.init_producer_id_request(mod, txn_id, _FENCE_TXN_TIMEOUT,
                                                      two_phase=True,
                                                      keep_prepared=keep_prepared)

            return build_request

        answers = self._per_transaction(transactional_ids, Api.INIT_PRODUCER_ID,
                                        apis.INIT_PRODUCER_ID, make, lambda r: r.error_code)
        result: dict[str, FencedTransaction | KafkaError] = {}
        for txn_id, a in answers.items():
            if isinstance(a, ErrorCode) or a.error_code != ErrorCode.none:
                error = a if isinstance(a, ErrorCode) else ErrorCode(a.error_code)
                result[txn_id] = KafkaError(error, f"InitProducerId {txn_id!r}")
            else:
                result[txn_id] = FencedTransaction(
                    txn_id, a.producer_id, a.producer_epoch,
                    getattr(a, "ongoing_txn_producer_id", -1),
                    getattr(a, "ongoing_txn_producer_epoch", -1))
        return result

    def _per_transaction(self, transactional_ids: Iterable[str], api: Api, api_key: int,
                         make: Callable[[str], Callable[[ModuleType, int], Any]],
                         error_of: Callable[[Any], int]) -> dict[str, Any]:
        """One request per transactional id (``make(id)``) to the id's coordinator, all of a
        coordinator's pipelined; what the producer's rules (transactions.judge) retry is
        asked again until the admin's timeout. id -> the answer, or the ErrorCode of a
        coordinator that could not be found."""
        deadline = time.monotonic() + self.timeout
        left = list(dict.fromkeys(transactional_ids))
        result: dict[str, Any] = {}
        while left:
            by_coordinator: dict[tuple[str, int], list[str]] = {}
            for txn_id in left:
                try:
                    coordinator = self._coordinator(txn_id, COORDINATOR_TRANSACTION)
                except KafkaError as exc:
                    result[txn_id] = exc.error
                    continue
                by_coordinator.setdefault((coordinator.host, coordinator.port),
                                          []).append(txn_id)
            again = []
            for (host, port), txn_ids in by_coordinator.items():
                try:
                    conn = self._broker(host, port)
                    for txn_id in txn_ids:
                        conn.send_only(api_key, make(txn_id))
                except KafkaError as exc:  # its broker died: the coordinators move
                    if not connection_lost(exc) or time.monotonic() >= deadline:
                        raise
                    self._lost(txn_ids, again)
                    continue
                for n, txn_id in enumerate(txn_ids):
                    try:
                        response = conn.receive()[1]
                    except KafkaError as exc:
                        if not connection_lost(exc) or time.monotonic() >= deadline:
                            raise
                        self._lost(txn_ids[n:], again)
                        break
                    error = ErrorCode(error_of(response))
                    action = judge(api, error)
                    if action in (Action.RETRY, Action.FIND_COORDINATOR) and \
                            time.monotonic() < deadline:
                        if action is Action.FIND_COORDINATOR:
                            self._coordinators.pop((COORDINATOR_TRANSACTION, txn_id), None)
                        again.append(txn_id)
                    else:
                        result[txn_id] = response
            left = again
            if left:
                time.sleep(RETRY_BACKOFF)
        return result

    def _lost(self, txn_ids: list[str], again: list[str]) -> None:
        """Ids whose coordinator's connection failed: asked again of a coordinator found
        anew (a request that reached the dead one is answered by the next as a retry)."""
        for txn_id in txn_ids:
            self._coordinators.pop((COORDINATOR_TRANSACTION, txn_id), None)
        again.extend(txn_ids)


class _Reader:
    """Kafka's flexible encoding, for the one answer kio cannot read."""

    def __init__(self, data: bytes | bytearray, pos: int) -> None:
        self.data, self.pos = data, pos

    def fixed(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def string(self) -> str:
        size = self.uvarint() - 1
        text = self.data[self.pos:self.pos + max(size, 0)].decode()
        self.pos += max(size, 0)
        return text

    def count(self) -> int:
        return max(self.uvarint() - 1, 0)

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()


def _read_describe_transactions(version: int, frame: bytes | bytearray
                                ) -> tuple[ErrorCode, tuple[Any, ...] | None]:
    """The first state of a DescribeTransactions v0 answer: (error, (producer id, epoch,
    state, timeout ms, start ms, partitions)). kio reads TransactionStartTimeMs as a datetime
    and refuses the -1 Kafka sends when no transaction is ongoing, so it is read here."""
    r = _Reader(frame, 4)
    r.skip_tags()  # response header v1
    r.fixed(">i")  # throttle time
    if r.count() == 0:
        return ErrorCode.unknown_server_error, None
    error = ErrorCode(r.fixed(">h"))
    r.string()  # transactional id
    state = r.string()
    timeout_ms, start_ms = r.fixed(">i"), r.fixed(">q")
    producer_id, epoch = r.fixed(">q"), r.fixed(">h")
    partitions = []
    for _ in range(r.count()):
        topic = r.string()
        partitions += [(topic, r.fixed(">i")) for _ in range(r.count())]
        r.skip_tags()
    return error, (producer_id, epoch, state, timeout_ms, start_ms, tuple(partitions))


def _describe_transactions_request(transactional_id: str):
    def make(mod, version):
        return build(mod.DescribeTransactionsRequest, transactional_ids=(transactional_id,))

    return make


def _list_transactions_request(wanted: _ListFilter):
    def make(mod, version):
        return build(mod.ListTransactionsRequest, state_filters=wanted.states,
                     producer_id_filters=wanted.producer_ids,
                     duration_filter=wanted.duration_ms,
                     transactional_id_pattern=wanted.pattern)

    return make
