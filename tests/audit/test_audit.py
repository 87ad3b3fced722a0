"""``oncelog audit``: the sequence and repeated-value checks, on synthetic batches and on topics
written to a live broker (a clean idempotent stream, a plain producer that sends a value twice,
and Kafka's figure-5 duplicate: a record re-sent under a new epoch), plus bounded memory."""

from __future__ import annotations

import io
import itertools
import json
import random
import time
import tracemalloc

import pytest
from confluent_kafka import Producer
from support.audit_helpers import (
    T0,
    TIMEOUT,
    batch,
    header,
    init_producer_id,
    produce,
    run_cli,
    store_forgetting,
)
from support.brokers import create_topic

from oncelog.audit import (
    SEQUENCE_SPACE,
    Audit,
    AuditError,
    SeenSequences,
    audit_topic,
    format_report,
    record_fields,
)
from oncelog.cli.main import main
from oncelog.client.network import calls
from oncelog.client.network.connection import connect
from oncelog.protocol.batches import RecordSetWalk
from oncelog.protocol.records import GZIP, NONE, ZSTD, decode_batch, encode_batch

# --- synthetic batches ----------------------------------------------------------------------------


def audit_of(*batches, partition: int = 0):
    audit = Audit("t")
    for b in batches:
        audit.add_header(partition, b)
    return audit.finish()


def row(report, partition: int = 0, pid: int | None = 7):
    (found,) = [r for r in report.producers if r.partition == partition and r.producer_id == pid]
    return found


def test_contiguous_stream_is_clean():
    report = audit_of(header(7, 0, 0, 5), header(7, 0, 5, 5, 5), header(7, 0, 10, 1, 10))
    assert report.clean, report.problems
    r = row(report)
    assert (r.records, r.duplicates, r.gaps, r.missing, r.regressions) == (11, 0, 0, 0, 0)
    (epoch,) = r.epochs
    assert (epoch.first_sequence, epoch.last_sequence, epoch.batches) == (0, 10, 3)
    assert report.verdict.startswith("CLEAN: 11 records in 1 partition, 1 producer id")


def test_duplicate_sequences_are_counted_per_record():
    report = audit_of(header(7, 0, 0, 5), header(7, 0, 5, 3, 5),
                      header(7, 0, 0, 5, 8),  # the first batch again
                      header(7, 0, 6, 4, 13))  # overlaps 6..7, then 8..9 are new
    r = row(report)
    assert (r.records, r.duplicates, r.gaps, r.regressions) == (17, 7, 0, 0)
    assert report.problems == ["7 duplicate sequences"]
    assert not report.clean
    assert report.verdict.startswith("NOT CLEAN")


def test_gap_and_its_late_fill():
    gap = audit_of(header(7, 0, 0, 5), header(7, 0, 9, 2, 5))
    r = row(gap)
    assert (r.duplicates, r.gaps, r.missing, r.regressions) == (0, 1, 4, 0)
    assert gap.problems == ["1 gap (4 missing sequences)"]

    # The missing batch arrives after the one that skipped ahead: no hole, but reordered.
    filled = audit_of(header(7, 0, 0, 5), header(7, 0, 9, 2, 5), header(7, 0, 5, 4, 7))
    r = row(filled)
    assert (r.duplicates, r.gaps, r.missing, r.regressions) == (0, 0, 0, 4)
    assert filled.problems == ["4 regressed sequences"]

    # Two holes, one half filled, the other straddled by a batch that is partly a duplicate.
    mixed = audit_of(header(7, 0, 0, 2), header(7, 0, 4, 2, 2), header(7, 0, 10, 2, 4),
                     header(7, 0, 2, 1, 6), header(7, 0, 5, 3, 7))
    r = row(mixed)
    # seen 0..1, 4..5, 10..11; then 2 (regression), then 5..7: 5 duplicate, 6..7 regressions
    assert (r.duplicates, r.regressions, r.gaps, r.missing) == (1, 3, 2, 3)  # holes 3, 8..9


def test_new_epoch_restarts_sequences_and_an_old_epoch_after_it_is_a_regression():
    report = audit_of(header(7, 0, 0, 10), header(7, 1, 0, 4, 10), header(7, 1, 4, 2, 14))
    assert report.clean, report.problems
    r = row(report)
    assert [(e.epoch, e.records, e.first_sequence, e.last_sequence) for e in r.epochs] == [
        (0, 10, 0, 9), (1, 6, 0, 5)]

    # A batch of the fenced epoch 0 after epoch 1 began (its sequences are new to epoch 0).
    zombie = audit_of(header(7, 0, 0, 10), header(7, 1, 0, 4, 10), header(7, 0, 10, 3, 14))
    r = row(zombie)
    assert (r.duplicates, r.gaps, r.regressions) == (0, 0, 3)


def test_first_batch_of_an_epoch_may_start_anywhere():
    # Retention deleted the start, or the producer's state had expired (KIP-360).
    report = audit_of(header(7, 0, 1234, 3), header(7, 0, 1237, 3, 3), header(7, 2, 50, 1, 6))
    assert report.clean, report.problems
    assert [e.first_sequence for e in row(report).epochs] == [1234, 50]


def test_sequences_wrap_at_2_31():
    top = SEQUENCE_SPACE - 3
    clean = audit_of(header(7, 0, top - 2, 2),
                     header(7, 0, top, 5, 2),  # top, top+1, 2^31-1, 0, 1
                     header(7, 0, 2, 3, 7))
    assert clean.clean, clean.problems
    (epoch,) = row(clean).epochs
    assert (epoch.first_sequence, epoch.last_sequence) == (top - 2, 4)

    # The wrapping batch again, then one that starts right after the wrap again.
    dup = audit_of(header(7, 0, top, 5), header(7, 0, 2, 3, 5), header(7, 0, top, 5, 8),
                   header(7, 0, 0, 2, 13))
    r = row(dup)
    assert (r.duplicates, r.gaps, r.regressions) == (7, 0, 0)

    # A gap across the wrap: 2^31-1 then 2 (0 and 1 missing).
    gap = audit_of(header(7, 0, SEQUENCE_SPACE - 1, 1), header(7, 0, 2, 1, 1))
    r = row(gap)
    assert (r.gaps, r.missing, r.regressions) == (1, 2, 0)


def test_partitions_and_producer_ids_are_separate():
    audit = Audit("t")
    audit.add_header(0, header(7, 0, 0, 3))
    audit.add_header(1, header(7, 0, 0, 3))  # the same producer on another partition
    audit.add_header(0, header(8, 0, 0, 3, 3))
    audit.add_header(1, header(8, 0, 0, 2, 3))
    audit.add_header(0, header(-1, -1, -1, 4, 6))  # a non-idempotent producer
    audit.add_header(0, header(-1, -1, -1, 4, 10))
    report = audit.finish()
    assert report.clean, report.problems
    assert [(r.partition, r.producer_id, r.records) for r in report.producers] == [
        (0, None, 8), (0, 7, 3), (0, 8, 3), (1, 7, 3), (1, 8, 2)]
    assert report.totals["records"] == 19
    assert report.totals["producers"] == 2
    assert [(p.partition, p.records, p.batches) for p in report.partitions] == [(0, 14, 4),
                                                                                (1, 5, 2)]


def test_many_producer_ids_and_the_human_table():
    audit = Audit("t")
    for pid in range(300):
        audit.add_header(pid % 2, header(pid, 0, 0, 2, pid))
        audit.add_header(pid % 2, header(pid, 0, 2, 2, pid))
    audit.add_header(1, header(251, 0, 2, 1, 999))  # one duplicate, far down the table
    report = audit.finish()
    assert len(report.producers) == 300
    assert report.problems == ["1 duplicate sequence"]
    out = io.StringIO()
    format_report(report, out)
    lines = out.getvalue().splitlines()
    assert lines[-1] == ("NOT CLEAN: 1,201 records in 2 partitions, 300 producer ids; "
                         "1 duplicate sequence")
    assert "(200 rows without problems not shown; --json lists every one)" in lines
    (bad,) = [line for line in lines if line.split()[:2] == ["1", "251"]]
    assert bad.split() == ["1", "251", "0", "5", "1", "0", "0", "0"]
    assert [line.split()[:4] for line in lines if line.startswith("TOTAL")] == [
        ["TOTAL", "300", "1201", "1"]]


def test_compacted_batch_keeps_its_sequence_span():
    # Compaction removed records inside the middle batch; its header still spans 5..9.
    report = audit_of(header(7, 0, 0, 5), header(7, 0, 5, 5, 5, records=2),
                      header(7, 0, 10, 5, 10))
    assert report.clean, report.problems
    assert row(report).records == 12


def test_seen_sequences_against_a_set():
    rng = random.Random(4)
    for _ in range(200):
        seen, model = SeenSequences(), set()
        for _ in range(rng.randrange(1, 40)):
            first = rng.randrange(0, 120)
            last = first + rng.randrange(0, 12)
            overlap = seen.add(first, last)
            batch = set(range(first, last + 1))
            assert overlap == len(batch & model)
            model |= batch
            assert seen.count == len(model)
            ranges = list(zip(seen.starts, seen.ends, strict=True))
            assert [s for a, b in ranges for s in range(a, b + 1)] == sorted(model)
            assert all(b + 1 < c for (_, b), (c, _) in itertools.pairwise(ranges))
            assert seen.missing == max(model) - min(model) + 1 - len(model)


def test_repeated_values_with_real_batches(tmp_path):
    audit = Audit("t", by=("key", "value"), directory=str(tmp_path), examples=2)
    batches = [
        (0, encode_batch([(b"k1", b"a", (), T0), (b"k2", b"b", (), T0), (None, b"c", (), T0)],
                         base_offset=0)),
        (0, encode_batch([(b"k1", b"b", (), T0), (b"k3", None, (), T0)], base_offset=3)),
        (1, encode_batch([(b"k4", b"a", (), T0), (b"k5", b"b", (), T0)], base_offset=0)),
    ]
    for partition, encoded in batches:
        audit.add_batch(partition, *decode_batch(encoded))
    report = audit.finish()
    assert not list(tmp_path.iterdir()), "the hash files were not removed"
    by_key, by_value = report.repeats
    assert (by_key.field, by_key.records, by_key.nulls, by_key.repeated, by_key.extra) == (
        "key", 6, 1, 1, 1)
    assert by_key.by_partition == {0: 1}
    assert [(e.count, e.locations) for e in by_key.examples] == [(2, [(0, 0), (0, 3)])]
    assert (by_value.records, by_value.nulls, by_value.repeated, by_value.extra) == (6, 1, 2, 3)
    assert by_value.by_partition == {0: 1, 1: 2}
    # Ordered by where the first extra copy is: b"b" at 0:3, then b"a" at 1:0.
    assert [(e.count, e.locations) for e in by_value.examples] == [
        (3, [(0, 1), (0, 3), (1, 1)]), (2, [(0, 0), (1, 0)])]
    assert report.problems == ["1 key repeated (1 extra record)",
                               "2 values repeated (3 extra records)"]
    json.dumps(report.to_json())


def test_many_buckets_and_a_heavily_repeated_value(tmp_path):
    audit = Audit("t", by=("value",), expected_records=500_000, directory=str(tmp_path))
    finder = audit.finders["value"]
    assert len(finder._paths) == 16
    finder.add(0, range(50_000), [b"%d" % i for i in range(50_000)])
    finder.add(3, range(1_000), [b"same"] * 1_000)
    finder.add(4, range(100), [b"%d" % (i * 2) for i in range(100)])  # 0, 2, ..., 198 again
    (repeat,) = audit.finish().repeats
    assert (repeat.records, repeat.repeated, repeat.extra) == (51_100, 101, 1_099)
    assert repeat.by_partition == {3: 999, 4: 100}
    same = [e for e in repeat.examples if e.count == 1_000]
    assert len(same) == 1 and len(same[0].locations) == 5


@pytest.mark.parametrize("codec", [NONE, GZIP, ZSTD])
def test_record_fields_reads_what_decode_batch_reads(codec):
    rng = random.Random(codec)
    records = []
    for i in range(3000):
        key = None if i % 7 == 0 else bytes(rng.randrange(256) for _ in range(rng.choice(
            (0, 1, 63, 64, 200))))
        value = None if i % 11 == 0 else b"v" * rng.choice((0, 5, 63, 64, 8191, 8192, 20_000))
        records.append((key, value, [("h", b"x" * (i % 3))], T0 + rng.randrange(-10**6, 10**9)))
    data = encode_batch(records, codec, base_offset=10**12, producer_id=3, producer_epoch=0,
                        base_sequence=0)
    _, decoded = decode_batch(data)
    (batch,) = RecordSetWalk(data, 10**12)
    offsets, keys, values = record_fields(batch, True, True)
    assert offsets == [r.offset for r in decoded]
    assert keys == [r.key for r in decoded]
    assert values == [r.value for r in decoded]
    assert record_fields(batch, False, True) == (offsets, [], values)
    assert record_fields(batch, True, False) == (offsets, keys, [])


# --- against a broker -----------------------------------------------------------------------------


def test_clean_idempotent_stream(broker, capsys):
    create_topic(broker.bootstrap, "clean", 3)
    produce(broker.bootstrap, "clean", [(i % 3, b"v%d" % i) for i in range(3000)],
            **{"enable.idempotence": True, "batch.num.messages": 100})
    code, out = run_cli(capsys, "--bootstrap-server", broker.bootstrap, "--topic", "clean")
    assert code == 0, out
    assert out.splitlines()[-1] == ("CLEAN: 3,000 records in 3 partitions, 1 producer id; "
                                    "no duplicate, gap or regression")
    assert "TOTAL" in out

    code, out = run_cli(capsys, "--bootstrap-server", broker.bootstrap, "--topic", "clean",
                        "--by", "value", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["clean"] is True
    assert report["totals"]["records"] == 3000
    assert report["totals"]["extra_value_records"] == 0
    assert [(p["partition"], p["start_offset"], p["end_offset"], p["complete"])
            for p in report["partitions"]] == [(0, 0, 1000, True), (1, 0, 1000, True),
                                               (2, 0, 1000, True)]
    assert {p["producer_id"] for p in report["producers"]} != {None}
    assert all(p["records"] == 1000 and len(p["epochs"]) == 1 for p in report["producers"])
    assert all(p["epochs"][0]["first_sequence"] == 0 and p["epochs"][0]["last_sequence"] == 999
               for p in report["producers"])


def test_plain_producer_writing_a_value_twice(broker, capsys):
    create_topic(broker.bootstrap, "plain", 2)
    items = [(i % 2, b"order-%d" % i) for i in range(200)]
    items.insert(150, (1, b"order-77"))  # the application sent order 77 twice
    produce(broker.bootstrap, "plain", items, **{"enable.idempotence": False, "acks": "all"})

    # Without producer ids there are no sequences to check: clean, but it says so.
    code, out = run_cli(capsys, "--bootstrap-server", broker.bootstrap, "--topic", "plain")
    assert code == 0, out
    assert "0 producer ids" in out.splitlines()[-1]
    assert "none" in out

    code, out = run_cli(capsys, "--bootstrap-server", broker.bootstrap, "--topic", "plain",
                        "--by", "value")
    assert code == 1, out
    assert "order-77  x2 at 1:38, 1:75" in out
    assert out.splitlines()[-1].endswith("1 value repeated (1 extra record)")

    code, out = run_cli(capsys, "--bootstrap-server", broker.bootstrap, "--topic", "plain",
                        "--by", "value", "--json", "--partition", "1")
    assert code == 1
    (repeat,) = json.loads(out)["repeats"]
    assert (repeat["repeated"], repeat["extra"], repeat["by_partition"]) == (1, 1, {"1": 1})
    (example,) = repeat["examples"]
    assert example["data"] == "order-77" and example["same"] is True
    assert example["locations"] == [{"partition": 1, "offset": 38},
                                    {"partition": 1, "offset": 75}]


def test_figure_5_duplicate_under_a_new_epoch(broker, capsys):
    """Kafka stores a retried batch again when the producer has bumped its epoch: the
    sequence audit sees two clean epochs, only the values show the duplicate."""
    create_topic(broker.bootstrap, "fig5", 1)
    with connect(broker.bootstrap, timeout=TIMEOUT) as conn:
        pid = init_producer_id(conn)
        assert calls.produce(conn, "fig5", 0, batch(pid, 0, 0, [b"A1", b"A2"])) == 0
        assert calls.produce(conn, "fig5", 0, batch(pid, 0, 2, [b"B1", b"B2", b"B3"])) == 2
        # B's answer was lost; the producer bumped its epoch and sent B again from sequence 0.
        assert calls.produce(conn, "fig5", 0, batch(pid, 1, 0, [b"B1", b"B2", b"B3"])) == 5
        assert calls.produce(conn, "fig5", 0, batch(pid, 1, 3, [b"C1"])) == 8

    code, out = run_cli(capsys, "--bootstrap-server", broker.bootstrap, "--topic", "fig5")
    assert code == 0, out
    assert f"0          {pid}" in out and "0,1" in out

    code, out = run_cli(capsys, "--bootstrap-server", broker.bootstrap, "--topic", "fig5",
                        "--by", "value", "--json")
    assert code == 1
    report = json.loads(out)
    assert report["totals"]["duplicates"] == 0
    (producer,) = report["producers"]
    assert [(e["epoch"], e["first_sequence"], e["last_sequence"]) for e in producer["epochs"]] \
        == [(0, 0, 4), (1, 0, 3)]
    (repeat,) = report["repeats"]
    assert (repeat["repeated"], repeat["extra"]) == (3, 3)
    assert [(e["data"], [loc["offset"] for loc in e["locations"]])
            for e in repeat["examples"]] == [("B1", [2, 5]), ("B2", [3, 6]), ("B3", [4, 7])]
    assert report["problems"] == ["3 values repeated (3 extra records)"]


def test_duplicates_gaps_and_regressions_stored_by_a_broker_that_forgot_the_producer(
        start_broker, capsys):
    """A broker refuses repeated and out-of-order sequences only while it remembers the
    producer. Make it forget at once (expiration 1 ms, no tombstone) and it stores what a
    forgetful broker would: a retried batch again, a batch after a lost one, and the lost one
    late. The audit finds each of them on the log alone."""
    broker = start_broker(**{"producer.id.expiration.ms": "1",
                             "producer.id.expiration.check.interval.ms": "50",
                             "producer.id.tombstone.ms": "0"})
    create_topic(broker.bootstrap, "forgot", 1)
    pid = store_forgetting(broker.bootstrap, "forgot", [
        (0, 0, 0, [b"a", b"b"]), (0, 0, 0, [b"a", b"b"]),  # the retry stored again
        (0, 0, 10, [b"k"]),  # 2..9 lost
        (0, 0, 5, [b"f"])])  # 5 arrives late

    code, out = run_cli(capsys, "--bootstrap-server", broker.bootstrap, "--topic", "forgot",
                        "--json", "--by", "value")
    assert code == 1
    report = json.loads(out)
    (producer,) = report["producers"]
    assert producer["producer_id"] == pid
    # seen: 0..1 twice, 10, 5: holes 2..4 and 6..9
    assert {k: producer[k] for k in ("records", "duplicates", "gaps", "missing",
                                     "regressions")} == {
        "records": 6, "duplicates": 2, "gaps": 2, "missing": 7, "regressions": 1}
    assert report["problems"] == ["2 duplicate sequences", "2 gaps (7 missing sequences)",
                                  "1 regressed sequence", "2 values repeated (2 extra records)"]

    code, out = run_cli(capsys, "--bootstrap-server", broker.bootstrap, "--topic", "forgot")
    assert code == 1
    assert out.splitlines()[-1] == (
        "NOT CLEAN: 6 records in 1 partition, 1 producer id; 2 duplicate sequences, 2 gaps "
        "(7 missing sequences), 1 regressed sequence")


def leaders_of(holder, topic: str) -> set[int]:
    for _ in range(20):  # the first Metadata answer may come before the topic has leaders
        partitions = holder.list_topics(topic, timeout=TIMEOUT).topics[topic].partitions
        leaders = {p.leader for p in partitions.values()}
        if partitions and -1 not in leaders:
            return leaders
        time.sleep(0.1)
    raise AssertionError(f"the mock gave {topic} no leaders")


def test_another_kafka_implementation_with_leaders_on_three_brokers(capsys):
    """librdkafka's mock cluster: a Kafka implementation that is not oncelog, three brokers,
    each partition led by one of them."""
    holder = Producer({"test.mock.num.brokers": 3})
    try:
        brokers = holder.list_topics(timeout=TIMEOUT).brokers
        bootstrap = ",".join(f"{b.host}:{b.port}" for b in brokers.values())
        # The mock creates topics on first use, with 4 partitions (it has no CreateTopics),
        # and places leaders as it likes: take the first topic whose leaders are spread.
        topic = next((t for t in (f"mock{i}" for i in range(20))
                      if len(leaders_of(holder, t)) > 1), None)
        assert topic is not None, "the mock put all leaders on one broker for 20 topics"
        produce(bootstrap, topic, [(i % 4, b"m%d" % i) for i in range(1200)],
                **{"enable.idempotence": True})
        produce(bootstrap, topic, [(1, b"m7")], **{"enable.idempotence": False})

        code, out = run_cli(capsys, "--bootstrap-server", bootstrap, "--topic", topic)
        assert code == 0, out
        assert out.splitlines()[-1] == ("CLEAN: 1,201 records in 4 partitions, 1 producer id; "
                                        "no duplicate, gap or regression")
        code, out = run_cli(capsys, "--bootstrap-server", bootstrap, "--topic", topic, "--by",
                            "value")
        assert code == 1
        assert "m7  x2 at 1:300, 3:1" in out
    finally:
        holder.flush(TIMEOUT)


def test_usage_errors_exit_2(broker, capsys):
    create_topic(broker.bootstrap, "small", 1)
    assert main(["audit", "--bootstrap-server", broker.bootstrap, "--topic", "absent"]) == 2
    assert main(["audit", "--bootstrap-server", broker.bootstrap, "--topic", "small",
                 "--partition", "3"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--bootstrap-server", broker.bootstrap, "--topic", "small",
              "--by", "timestamp"])
    assert exc.value.code == 2
    assert main(["audit", "--bootstrap-server", broker.bootstrap, "--topic", "small",
                 "--examples", "-1"]) == 2
    with pytest.raises(AuditError):
        audit_topic(broker.bootstrap, "absent")
    # An empty topic is clean.
    code, out = run_cli(capsys, "--bootstrap-server", broker.bootstrap, "--topic", "small")
    assert code == 0 and "CLEAN: 0 records in 1 partition" in out


def test_memory_stays_bounded(broker, tmp_path):
    """200,000 records with 250-byte values, read with --by value: holding the values alone
    would take over 50 MB; the audit's peak stays a fraction of that."""
    create_topic(broker.bootstrap, "big", 2)
    count, per_batch = 200_000, 2_000
    pad = b"x" * 241
    with connect(broker.bootstrap, timeout=TIMEOUT) as conn:
        pid = init_producer_id(conn)
        for partition in range(2):
            for seq in range(0, count // 2, per_batch):
                values = [b"%s%09d" % (pad, partition * count + seq + i)
                          for i in range(per_batch)]
                calls.produce(conn, "big", partition, batch(pid, 0, seq, values))
    held = count * (len(pad) + 9 + 33)  # the values as bytes objects, nothing else

    tracemalloc.start()
    try:
        report = audit_topic(broker.bootstrap, "big", by=("value",), directory=str(tmp_path),
                             max_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.clean, report.problems
    assert report.totals["records"] == count
    assert report.repeats[0].records == count
    assert peak < held / 4, f"peak {peak:,} bytes against {held:,} to hold the values"


def test_a_batch_whose_records_do_not_parse_is_reported_corrupt(broker, capsys):
    """Its CRC holds (a broker that validated nothing stored it): the sequence audit reads its
    header; --by cannot read its values and reports it as a corrupt batch, exit 1."""
    import struct

    from support.brokers import append_on_disk
    from support.record_sets import craft_batch

    from oncelog.protocol.record_batch import CRC_OFFSET, crc_of

    create_topic(broker.bootstrap, "torn", 1)
    damaged = bytearray(craft_batch(0, [(0, None, b"only one")], producer_id=7,
                                    producer_epoch=0, base_sequence=0))
    struct.pack_into(">i", damaged, 23, 2)  # says 3 records (deltas 0..2): holds 1
    struct.pack_into(">i", damaged, 57, 3)
    struct.pack_into(">I", damaged, CRC_OFFSET, crc_of(damaged, 0, len(damaged)))
    append_on_disk(broker, "torn", 0, [bytes(damaged)])

    code, out = run_cli(capsys, "--bootstrap-server", broker.bootstrap, "--topic", "torn")
    assert code == 0, out
    code, out = run_cli(capsys, "--bootstrap-server", broker.bootstrap, "--topic", "torn",
                        "--by", "value", "--json")
    report = json.loads(out)
    assert code == 1 and report["partitions"][0]["corrupt_batches"] == 1
    assert report["problems"] == ["1 corrupt batch"]
