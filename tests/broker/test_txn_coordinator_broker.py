"""The transaction coordinator's defects of issue 21 on a real broker process, with real
clients where one can trigger them (oncelog's Producer, confluent-kafka, kafka-python) and raw
requests (txn_wire.py) where none can: epoch exhaustion (2), mixed transaction versions on one
transactional id (3), concurrent InitProducerId (4), a retried EndTxn v5 after a restart (6),
ListTransactions' pattern (issue 28 #3)."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Producer as ConfluentProducer
from kio.schema.errors import ErrorCode as E
from support.brokers import BrokerProcess, append_on_disk, create_topic
from support.txn_client_broker_helpers import read_committed, txn_producer
from support.txn_wire import add_partitions, end_txn, init_producer_id, produce_txn, wait_settled

from oncelog.client.network.connection import BrokerConnection
from oncelog.coordinator.internal_log import partition_for
from oncelog.coordinator.transaction import txn_records as tr
from oncelog.protocol import api_versions as apis
from oncelog.protocol.records import encode_batch
from oncelog.protocol.schema import build

TIMEOUT = 30
STATE_PARTITIONS = 50  # transaction.state.log.num.partitions' default


def connect(broker: BrokerProcess) -> BrokerConnection:
    return BrokerConnection("127.0.0.1", broker.port, client_id="txn-coord-test", timeout=30)


def test_epoch_exhaustion_moves_to_a_new_producer_id_without_a_hanging_transaction(broker):
    """Defect 2: a transactional id at epoch 32765 (its record written on disk, as 32k
    transactions would leave it): oncelog's Producer (transaction version 2) gets 32766, and
    its next commit exhausts the epoch; the markers go as (old id, 32767), the LSO reaches
    the high watermark and the producer goes on under a new producer id."""
    create_topic(broker.bootstrap, "ex")
    with txn_producer(broker.bootstrap, "ex-id") as p:
        p.begin_transaction()
        p.produce("ex", b"first", partition=0)
        p.commit_transaction(TIMEOUT)
        pid = p._core.idem.producer_id
    now = int(time.time() * 1000)
    seeded = tr.TxnValue(pid, 32765, 60000, tr.TxnState.COMPLETE_COMMIT, (), now, -1, -1, -1, 2)
    append_on_disk(broker, "__transaction_state", partition_for("ex-id", STATE_PARTITIONS),
                   [encode_batch([(tr.txn_key("ex-id"), tr.txn_value(seeded), (), now)])])
    with txn_producer(broker.bootstrap, "ex-id") as p:
        assert (p._core.idem.producer_id, p._core.idem.epoch) == (pid, 32766)
        p.begin_transaction()
        p.produce("ex", b"at-32766", partition=0)
        p.commit_transaction(TIMEOUT)
        assert p._core.idem.producer_id != pid and p._core.idem.epoch == 0
        p.begin_transaction()
        p.produce("ex", b"new-id", partition=0)
        p.commit_transaction(TIMEOUT)
    with connect(broker) as conn:
        wait_settled(conn, "ex", 1)
    assert read_committed(broker.bootstrap, "ex") == [b"first", b"at-32766", b"new-id"]


def test_clients_of_both_transaction_versions_share_one_transactional_id(broker):
    """Defect 3: oncelog's Producer (EndTxn v5), then confluent-kafka and kafka-python
    (transaction version 1) with the same transactional.id, each committing."""
    from kafka import KafkaProducer

    create_topic(broker.bootstrap, "mix")
    with txn_producer(broker.bootstrap, "mixed") as p:
        p.begin_transaction()
        p.produce("mix", b"oncelog", partition=0)
        p.commit_transaction(TIMEOUT)
    theirs = ConfluentProducer({"bootstrap.servers": broker.bootstrap,
                                "transactional.id": "mixed", "transaction.timeout.ms": 60_000})
    try:
        theirs.init_transactions(TIMEOUT)
        for value in (b"confluent-1", b"confluent-2"):
            theirs.begin_transaction()
            theirs.produce("mix", value=value, partition=0)
            theirs.commit_transaction(TIMEOUT)
    finally:
        theirs.flush(1)
        del theirs  # librdkafka's threads stop with it, before the broker does
    kp = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="mixed",
                       request_timeout_ms=TIMEOUT * 1000, max_block_ms=TIMEOUT * 1000)
    try:
        kp.init_transactions()
        for value in (b"kafka-python-1", b"kafka-python-2"):
            kp.begin_transaction()
            kp.send("mix", value=value, partition=0)
            kp.commit_transaction()
    finally:
        kp.close(TIMEOUT)
    with txn_producer(broker.bootstrap, "mixed") as p:
        p.begin_transaction()
        p.produce("mix", b"oncelog-again", partition=0)
        p.commit_transaction(TIMEOUT)
    with connect(broker) as conn:
        wait_settled(conn, "mix", 1)
    assert read_committed(broker.bootstrap, "mix") == [
        b"oncelog", b"confluent-1", b"confluent-2", b"kafka-python-1", b"kafka-python-2",
        b"oncelog-again"]


def test_two_init_producer_ids_at_once_never_share_an_epoch(start_broker):
    """Defect 4: with every write waiting for its fsync, two InitProducerId for one id sent
    at the same moment are never both answered with the same producer id and epoch (nor,
    for a new id, with two producer ids)."""
    broker = start_broker(log_flush_interval_messages=1)
    conns = [connect(broker), connect(broker)]
    try:
        for round_ in range(8):
            for _ in range(2):  # a new id, then the same id again
                txn_id = f"race-{round_}"
                barrier = threading.Barrier(2, timeout=TIMEOUT)
                answers: list = [None, None]

                def call(i: int, txn_id: str = txn_id, barrier=barrier, answers=answers):
                    barrier.wait()
                    answers[i] = init_producer_id(conns[i], txn_id, retry_busy=False)

                threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(TIMEOUT)
                assert None not in answers
                granted = [(pid, epoch) for error, pid, epoch in answers if error is E.none]
                assert all(error in (E.none, E.concurrent_transactions)
                           for error, _, _ in answers), answers
                assert len(set(granted)) == len(granted), answers
                assert len({pid for pid, _ in granted}) <= 1, answers
    finally:
        for conn in conns:
            conn.close()


def test_a_retried_end_txn_v5_is_answered_after_a_restart(broker):
    """Defect 6: the EndTxn v5 whose answer was lost, sent again after the broker
    restarted, gets NONE and the bumped epoch, not PRODUCER_FENCED."""
    create_topic(broker.bootstrap, "rt")
    with connect(broker) as conn:
        error, pid, epoch = init_producer_id(conn, "retry-id")
        assert error is E.none
        assert add_partitions(conn, "retry-id", pid, epoch, [("rt", 0)]) == {("rt", 0): E.none}
        assert produce_txn(conn, "retry-id", "rt", 0, pid, epoch, 0, [b"v"]) is E.none
        assert end_txn(conn, "retry-id", pid, epoch, True) == (E.none, epoch + 1)
        wait_settled(conn, "rt", 1)
    broker.restart()
    with connect(broker) as conn:
        deadline = time.monotonic() + TIMEOUT
        while (answer := end_txn(conn, "retry-id", pid, epoch, True))[0] in (
                E.coordinator_load_in_progress, E.concurrent_transactions):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert answer == (E.none, epoch + 1)
    assert read_committed(broker.bootstrap, "rt") == [b"v"]


def test_list_transactions_pattern_is_re2(broker):
    """Issue 28 #3: ``(a+)+b`` against a long id answers at once; an invalid pattern is
    INVALID_REGULAR_EXPRESSION."""
    with connect(broker) as conn:
        for txn_id in ("a" * 40, "aab"):
            assert init_producer_id(conn, txn_id)[0] is E.none

        def listing(pattern: str):
            return conn.call(apis.LIST_TRANSACTIONS, lambda mod, v: build(
                mod.ListTransactionsRequest, state_filters=(), producer_id_filters=(),
                duration_filter=-1, transactional_id_pattern=pattern))

        start = time.monotonic()
        answer = listing("(a+)+b")
        assert time.monotonic() - start < 5  # backtracking: hours
        assert E(answer.error_code) is E.none
        assert [t.transactional_id for t in answer.transaction_states] == ["aab"]
        assert E(listing("(?<=a)b").error_code) is E.invalid_regular_expression
