"""Offsets without records, as a Kafka log has them: a partition whose last batch is a control
batch (every committed transaction ends with one) and compacted batches whose records skip
offsets. oncelog.Consumer (its iterator and ``oncelog consume --exit-at-end``) and the audit
read every record once and reach the end. The batches are written through the log classes,
as no client may produce them."""

from __future__ import annotations

import json
import threading

import pytest
from support.offset_gaps_helpers import TIMEOUT, gappy_partition

from oncelog import Consumer, TopicPartition
from oncelog.cli.main import main

TP = TopicPartition("gaps", 0)


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
