"""Offsets without records, as a Kafka log has them: a partition whose last batch is a control
batch (every committed transaction ends with one) and compacted batches whose records skip
offsets. oncelog.Consumer (its iterator and ``oncelog consume --exit-at-end``) and the audit
read every record once and reach the end. The batches are written through the log classes,
as no client may produce them."""

from __future__ import annotations

import json
import threading

import pytest
from brokers import append_on_disk
from record_sets import control_batch, craft_batch, data_batch

import oncelog
from oncelog import Consumer, TopicPartition
from oncelog.cli.main import main

TIMEOUT = 30.0
TP = TopicPartition("gaps", 0)


def gappy_partition(broker) -> tuple[list[int], int]:
    """Partition gaps-0: 5 produced records (0..4), a transaction's 3 records (5..7) and its
    commit marker (8), a compacted batch spanning 9..18 with records at 9, 12 and 14 only,
    then another transaction's 2 records (19, 20) and its marker (21). Returns the offsets
    holding records and the log end offset (22)."""
    with oncelog.Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topic("gaps", 1)
    with oncelog.Producer({"bootstrap.servers": broker.bootstrap}) as producer:
        for i in range(5):
            producer.produce("gaps", b"plain-%d" % i, partition=0)
        producer.flush(TIMEOUT)
    end = append_on_disk(broker, "gaps", 0, [
        data_batch(0, [b"tx1-0", b"tx1-1", b"tx1-2"], producer_id=1000, producer_epoch=0,
                   base_sequence=0, transactional=True),
        control_batch(0, producer_id=1000),
        craft_batch(0, [(0, b"a", b"compacted-9"), (3, b"b", b"compacted-12"),
                        (5, b"c", b"compacted-14")], last_offset_delta=9),
        data_batch(0, [b"tx2-0", b"tx2-1"], producer_id=1001, producer_epoch=0,
                   base_sequence=0, transactional=True),
        control_batch(0, producer_id=1001),
    ])
    return [0, 1, 2, 3, 4, 5, 6, 7, 9, 12, 14, 19, 20], end


def bounded(run, timeout: float = TIMEOUT):
    """``run()``'s result, or a failure if it does not return in time (the bug this file
    guards against is a reader that never ends)."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(run()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"did not return within {timeout}s"
    return result[0]


def test_the_consumer_reads_to_the_end_past_markers_and_compaction_gaps(broker):
    held, end = gappy_partition(broker)
    assert end == 22
    with Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TP])
        records = bounded(lambda: list(c))
        assert [r.offset for r in records] == held
        assert c.position(TP) == end and c.watermarks(TP) == (0, end)
        tx = [r for r in records if r.producer_id == 1000]
        assert [(r.sequence, r.is_transactional) for r in tx] == [(0, True), (1, True),
                                                                  (2, True)]

        # From inside the compacted batch, from the last record's offset, from a marker.
        for start, expected in ((10, [12, 14, 19, 20]), (14, [14, 19, 20]), (15, [19, 20]),
                                (20, [20]), (21, []), (8, [9, 12, 14, 19, 20])):
            c.seek(TP, start)
            assert [r.offset for r in bounded(lambda: list(c))] == expected, start
            assert c.position(TP) == end

        # poll() alone: the position moves past the final marker though no record comes.
        c.seek(TP, 21)
        assert c.poll(1.0) == []
        assert c.position(TP) == end


def test_consume_exit_at_end_and_the_audit_reach_the_end(broker, capsys):
    held, end = gappy_partition(broker)
    capsys.readouterr()
    code = bounded(lambda: main(["consume", "--bootstrap-server", broker.bootstrap, "--topic",
                                 "gaps", "--exit-at-end",
                                 "--print-offset"]))
    out = capsys.readouterr().out
    assert code == 0
    assert [int(line.split()[0].split(":")[1]) for line in out.splitlines()] == held

    code = bounded(lambda: main(["audit", "--bootstrap-server", broker.bootstrap, "--topic",
                                 "gaps", "--by", "value", "--json"]))
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    (partition,) = report["partitions"]
    assert (partition["start_offset"], partition["end_offset"], partition["complete"],
            partition["records"], partition["batches"]) == (0, end, True, len(held), 4)
    assert report["totals"]["records"] == len(held)
    assert {p["producer_id"]: p["records"] for p in report["producers"]}.get(1000) == 3


@pytest.mark.parametrize("position", [8, 21])
def test_a_partition_holding_only_a_marker_after_the_position(broker, position):
    """The records before it were all read: the consumer's iterator ends at once."""
    held, end = gappy_partition(broker)
    with Consumer({"bootstrap.servers": broker.bootstrap}) as c:
        c.assign([TP], {TP: position})
        got = bounded(lambda: [r.offset for r in c])
    assert got == [o for o in held if o >= position] and c.position(TP) == end
