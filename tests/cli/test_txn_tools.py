"""``oncelog transactions`` (list, describe, describe-producers, find-hanging, abort), the
transaction lines of /metrics and the LSO of ``oncelog topics describe``, against a real
broker with confluent-kafka's transactional producer. A hanging transaction (transactional
data no coordinator knows of, which KIP-890's checks keep clients from making) is put on disk
with the broker stopped, as a bug or an old broker would have left it."""

from __future__ import annotations

import subprocess
import time
import urllib.request

import pytest
from support.broker_forks import run_oncelog
from support.brokers import START_TIMEOUT, append_on_disk, create_topic

from oncelog.client.admin.admin import Admin
from oncelog.client.network import calls
from oncelog.protocol.records import encode_batch

HANGING_PRODUCER = 4242


def run(broker, command: str, *args: str) -> subprocess.CompletedProcess:
    bootstrap = ["--bootstrap-server", broker.bootstrap] if broker is not None else []
    done = run_oncelog(command, *args, *bootstrap)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def txns(broker, *args: str) -> subprocess.CompletedProcess:
    return run(broker, "transactions", *args)


def rows(stdout: str) -> list[list[str]]:
    """Kafka's prettyPrintTable: a header line, then the rows, cells split by tabs."""
    lines = stdout.splitlines()
    assert lines, stdout
    width = len(lines[0].split("\t"))
    return [([cell.strip() for cell in line.split("\t")] + [""] * width)[:width]
            for line in lines]


def open_transaction(bootstrap: str, txn_id: str, topic: str, partition: int):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    producer.init_transactions(START_TIMEOUT)
    producer.begin_transaction()
    producer.produce(topic, b"open", partition=partition)
    assert producer.flush(START_TIMEOUT) == 0
    return producer


def offsets(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    """(high watermark, last stable offset)."""
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        tp = (topic, partition)
        return (admin.list_offsets({tp: calls.LATEST})[tp],
                admin.list_offsets({tp: calls.LATEST}, read_committed=True)[tp])


def metrics(broker) -> list[str]:
    with urllib.request.urlopen(broker.metrics_url, timeout=30) as answer:
        return answer.read().decode().splitlines()


def test_list_describe_and_producers_of_an_open_then_committed_transaction(broker):
    create_topic(broker.bootstrap, "t", 2)
    producer = open_transaction(broker.bootstrap, "tx-a", "t", 1)

    listed = txns(broker, "list")
    assert listed.returncode == 0, listed.stderr
    table = rows(listed.stdout)
    assert table[0] == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
    assert [r for r in table[1:] if r[0] == "tx-a"] == [["tx-a", "0", table[1][2], "Ongoing"]]
    producer_id = table[1][2]
    assert rows(txns(broker, "list", "--state", "CompleteCommit").stdout)[1:] == []
    assert rows(txns(broker, "list", "--state", "ongoing", "--producer-id",
                     producer_id).stdout)[1:] == [["tx-a", "0", producer_id, "Ongoing"]]
    assert rows(txns(broker, "list", "--transactional-id-pattern", "tx-.*").stdout)[1][0] == \
        "tx-a"

    described = txns(broker, "describe", "--transactional-id", "tx-a")
    assert described.returncode == 0, described.stderr
    header, row = rows(described.stdout)
    assert header == ["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch",
                      "TransactionState", "TransactionTimeoutMs",
                      "CurrentTransactionStartTimeMs", "TransactionDurationMs",
                      "TopicPartitions"]
    assert row[:5] == ["0", "tx-a", producer_id, row[3], "Ongoing"]
    assert int(row[6]) > 0 and int(row[7]) >= 0 and row[8] == "t-1"

    producers = rows(txns(broker, "describe-producers", "--topic", "t", "--partition",
                          "1").stdout)
    assert producers[0][-1] == "CurrentTransactionStartOffset"
    assert producers[1][0] == producer_id and producers[1][-1] == "0"
    assert offsets(broker.bootstrap, "t", 1) == (1, 0)
    # The coordinator knows this transaction: it is open, not hanging.
    found = txns(broker, "find-hanging", "--topic", "t", "--max-transaction-timeout", "0")
    assert found.returncode == 0 and rows(found.stdout)[1:] == [], found.stdout
    lines = metrics(broker)
    assert 'oncelog_transactions{state="Ongoing"} 1' in lines
    age = [line for line in lines if line.startswith("oncelog_transaction_oldest_open_age_ms")]
    assert len(age) == 1 and int(age[0].split()[1]) >= 0

    described = run(broker, "topics", "describe", "--topic", "t")
    assert "Offsets: 0..1\tLastStableOffset: 0" in described.stdout, described.stdout

    producer.commit_transaction(START_TIMEOUT)
    header, row = rows(txns(broker, "describe", "--transactional-id", "tx-a").stdout)
    assert row[4] == "CompleteCommit" and row[6] == row[7] == "None" and row[8] == ""
    assert rows(txns(broker, "describe-producers", "--topic", "t", "--partition",
                     "1").stdout)[1][-1] == "None"
    assert 'oncelog_transactions{state="CompleteCommit"} 1' in metrics(broker)
    assert "oncelog_transaction_oldest_open_age_ms 0" in metrics(broker)

    missing = txns(broker, "describe", "--transactional-id", "nope")
    assert missing.returncode == 1
    assert "Failed to describe transaction state of transactional-id `nope`: " \
           "TRANSACTIONAL_ID_NOT_FOUND" in missing.stderr


def _leave_a_hanging_transaction(broker, topic: str) -> int:
    """A transactional batch of a producer no coordinator knows of, written 20 minutes ago,
    after a committed record: returns the log end offset."""
    create_topic(broker.bootstrap, topic, 1)
    old = int(time.time() * 1000) - 20 * 60_000
    plain = encode_batch([(None, b"before", (), old)])
    hanging = encode_batch([(None, b"hanging", (), old)], producer_id=HANGING_PRODUCER,
                           producer_epoch=3, base_sequence=0, transactional=True)
    return append_on_disk(broker, topic, 0, [plain, hanging])


def test_find_hanging_then_abort_by_start_offset_moves_the_lso(broker):
    end = _leave_a_hanging_transaction(broker, "h")
    assert offsets(broker.bootstrap, "h", 0) == (end, 1)

    found = txns(broker, "find-hanging", "--broker-id", "0")
    assert found.returncode == 0, found.stderr
    table = rows(found.stdout)
    assert table[0] == ["Topic", "Partition", "ProducerId", "ProducerEpoch",
                        "CoordinatorEpoch", "StartOffset", "LastTimestamp", "Duration(min)"]
    assert len(table) == 2 and table[1][:6] == ["h", "0", str(HANGING_PRODUCER), "3", "-1",
                                                "1"]
    assert int(table[1][7]) >= 20
    # Younger than the maximum timeout: not reported.
    assert rows(txns(broker, "find-hanging", "--topic", "h", "--max-transaction-timeout",
                     "60").stdout)[1:] == []

    wrong = txns(broker, "abort", "--topic", "h", "--partition", "0", "--start-offset", "0")
    assert wrong.returncode == 1
    assert "Could not find any open transactions starting at offset 0 on partition h-0" in \
        wrong.stderr

    aborted = txns(broker, "abort", "--topic", "h", "--partition", "0", "--start-offset", "1")
    assert aborted.returncode == 0, aborted.stderr
    assert offsets(broker.bootstrap, "h", 0) == (end + 1, end + 1)
    assert rows(txns(broker, "find-hanging", "--broker-id", "0").stdout)[1:] == []


def test_abort_by_producer_identity(broker):
    end = _leave_a_hanging_transaction(broker, "h")
    stale = txns(broker, "abort", "--topic", "h", "--partition", "0", "--producer-id",
                 str(HANGING_PRODUCER), "--producer-epoch", "2", "--coordinator-epoch", "-1")
    assert stale.returncode == 1 and "INVALID_PRODUCER_EPOCH" in stale.stderr, stale.stderr
    assert offsets(broker.bootstrap, "h", 0) == (end, 1)
    aborted = txns(broker, "abort", "--topic", "h", "--partition", "0", "--producer-id",
                   str(HANGING_PRODUCER), "--producer-epoch", "3", "--coordinator-epoch", "-1")
    assert aborted.returncode == 0, aborted.stderr
    assert offsets(broker.bootstrap, "h", 0) == (end + 1, end + 1)


@pytest.mark.parametrize("args, message", [
    (["find-hanging"], "requires either --topic or --broker-id"),
    (["find-hanging", "--partition", "0", "--broker-id", "0"], "requires --topic"),
    (["find-hanging", "--topic", "t", "--max-transaction-timeout", "-1"], "0 or more"),
    (["abort", "--topic", "t", "--partition", "0"], "must be identified either"),
    (["abort", "--topic", "t", "--partition", "0", "--producer-id", "7"],
     "Missing required argument --producer-epoch"),
    (["abort", "--topic", "t", "--partition", "0", "--producer-id", "7", "--producer-epoch",
      "1"], "Missing required argument --coordinator-epoch"),
    (["abort", "--topic", "t", "--partition", "-1", "--start-offset", "0"], "0 or more"),
    (["abort", "--topic", "t", "--partition", "0", "--start-offset", "0", "--producer-id",
      "7"], "not both"),
    (["list", "--state", "Bogus"], "Invalid state list 'Bogus'"),
    (["list", "--duration-filter", "-5"], "0 or more"),
    (["list", "--bootstrap-server", "nohostport"], "is not host:port"),
    (["describe"], "--transactional-id"),
    (["describe-producers", "--topic", "t", "--partition", "x"], "invalid int value"),
])
def test_bad_arguments_exit_2_with_a_message(args, message):
    done = txns(None, *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr


@pytest.mark.parametrize("name", ["zombie-fencing", "abort-then-commit"])
def test_transactional_scenarios(broker, name, tmp_path):
    out = tmp_path / "flow.html"
    done = run(broker, "scenario", name, "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"{name}: PASS: "), done.stdout
    page = out.read_text()
    assert "<svg" in page
    if name == "zombie-fencing":
        assert "Produce Y: INVALID_PRODUCER_EPOCH" in page or \
            "Produce Y: PRODUCER_FENCED" in page
        assert "EndTxn(commit): PRODUCER_FENCED" in page
    else:
        assert "EndTxn(abort) OK" in page
